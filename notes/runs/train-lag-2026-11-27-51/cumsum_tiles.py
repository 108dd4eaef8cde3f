"""Session 51, for the next GPU call: kernels._chunk_cumsum (the KDA gate formed from its input u and summed per
chunk) under TUNING['cumsum'] candidates, at the 124M hybrid's KDA shapes (1k: B 32, 4k: B 8; H 6, Dk 128) and
bench.py's (8 x 4096 x 16 x 128). Each candidate's G must equal the default's bit for bit; time by do_bench
(median, ms), with the bytes moved (u bf16 read, G fp32 written) as GB/s, beside a plain copy of the same bytes
(torch: G.copy_(u), bf16 -> fp32) as the bandwidth a simple kernel reaches. Run: python cumsum_tiles.py (from the
repository root)."""
import os, sys
sys.path.insert(0, os.getcwd())
import torch
from triton.testing import do_bench
import kernels

CANDIDATES = [dict(d=d, warps=w) for d in (128, 64, 32, 16) for w in (1, 2, 4, 8)]
SHAPES = [(32, 1024, 6, 128), (8, 4096, 6, 128), (8, 4096, 16, 128)]
gen = torch.Generator(device="cuda").manual_seed(0)
for B, T, H, D in SHAPES:
    u = torch.randn(B, T, H * D, device="cuda", generator=gen).to(torch.bfloat16).view(B, T, H, D)
    A_log = torch.log(torch.empty(H, device="cuda").uniform_(1, 16, generator=gen))
    dt_bias = torch.log(torch.expm1(torch.empty(H * D, device="cuda").uniform_(0.001, 0.1, generator=gen)))
    nbytes = u.numel() * (2 + 4)
    out = torch.empty(u.shape, device="cuda", dtype=torch.float32)
    ms = do_bench(lambda: out.copy_(u), return_mode="median")
    print(f"\n{B}x{T}x{H}x{D}: copy bf16 -> fp32 {ms:.4f} ms, {nbytes / ms / 1e6:,.0f} GB/s")
    ref = None
    for c in CANDIDATES:
        kernels.TUNING["cumsum"] = c
        G = kernels._chunk_cumsum(u, H, D, A_log, dt_bias)
        if ref is None:
            ref = G.clone()
        same = torch.equal(G, ref)
        ms = do_bench(lambda: kernels._chunk_cumsum(u, H, D, A_log, dt_bias), return_mode="median")
        print(f"  d={c['d']:3d} warps={c['warps']}: {ms:.4f} ms, {nbytes / ms / 1e6:,.0f} GB/s, "
              f"{'equal' if same else 'DIFFERENT from d=128 warps=1'}")
