"""Where a train.py step's time goes, without changing train.py: run it under torch.profiler.

    torchrun --standalone --nproc_per_node=2 prof_train.py config/kda_hybrid.py --fsdp=True ...   (train.py's args)

(PROF_TRAIN=path/to/a/copy/of/train.py, relative to the repository root, profiles that copy instead.)

The profiler steps at every optimizer step (a global post-hook), so steps PROF_AFTER .. PROF_AFTER + PROF_STEPS - 1
are recorded whole. Each rank prints, per recorded step: its wall time, the GPU's busy time (the union of all kernel
intervals on every stream), the time in NCCL kernels and outside them, the GPU's idle time, kernels launched; then
the host's ops by self time (FSDP's record_function ranges included) and, on rank 0 with PROF_TRACE=path, a chrome
trace (gzipped). On CPU (no CUDA) only the host table."""
import gzip
import os
import runpy
import shutil
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

AFTER, STEPS = int(os.environ.get("PROF_AFTER", 20)), int(os.environ.get("PROF_STEPS", 5))
RANK = int(os.environ.get("RANK", 0))
cuda = torch.cuda.is_available()
marks = []  # perf_counter at each optimizer step's end


def union_us(intervals):
    """Total length of the union of [start, end) intervals (µs)."""
    total, end = 0.0, -float("inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def summarize(prof):
    lines = [f"== rank {RANK}: {STEPS} steps after step {AFTER}"]
    host_ms = [1e3 * (b - a) for a, b in zip(marks[AFTER:], marks[AFTER + 1:AFTER + 1 + STEPS])]
    lines.append("step wall ms (optimizer step to optimizer step): " + " ".join(f"{t:.1f}" for t in host_ms))
    if cuda:
        ev = [e for e in prof.profiler.kineto_results.events() if e.device_type() == torch.autograd.DeviceType.CUDA
              and e.duration_ns() > 0]
        kern = [(e.start_ns() / 1e3, (e.start_ns() + e.duration_ns()) / 1e3, e.name()) for e in ev]
        nccl = [(s, e) for s, e, n in kern if "nccl" in n.lower()]
        other = [(s, e) for s, e, n in kern if "nccl" not in n.lower()]
        span = max(e for _, e, _ in kern) - min(s for s, _, _ in kern)
        busy, busy_c, busy_n = union_us([(s, e) for s, e, _ in kern]), union_us(other), union_us(nccl)
        per = lambda x: x / 1e3 / STEPS
        lines.append(f"GPU per step (ms): span {per(span):.1f}, busy {per(busy):.1f}, compute (non-NCCL) "
                     f"{per(busy_c):.1f}, NCCL {per(busy_n):.1f} (overlapping compute {per(busy_c + busy_n - busy):.1f}), "
                     f"idle {per(span - busy):.1f}; kernels {len(kern) / STEPS:.0f}, NCCL kernels {len(nccl) / STEPS:.0f}")
        byname = {}
        for s, e, n in kern:
            if "nccl" in n.lower():
                k = n[:60]
                byname[k] = byname.get(k, 0) + (e - s)
        for k, v in sorted(byname.items(), key=lambda x: -x[1]):
            lines.append(f"  {per(v):8.2f} ms/step  {k}")
    lines.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    fsdp = [a for a in prof.key_averages() if a.key.startswith("FSDP") or "DistributedDataParallel" in a.key
            or a.key.startswith("torch/") or "CompiledFunction" in a.key or a.key.startswith("Torch-Compiled")]
    for a in sorted(fsdp, key=lambda a: -a.cpu_time_total)[:20]:
        lines.append(f"  host {a.cpu_time_total / 1e3 / STEPS:8.2f} ms/step ({a.count / STEPS:.0f} calls)  {a.key}")
    text = "\n".join(lines)
    out = os.environ.get("PROF_OUT")
    if out:
        with open(f"{out}.rank{RANK}.txt", "w") as f:
            f.write(text + "\n")
    if RANK == 0:
        print(text, flush=True)
        trace = os.environ.get("PROF_TRACE")
        if trace:
            prof.export_chrome_trace(trace)
            with open(trace, "rb") as f, gzip.open(trace + ".gz", "wb") as g:
                shutil.copyfileobj(f, g)
            os.remove(trace)


prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []),
               schedule=schedule(wait=AFTER, warmup=1, active=STEPS, repeat=1), on_trace_ready=summarize)


def on_step(optimizer, args, kwargs):
    marks.append(time.perf_counter())
    prof.step()


from torch.optim.optimizer import register_optimizer_step_post_hook
register_optimizer_step_post_hook(on_step)
prof.start()
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here) if os.path.exists(os.path.join(os.path.dirname(here), "train.py")) else os.getcwd()
sys.argv = [os.path.join(root, os.environ.get("PROF_TRAIN", "train.py"))] + sys.argv[1:]  # PROF_TRAIN: another copy
sys.path.insert(0, root)
runpy.run_path(sys.argv[0], run_name="__main__")
prof.stop()
