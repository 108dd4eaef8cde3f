"""
Tile / warp settings of the delta-rule kernels by measurement (GPU): every setting first checked against the fp64
recurrence by test_kernels.triton_check in its own process, all in parallel (this also compiles them; Triton's disk
cache is shared and T, B, H are not specialised), then the settings that passed timed one after another, alone.
Triton 3.6 miscompiles some settings on Hopper (wrong gradients or an illegal memory access), hence the checks.
kernels.STATE_TILE, WY_GRADS_TILE, KDA_KEY_TILE, KDA_GRAMS_TILE and INVERSE_WARPS hold the defaults; this script is
how they are chosen.

$ python notes/delta_tiles.py                       # every setting below, DeltaNet, GDN, KDA at B8 T4096 H16 D128
$ python notes/delta_tiles.py --variants deltanet   # time a subset (the checks run every setting)
$ python notes/delta_tiles.py --only kda_grams      # check and time one knob's settings
"""
import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
import kernels  # noqa: E402

# one knob at a time: (kernels attribute, value, the variants it affects)
WY = [("WY_GRADS_TILE", {"v": v, "warps": w}, ("deltanet", "gdn"))
      for v, w in ((64, 8), (64, 16), (32, 8))]
STATE = [("STATE_TILE", {"v": v, "warps": w, "kda_bwd_warps": kw, "min_v": m}, ("deltanet", "gdn", "kda"))
         for v, w, kw, m in ((64, 8, 8, 32), (32, 4, 4, 32), (32, 8, 8, 32), (64, 4, 4, 32), (64, 4, 8, 32),
                             (64, 4, 8, 16))]  # min_v: the smallest V-tile at small B*H (--shape 2,16384,16,128)
KDA = [("KDA_KEY_TILE", {"k": k, "warps": w}, ("kda",)) for k, w in ((64, 8), (32, 8), (64, 4))]
GRAMS = [("KDA_GRAMS_TILE", {"k": k, "warps": w, "split": s}, ("kda",))
         for k, w, s in ((128, 8, False), (64, 8, False), (64, 4, False), (128, 16, False),
                         (128, 8, True), (64, 8, True), (64, 4, True), (32, 4, True))]
INVERSE = [("INVERSE_WARPS", w, ("deltanet", "kda")) for w in (2, 1, 4)]
SETTINGS = WY + STATE + KDA + GRAMS + INVERSE
ATTRS = ("STATE_TILE", "WY_GRADS_TILE", "KDA_KEY_TILE", "KDA_GRAMS_TILE", "INVERSE_WARPS")
CHECKS = {"deltanet": ("none", "-"), "gdn": ("gdn", "mild"), "kda": ("kda", "strong")}


def name(i):
    attr, value, _ = SETTINGS[i]
    what = '/'.join(map(str, value.values())) if isinstance(value, dict) else str(value)
    return f"{attr.lower().replace('_tile', '')} {what}"


def check(i):
    """test_kernels' GPU check of every variant setting i affects: bf16 at T 1000 / Dk 128 and T 65 / Dk 64, fp32 at
    T 65 / Dk 128 (subprocess: an illegal memory access would poison the timing process)."""
    import test_kernels as tk
    attr, value, variants = SETTINGS[i]
    setattr(kernels, attr, value)
    for variant in variants:
        gate, strength = CHECKS[variant]
        for T, D, dtype in ((1000, 128, torch.bfloat16), (65, 64, torch.bfloat16), (65, 128, torch.float32)):
            tk.triton_check(2, T, 2, D, D, gate, strength, dtype)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def time_setting(i, shape, variants, base=()):
    B, T, H, D = shape
    defaults = {a: getattr(kernels, a) for a in ATTRS}
    for attr, value in list(base) + [SETTINGS[i][:2]]:
        setattr(kernels, attr, value)
    out = {}
    for variant in variants:
        if variant not in SETTINGS[i][2]:
            continue
        x = bench.inputs(B, T, H, D, variant)
        leaves = ["q", "k", "v", "beta", "g"]
        f, fb, peak = bench.measure(lambda x: bench.run_chunk("ours", variant, x), x, leaves)
        out[variant] = fb
        print(f"  {variant:8s} {name(i):16s} {f:6.3f} / {fb:6.3f} ms  {peak:6.0f} MiB", flush=True)
    for a, v in defaults.items():
        setattr(kernels, a, v)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="deltanet,gdn,kda")
    ap.add_argument("--shape", default="8,4096,16,128")
    ap.add_argument("--only", default="", help="time only the settings whose name starts with one of these (comma-separated), e.g. 'state'")
    ap.add_argument("--no_checks", action="store_true", help="skip the checks (settings that passed them before)")
    ap.add_argument("--check", type=int, default=None, help=argparse.SUPPRESS)  # internal: one setting (subprocess)
    args = ap.parse_args()
    if args.check is not None:
        if args.no_checks:
            time_setting(args.check, tuple(map(int, args.shape.split(","))), args.variants.split(","))
        else:
            check(args.check)
        return
    variants = args.variants.split(",")
    chosen = [i for i in range(len(SETTINGS)) if any(name(i).startswith(p) for p in args.only.split(","))]
    cmd = [sys.executable, __file__, "--check"] if not args.no_checks else \
        [sys.executable, __file__, "--variants", args.variants, "--shape", "1,1000,2," + args.shape.split(",")[3],
         "--only", "", "--no_checks", "--check"]  # only compiles (a tiny shape, no comparison)
    procs = {i: subprocess.Popen(cmd + [str(i)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in chosen}
    ok = [False] * len(SETTINGS)
    for i, p in procs.items():
        err = p.communicate()[1]
        ok[i] = p.returncode == 0
        why = "" if ok[i] else " ".join(err.strip().splitlines()[-1:])[:110]
        print(f"{'compile' if args.no_checks else 'check'} {name(i):16s} {'ok' if ok[i] else 'FAILED ' + why}",
              flush=True)
    shape = tuple(map(int, args.shape.split(",")))
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; shape {args.shape}; fwd / fwd+bwd ms "
          "(do_bench medians), peak MiB; settings that passed their checks only", flush=True)
    best_wy = None
    for i, (attr, value, _) in enumerate(SETTINGS):
        if not ok[i]:
            continue
        if args.no_checks and i not in procs:
            continue
        base = [("WY_GRADS_TILE", best_wy)] if (attr != "WY_GRADS_TILE" and best_wy) else []
        fb = time_setting(i, shape, variants, base)
        if attr == "WY_GRADS_TILE" and "deltanet" in fb and (best_wy is None or fb["deltanet"] < best_fb):
            best_wy, best_fb = value, fb["deltanet"]
    print("fastest wy_grads setting (deltanet fwd+bwd), used under the state and kda settings:", best_wy)


if __name__ == "__main__":
    main()
