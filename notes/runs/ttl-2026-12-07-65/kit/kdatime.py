# KDA delta_rule forward+backward at the 124M hybrid's shape with the kernels.py in DIR (one process per version:
# two modules in one process share their torch custom ops, so the first one's kernels run for both)
# usage: python .gpu/kdatime.py DIR LABEL
import sys, torch
sys.path[:0] = [sys.argv[1], '.']
import kernels
from model import init_decay_rates
import os; assert os.path.dirname(os.path.abspath(kernels.__file__)) == os.path.abspath(sys.argv[1]), kernels.__file__
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
u = 0.5 * mk(B, T, H, D)
strong = float(os.environ.get('STRONG', 0))  # every 8th key channel's log-decay near -STRONG (a trained gate's fastest)
if strong:  # g = -exp(A_log) softplus(u + dt_bias) = -STRONG: u = softplus^-1(STRONG / exp(A_log)) - dt_bias
    y = (strong / A_log.exp())[:, None].expand(H, D)[:, ::8]
    u[..., ::8] = y + torch.log(-torch.expm1(-y)) - dt_bias[:, ::8]
u = u.to(dt).requires_grad_()
do = mk(B, T, H, D).to(dt)
def step():
    o, _ = kernels.delta_rule(q, k, v, beta, u, A_log=A_log, dt_bias=dt_bias, path='triton')
    o.backward(do)
for _ in range(5): step()
ms = []
for _ in range(5):
    e = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    torch.cuda.synchronize(); e[0].record()
    for _ in range(10): step()
    e[1].record(); torch.cuda.synchronize()
    ms.append(e[0].elapsed_time(e[1]) / 10)
print(f"{sys.argv[2]}: KDA fwd+bwd B8 T4096 H6 D128 bf16, STRONG={strong:g}, min of 5 x 10 calls: {min(ms):.3f} ms ({' '.join(f'{x:.3f}' for x in ms)})")
