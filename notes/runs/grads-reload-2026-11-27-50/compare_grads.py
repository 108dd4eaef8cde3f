"""Session 50: KDA's _grads_bwd_kernel before and after its Gram backward reads dP, dL as pair tiles from memory
(run on a GPU from the repository root, after `git show <before>:kernels.py > /tmp/kernels-before/kernels.py`):

    python notes/runs/grads-reload-2026-11-27-50/compare_grads.py /tmp/kernels-before [B,T,H,D ...]

Each variant ('before': the given directory's kernels.py, 'after': the repository's) runs in its own process (both
register the same custom ops); all compile side by side first (Triton's disk cache), then each is timed alone: the
kernels' own CUDA time per call from torch.profiler over 5 forward+backward passes, for bench.py's gate ('given':
logsigmoid(randn)/16) and the model's (formed in the kernels from u with model.KDA's initial A_log, dt_bias). The
child is session 49's ablate_grads.py child, with the outputs' checksum printed so that the two can be compared."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.getcwd()
BEFORE = sys.argv[1]
SHAPES = sys.argv[2:] or ["8,4096,16,128", "8,4096,16,64", "32,1024,6,128"]

CHILD = r'''
import math, sys, torch, torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
import kernels
assert kernels.__file__.startswith(sys.argv[1]), kernels.__file__
from torch.profiler import profile, ProfilerActivity
B, T, H, D = map(int, sys.argv[2].split(","))
gate = sys.argv[3]
g = torch.Generator(device="cuda").manual_seed(0)
rnd = lambda *s: torch.randn(*s, device="cuda", generator=g)
q = F.normalize(rnd(B, T, H, D), dim=-1).bfloat16().requires_grad_()
k = F.normalize(rnd(B, T, H, D), dim=-1).bfloat16().requires_grad_()
v = rnd(B, T, H, D).bfloat16().requires_grad_()
beta = torch.sigmoid(rnd(B, T, H)).bfloat16().requires_grad_()
if gate == "given":
    u = (F.logsigmoid(rnd(B, T, H, D)) / 16).requires_grad_()
    kw = {}
else:
    u = rnd(B, T, H, D).bfloat16().requires_grad_()
    dt = torch.exp(torch.rand(H * D, device="cuda", generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    kw = dict(A_log=torch.log(1 + 15 * torch.rand(H, device="cuda", generator=g)).requires_grad_(),
              dt_bias=(dt + torch.log(-torch.expm1(-dt))).requires_grad_())
do = rnd(B, T, H, D).bfloat16()
def step():
    o = kernels.delta_rule(q, k, v, beta, u, **kw)[0]
    return torch.autograd.grad(o, [q, k, v, beta, u] + list(kw.values()), do)
for _ in range(1 if len(sys.argv) > 4 else 3):
    grads = step()
torch.cuda.synchronize()
if len(sys.argv) > 4:
    sys.exit(0)
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
times = {}
for e in p.key_averages():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        times[e.key] = e.device_time_total / 1e3 / 5
gb = sum(t for n, t in times.items() if n.startswith("_grads_bwd_kernel"))
total = sum(times.values())
sums = " ".join(f"{x.float().abs().sum().item():.6g}" for x in grads)
print(f"RESULT _grads_bwd {gb:.3f} ms, every kernel of fwd+bwd {total:.3f} ms; |grad| sums {sums}")
'''

variants = {"before": BEFORE, "after": ROOT}
cases = [(shape, gate, name) for shape in SHAPES for gate in ("given", "model") for name in variants]
with ThreadPoolExecutor(8) as pool:
    list(pool.map(lambda c: subprocess.run([sys.executable, "-c", CHILD, variants[c[2]], c[0], c[1], "warm"],
                                           capture_output=True), cases))
for shape, gate, name in cases:
    p = subprocess.run([sys.executable, "-c", CHILD, variants[name], shape, gate], capture_output=True, text=True)
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")]
    print(f"{shape} gate={gate:5s} {name:6s}: " + (line[0][7:] if line else "FAILED " +
                                                   (p.stderr.strip().splitlines() or ["?"])[-1][:150]), flush=True)
