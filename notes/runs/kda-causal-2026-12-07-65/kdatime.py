# KDA delta_rule forward+backward at the 124M hybrid's shape: kernels.py (new) against .gpu/kernels_old.py, one process
import importlib.util, sys, torch
sys.path.insert(0, '.')
import kernels as new
from model import init_decay_rates
spec = importlib.util.spec_from_file_location('kernels_old', '.gpu/kernels_old.py')
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
torch.manual_seed(0)
B, T, H, D = 8, 4096, 6, 128
dev, dt = 'cuda', torch.bfloat16
A_log, _ = init_decay_rates(H); _, dt_bias = init_decay_rates(H * D)
A_log, dt_bias = A_log.detach().to(dev), dt_bias.detach().view(H, D).to(dev)
mk = lambda *s: torch.randn(*s, device=dev)
q = torch.nn.functional.normalize(mk(B, T, H, D), dim=-1).to(dt).requires_grad_()
k = torch.nn.functional.normalize(mk(B, T, H, D), dim=-1).to(dt).requires_grad_()
v = mk(B, T, H, D).to(dt).requires_grad_()
beta = torch.sigmoid(mk(B, T, H)).to(dt).requires_grad_()
u = (0.5 * mk(B, T, H, D)).to(dt).requires_grad_()
do = mk(B, T, H, D).to(dt)
def step(m):
    o, _ = m.delta_rule(q, k, v, beta, u, A_log=A_log, dt_bias=dt_bias, path='triton')
    o.backward(do)
    return o
outs = {}
for name, m in (('old', old), ('new', new)):
    for t in (q, k, v, beta, u): t.grad = None
    outs[name] = (step(m).float(), [t.grad.float().clone() for t in (q, k, v, beta, u)])
o0, g0 = outs['old']; o1, g1 = outs['new']
rel = lambda a, b: ((a - b).norm() / b.norm()).item()
print(f"new vs old: out rel {rel(o1, o0):.2e}, grads rel " + ", ".join(f"{rel(a, b):.2e}" for a, b in zip(g1, g0)))
res = {'old': [], 'new': []}
for rnd in range(3):
    for name, m in (('old', old), ('new', new)):
        for _ in range(3): step(m)
        e = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        torch.cuda.synchronize(); e[0].record()
        for _ in range(10): step(m)
        e[1].record(); torch.cuda.synchronize()
        res[name].append(e[0].elapsed_time(e[1]) / 10)
print("KDA fwd+bwd B8 T4096 H6 D128 bf16 ms (3 rounds): " + "; ".join(f"{n} " + " ".join(f"{x:.3f}" for x in r) for n, r in res.items())
      + f"; new/old (min) {min(res['new']) / min(res['old']):.3f}")
