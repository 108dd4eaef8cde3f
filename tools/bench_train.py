"""
Whole-model training benchmarks of the 124M models, per mixer: training speed, memory and GPU time by kernel
category per context (generation: tools/bench_decode.py).

    python tools/bench_train.py        # training, every mixer x T = 1024, 4096, 8192, 16384
    python tools/bench_train.py --mixers softmax 'kda*3,softmax' kda --contexts 4096 --jobs 2 --json train.json
    python tools/bench_train.py --tiny --mixers softmax kda   # CPU smoke run: 4 layers x 64, T = 64 and 128,
                                                               # 256 tokens per step (the CPU defaults)
    python tools/bench_train.py --documents --contexts 4096 --json docs.json   # each mixer also with documents=True
    python tools/bench_train.py --contexts 1024,4096 --tuning default recompute   # each linear mixer under each of
                                                               # TUNING_PRESETS (settings of kernels.TUNING)
    python tools/bench_train.py --contexts 4096 --compile_mode default reduce-overhead   # rows per compile mode

Training: config/owt.py's model with that mixer (config/kda_hybrid.py's for 'kda*3,softmax'), softmax always
included and first, --tokens per step (batch = tokens // T), trained as train.py trains on CUDA: torch.compile, bf16
autocast, TF32, clip_grad_norm_ at 1.0, fused AdamW skipping a non-finite step, the step's loss and gradient norm
read a step late (no sync at the step's boundary); one micro-step per optimizer step, random tokens. Each (mixer, T)
cell runs in its own process: first all of them compile, --jobs at a time (the Inductor and Triton caches on disk
are shared), then each is measured alone. Compiling dominates a run: one context per command (--contexts 4096)
keeps it short. Columns: ms/step = median wall time of a step between CUDA events, tokens/s = B*T over it,
× softmax = tokens/s over softmax's at that T, MFU = model.flops_per_token(T) × tokens/s over the GPU's bf16 peak,
peak MiB = max_memory_allocated over the timed steps; then GPU ms per step by kernel category (torch.profiler over 3
more steps; the rules are kernel_category's), whose sum is the GPU's busy time and can be below ms/step; idle
(timed) = ms/step less that sum, the GPU's wait in an unprofiled step (the profiled idle is larger where the
profiler's per-launch cost puts the host behind the GPU: KDA, GDN); outside mixer+attn = that sum less the
linear-mixer and attention kernels, and ÷ softmax's = it over the softmax row's at that T (the target: <= 1.15 at
T=4096). Under the table: each cell's top 5 unfused and fused-elementwise kernels, and which path kernels.py took.
On CPU, a smoke run: eager fp32, no profile, no warm phase (nothing compiles), the cells --jobs at a time on one
thread each, and small defaults (CPU_CONTEXTS, CPU_TOKENS; also with --tiny).
--documents: every mixer also runs with GPTConfig.documents on (row '<mixer> +docs'; its tokens hold an EOT at
random positions, one in DOC_LEN, about OpenWebText's mean document), and '÷ off' = its tokens/s over the same
mixer's without.
"""

import argparse
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)  # its modules
import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import torch
import triton

import kernels
from benchlib import TUNING_PRESETS, first_line, row, tuned

TRAIN_CONFIGS = {"kda*3,softmax": "kda_hybrid"}  # mixer pattern -> config/<file>.py when not config/owt.py (run with
HYBRID = "kda*3,softmax"                          # that mixer); the default mixers: every MIXERS entry and the hybrid
TRAIN_CONTEXTS = "1024,4096,8192,16384"  # the default contexts on CUDA
TRAIN_TOKENS = 32768  # the default tokens per step on CUDA (batch = tokens // T)
CPU_CONTEXTS, CPU_TOKENS = "64,128", 256  # the defaults with --tiny or on CPU: a smoke run (8 mixers x 2 contexts,
                                          # a process each, two at a time: with --tiny about a minute of CPU time in
                                          # all, most of it importing torch; half that on 2 idle cores)
CATEGORIES = ("linear mixer", "attention", "matmul", "conv", "fused elem", "unfused", "optimizer")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # train.py's
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the modes that replay CUDA graphs
TRAIN_COMPILE_MODE = "default"  # train.py's default on CUDA
WARM_STEPS, WARMUP_STEPS, PROFILE_STEPS = 2, 3, 3  # steps of the --warm run; before the timing; under the profiler
DOC_LEN = 1100  # --documents: mean tokens per document (OpenWebText: ~9.0B GPT-2 tokens in ~8.0M documents)
# the Triton functions of kernels.py (KernelInterface: also what triton.jit returns under TRITON_INTERPRET=1)
MIXER_KERNELS = frozenset(n for n, o in vars(kernels).items() if isinstance(o, triton.runtime.jit.KernelInterface))


def kernel_category(name, mixer_kernels=MIXER_KERNELS):
    """The category of one CUDA profiler event name (a kernel, memcpy or memset); the first rule that matches wins,
    case-insensitively (the order matters: Inductor names its kernels after the ops they fuse, 'short_conv_bwd'
    included; cuDNN's sdpa kernels also hold 'sm90_', fmha kernels 'cutlass'):
      attention     'flex_attention' (FlexAttention's kernels, which Inductor generates: --documents)
      fused elem    Inductor's generated Triton kernels: 'triton_' (triton_poi_, triton_red_, triton_per_)
      conv          our short-conv Triton kernels (the name holds 'short_conv')
      linear mixer  the other Triton kernels of kernels.py: a name starting with one of mixer_kernels (the function
                    names; all start with '_', which no ATen, cuBLAS or Inductor kernel does)
      attention     'flash', 'fmha', 'attention', 'sdpa', and the backward's helpers 'dot_do_o' and 'convert_dq'
                    (FlashAttention, mem-efficient, cuDNN SDPA with its cudnn::fusion:: helpers)
      conv          'conv' (not 'convert'), 'fprop', 'dgrad', 'wgrad': ATen's conv_depthwise2d_*, cuDNN convolutions
      optimizer     'multi_tensor_apply' (fused AdamW, and clip_grad_norm_'s _foreach_norm / _foreach_mul_),
                    'adam', 'lpnorm' (the foreach norm's cleanup); the few scalar ops between them land in unfused
      matmul        'gemm', 'gemv', 'cutlass', 'nvjet', 'xmma', 'cublas', 'sm80_', 'sm90_', 'splitkreduce'
      unfused       everything else: ATen elementwise / reduce / copy / fill / cat / index kernels, memcpy, memset"""
    low = name.lower()
    if "flex_attention" in low:
        return "attention"
    if low.startswith("triton_"):
        return "fused elem"
    if "short_conv" in low:
        return "conv"
    if name.startswith(tuple(mixer_kernels)):
        return "linear mixer"
    for category, pattern in (("attention", r"flash|fmha|attention|sdpa|dot_do_o|convert_dq"),
                              ("conv", r"conv(?!ert)|fprop|dgrad|wgrad"),
                              ("optimizer", r"multi_tensor_apply|adam|lpnorm"),
                              ("matmul", r"gemm|gemv|cutlass|nvjet|xmma|cublas|sm80_|sm90_|splitkreduce")):
        if re.search(pattern, low):
            return category
    return "unfused"


def short_kernel_name(name, n=80):
    """A profiler name without 'void ', 'at::native::' and '(anonymous namespace)::', cut to n characters."""
    s = re.sub(r"^void |at::native::|\(anonymous namespace\)::", "", name)
    return s if len(s) <= n else s[:n - 3] + "..."


def train_model_config(mixer, T, tiny=False, documents=False):
    """GPTConfig of the 124M config file for this mixer pattern (TRAIN_CONFIGS; a pattern not there uses
    config/owt.py), run with that mixer (its rules read it: head_dim), block_size T, vocab 50304 (train.py's default: GPT-2's 50257 padded to a multiple of 64).
    tiny: 4 layers x 64 (the hybrid's pattern tiles 4), vocab 256 (EOT 0), for a CPU smoke run. documents: GPTConfig's."""
    import dataclasses
    from model import GPTConfig
    path = os.path.join(ROOT, "config", TRAIN_CONFIGS.get(mixer, "owt") + ".py")
    g = {"mixer": mixer, "__file__": path}  # what train.py's configurator gives a config file
    with open(path) as f:
        exec(f.read(), g)
    args = {f.name: g[f.name] for f in dataclasses.fields(GPTConfig) if f.name in g}
    args.update(mixer=mixer, block_size=T, vocab_size=50304, documents=documents)
    if tiny:
        args.update(n_layer=4, n_head=2, n_embd=64, head_dim=32, d_state=16, vocab_size=256, eot_token=0)
    return GPTConfig(**args)


def train_cell(mixer, T, tokens, steps, device, tiny=False, warm=False, documents=False, mode="default",
               tuning="default"):
    """One (mixer, T) cell, in its own process: build the model, torch.compile it on CUDA (eager on CPU), then train
    on fixed random tokens with train.py's step (bf16 autocast and TF32 on CUDA, fp32 on CPU; forward, backward,
    clip_grad_norm_ at 1.0, fused AdamW skipping a non-finite step, zero_grad, then the previous step's loss and
    gradient norm read and checked: train.py reads them a step late, so that no step waits for the host),
    one micro-step per optimizer step. warm: WARM_STEPS steps and return (fills the compile caches). Otherwise
    WARMUP_STEPS steps, then `steps` timed ones (CUDA events around each step; the median), peak memory over them,
    then PROFILE_STEPS under torch.profiler (CUDA only): GPU ms per step by kernel_category. -> dict for the JSON
    line. documents: GPTConfig.documents on, and an EOT at random positions (one in DOC_LEN) of the tokens. mode:
    torch.compile's mode; under CUDA graphs ('reduce-overhead', 'max-autotune') the gradients stay allocated between
    steps, as train.py keeps them. tuning: a TUNING_PRESETS name, applied to kernels.TUNING for this process."""
    from model import GPT
    cuda = device.startswith("cuda")
    B = max(1, tokens // T)
    tuned(TUNING_PRESETS[tuning]).__enter__()  # (this process only)
    out = dict(mixer=mixer, T=T, B=B, documents=documents, mode=mode, tuning=tuning)
    torch.backends.cuda.matmul.allow_tf32 = True  # as train.py
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    raw = GPT(train_model_config(mixer, T, tiny, documents)).to(device)
    out["params"] = raw.get_num_params()
    optimizer = raw.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda" if cuda else "cpu")  # fused AdamW on CUDA
    if warm:  # compile only: Inductor's choice among its configs of a generated kernel is timed at the first call and
        # kept on disk, and timed beside the other warm processes it was noisy (one RMSNorm kernel several times
        # slower in one run than in another: notes/perf.md (o)); the measure phase, alone, times and keeps it
        torch._inductor.config.autotune_local_cache = False  # (outside the compile caches' keys: they still hit)
    model = torch.compile(raw, mode=mode) if cuda else raw
    graphs = cuda and mode in CUDA_GRAPH_MODES
    if graphs:  # train.py's rule: a graph's outputs are overwritten by its next replay, so .grad must not be one
        for p in raw.parameters():
            p.grad = torch.zeros_like(p)
    ctx = torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16) if cuda else nullcontext()
    seq = torch.randint(0, raw.config.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(0)).to(device)
    if documents:  # documents of DOC_LEN tokens on average (the eot_token the data would hold)
        eot = torch.rand(B, T + 1, generator=torch.Generator().manual_seed(1)) < 1 / DOC_LEN
        seq = seq.masked_fill(eot.to(device), raw.config.eot_token)
    X, Y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()  # as the loader's; the loss values do not matter

    pending = []  # the last step's (numbers on their way to the host, event): train.py reads them a step late

    def check():
        host, done = pending.pop()
        if done is not None:
            done.synchronize()
        lossf, normf = host.tolist()
        if not (math.isfinite(lossf) and math.isfinite(normf)):
            raise RuntimeError(f"loss {lossf:.4g}, gradient norm {normf:.4g}")

    def step():
        with ctx:
            _, loss = model(X, Y)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
        numbers = torch.stack([loss.detach().float(), grad_norm.float()])
        optimizer.found_inf = (~torch.isfinite(numbers)).any().float()  # fused AdamW skips a non-finite step
        optimizer.step()
        optimizer.zero_grad(set_to_none=not graphs)
        if cuda:  # train.py's late read: the numbers land on the host when the GPU gets there; the host reads the
            host = torch.empty(2, pin_memory=True)  # previous step's now, with this one's kernels queued behind it
            host.copy_(numbers, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            numbers = (host, done)
        else:
            numbers = (numbers, None)
        if pending:
            check()
        pending.append(numbers)

    def sync():
        if cuda:
            torch.cuda.synchronize()
        if pending:
            check()
    t0 = time.perf_counter()
    for _ in range(WARM_STEPS if warm else WARMUP_STEPS + graphs):  # (one more: the graphs are recorded at the 2nd)
        step()
    sync()
    if warm:
        return dict(out, warm_s=time.perf_counter() - t0)
    times = []  # ms per step
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for start, end in events:
            start.record()
            step()
            end.record()
        sync()
        times = [start.elapsed_time(end) for start, end in events]
        # under CUDA graphs the graphs' memory pools are reserved, not allocated, while the graphs replay
        out["peak_mib"] = (torch.cuda.max_memory_reserved() if graphs else torch.cuda.max_memory_allocated()) / 2**20
        out["device_name"] = torch.cuda.get_device_name()
    else:
        for _ in range(steps):
            t = time.perf_counter()
            step()
            times.append((time.perf_counter() - t) * 1000)
        out["device_name"] = "cpu"
    out["ms"] = statistics.median(times)
    out["step_ms"] = times  # every timed step (the JSON file): a slow process shows apart from a slow step
    out["tokens_per_s"] = B * T / out["ms"] * 1000
    from model import gpu_peak_flops
    peak = gpu_peak_flops(out["device_name"]) if cuda else None
    out["mfu"] = raw.flops_per_token(T) * out["tokens_per_s"] / peak if peak else None
    if cuda:
        from torch.profiler import ProfilerActivity, profile
        first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            first.record()
            for _ in range(PROFILE_STEPS):
                step()
            last.record()
            sync()
        per_kernel = {}  # name -> GPU ms per step
        spans = []  # (start, end) of every kernel, µs
        for e in prof.events():
            if e.device_type.name == "CUDA":
                per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.device_time / PROFILE_STEPS / 1000
                spans.append((e.time_range.start, e.time_range.end))
        out["gpu_ms"] = sum(per_kernel.values())
        # GPU idle per step: the profiled steps' wall time (CUDA events) less the time some kernel ran (the union of
        # the kernels' spans, so that kernels running side by side count once)
        busy, end = 0.0, float("-inf")
        for a, b in sorted(spans):
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
        wall = first.elapsed_time(last)
        out["profiled_ms"] = wall / PROFILE_STEPS
        out["idle_ms"] = max(0.0, wall - busy / 1000) / PROFILE_STEPS
        # the same against the timed steps' median: the profiler's tracing slows the host (more idle in the profiled
        # steps) and the kernels (more busy time), so the two bracket the truth (notes/perf.md (x))
        out["idle_timed_ms"] = out["ms"] - busy / 1000 / PROFILE_STEPS
        out["categories"] = {c: 0.0 for c in CATEGORIES}
        for name, ms in per_kernel.items():
            out["categories"][kernel_category(name)] += ms
        ranked = [(short_kernel_name(n, 120), kernel_category(n), ms)
                  for n, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1])]
        out["top"] = {c: [(n, ms) for n, k, ms in ranked if k == c][:5] for c in ("unfused", "fused elem")}
        out["kernels"] = ranked  # every kernel, for the JSON file
    return out


def run_cell(mixer, T, args, warm, documents=False, mode="default", tuning="default"):
    """Run train_cell in a fresh `python tools/bench_train.py --train_cell` process -> its dict, or {'error': first line}.
    Also keeps the 'kernels: ...' lines (which path each mixer took) of its output. On CPU a cell runs on one thread
    (unless OMP_NUM_THREADS says otherwise): the cells run side by side there, and a small model's OpenMP threads
    wait on each other more than they compute (many times slower on a busy machine)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--train_cell", mixer, str(T), "--tokens", str(args.tokens),
           "--steps", str(args.steps), "--device", args.device] + ["--tiny"] * args.tiny + ["--warm"] * warm + [
           "--documents"] * documents + ["--compile_mode", mode, "--tuning", tuning]
    one_thread = args.device == "cpu" and "OMP_NUM_THREADS" not in os.environ
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1") if one_thread
                       else None)
    lines = p.stdout.splitlines()
    cell = next((json.loads(s[5:]) for s in reversed(lines) if s.startswith("CELL ")), None)
    if cell is None:  # died without a word (a crash, killed for memory): the last line it wrote to stderr
        err = [s for s in p.stderr.splitlines() if s.strip()]
        cell = dict(mixer=mixer, T=T, B=max(1, args.tokens // T), documents=documents, mode=mode, tuning=tuning,
                    error=err[-1] if err else f"exit code {p.returncode}")
    cell["paths"] = sorted({s for s in lines if s.startswith("kernels: ")})
    return cell


def train_bench(args, mixers, contexts):
    """Phase 1 (warm): every cell once, args.jobs processes at a time, to compile (the Inductor and Triton caches
    on disk are shared, so phase 2 compiles from them). A warm run that fails (e.g. out of memory while sharing
    the GPU) is measured anyway. Phase 2 (measure): each cell alone, one after the other. Then the table. On CPU,
    a smoke run: no phase 1 (the model runs eager: nothing compiles), and phase 2 args.jobs cells at a time."""
    mixers = ["softmax"] + [m for m in mixers if m != "softmax"]  # every row is a ratio to softmax at its T
    modes = args.compile_mode
    presets = args.tuning  # softmax (no linear-mixer kernels) runs under the first preset only
    cells = [(m, T, d, mode, p) for mode in modes for T in contexts for p in presets for m in mixers
             for d in ((False, True) if args.documents else (False,)) if m != "softmax" or p == presets[0]]
    label = lambda r: (r["mixer"] + (" +docs" if r.get("documents") else "")
                       + (f" [{r['mode']}]" if len(modes) > 1 else "")
                       + (f" [{r.get('tuning')}]" if len(presets) > 1 and r["mixer"] != "softmax" else ""))
    cuda = args.device.startswith("cuda")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        for w in pool.map(lambda c: run_cell(c[0], c[1], args, True, c[2], c[3], c[4]), cells if cuda else []):
            status = f"error: {w['error']}" if "error" in w else f"{WARM_STEPS} steps in {w['warm_s']:.0f} s, compiling included"
            print(f"warm {label(w)} T={w['T']} B={w['B']}: {status} ({time.perf_counter() - t0:.0f} s in)",
                  flush=True)
    results = []
    with ThreadPoolExecutor(1 if cuda else args.jobs) as pool:
        for r in pool.map(lambda c: run_cell(c[0], c[1], args, False, c[2], c[3], c[4]), cells):
            status = f"error: {r['error']}" if "error" in r else f"{r['ms']:.1f} ms/step, {r['tokens_per_s']:,.0f} tokens/s"
            print(f"measure {label(r)} T={r['T']} B={r['B']}: {status} ({time.perf_counter() - t0:.0f} s in)",
                  flush=True)
            results.append(r)

    def outside(r):  # GPU ms per step outside the linear-mixer and attention kernels
        c = r.get("categories")
        return r["gpu_ms"] - c["linear mixer"] - c["attention"] if c else None

    # every ratio is to the cell of the same context and compile mode
    soft = {(r["T"], r["mode"]): r for r in results
            if r["mixer"] == "softmax" and not r.get("documents") and "error" not in r}
    key = lambda r: (r["mixer"], r["T"], r["mode"], r.get("tuning"))
    off = {key(r): r for r in results if not r.get("documents") and "error" not in r}
    for r in results:
        s = soft.get((r["T"], r["mode"]))
        if r.get("documents") and "error" not in r and key(r) in off:
            r["x_off"] = r["tokens_per_s"] / off[key(r)]["tokens_per_s"]  # documents on ÷ off
        if "error" not in r and s:
            r["x_softmax"] = r["tokens_per_s"] / s["tokens_per_s"]
            if outside(r) is not None:
                r["outside_ms"] = outside(r)
                r["outside_vs_softmax"] = outside(r) / outside(s)
    device_name = next((r["device_name"] for r in results if "device_name" in r), args.device)
    print(f"\ndevice {device_name}, torch {torch.__version__}, triton {triton.__version__}")
    print("command: python " + " ".join(shlex.quote(a) for a in sys.argv))
    print(f"whole-model training, {args.tokens:,} tokens per step, median of {args.steps} steps, torch.compile mode "
          f"{' / '.join(modes)}, kernels.TUNING preset {' / '.join(presets)}"
          f"; categories: GPU ms per step from the kernels of {PROFILE_STEPS} profiled steps "
          f"(peak MiB: allocated; under CUDA graphs reserved, which holds the graphs' pools; ms/step: median wall time of a step; profiled idle: the profiled steps' wall time when no kernel ran, per step, and its share; idle (timed): the median step less the profiled kernels' busy time, and its share of the step; the profiler's per-launch cost inflates the first where the host runs close to the GPU, and can make the second negative)\n")
    f = lambda x, spec: "" if x is None else format(x, spec)
    docs = args.documents  # one more column: ÷ off
    print("| mixer | T (B) | tokens/s | × softmax | " + "÷ off | " * docs + "MFU | peak MiB | ms/step | "
          + " | ".join(CATEGORIES) + " | profiled idle ms | profiled idle % | idle ms (timed) | idle % (timed) | "
          "outside mixer+attn | ÷ softmax's |")
    print("|---" * (13 + docs + len(CATEGORIES)) + "|")
    for r in results:
        head = f"| {label(r)} | {r['T']} ({r['B']}) | "
        if "error" in r:
            print(head + f"error: {r['error'][:100]} |" + " |" * (10 + docs + len(CATEGORIES)))
            continue
        c = r.get("categories", {})
        print(head + " | ".join([f(r["tokens_per_s"], ",.0f"), f(r.get("x_softmax"), ".3f")]
                                + [f(r.get("x_off"), ".2f")] * docs
                                + [f(r["mfu"] and 100 * r["mfu"], ".1f") + ("%" if r["mfu"] else ""),
                                   f(r.get("peak_mib"), ",.0f"), f(r["ms"], ".1f")]
                                + [f(c.get(k), ".2f") for k in CATEGORIES]
                                + [f(r.get("idle_ms"), ".2f"), f(r.get("idle_ms") and 100 * r["idle_ms"] / r["profiled_ms"], ".1f"),
                                   f(r.get("idle_timed_ms"), ".2f"),
                                   f(100 * r["idle_timed_ms"] / r["ms"] if r.get("idle_timed_ms") is not None else None, ".1f"),
                                   f(r.get("outside_ms"), ".2f"), f(r.get("outside_vs_softmax"), ".2f")]) + " |")
    for r in results:
        for category, top in r.get("top", {}).items():
            print(f"\n{label(r)} T={r['T']}: top {category} kernels, ms/step")
            for name, ms in top:
                print(f"  {ms:7.3f}  {name[:80]}")
    paths = sorted({p for r in results for p in r["paths"]})
    if paths:
        print("\n" + "\n".join(paths))
    if not any("categories" in r for r in results):
        print("\n(no GPU-time categories: the profiler part runs on CUDA only)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=device_name, torch=torch.__version__, triton=triton.__version__,
                           command=sys.argv, tokens=args.tokens, steps=args.steps, compile_modes=modes, tuning=presets,
                           cells=results), fh, indent=1)
        print(f"\nwrote {args.json}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mixers", nargs="+", default=None,
                    help="mixer patterns, space-separated (a pattern may hold commas: 'kda*3,softmax'); default "
                         "model.MIXERS and the hybrid")
    ap.add_argument("--contexts", default="", help=f"context lengths (default {TRAIN_CONTEXTS}; with --tiny or on "
                    f"CPU {CPU_CONTEXTS})")
    ap.add_argument("--device", default="", help="'' = cuda if available, else cpu")
    ap.add_argument("--tokens", type=int, default=None, help=f"tokens per step; batch = tokens // T (default "
                    f"{TRAIN_TOKENS}; with --tiny or on CPU {CPU_TOKENS})")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per cell (the median is reported)")
    ap.add_argument("--jobs", type=int, default=2, help="cells compiled at once in the warm phase")
    ap.add_argument("--json", default="", help="also write the results to this JSON file")
    ap.add_argument("--tiny", action="store_true", help="a 4-layer x 64 model (CPU smoke run)")
    ap.add_argument("--documents", action="store_true",
                    help="every mixer also with documents=True (EOTs in its tokens): a row '+docs', ÷ off")
    ap.add_argument("--compile_mode", nargs="+", default=[TRAIN_COMPILE_MODE], choices=COMPILE_MODES,
                    help=f"torch.compile mode(s), each a set of rows (default {TRAIN_COMPILE_MODE}, train.py's on "
                         "CUDA)")
    ap.add_argument("--tuning", nargs="+", choices=tuple(TUNING_PRESETS), default=["default"],
                    help="settings of kernels.TUNING by name (TUNING_PRESETS): each linear mixer's rows under each")
    ap.add_argument("--train_cell", nargs=2, metavar=("MIXER", "T"), help=argparse.SUPPRESS)  # internal: one cell
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)  # internal: --train_cell's warm phase
    args = ap.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    small = args.tiny or device == "cpu"
    try:  # every pattern and context checked before any cell runs (a cell's own error lands in its table row)
        counts = [int(t) for t in (args.contexts or "1").split(",")] + [n for n in (args.tokens, args.steps) if n is not None]
        from model import parse_mixer_pattern
        for m in args.mixers or []:
            parse_mixer_pattern(m, 12)  # config/owt.py's 12 layers (4 with --tiny): both tiled by 1, 2, 3, 4
    except ValueError as e:  # (UserError is one)
        ap.error(str(e))
    if min(counts) < 1:
        ap.error(f"--contexts, --tokens and --steps must be >= 1, got {args.contexts}, {args.tokens}, {args.steps}")
    if args.tokens is None:
        args.tokens = CPU_TOKENS if small else TRAIN_TOKENS
    if args.train_cell:  # one cell, in its own process: one JSON line for the parent
        mixer, T = args.train_cell[0], int(args.train_cell[1])
        try:
            cell = train_cell(mixer, T, args.tokens, args.steps, device, args.tiny, args.warm, args.documents,
                              args.compile_mode[0], args.tuning[0])
        except Exception as e:  # noqa: BLE001 (out of memory, a compile error: the table reports it)
            import traceback
            traceback.print_exc()
            cell = dict(mixer=mixer, T=T, B=max(1, args.tokens // T), documents=args.documents,
                        mode=args.compile_mode[0], tuning=args.tuning[0], error=first_line(e, 200))
        print("CELL " + json.dumps(cell), flush=True)
        return
    args.device = device  # runs on CPU too (--tiny)
    contexts = [int(t) for t in (args.contexts or (CPU_CONTEXTS if small else TRAIN_CONTEXTS)).split(",")]
    from model import MIXERS
    return train_bench(args, args.mixers or list(MIXERS) + [HYBRID], contexts)


if __name__ == "__main__":
    main()
