"""
Tile / warp settings of the delta-rule kernels by measurement (GPU): every setting compiled first in parallel
processes (Triton's disk cache is shared, T, B, H are not specialised), then timed one after another alone, with
each setting's output and gradients compared to the default setting's (a miscompiled variant shows as a large
difference). kernels.STATE_TILE, WY_GRADS_TILE and KDA_KEY_TILE hold the defaults; this script is how they are chosen.

$ python notes/delta_tiles.py                       # every setting below, DeltaNet, GDN, KDA at B8 T4096 H16 D128
$ python notes/delta_tiles.py --variants deltanet   # a subset
"""
import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
import kernels  # noqa: E402

SETTINGS = {  # name -> {kernels attribute: value}; 'default' is kernels.py as it is
    "default": {},
    "state 32/4": {"STATE_TILE": {"v": 32, "warps": 4}},
    "state 32/8": {"STATE_TILE": {"v": 32, "warps": 8}},
    "state 64/4": {"STATE_TILE": {"v": 64, "warps": 4}},
    "wy_grads 32/16": {"WY_GRADS_TILE": {"v": 32, "warps": 16}},
    "wy_grads 64/8": {"WY_GRADS_TILE": {"v": 64, "warps": 8}},
    "wy_grads 16/8": {"WY_GRADS_TILE": {"v": 16, "warps": 8}},
    "wy_grads 32/4": {"WY_GRADS_TILE": {"v": 32, "warps": 4}},
    "kda key 64/8": {"KDA_KEY_TILE": {"k": 64, "warps": 8}},
    "kda key 32/4": {"KDA_KEY_TILE": {"k": 32, "warps": 4}},
}


def apply(name):
    for attr, value in SETTINGS[name].items():
        setattr(kernels, attr, value)


def run(variant, x, leaves):
    xg = {n: (t.detach().requires_grad_() if n in leaves and t is not None else t) for n, t in x.items()}
    o = bench.run_chunk("ours", variant, xg)
    o.backward(torch.ones_like(o) / o.numel() ** 0.5)
    return [o.float()] + [xg[n].grad.float() for n in leaves if xg[n] is not None]


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="deltanet,gdn,kda")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--shape", default="8,4096,16,128")
    ap.add_argument("--compile_only", default=None, help=argparse.SUPPRESS)  # one setting, tiny shape (subprocess)
    args = ap.parse_args()
    variants = args.variants.split(",")
    settings = args.settings.split(",")
    if args.compile_only:
        apply(args.compile_only)
        for variant in variants:
            x = bench.inputs(1, 130, 2, int(args.shape.split(",")[3]), variant)
            run(variant, x, ["q", "k", "v", "beta", "g"])
        torch.cuda.synchronize()
        return
    procs = [subprocess.Popen([sys.executable, __file__, "--variants", args.variants, "--shape", args.shape,
                               "--compile_only", s]) for s in settings]
    print("compiled:", [p.wait() for p in procs], flush=True)
    B, T, H, D = map(int, args.shape.split(","))
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; shape {args.shape}; fwd / fwd+bwd ms "
          "(do_bench medians), peak MiB, max relative difference of o and the gradients from the default setting")
    defaults = {a: getattr(kernels, a) for a in ("STATE_TILE", "WY_GRADS_TILE", "KDA_KEY_TILE")}
    for variant in variants:
        x = bench.inputs(B, T, H, D, variant)
        leaves = ["q", "k", "v", "beta", "g"]
        ref = run(variant, x, leaves)
        for s in settings:
            if (s.startswith("wy_grads") and variant == "kda") or (s.startswith("kda") and variant != "kda"):
                continue
            for a, v in defaults.items():
                setattr(kernels, a, v)
            apply(s)
            try:
                out = run(variant, x, leaves)
                diff = max(rel(a, b) for a, b in zip(out, ref))
                f, fb, peak = bench.measure(lambda x: bench.run_chunk("ours", variant, x), x, leaves)
                print(f"  {variant:8s} {s:16s} {f:6.3f} / {fb:6.3f} ms  {peak:6.0f} MiB  diff {diff:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"  {variant:8s} {s:16s} {bench.first_line(e)}", flush=True)
        for a, v in defaults.items():
            setattr(kernels, a, v)


if __name__ == "__main__":
    main()
