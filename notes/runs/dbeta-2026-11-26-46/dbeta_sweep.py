"""Issue 41 point 5: dβ at T = 1, Dk = Dv = 64, bf16, per-channel gate of 0 and -1000 entries: the Triton kernel's
dβ against the fp64 recurrence, and against the fp64 dot of bf16-rounded operands (dβ = (dS1^T k) · u at T = 1)."""
import os, sys
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, ".")
import torch, torch.nn.functional as F
import kernels
bf = torch.bfloat16
def rms(a, r): return ((a.double() - r).norm() / r.norm()).item()
B, H, D = int(os.environ.get("B", 2)), int(os.environ.get("H", 2)), 64
for seed in range(int(os.environ.get("SEEDS", 20))):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)
    q, k = F.normalize(rnd(B, 1, H, D), dim=-1), F.normalize(rnd(B, 1, H, D), dim=-1)
    v, beta = rnd(B, 1, H, D), torch.sigmoid(rnd(B, 1, H))
    g = torch.where(torch.rand(B, 1, H, D, generator=gen) < 0.5, -1000.0, 0.0)
    S0 = rnd(B, H, D, D)
    do, dS = rnd(B, 1, H, D).double(), rnd(B, H, D, D).double()
    x = dict(q=q, k=k, v=v, beta=beta, g=g)
    xb = {n: t.to(bf).requires_grad_(n == "beta") for n, t in x.items()}
    o, ht = kernels.delta_rule_triton(**xb, initial_state=S0, output_final_state=True)
    db = torch.autograd.grad((o.double() * do).sum() + (ht.double() * dS).sum(), xb["beta"])[0]
    xr = {n: t.to(bf).double().requires_grad_(n == "beta") for n, t in x.items()}
    ro, rS = kernels.delta_rule_recurrent(**xr, initial_state=S0.double(), output_final_state=True)
    rdb = torch.autograd.grad((ro * do).sum() + (rS * dS).sum(), xr["beta"])[0]
    # the closed form at T = 1: dβ = a · u with a = dS1^T k, u = v - (Diag(α) S0)^T k, dS1 = s q do^T + dS
    qd, kd, vd = (xr[n].detach()[:, 0] for n in ("q", "k", "v"))
    al = torch.exp(xr["g"].detach()[:, 0])
    St = al[..., None] * S0.double()
    u = vd - torch.einsum("bhkv,bhk->bhv", St, kd)
    dS1 = D ** -0.5 * torch.einsum("bhk,bhv->bhkv", qd, do[:, 0]) + dS
    a = torch.einsum("bhkv,bhk->bhv", dS1, kd)
    closed = (a * u).sum(-1)
    emul = (a.to(bf).double() * u.to(bf).double()).sum(-1)
    cond = ((a * u).abs().sum(-1) / closed.abs())
    err = (db[:, 0].double() - rdb[:, 0]).abs().flatten()
    scale = (a * u).abs().sum(-1).flatten()
    trunc = lambda x: (x.float().view(torch.int32) & -65536).view(torch.float32).double()  # the interpreter's cast
    ea = ((trunc(a) * u).sum(-1) - closed).abs().flatten()
    eu = ((a * trunc(u)).sum(-1) - closed).abs().flatten()
    for e, r, sc, x, y in zip(err.tolist(), rdb[:, 0].flatten().tolist(), scale.tolist(), ea.tolist(), eu.tolist()):
        print(f"elem rel {e / abs(r):.2e} err/Σ|terms| {e / sc:.2e} cond {sc / abs(r):.1f} "
              f"emulated: X truncated {x / abs(r):.2e} u truncated {y / abs(r):.2e}")
    print(f"seed {seed}: dβ kernel {rms(db[:, 0], rdb[:, 0]):.1e}  closed-form check {rms(closed, rdb[:, 0]):.0e}  "
          f"bf16 operands {rms(emul, closed):.1e}  cond (Σ|a_j u_j| / |a·u|) {[round(c, 1) for c in cond.flatten().tolist()]}",
          flush=True)
