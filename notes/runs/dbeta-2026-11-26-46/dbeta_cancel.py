"""dβ at T = 1 when the state already holds v for k (u = v - S~^T k small: the delta rule's error nearly 0), bf16.
δ sets |u| / |v|. Kernel dβ error against the fp64 recurrence, and against the first-order bound ε·(|X·v| + |X·S~^T k|)/|X·u|."""
import os, sys
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, ".")
import torch, torch.nn.functional as F
import kernels
bf = torch.bfloat16
B, H, D = 1, 2, 64
for delta in (1.0, 0.1, 0.01):
    gen = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=gen)
    q, k = F.normalize(rnd(B, 1, H, D), dim=-1), F.normalize(rnd(B, 1, H, D), dim=-1)
    v, beta = rnd(B, 1, H, D), torch.sigmoid(rnd(B, 1, H))
    g = torch.where(torch.rand(B, 1, H, D, generator=gen) < 0.5, -1000.0, 0.0)
    kt = (k.to(bf).double() * torch.exp(g.double()))[:, 0]                 # S~^T k = S0^T (α ⊙ k)
    vb = v.to(bf).double()[:, 0]
    S0 = (1 - delta) * kt[..., None] * vb[..., None, :] / (kt * kt).sum(-1)[..., None, None] + 0.02 * rnd(B, H, D, D).double()
    do, dS = rnd(B, 1, H, D).double(), rnd(B, H, D, D).double()
    for dt in (bf, torch.float32):
        x = dict(q=q, k=k, v=v, beta=beta, g=g)
        xb = {n: t.to(dt).requires_grad_(n == "beta") for n, t in x.items()}
        o, ht = kernels.delta_rule_triton(**xb, initial_state=S0.float(), output_final_state=True)
        db = torch.autograd.grad((o.double() * do).sum() + (ht.double() * dS).sum(), xb["beta"])[0]
        xr = {n: t.to(dt).double().requires_grad_(n == "beta") for n, t in x.items()}
        ro, rS = kernels.delta_rule_recurrent(**xr, initial_state=S0.float().double(), output_final_state=True)
        rdb = torch.autograd.grad((ro * do).sum() + (rS * dS).sum(), xr["beta"])[0]
        St = torch.exp(xr["g"].detach()[:, 0])[..., None] * S0.float().double()
        u = xr["v"].detach()[:, 0] - torch.einsum("bhkv,bhk->bhv", St, xr["k"].detach()[:, 0])
        rel = ((db.double() - rdb).abs() / rdb.abs()).flatten().tolist()
        # the scale of the two terms the kernel forms, X·v and X·(S~^T k), X = dS1^T k (dS1 = s q do^T + dS)
        dS1 = D ** -0.5 * torch.einsum("bhk,bhv->bhkv", xr["q"].detach()[:, 0], do[:, 0]) + dS
        X = torch.einsum("bhkv,bhk->bhv", dS1, xr["k"].detach()[:, 0])
        w = xr["v"].detach()[:, 0] - u
        terms = ((X * xr["v"].detach()[:, 0]).abs() + (X * w).abs()).sum(-1)
        per_scale = ((db.double() - rdb).abs()[:, 0] / terms).flatten().tolist()
        print(f"δ {delta}: {str(dt)[6:]} |u|/|v| {[round(x, 3) for x in (u.norm(dim=-1) / xr['v'].detach()[:, 0].norm(dim=-1)).flatten().tolist()]} "
              f"dβ rel err per head {[f'{e:.1e}' for e in rel]}, err / Σ(|X_j v_j| + |X_j (S~^T k)_j|) "
              f"{[f'{e:.1e}' for e in per_scale]}", flush=True)
