"""
Tile / warp settings of the delta-rule kernels by measurement (GPU): every setting first checked against the fp64
recurrence by test_kernels.triton_check in its own process, all in parallel (this also compiles them; Triton's disk
cache is shared and T, B, H are not specialised), then the settings that passed timed one after another, alone.
Triton 3.6 miscompiles some settings on Hopper (wrong gradients or an illegal memory access), hence the checks.
kernels.STATE_TILE, WY_GRADS_TILE, KDA_KEY_TILE, GRAMS_TILE and INVERSE_WARPS hold the defaults; this script is
how they are chosen.

$ python notes/delta_tiles.py                       # every setting below, DeltaNet, GDN, KDA at B8 T4096 H16 D128
$ python notes/delta_tiles.py --variants deltanet   # time a subset (the checks run every setting)
$ python notes/delta_tiles.py --only grams          # check and time one knob's settings
$ python notes/delta_tiles.py --only "state 64/4/8/32/8" --shapes 8,4096,16,128:2,16384,16,128:8,4096,16,64
$ python notes/delta_tiles.py --only gdn_bwd --variants deltanet,gdn --shapes 8,4096,16,128:2,16384,16,128:8,4096,16,64
                                                    # GDN's dg forms at the three shapes, GDN / DeltaNet at the end
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
WY = [("WY_GRADS_TILE", dict(kernels.WY_GRADS_TILE, v=v, warps=w), ("deltanet", "gdn"))
      for v, w in ((64, 8), (64, 16), (32, 8), (64, 4))]
# at Dk <= 64 (warps_d64 by gate kind, 0 DeltaNet, 1 GDN) with GDN's dg forms: --shapes 8,4096,16,64
WY += [("WY_GRADS_TILE", dict(kernels.WY_GRADS_TILE, warps_d64={0: 4, 1: w}, gdn=f), ("deltanet", "gdn"))
       for w, f in ((4, "order"), (4, "rows_dq"), (4, "tile"))]
STATE = [("STATE_TILE", dict(kernels.STATE_TILE, v=v, warps=w, kda_bwd_warps=kw, min_v=m), ("deltanet", "gdn", "kda"))
         for v, w, kw, m in ((64, 8, 8, 32), (32, 4, 4, 32), (32, 8, 8, 32), (64, 4, 4, 32), (64, 4, 8, 32),
                             (64, 4, 8, 16))]  # min_v: the smallest V-tile at small B*H (--shape 2,16384,16,128)
KDA = [("KDA_KEY_TILE", {"k": k, "warps": w}, ("kda",)) for k, w in ((64, 8), (32, 8), (64, 4))]
INVERSE = [("INVERSE_WARPS", w, ("deltanet", "kda")) for w in (2, 1, 4)]
# the Grams by 16 x 16 blocks (_grams_block_kernel): key tile of DeltaNet / GDN, of KDA, warps
GRAMS = [("GRAMS_TILE", {"k": k, "kda_k": kk, "warps": w}, ("deltanet", "gdn", "kda"))
         for k, kk, w in ((64, 16, 1), (64, 32, 1), (32, 16, 2), (128, 16, 1))]
# warps of the forward's state pass, which forms the output (out_warps), software pipelining (stages, bwd_stages)
STATE += [("STATE_TILE", dict(kernels.STATE_TILE, **kw), ("deltanet", "gdn", "kda"))
          for kw in (dict(out_warps=8), dict(stages=3, bwd_stages=3), dict(stages=4), dict(warps=2, out_warps=2),
                     dict(warps=2, stages=3, bwd_stages=3))]
SETTINGS = WY + STATE + KDA + GRAMS + INVERSE
ATTRS = ("STATE_TILE", "WY_GRADS_TILE", "KDA_KEY_TILE", "GRAMS_TILE", "INVERSE_WARPS")
CHECKS = {"deltanet": ("none", "-"), "gdn": ("gdn", "mild"), "kda": ("kda", "strong")}
# GDN's dg forms in _wy_grads_bwd (WY_GRADS_TILE['gdn'], kernels.py's comment at the kernel), named 'gdn_bwd FORM':
# checked on GDN at mild and strong gates, timed on GDN and on DeltaNet, which they do not change
# (its repeats beside each form show the noise; the summary divides by the DeltaNet timed beside the form):
#   python notes/delta_tiles.py --only gdn_bwd --variants deltanet,gdn --shapes 8,4096,16,128:2,16384,16,128:8,4096,16,64
# 'phased' (_wy_grads_bwd_phased_kernel, Dk <= 64 only; 'gdn_d128' above) also with its warps: 'gdn_bwd FORM/WARPS'
GDN_BWD = [("WY_GRADS_TILE", dict(kernels.WY_GRADS_TILE, gdn=f, warps_d64={0: 4, 1: w}), ("deltanet", "gdn"))
           for f, w in (("tile", 8), ("rows", 8), ("rows_dq", 8), ("order", 8), ("phased", 4), ("phased", 8))]
SETTINGS += GDN_BWD
# DeltaNet's form (WY_GRADS_TILE['deltanet']) at Dk <= 64: 'dn_bwd FORM/WARPS'
DN_BWD = [("WY_GRADS_TILE", dict(kernels.WY_GRADS_TILE, deltanet=f, warps_d64={0: w, 1: 4}), ("deltanet",))
          for f, w in (("phased", 4),)]
SETTINGS += DN_BWD
# _inverse's dots for bf16 inputs: 'tf32' (one pass) against the default 'tf32x3' (fp32-accurate)
INV_PREC = [("INVERSE_PREC", dict(kernels.INVERSE_PREC, bf16=p), ("deltanet", "gdn", "kda")) for p in ("tf32",)]
SETTINGS += INV_PREC
ATTRS += ("INVERSE_PREC",)


def is_gdn_bwd(i):
    return any(SETTINGS[i] is g for g in GDN_BWD)


def name(i):
    attr, value, _ = SETTINGS[i]
    if is_gdn_bwd(i):
        return f"gdn_bwd {value['gdn']}/{value['warps_d64'][1]}"
    if any(SETTINGS[i] is g for g in DN_BWD):
        return f"dn_bwd {value['deltanet']}/{value['warps_d64'][0]}"
    if attr == "INVERSE_PREC":
        return f"inverse_prec {value['bf16']}"
    what = '/'.join('.'.join(map(str, x.values())) if isinstance(x, dict) else str(x) for x in value.values()) \
        if isinstance(value, dict) else str(value)
    return f"{attr.lower().replace('_tile', '')} {what}"


def check(i):
    """test_kernels' GPU check of every variant setting i affects: bf16 at T 1000 / Dk 128 and T 65 / Dk 64, fp32 at
    T 65 / Dk 128 (subprocess: an illegal memory access would poison the timing process)."""
    import test_kernels as tk
    attr, value, variants = SETTINGS[i]
    setattr(kernels, attr, value)
    if is_gdn_bwd(i):  # GDN's dg forms: DeltaNet takes none of them; strong gates (a tenth at -1000) and fp32 at T 1000
        for strength in ("mild", "strong"):
            for T, D, dtype in ((1000, 128, torch.bfloat16), (65, 64, torch.bfloat16), (65, 128, torch.float32),
                                (1000, 64, torch.float32)):
                tk.triton_check(2, T, 2, D, D, "gdn", strength, dtype)
        return
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
        print(f"  {variant:8s} {name(i):20s} {B}x{T}x{H}x{D}  {f:6.3f} / {fb:6.3f} ms  {peak:6.0f} MiB", flush=True)
    for a, v in defaults.items():
        setattr(kernels, a, v)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="deltanet,gdn,kda")
    ap.add_argument("--shape", default="8,4096,16,128")
    ap.add_argument("--shapes", default="", help="time at each of these B,T,H,D (colon-separated) instead of --shape")
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
    shapes = [tuple(map(int, s.split(","))) for s in (args.shapes or args.shape).split(":")]
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; shapes {args.shapes or args.shape}; "
          f"fwd / fwd+bwd ms ({bench.TIMING} timing), peak MiB; settings that passed their checks only", flush=True)
    best_wy = None
    results = {}
    for i, (attr, value, _) in enumerate(SETTINGS):
        if not ok[i]:
            continue
        if args.no_checks and i not in procs:
            continue
        base = [("WY_GRADS_TILE", best_wy)] if (attr != "WY_GRADS_TILE" and best_wy) else []
        for shape in shapes:
            fb = results[i, shape] = time_setting(i, shape, variants, base)
            if shape == shapes[0] and attr == "WY_GRADS_TILE" and not is_gdn_bwd(i) and \
                    not any(SETTINGS[i] is g for g in DN_BWD) and "deltanet" in fb and \
                    (best_wy is None or fb["deltanet"] < best_fb):
                best_wy, best_fb = value, fb["deltanet"]
    print("fastest wy_grads setting (deltanet fwd+bwd), used under the state and kda settings:", best_wy)
    gdn = [i for i in range(len(SETTINGS)) if is_gdn_bwd(i) and (i, shapes[0]) in results]
    if gdn:
        print("GDN fwd+bwd / DeltaNet fwd+bwd timed beside it = ratio (target <= 1.1), by GDN's dg form:")
        print(f"  {'':20s} " + " | ".join(f"{'x'.join(map(str, s)):23s}" for s in shapes))
        for i in gdn:
            cells = []
            for s in shapes:
                g, d = results[i, s].get("gdn"), results[i, s].get("deltanet")
                cells.append(f"{g:.3f} / {d:.3f} = {g / d:.3f}" if g and d else f"{'-':23s}")
            print(f"  {name(i):20s} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
