"""
Time the delta-rule backward's _grads_bwd kernel at several (key tile, warps) settings on a GPU: forward+backward of
ours at B8 T4096 H16 D128, bf16 (bench.py's inputs), triton.testing.do_bench median per setting, and the gradients'
largest relative difference from the first setting's (the tile must not change the result beyond rounding).
kernels._bwd_key_tile holds the default; this script is how it was chosen (notes/perf.md, 2026-11-23).

$ python notes/bwd_tiles.py kda 16,8 32,8 16,4 64,8
$ python notes/bwd_tiles.py deltanet 32,8 64,8 32,4
$ python notes/bwd_tiles.py gdn 32,8 32,4 --warm      # --warm: compile only (run several at once before timing)
"""
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
import kernels  # noqa: E402

if __name__ == "__main__":
    variant, rest = sys.argv[1], sys.argv[2:]
    warm = "--warm" in rest
    settings = [tuple(map(int, s.split(","))) for s in rest if s != "--warm"]
    torch.backends.cuda.matmul.allow_tf32 = True
    x = bench.inputs(8, 4096, 16, 128, variant)
    leaves = ["q", "k", "v", "beta"] + (["g"] if x["g"] is not None else [])
    xg = {n: (t.detach().requires_grad_() if n in leaves and t is not None else t) for n, t in x.items()}
    params = [xg[n] for n in leaves]
    do = torch.randn_like(x["v"])
    default, ref = kernels._bwd_key_tile, None
    for BK, nw in settings:
        kernels._bwd_key_tile = lambda DK, GATE, BK=BK, nw=nw: (min(DK, BK), nw)
        step = lambda: bench.run_chunk("ours", variant, xg).backward(do)
        for p in params:
            p.grad = None  # each setting's gradients from zero (do_bench below leaves its last ones behind)
        step()
        torch.cuda.synchronize()
        grads = [p.grad.float().clone() for p in params]
        if warm:
            continue
        ref = grads if ref is None else ref
        err = max(((a - b).norm() / b.norm()).item() for a, b in zip(grads, ref))
        ms = triton.testing.do_bench(step, grad_to_none=params, return_mode="median")
        print(f"{variant} _grads_bwd BK={BK} warps={nw}: fwd+bwd {ms:.2f} ms, "
              f"gradients vs the first setting's: largest relative difference {err:.1e}", flush=True)
    kernels._bwd_key_tile = default
