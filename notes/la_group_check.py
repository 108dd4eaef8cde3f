"""
GPU check of the grouped-q/k backward of the scalar-decay Triton kernels (Mamba2's B, C shared by the heads of a
group): _la_dqkg_bwd runs one program per (key tile, chunk, b, group), loops over the group's H / HK heads and
writes dq, dk [B, T, HK, Dk] once in the inputs' dtype (before: per-head fp32 dq, dk [B, T, H, Dk], summed in torch).

$ python notes/la_group_check.py            # from the repo root, on a CUDA machine (about a minute)

1. Correctness: kernels.linear_attn_triton against kernels.linear_attn_recurrent on fp64 copies, Mamba2-like bf16
   inputs (B=2, T=1000, H=8, HK=1 and 2, Dk=Dv=64, scale 1, an initial state and a final-state cotangent, g = -A_h Δ
   < 0 with mamba_ssm's init ranges); relative RMS errors against test_kernels.py's bf16 tolerances (TRITON_TOL),
   the max relative error for information, and whether two backward runs are bit-identical (no atomics).
2. Timing (triton.testing.do_bench, median ms): forward and forward+backward at the Mamba2 core shape B=8, T=4096,
   H=32, HK=1, Dk=N=128, Dv=P=64, bf16; next to it the same with q, k expanded to 32 heads (the ungrouped kernels
   plus autograd's sum over the expanded heads: roughly the old per-head path).
3. _la_dqkg_bwd alone at that shape for the (key tile, stages) pairs kernels._linear_attn_bwd could launch with
   groups (it uses key tiles of 32 and 2 stages at Dv = 64), to confirm that choice.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import kernels  # noqa: E402
from triton.testing import do_bench  # noqa: E402

TOL = {"o": 5e-3, "ht": 5e-3, "q": 8e-3, "k": 8e-3, "v": 8e-3, "initial_state": 8e-3, "g": 2e-2}  # TRITON_TOL, bf16
DEV = "cuda"


def mamba2_like(B, T, H, HK, DK, DV, dtype=torch.bfloat16, seed=0):
    """q = C, k = B [B, T, HK, Dk], v = Δ·x [B, T, H, Dv] in dtype; g = -A_h Δ [B, T, H] fp32 with A_h in [1, 16] and
    Δ = softplus(u + dt_bias), dt_bias from Δ0 log-uniform in [1e-3, 0.1] (model.init_decay_rates); an fp32 initial
    state."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device=DEV, generator=gen)
    dt0 = torch.exp(torch.rand(H, device=DEV, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))
    A = 1 + 15 * torch.rand(H, device=DEV, generator=gen)
    delta = F.softplus(rnd(B, T, H) + dt_bias)
    x = F.silu(rnd(B, T, H, DV))
    return dict(q=F.silu(rnd(B, T, HK, DK)).to(dtype), k=F.silu(rnd(B, T, HK, DK)).to(dtype),
                v=(x * delta[..., None]).to(dtype), g=-A * delta, initial_state=rnd(B, H, DK, DV))


def grads(fn, x, do, dS):
    """-> o, final state, {name: gradient} of <o, do> + <S, dS>."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in x.items()}
    o, S = fn(**leaves, scale=1.0, output_final_state=True)
    loss = (o.double() * do).sum() + (S.double() * dS).sum()
    return o, S, dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def check(HK, B=2, T=1000, H=8, D=64):
    x = mamba2_like(B, T, H, HK, D, D, seed=HK)
    gen = torch.Generator(device=DEV).manual_seed(1)
    do = torch.randn(B, T, H, D, device=DEV, dtype=torch.float64, generator=gen)
    dS = torch.randn(B, H, D, D, device=DEV, dtype=torch.float64, generator=gen)
    o, S, g1 = grads(kernels.linear_attn_triton, x, do, dS)
    ro, rS, rg = grads(kernels.linear_attn_recurrent, {n: t.double() for n, t in x.items()}, do, dS)
    _, _, g2 = grads(kernels.linear_attn_triton, x, do, dS)
    got, ref = {"o": o, "ht": S} | g1, {"o": ro, "ht": rS} | rg
    ok = True
    print(f"H={H} HK={HK} (group of {H // HK}) B={B} T={T} Dk=Dv={D} bf16:")
    for n in got:
        a, r = got[n].double(), ref[n]
        rms = ((a - r).norm() / r.norm().clamp_min(1e-30)).item()
        mx = ((a - r).abs().max() / r.abs().max().clamp_min(1e-300)).item()
        good = bool(torch.isfinite(a).all()) and rms < TOL[n]
        ok &= good
        print(f"  {n:14s} rel RMS {rms:.2e} (tol {TOL[n]:.0e})  max rel {mx:.2e}  {'ok' if good else 'OVER'}")
    shapes = g1["q"].shape == x["q"].shape and g1["k"].shape == x["k"].shape
    dtypes = g1["q"].dtype == x["q"].dtype and g1["k"].dtype == x["k"].dtype
    same = all(torch.equal(g1[n], g2[n]) for n in g1)
    print(f"  dq, dk {tuple(g1['q'].shape)} {g1['q'].dtype}: shapes {'ok' if shapes else 'WRONG'}, dtypes "
          f"{'ok' if dtypes else 'WRONG'}; two backward runs bit-identical: {same}")
    ok &= shapes and dtypes and same
    print(f"  {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def fwd_bwd_ms(x, heads=None):
    """-> (fwd, fwd+bwd) median ms of linear_attn_triton on x (no initial state); heads: expand q, k to that many
    heads inside the timed function, so that autograd sums their gradients over the expanded heads."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in x.items() if n != "initial_state"}
    do = torch.randn_like(x["v"])

    def fwd():
        y = dict(leaves)
        if heads:
            y["q"], y["k"] = (y[n].expand(-1, -1, heads, -1) for n in ("q", "k"))
        return kernels.linear_attn_triton(**y, scale=1.0)[0]

    def step():
        torch.autograd.grad(fwd(), list(leaves.values()), do)

    with torch.no_grad():
        t_f = do_bench(fwd, return_mode="median")
    step()  # compile outside the measurement
    return t_f, do_bench(step, return_mode="median")


def dqkg_sweep(x, BKs=(32, 64), stages=(1, 2)):
    """_la_dqkg_bwd alone on x's shapes (random h, dh), as kernels._linear_attn_bwd launches it with groups."""
    q, k, v, g = x["q"], x["k"], x["v"], x["g"]
    B, T, H, DV = v.shape
    HK, DK = q.shape[2], q.shape[3]
    C, BV, NT = kernels.TRITON_CHUNK, min(DV, 64), (T + kernels.TRITON_CHUNK - 1) // kernels.TRITON_CHUNK
    h = torch.randn(B, NT, H, DK, DV, device=DEV) * 0.1
    dh = torch.randn_like(h) * 0.1
    do = torch.randn_like(v)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    for BK in BKs:
        dgk = torch.empty(B, T, H, DK // BK, device=DEV)
        for s in stages:
            launch = lambda: kernels._la_dqkg_bwd_kernel[(DK // BK, NT, B * HK)](
                q, k, v, g, g, h, do, dh, dq, dk, dgk, 1.0, T, NT, H, HK, DK, DV, BK, BV, C, 1, 'bf16', H // HK, 0,
                num_warps=8, num_stages=s)
            try:
                launch()
                print(f"  key tile {BK:2d}, {s} stage(s): {do_bench(launch, return_mode='median'):.3f} ms", flush=True)
            except Exception as e:  # noqa: BLE001 (e.g. out of shared memory)
                print(f"  key tile {BK:2d}, {s} stage(s): {str(e).splitlines()[0][:100]}", flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (the Triton kernels compile for it)")
    import triton
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}\n", flush=True)
    print("1. grouped backward vs the fp64 recurrence", flush=True)
    results = [check(HK) for HK in (1, 2)]
    print(f"correctness: {'PASS' if all(results) else 'FAIL'}\n", flush=True)

    print("2. Mamba2 core B=8 T=4096 H=32 HK=1 Dk=128 Dv=64 bf16, median ms", flush=True)
    x = mamba2_like(8, 4096, 32, 1, 128, 64)
    f, fb = fwd_bwd_ms(x)
    print(f"  grouped (HK=1):            fwd {f:.3f}   fwd+bwd {fb:.3f}", flush=True)
    f, fb = fwd_bwd_ms(x, heads=32)
    print(f"  q, k expanded to 32 heads: fwd {f:.3f}   fwd+bwd {fb:.3f}   (ungrouped kernels + torch sum)", flush=True)
    torch.cuda.empty_cache()

    print("\n3. _la_dqkg_bwd alone at that shape (kernels.py launches key tile 64, 2 stages)", flush=True)
    dqkg_sweep(x)
