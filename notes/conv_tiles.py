"""
Time the short-conv Triton kernels of kernels.py at several (rows per program, channels per program, warps) against F.conv1d (the torch path), on CUDA,
and check each tiling against the torch path in fp32. Effective bandwidth counts the floor's bytes: forward one read
of x and one write of y; backward reads of x, dy and a write of dx (the dw partial sums and their sum excluded).

$ python notes/conv_tiles.py      # KDA's q/k/v shape of the 124M hybrid (B8 T4096 D768) and Mamba2's xBC (D1792, bias,
                                  # a column slice of the in_proj output)
"""
import os
import sys

import torch
from triton.testing import do_bench as do_bench_eager, do_bench_cudagraph


def do_bench(fn):
    # replayed as a CUDA graph: the kernels' time without the Python dispatch of the custom op between them
    try:
        return do_bench_cudagraph(fn)
    except Exception as e:  # noqa: BLE001
        print('  (no CUDA graph:', str(e).splitlines()[0][:80], ')')
        return do_bench_eager(fn)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import kernels  # noqa: E402

CFGS = [(64, 256, 1), (64, 128, 1), (32, 128, 1), (128, 256, 1), (64, 256, 2), (32, 256, 1)]  # (L, BD, warps)


def case(B, T, D, bias, wide, norm):
    g = torch.Generator(device="cuda").manual_seed(0)
    xw = torch.randn(B, T, D + (1024 if wide else 0), device="cuda", generator=g).bfloat16()
    x = xw[..., :D]
    w = (torch.randn(D, 4, device="cuda", generator=g) / 2).requires_grad_()
    b = torch.randn(D, device="cuda", generator=g).requires_grad_() if bias else None
    dy = torch.randn(B, T, D, device="cuda", generator=g).bfloat16()
    return x, w, b, dy


def fwd_bwd(fn, x, w, b, dy):
    xx = x.detach().requires_grad_()
    y = fn(xx, w, b)
    y.backward(dy)
    return y, xx.grad, w.grad.clone(), None if b is None else b.grad.clone()


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for name, (B, T, D, bias, wide, norm) in {
            "kda v B8 T4096 D768": (8, 4096, 768, False, False, 0),
            "kda q/k B8 T4096 D768, l2 norm per 128": (8, 4096, 768, False, False, 128),
            "gdn q/k B8 T4096 D384, l2 norm per 64": (8, 4096, 384, False, False, 64),
            "mamba2 x B8 T4096 D768 (slice of a 1792-wide xBC), bias": (8, 4096, 768, True, True, 0)}.items():
        x, w, b, dy = case(B, T, D, bias, wide, norm)
        n = B * T * D
        torch_fn = lambda x, w, b: kernels.short_conv_torch(x, w, b, norm)
        tri_fn = lambda x, w, b: kernels._short_conv_fwd(x, w, b, norm)
        ref = fwd_bwd(lambda x, w, b: torch_fn(x.float(), w, b), x, w, b, dy.float())
        for p in (w, b):
            if p is not None:
                p.grad = None
        t_f = do_bench_eager(lambda: torch_fn(x, w, b))
        xg = x.detach().requires_grad_()
        y = torch_fn(xg, w, b)
        t_fb = do_bench_eager(lambda: torch.autograd.grad(y, [xg, w] + ([b] if bias else []), dy, retain_graph=True))
        print(f"{name}: F.conv1d fwd {t_f:.3f} ms, bwd {t_fb:.3f} ms")
        for cfg in CFGS:
            kernels._CONV_FWD = cfg
            t = do_bench(lambda: tri_fn(x, w, b))
            err = ((tri_fn(x, w, b).float() - ref[0]).abs().max() / ref[0].abs().max()).item()
            print(f"  fwd {cfg}: {t:.3f} ms, {4 * n / t / 1e6:.0f} GB/s, max rel err {err:.1e}")
        for cfg in CFGS:
            kernels._CONV_BWD = cfg
            t = do_bench(lambda: kernels._short_conv_bwd(x, w, b, norm, dy))
            dx, dw, db = kernels._short_conv_bwd(x, w, b, norm, dy)
            errs = [((a.float() - r).abs().max() / r.abs().max()).item() for a, r in
                    zip((dx, dw, db), (ref[1], ref[2], ref[3])) if r is not None]
            print(f"  bwd {cfg}: {t:.3f} ms, {6 * n / t / 1e6:.0f} GB/s, max rel err dx/dw/db "
                  + " ".join(f"{e:.1e}" for e in errs))


if __name__ == "__main__":
    main()
