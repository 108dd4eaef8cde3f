"""Session 50: KDA's _grads_bwd_kernel before and after its Gram backward reads dP, dL as pair tiles from memory
(run on a GPU from the repository root, after `git show <before>:kernels.py > /tmp/kernels-before/kernels.py`):

    python notes/runs/grads-reload-2026-11-27-50/compare_grads.py /tmp/kernels-before [B,T,H,D ...]

Each variant ('before': the given directory's kernels.py, 'after': the repository's) runs in its own process (both
register the same custom ops); all compile side by side first (Triton's disk cache), then each is timed alone: the
kernels' own CUDA time per call from torch.profiler over 5 forward+backward passes, for bench.py's gate ('given':
logsigmoid(randn)/16) and the model's (formed in the kernels from u with model.KDA's initial A_log, dt_bias). The
child is session 49's ablate_grads.py child (it prints the gradients' checksums, so that the two can be compared)."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.getcwd()
BEFORE = sys.argv[1]
SHAPES = sys.argv[2:] or ["8,4096,16,128", "8,4096,16,64", "32,1024,6,128"]

sys.path.insert(0, os.path.join(ROOT, "notes", "runs", "grads-ablation-2026-11-26-49"))
from ablate_grads import CHILD  # noqa: E402 (session 49's child: one variant's times and its gradients' checksums)

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
