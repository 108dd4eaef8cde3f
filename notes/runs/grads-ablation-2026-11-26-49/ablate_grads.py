"""Where KDA's _grads_bwd_kernel spends its time now (session 49's plan; run on a GPU from the repository root):

    python notes/runs/grads-ablation-2026-11-26-49/ablate_grads.py [B,T,H,D ...]

Each variant is a copy of kernels.py with one part of _grads_bwd_kernel cut out, run in its own process (the copies
register the same custom ops): 'whole' (unchanged), 'no_vloop' (the value-side loop: dqg, dkd, Y, sds stay zero),
'no_grams' (the Gram backward, _grams_bwd), 'neither'. Results are wrong by construction; only the time matters: the
kernel's own CUDA time per call from torch.profiler over 5 forward+backward passes, for two gates: 'given'
(logsigmoid(randn)/16 as bench.py's table: one reference per chunk, S = 64, everywhere) and 'model' (the gate formed
in the kernels from u with model.KDA's initial A_log, dt_bias: S = 16 in part of the tiles)."""
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.getcwd()
SHAPES = sys.argv[1:] or ["8,4096,16,128", "32,1024,6,128"]


def variant_source(src, cut):
    a = src.index("def _grads_bwd_kernel(")
    b = src.index("# ---- 4.5", a)
    body = src[a:b]
    if cut in ("no_vloop", "neither"):
        body, n = re.subn(r"for iv in range\(DV // BV\):", "for iv in range(0):", body)
        assert n == 1, "the value loop not found"
    if cut in ("no_grams", "neither"):
        body, n = re.subn(r"\n    dq, dk, dG, dbeta = _grams_bwd\([^)]*\)", "\n", body)
        assert n == 1, "the _grams_bwd call not found"
    return src[:a] + body + src[b:]


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
if len(sys.argv) > 4:  # the warm phase: compiled into Triton's disk cache, not timed
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
sums = " ".join(f"{x.float().abs().sum().item():.6g}" for x in grads)  # session 50: to compare two copies' outputs
print(f"RESULT _grads_bwd {gb:.3f} ms, every kernel of fwd+bwd {total:.3f} ms; |grad| sums {sums}")
'''

if __name__ == "__main__":  # (session 50: its child is imported by compare_grads.py)
    src = open(os.path.join(ROOT, "kernels.py")).read()
    tmp = tempfile.mkdtemp(prefix="ablate-grads-")
    for cut in ("whole", "no_vloop", "no_grams", "neither"):
        d = os.path.join(tmp, cut)
        os.makedirs(d)
        with open(os.path.join(d, "kernels.py"), "w") as f:
            f.write(variant_source(src, cut))
    cases = [(shape, gate, cut) for shape in SHAPES for gate in ("given", "model")
             for cut in ("whole", "no_vloop", "no_grams", "neither")]
    with ThreadPoolExecutor(8) as pool:  # compiled side by side (session 50), then timed one at a time
        list(pool.map(lambda c: subprocess.run([sys.executable, "-c", CHILD, os.path.join(tmp, c[2]), c[0], c[1], "warm"],
                                               capture_output=True), cases))
    for shape in SHAPES:
        for gate in ("given", "model"):
            for cut in ("whole", "no_vloop", "no_grams", "neither"):
                p = subprocess.run([sys.executable, "-c", CHILD, os.path.join(tmp, cut), shape, gate],
                                   capture_output=True, text=True)
                line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")]
                print(f"{shape} gate={gate:5s} {cut:8s}: " + (line[0][7:] if line else "FAILED " +
                                                               (p.stderr.strip().splitlines() or ["?"])[-1][:150]),
                      flush=True)
