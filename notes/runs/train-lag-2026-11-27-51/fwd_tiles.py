"""Session 51, for the next GPU call (after fwd_tiles.patch is applied): KDA's forward kernels _chunk_cumsum (the gate
formed from its input u, summed per chunk) and _wy_fwd under TUNING['cumsum'] and TUNING['wy_fwd'] candidates, at the
124M hybrid's KDA shapes (1k: B 32, 4k: B 8; H 6, Dk = Dv = 128) and bench.py's (8 x 4096 x 16 x 128), bf16, the gate
as the model forms it (A_log, dt_bias given). Per candidate: the forward's output against the default's (max abs
difference; the column tiles compute each output element by the same sums, so 0 is expected) and each kernel's own
CUDA time per call (torch.profiler over REPS forwards), with the bytes each must move as GB/s: the cumsum reads u
(bf16) and writes G (fp32); _wy_fwd reads k, v, q (bf16), G (fp32), A (bf16, [C] a token) and writes W, U, Kd, Qg.
Run from the repository root: python notes/runs/train-lag-2026-11-27-51/fwd_tiles.py"""
import os, sys
sys.path.insert(0, os.getcwd())
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
import kernels

REPS = 20
CANDIDATES = [("default", {})]
CANDIDATES += [(f"cumsum d{d} w{w}", {"cumsum": dict(d=d, warps=w)}) for d, w in
               ((128, 8), (64, 2), (64, 4), (32, 1), (32, 2), (32, 4), (16, 1), (16, 2))]
CANDIDATES += [(f"wy_fwd split{s} w{w}", {"wy_fwd": dict(split=s, warps=w)}) for s, w in
               ((2, 4), (2, 8), (4, 2), (4, 4))]
SHAPES = [(32, 1024, 6, 128), (8, 4096, 6, 128), (8, 4096, 16, 128)]
DEV = os.environ.get("DEV", "cuda")  # DEV=cpu TRITON_INTERPRET=1 SMOKE=1: a CPU check of the script (no times)
if os.environ.get("SMOKE"):
    SHAPES, REPS = [(1, 130, 2, 32)], 1
DEFAULT = {k: dict(v) for k, v in kernels.TUNING.items() if isinstance(v, dict)}


def kernel_ms(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize() if DEV == "cuda" else None
    with profile(activities=[ProfilerActivity.CUDA if DEV == "cuda" else ProfilerActivity.CPU]) as prof:
        for _ in range(REPS):
            fn()
        torch.cuda.synchronize() if DEV == "cuda" else None
    ms = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            ms[e.name] = ms.get(e.name, 0.0) + e.device_time / REPS / 1000
    return ms


gen = torch.Generator(device=DEV).manual_seed(0)
for B, T, H, D in SHAPES:
    rnd = lambda *s: torch.randn(*s, device=DEV, generator=gen)
    q = F.normalize(rnd(B, T, H, D), dim=-1).bfloat16()
    k = F.normalize(rnd(B, T, H, D), dim=-1).bfloat16()
    v = rnd(B, T, H, D).bfloat16()
    beta = torch.sigmoid(rnd(B, T, H)).bfloat16()
    u = rnd(B, T, H, D).bfloat16()
    A_log = torch.log(torch.empty(H, device=DEV).uniform_(1, 16, generator=gen))
    dt_bias = torch.log(torch.expm1(torch.empty(H * D, device=DEV).uniform_(0.001, 0.1, generator=gen)))
    fwd = lambda: kernels.delta_rule_triton(q, k, v, beta, u, A_log=A_log, dt_bias=dt_bias)[0]
    tok = B * T * H
    nbytes = {"_chunk_cumsum_kernel": tok * D * (2 + 4), "_wy_fwd_kernel": tok * D * (3 * 2 + 4 + 4 * 2) + tok * 64 * 2}
    print(f"\n{B}x{T}x{H}x{D}, bf16, the model's gate (A_log, dt_bias), ms per call of each kernel (GB/s)")
    ref = None
    for name, change in CANDIDATES:
        for key, d in DEFAULT.items():
            kernels.TUNING[key] = dict(d, **change.get(key, {}))
        try:
            o = fwd()
            ref = o if ref is None else ref
            diff = (o.float() - ref.float()).abs().max().item()
            ms = kernel_ms(fwd)
            cols = ", ".join(f"{n[1:-7]} {ms.get(n, 0):.4f} ({nb / ms.get(n, 1) / 1e6:,.0f})" for n, nb in nbytes.items())
            print(f"  {name:22s} max|o - default's| {diff:.1e}; {cols}; every forward kernel {sum(ms.values()):.4f}",
                  flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"  {name:22s} FAILED: {str(e).splitlines()[0][:150]}", flush=True)
    for key, d in DEFAULT.items():
        kernels.TUNING[key] = d
