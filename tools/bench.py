"""
Kernel benchmark (CUDA): the Triton delta-rule kernels of kernels.py — DeltaNet (no gate), Gated DeltaNet (g [B,T,H])
and KDA (g [B,T,H,Dk]) — side by side with flash-linear-attention (fla-core: chunk_delta_rule,
chunk_gated_delta_rule, chunk_kda, when importable) and causal softmax attention (F.scaled_dot_product_attention)
at the same shapes; then the one-token decode step against fla's fused recurrent kernels.
The linear-attention family (variants retnet, mamba2, gla; not in the default run) has its own tables: RetNet's kernels
(kernels.linear_attn_triton, the CUDA default) vs fla chunk_retention, SDPA and the chunked torch path (the CUDA
default before 2026-11-23); the Mamba2 core (Δ = softplus(dt + dt_bias), g = Δ·A, the scan with the value Δ·x and the
skip + D·x inside the kernels: model.py's math between the conv output and the gated norm) at two mamba_ssm shapes
(MAMBA2_SHAPES), next to mamba_ssm's mamba_chunk_scan_combined in the same run when importable (its Triton SSD is pure
Python: a source tree of state-spaces/mamba on PYTHONPATH is enough, without building its CUDA extensions,
import_mamba_ssd); GLA (a decay per key channel) vs fla chunk_gla at RetNet's shapes; then a decode-step row per
mixer (Triton step vs the torch step).
--model_decode and --train measure whole models: decode latency, and training speed, memory and GPU time by kernel
category per mixer and context.

    python bench.py            # B=8 T=4096 H=16 D=128; B=2 T=16384 H=16 D=128; B=8 T=4096 H=12 D=64; decode at 1 and 64
    python bench.py --quick    # B=2 T=4096 H=16 D=128; decode at batch 1
    python bench.py --variants kda,gdn     # a subset of kda, gdn, deltanet
    python bench.py --profile --variants deltanet,kda   # per-kernel CUDA time of ours (fwd, fwd+bwd) at the first
                                                         # shape, then registers / spills of every compiled kernel
    python bench.py --chunks 32,64,128 --variants retnet,mamba2   # the scalar-decay kernels at several chunk sizes
    python bench.py --model_decode --mixers softmax 'kda*3,softmax'   # decode ms per token of the 124M models through
                                                         # the CUDA graph, batch 1 and 64, contexts 256..16384 (64k)
    python bench.py --variants retnet,mamba2   # scalar decay: RetNet at B=8 T=4096, B=2 T=16384 (H=16 D=128), B=8 D=64;
                                               # Mamba2 at B=8 T=4096, 32 heads x 64, d_state 128, 1 group, and
                                               # 16 heads x 128, 16 groups; decode at batch 1 and 64
    python bench.py --train    # whole-model training of the 124M models, every mixer x T = 1024, 4096, 8192, 16384
    python bench.py --train --mixers softmax 'kda*3,softmax' kda --contexts 4096 --jobs 2 --json train.json
    python bench.py --train --device cpu --contexts 64 --tokens 128 --mixers softmax kda --steps 2 --tiny  # smoke run
    python bench.py --train --documents --contexts 4096 --json docs.json   # each mixer also with documents=True
    python bench.py --train --contexts 1024,4096 --tuning default recompute   # each linear mixer under each of
                                               # TUNING_PRESETS (settings of kernels.TUNING); the kernel table
                                               # takes one: python bench.py --tuning recompute
    python bench.py --multi_gpu dp,cp --gpus 2   # train.py itself under torchrun (see --multi_gpu below)
    python bench.py --tiles delta --jobs 8     # kernels.TUNING's candidates (TILE_CANDIDATES) for the delta rule, each
                                               # checked against the fp64 reference in its own process, then timed
    python bench.py --tiles conv --only "bwd"  # the short conv's backward candidates (and 'default'); also: scalar
    python bench.py --tiles delta --tiny --jobs 2   # CPU: the checks only, through Triton's interpreter
    python bench.py --ptxas --only _wy,_grads   # registers / spills / shared memory of every launch of those kernels,
                                                # compiled offline for sm_90a (no GPU needed): prepares GPU work
A cold run (empty Triton cache) spends minutes compiling: on an H100 (Triton 3.6, 2026-11-26) the full table did
not finish in 590 s, most of it fla's autotuned compiles. So the kernel table first runs each of its calls once in
its own process, --jobs at a time (a delta-rule variant at one shape, or a scalar-decay variant, per process:
warm_kernel_table), which fills Triton's disk cache; the timed run then loads the kernels (and still autotunes fla's,
without compiling). `python bench.py --jobs 6` on a 16-core GPU host; --jobs 1 skips the warm phase.

--train: config/owt.py's model with that mixer (config/kda_hybrid.py's for 'kda*3,softmax'), softmax
always included and first, --tokens per step (batch = tokens // T), trained as train.py trains on CUDA: torch.compile,
bf16 autocast, TF32, clip_grad_norm_ at 1.0, fused AdamW skipping a non-finite step, the step's loss and gradient
norm read a step late (no sync at the step's boundary); one micro-step per
optimizer step, random tokens. Each (mixer, T) cell runs in its own process: first all of them compile, --jobs at a
time (the Inductor and Triton caches on disk are shared), then each is measured alone. Compiling dominates a run:
one context per command (--contexts 4096) keeps it short. Columns: ms/step = median wall time of a step between CUDA
events, tokens/s = B*T over it, × softmax = tokens/s over softmax's at that T, MFU = model.flops_per_token(T) ×
tokens/s over the GPU's bf16 peak, peak MiB = max_memory_allocated over the timed steps; then GPU ms per step by
kernel category (torch.profiler over 3 more steps; the rules are kernel_category's), whose sum is the GPU's busy
time and can be below ms/step; idle (timed) = ms/step less that sum, the GPU's wait in an unprofiled step (the
profiled idle is larger where the profiler's per-launch cost puts the host behind the GPU: KDA, GDN); outside
mixer+attn = that sum less the linear-mixer and attention kernels, and
÷ softmax's = it over the softmax row's at that T (the target: <= 1.15 at T=4096). Under the table: each
cell's top 5 unfused and fused-elementwise kernels, and which path kernels.py took. On CPU: eager fp32, no profile.
--documents: every mixer also runs with GPTConfig.documents on (row '<mixer> +docs'; its tokens hold an EOT at random
positions, one in DOC_LEN, about OpenWebText's mean document), and '÷ off' = its tokens/s over the same mixer's without.

--multi_gpu: config/kda_hybrid.py trained by train.py itself under torchrun on the pystdlib shards (median tokens/s of
the steps after the first third, with their quartiles; peak = the largest max_memory_allocated over ranks, from
train.py's iter lines), NCCL multicast off. 'dp': T = 1,024, --dp_batch sequences × 2 micro-steps per GPU, 60 steps
(32: the GPU is the limit; at owt.py's 12 the H100 idles over half of each step, waiting for the host's launches, and
the table measures the host's Python more than the layouts: notes/perf.md 2026-11-26 (49)), DDP and FSDP on 1 GPU
(a torchrun of one rank), then both on each of --gpus; the two side by side (GPUs 0..n-1 and n..2n-1) where the host
has 2n GPUs, else one after the other. 'cp': batch 1, 30 steps, data 'pystdlib_long'
(long_rows_dataset: rows longer than pystdlib's val split), one GPU at --cp_context and at --cp_context + 16,384 (side
by side on two GPUs: the longer one is expected not to fit, which makes --cp_context the longest that does; where
neither fits, the two contexts 16,384 and 32,768 shorter, and so on down), then
--context_parallel=n for each n of --gpus at each --cp_multiples of the longest that fit one GPU (default 1 and n;
a multiple of n or more runs with --activation_checkpointing=True: each rank would hold as many tokens as the one GPU
did, plus CP's own tensors, which ran out of memory at 2 × 98,304 over 2 H100s); the losses of the 1-GPU and the CP
runs at the same context (same data, same init) are compared step by step.

fla on a machine without internet: pip download --no-deps -d .whl fla-core==0.6.0 (pure Python; needs einops), then
    pip install --no-deps --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site python bench.py

Inputs: bf16 q, k (L2-normalised), v; beta = sigmoid(randn) in bf16; gates fp32 logsigmoid(randn)/16 (mild; the same
tensors for ours and fla); scale Dk^-0.5; no initial or final state. Times (ms): by default the median over 30
replays of a CUDA graph holding 10 calls, divided by 10 — the GPU's time without Python's launch cost, which at
Dk = 64 and in the decode step made do_bench's medians move between runs; --timing eager gives
triton.testing.do_bench's median (each call launched from Python, L2 flushed before it). fwd runs without autograd; fwd+bwd is one forward and the backward of <o, do>. Peak MiB is
torch.cuda.max_memory_allocated() during one forward+backward minus what was allocated before it (inputs, do and
the gradients of the previous run excluded). Ours runs first and prints at once; fla's row then carries
"ours/fla" = ours ÷ that fla kernel at the same shape (fwd / fwd+bwd; on our GDN row: ours ÷ our DeltaNet, "÷dn") and
"o vs fla", the relative RMS difference
of the two outputs. A kernel that refuses or fails is reported in its row.
"""

import argparse
import importlib
import importlib.util
import inspect
import itertools
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import kernels

SHAPES = [(8, 4096, 16, 128), (2, 16384, 16, 128), (8, 4096, 16, 64)]  # B, T, H, D (Dk = Dv = D): the issue's three
QUICK_SHAPES = [(2, 4096, 16, 128)]
VARIANTS = ("kda", "deltanet", "gdn")  # KDA first (the headline target); DeltaNet before GDN, whose row is also
                                       # divided by our DeltaNet's at the same shape
SCALAR_VARIANTS = ("retnet", "mamba2", "gla")  # not in the default run: --variants retnet,mamba2,gla
RETNET_SHAPES = [(8, 4096, 16, 128), (2, 16384, 16, 128), (8, 4096, 16, 64)]  # B, T, H, D
MAMBA2_SHAPES = [(8, 4096, 32, 64, 128, 1), (8, 4096, 16, 128, 128, 16)]  # B, T, heads, headdim P, d_state N, groups
# mamba_ssm's mamba_chunk_scan_combined at these shapes from an earlier mamba_ssm run (H200, torch 2.11, Triton 3.6, bf16,
# chunk 256): (fwd ms, fwd+bwd ms); printed for reference only, not measured here
MAMBA2_ISSUE = {MAMBA2_SHAPES[0]: (0.59, 3.15), MAMBA2_SHAPES[1]: (0.73, 4.52)}
DEVICE = "cuda"


def load_fla():
    """{variant: (chunk fn, fused recurrent fn)} with an error string in place of what cannot be imported."""
    out, version = {}, "not installed"
    try:
        import fla
        version = fla.__version__
    except Exception as e:  # noqa: BLE001 (any import failure means: no fla here)
        return {v: (f"import fla: {e}", f"import fla: {e}") for v in VARIANTS}, version
    for v, chunk, rec in (("deltanet", "fla.ops.delta_rule:chunk_delta_rule", "fla.ops.delta_rule:fused_recurrent_delta_rule"),
                          ("gdn", "fla.ops.gated_delta_rule:chunk_gated_delta_rule",
                           "fla.ops.gated_delta_rule:fused_recurrent_gated_delta_rule"),
                          ("kda", "fla.ops.kda:chunk_kda", "fla.ops.kda:fused_recurrent_kda")):
        fns = []
        for path in (chunk, rec):
            mod, name = path.split(":")
            try:
                fns.append(getattr(__import__(mod, fromlist=[name]), name))
            except Exception as e:  # noqa: BLE001
                fns.append(f"import {name}: {e}")
        out[v] = tuple(fns)
    return out, version


KDA_GATE = "given"  # --kda_gate: KDA's g given as log-decays, or its input u with the gate formed in the kernels,
KDA_GATES = ("given", "in_kernel", "safe")  # unbounded (model.KDA's default) or bounded at SAFE_BOUND (kda_gate_bound)
SAFE_BOUND = -5.0


def inputs(B, T, H, D, variant, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device=DEVICE, generator=gen)
    x = dict(q=F.normalize(rnd(B, T, H, D), dim=-1).bfloat16(), k=F.normalize(rnd(B, T, H, D), dim=-1).bfloat16(),
             v=rnd(B, T, H, D).bfloat16(), beta=torch.sigmoid(rnd(B, T, H)).bfloat16())
    x["g"] = {"deltanet": None, "gdn": F.logsigmoid(rnd(B, T, H)) / 16, "kda": F.logsigmoid(rnd(B, T, H, D)) / 16}[variant]
    if variant == "kda" and KDA_GATE != "given":  # the gate's input u and its parameters, as model.KDA initialises
        x["g"] = rnd(B, T, H, D).bfloat16()        # them (A_log = 0 with the bound, as fla's safe gate)
        dt = torch.exp(torch.rand(H * D, device=DEVICE, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        x["A_log"] = torch.zeros(H, device=DEVICE) if KDA_GATE == "safe" else \
            torch.log(1 + 15 * torch.rand(H, device=DEVICE, generator=gen))
        x["dt_bias"] = dt + torch.log(-torch.expm1(-dt))
    return x


def run_chunk(impl, variant, x):
    """One forward of a chunked kernel -> o [B, T, H, D]."""
    q, k, v, beta, g = x["q"], x["k"], x["v"], x["beta"], x["g"]
    if variant == "kda" and KDA_GATE != "given":
        bound = SAFE_BOUND if KDA_GATE == "safe" else None
        if impl == "ours":
            return kernels.delta_rule(q, k, v, beta, g, A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=bound)[0]
        return impl(q, k, v, g, beta, A_log=x["A_log"], dt_bias=x["dt_bias"], use_gate_in_kernel=True,
                    safe_gate=bound is not None, lower_bound=bound)[0]
    if impl == "ours":
        return kernels.delta_rule(q, k, v, beta, g)[0]
    if variant == "deltanet":
        return impl(q, k, v, beta)[0]
    return impl(q, k, v, g, beta)[0]  # chunk_gated_delta_rule and chunk_kda: (q, k, v, g, beta)


def first_line(e, n=70):
    s = f"{type(e).__name__}: {e}".strip().splitlines()[0]
    return s if len(s) <= n else s[:n - 3] + "..."


TIMING = "graph"  # --timing: "graph" (CUDA-graph replay, the default) or "eager" (do_bench)


def graph_ms(fn, copies=10, reps=30):
    """Median ms of one fn() from replays of a CUDA graph holding `copies` calls back to back: the GPU's own time.
    do_bench launches from Python each time, and when a call's kernels are short (Dk = 64, the decode step) the
    host's launch cost and its jitter enter the time."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # the capture's allocator warm-up (autotuning has run before: see measure)
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(copies):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b) / copies)
    del g
    torch.cuda.synchronize()
    return statistics.median(ms)


WARM = False  # --warm_kernels: one call of each timed function (compiles and autotunes into Triton's disk cache)


def bench_ms(fn):
    """ms of fn() by TIMING; a call that cannot be captured (a host sync inside) falls back to do_bench, said once.
    Under WARM: fn() once, no timing (1.0: a placeholder that keeps the callers' ratios finite; no one reads it)."""
    if WARM:
        fn()
        torch.cuda.synchronize()
        return 1.0
    if TIMING == "graph":
        try:
            return graph_ms(fn)
        except Exception as e:  # noqa: BLE001
            print(f"  (not capturable, timed by do_bench: {first_line(e)})", flush=True)
            torch.cuda.synchronize()
    return do_bench(fn, return_mode="median")


def measure(fwd, x, leaves):
    """-> (fwd ms, fwd+bwd ms, peak MiB) of fwd(x) -> o, with gradients w.r.t. x[leaves]."""
    with torch.no_grad():
        fwd(x)  # compile / autotune outside the measurements (and outside a graph capture)
        t_fwd = bench_ms(lambda: fwd(x))
    xg = {n: (t.detach().requires_grad_() if n in leaves and t is not None else t) for n, t in x.items()}
    params = [xg[n] for n in leaves if xg[n] is not None]
    do = torch.randn_like(fwd(x))

    def step():
        fwd(xg).backward(do)

    step()  # compile / autotune outside the measurements
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    for p in params:
        p.grad = None
    if TIMING == "graph":  # fresh gradients per call, as do_bench's grad_to_none gives the eager step
        t_fb = bench_ms(lambda: torch.autograd.grad(fwd(xg), params, do))
    else:
        t_fb = do_bench(step, grad_to_none=params, return_mode="median")
    return t_fwd, t_fb, peak


def row(cells, widths=(27, 15, 7, 10, 8, 13, 8)):
    print(" | ".join(str(c).ljust(w) for c, w in zip(cells, widths)), flush=True)


def bench_chunked(shapes, variants, fla):
    row(["kernel", "shape (B,T,H,D)", "fwd ms", "fwd+bwd ms", "peak MiB", "ours/fla", "o vs fla"])
    row(["-" * w for w in (27, 15, 7, 10, 8, 13, 8)])
    for B, T, H, D in shapes:
        shape = f"{B},{T},{H},{D}"
        qkv = None
        try:  # causal softmax attention at the same shape, [B, H, T, D] as SDPA wants it (flash backend)
            qkv = {n: torch.randn(B, H, T, D, device=DEVICE, dtype=torch.bfloat16) for n in "qkv"}
            sdpa = lambda x: F.scaled_dot_product_attention(x["q"], x["k"], x["v"], is_causal=True)
            f, fb, peak = measure(sdpa, qkv, "qkv")
            row(["sdpa causal (flash)", shape, f"{f:.2f}", f"{fb:.2f}", f"{peak:.0f}", "", ""])
        except Exception as e:  # noqa: BLE001
            row(["sdpa causal (flash)", shape, first_line(e)])
        del qkv
        torch.cuda.empty_cache()
        ours_at_shape = {}  # variant -> (fwd, fwd+bwd) ms of ours at this shape
        for variant in variants:
            x = inputs(B, T, H, D, variant)
            leaves = ["q", "k", "v", "beta"] + (["g"] if x["g"] is not None else []) + \
                (["A_log", "dt_bias"] if "A_log" in x else [])
            fla_name = {"deltanet": "chunk_delta_rule", "gdn": "chunk_gated_delta_rule", "kda": "chunk_kda"}[variant]
            if variant == "kda" and KDA_GATE != "given":
                fla_name += f" (gate in kernel{', safe' if KDA_GATE == 'safe' else ''})"
            ours, o_ours = None, None
            # ours first, printed at once: a slow first compile of fla's kernels cannot hide our numbers
            for name, impl in ((f"ours {variant}", "ours"), (f"fla {fla_name}", fla[variant][0])):
                try:
                    if isinstance(impl, str) and impl != "ours":
                        raise RuntimeError(impl)  # the import failed
                    f, fb, peak = measure(lambda x: run_chunk(impl, variant, x), x, leaves)
                    with torch.no_grad():
                        o = run_chunk(impl, variant, x).float()
                    ratio, diff = "", ""
                    if impl == "ours":
                        ours, o_ours = (f, fb), o
                        ours_at_shape[variant] = ours
                        if variant == "gdn" and "deltanet" in ours_at_shape:  # the gate's cost over our DeltaNet
                            dn = ours_at_shape["deltanet"]
                            ratio = f"{f / dn[0]:.2f} / {fb / dn[1]:.2f} ÷dn"
                    else:
                        if ours:  # three places: the issue's targets (0.70, 0.65) sit at the second
                            ratio = f"{ours[0] / f:.3f} / {ours[1] / fb:.3f}"
                        if o_ours is not None:
                            diff = f"{((o_ours - o).norm() / o.norm()).item():.1e}"
                    row([name, shape, f"{f:.3f}", f"{fb:.3f}", f"{peak:.0f}", ratio, diff])
                except Exception as e:  # noqa: BLE001 (fla refuses some set-ups: report, go on)
                    row([name, shape, first_line(e)])
                torch.cuda.empty_cache()
            del x, o_ours
            torch.cuda.empty_cache()


def bench_decode(batches, variants, fla, H=16, D=128):
    """One token, one layer: ours (kernels.delta_rule_step, state updated in place) vs fla's fused recurrent
    kernel at T=1 (returns a new final state)."""
    print(f"\ndecode step, one layer, H={H}, Dk=Dv={D}, fp32 state, bf16 inputs (median ms)", flush=True)
    row(["kernel", "batch", "ms", "ours/fla"], widths=(40, 6, 9, 9))
    for B in batches:
        for variant in variants:
            x = {n: (t[:, 0] if t is not None and n not in ("A_log", "dt_bias") else t)
                 for n, t in inputs(B, 1, H, D, variant).items()}
            if "A_log" in x:  # --kda_gate in_kernel / safe: the step takes log-decays
                x["g"] = F.logsigmoid(x["g"].float()) / 16
            state = torch.randn(B, H, D, D, device=DEVICE)
            fla_rec = fla[variant][1]
            t_fla = None
            name = f"fla {getattr(fla_rec, '__name__', variant)}"
            try:
                if isinstance(fla_rec, str):
                    raise RuntimeError(fla_rec)
                q, k, v, beta = (x[n][:, None] for n in ("q", "k", "v", "beta"))  # [B, 1, H, ...]
                g = None if x["g"] is None else x["g"][:, None]
                gate = {} if variant == "deltanet" else {"g": g}  # keywords: GDN's 4th argument is g, then gk, gv
                call = lambda: fla_rec(q, k, v, beta=beta, initial_state=state, output_final_state=True, **gate)
                with torch.no_grad():
                    call()  # autotune outside the capture
                    t_fla = bench_ms(call)
                row([name, B, f"{t_fla:.4f}", ""], widths=(40, 6, 9, 9))
            except Exception as e:  # noqa: BLE001
                row([name, B, first_line(e, 60)], widths=(40, 6, 60))
            try:
                with torch.no_grad():
                    step = lambda: kernels.delta_rule_step(x["q"], x["k"], x["v"], x["beta"], x["g"], state)
                    step()
                    t = bench_ms(step)
                row([f"ours delta_rule_step ({variant})", B, f"{t:.4f}", f"{t / t_fla:.2f}" if t_fla else ""],
                    widths=(40, 6, 9, 9))
            except Exception as e:  # noqa: BLE001
                row([f"ours delta_rule_step ({variant})", B, first_line(e, 60)], widths=(40, 6, 60))


# -----------------------------------------------------------------------------
# scalar-decay family: RetNet and the Mamba2 core

def import_mamba_ssd():
    """mamba_ssm's mamba_chunk_scan_combined. Its Triton SSD sources are pure Python, but the package's __init__
    imports the CUDA extensions (selective_scan_cuda), which need building; where that import fails, the package is
    registered as a bare module on its own search path, so that its Triton submodules import without the __init__."""
    name = "mamba_ssm.ops.triton.ssd_combined"
    try:
        return importlib.import_module(name).mamba_chunk_scan_combined
    except ImportError as e:
        spec = importlib.util.find_spec("mamba_ssm")
        if spec is None or not spec.submodule_search_locations:
            raise
        for m in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
            del sys.modules[m]  # what the failed import left half-initialised
        pkg = types.ModuleType("mamba_ssm")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["mamba_ssm"] = pkg
        fn = importlib.import_module(name).mamba_chunk_scan_combined
        print(f"mamba_ssm: its __init__ failed ({first_line(e, 60)}); imported its Triton SSD alone", flush=True)
        return fn


def load_scalar_peers():
    """(fla chunk_retention, mamba_ssm mamba_chunk_scan_combined), each a function or the import error string."""
    out = []
    try:
        from fla.ops.retention import chunk_retention
        out.append(chunk_retention)
    except Exception as e:  # noqa: BLE001 (not installed, or fails to import)
        out.append(f"import chunk_retention: {first_line(e)}")
    try:
        out.append(import_mamba_ssd())
    except Exception as e:  # noqa: BLE001
        out.append(f"import mamba_chunk_scan_combined: {first_line(e)}")
    return tuple(out)


def retnet_gate(H):
    return torch.log(1 - 2.0 ** (-5.0 - torch.arange(H, device=DEVICE, dtype=torch.float32)))  # as fla and model.py


def retnet_inputs(B, T, H, D, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return {n: torch.randn(B, T, H, D, device=DEVICE, generator=gen, dtype=torch.bfloat16) for n in "qkv"}


def compare_rows(impls, x, leaves, shape):
    """One table row per (name, fwd) of impls, timed by measure with gradients w.r.t. x[leaves]; the first row (ours,
    Triton) is the one the fla rows are divided by and compared with. fwd a string: the import that failed."""
    ours, o_ours = None, None
    for name, fwd in impls:
        try:
            if isinstance(fwd, str):
                raise RuntimeError(fwd)  # the import failed
            f, fb, peak = measure(fwd, x, leaves)
            with torch.no_grad():
                o = fwd(x).float()
            ratio, diff = "", ""
            if ours is None:
                ours, o_ours = (f, fb), o
            elif name.startswith("fla"):
                ratio = f"{ours[0] / f:.2f} / {ours[1] / fb:.2f}"
                diff = f"{((o_ours - o).norm() / o.norm()).item():.1e}"
            row([name, shape, f"{f:.2f}", f"{fb:.2f}", f"{peak:.0f}", ratio, diff])
        except Exception as e:  # noqa: BLE001 (a peer that fails: report, go on)
            row([name, shape, first_line(e)])
        torch.cuda.empty_cache()


def bench_retnet(shapes, chunk_retention):
    """RetNet: bf16 q, k, v (randn), the constant gate log(1 - 2^(-5-h)), scale D^-0.5, no states."""
    print("\nRetNet (scalar decay, constant per head)", flush=True)
    row(["kernel", "shape (B,T,H,D)", "fwd ms", "fwd+bwd ms", "peak MiB", "ours/fla", "o vs fla"])
    row(["-" * w for w in (27, 15, 7, 10, 8, 13, 8)])
    for B, T, H, D in shapes:
        shape = f"{B},{T},{H},{D}"
        x = retnet_inputs(B, T, H, D)
        try:
            sdpa = lambda x: F.scaled_dot_product_attention(*(x[n].transpose(1, 2) for n in "qkv"), is_causal=True)
            f, fb, peak = measure(sdpa, x, "qkv")
            row(["sdpa causal (flash)", shape, f"{f:.2f}", f"{fb:.2f}", f"{peak:.0f}", "", ""])
        except Exception as e:  # noqa: BLE001
            row(["sdpa causal (flash)", shape, first_line(e)])
        g = retnet_gate(H)
        fla_fwd = chunk_retention if isinstance(chunk_retention, str) else (
            lambda x: chunk_retention(x["q"], x["k"], x["v"])[0])  # computes the same gate from H
        impls = (("ours retnet (triton)", lambda x: kernels.linear_attn_triton(x["q"], x["k"], x["v"], g)[0]),
                 ("ours retnet (chunked torch)", lambda x: kernels.linear_attn_chunked(x["q"], x["k"], x["v"], g)[0]),
                 ("fla chunk_retention", fla_fwd))
        compare_rows(impls, x, "qkv", shape)
        del x
        torch.cuda.empty_cache()


def bench_gla(shapes, chunk_gla):
    """GLA (a decay per key channel): bf16 q, k, v (randn), fp32 g = logsigmoid(randn) / 16 [B, T, H, D] (the layer's
    gate), scale D^-0.5, no states; ours (kernels.linear_attn_triton) vs fla's chunk_gla."""
    print("\nGLA (decay per key channel)", flush=True)
    row(["kernel", "shape (B,T,H,D)", "fwd ms", "fwd+bwd ms", "peak MiB", "ours/fla", "o vs fla"])
    row(["-" * w for w in (27, 15, 7, 10, 8, 13, 8)])
    for B, T, H, D in shapes:
        shape = f"{B},{T},{H},{D}"
        x = retnet_inputs(B, T, H, D)
        x["g"] = F.logsigmoid(torch.randn(B, T, H, D, device=DEVICE, generator=torch.Generator(device=DEVICE)
                                          .manual_seed(1))) / 16
        impls = (("ours gla (triton)", lambda x: kernels.linear_attn_triton(x["q"], x["k"], x["v"], x["g"])[0]),
                 ("fla chunk_gla", chunk_gla if isinstance(chunk_gla, str) else
                  (lambda x: chunk_gla(x["q"], x["k"], x["v"], x["g"])[0])))
        compare_rows(impls, x, "qkvg", shape)
        del x
        torch.cuda.empty_cache()


def mamba2_inputs(B, T, H, P, N, G, seed=0):
    """What model.py's Mamba2 has after the conv: x [B,T,H,P], B/C [B,T,G,N] (bf16), dt [B,T,H] (bf16, before the
    softplus), and its parameters A_log, dt_bias, D [H] (fp32, mamba_ssm's init ranges)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device=DEVICE, generator=gen)
    dt0 = torch.exp(torch.rand(H, device=DEVICE, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    return dict(x=F.silu(rnd(B, T, H, P)).bfloat16(), Bm=F.silu(rnd(B, T, G, N)).bfloat16(),
                Cm=F.silu(rnd(B, T, G, N)).bfloat16(), dt=rnd(B, T, H).bfloat16(),
                A_log=torch.log(1 + 15 * torch.rand(H, device=DEVICE, generator=gen)),
                dt_bias=dt0 + torch.log(-torch.expm1(-dt0)), D=torch.ones(H, device=DEVICE))


def mamba2_core(x):
    """model.py's Mamba2 between the conv output and the gated norm, on the Triton kernels."""
    dt = F.softplus(x["dt"].float() + x["dt_bias"])                  # Δ [B, T, H] fp32
    g = -torch.exp(x["A_log"]) * dt                                  # Δ·A <= 0
    return kernels.linear_attn_triton(x["Cm"], x["Bm"], x["x"], g, scale=1.0, dt=dt, D=x["D"])[0]  # Δ·x, D·x inside


def bench_mamba2(shapes, scan_combined):
    print("\nMamba2 core (conv output -> before the gated norm) vs mamba_ssm's mamba_chunk_scan_combined (chunk 256) "
          "in the same run; its earlier H200 figures for reference", flush=True)
    widths = (30, 26, 7, 10, 8, 13, 8, 15)
    row(["kernel", "shape (B,T,H,P,N,groups)", "fwd ms", "fwd+bwd ms", "peak MiB", "ours/mamba_ssm", "o vs it",
         "earlier mamba_ssm"], widths)
    row(["-" * w for w in widths], widths)
    leaves = ["x", "Bm", "Cm", "dt", "A_log", "dt_bias", "D"]
    for sh in shapes:
        B, T, H, P, N, G = sh
        shape = ",".join(map(str, sh))
        x = mamba2_inputs(B, T, H, P, N, G)
        ref = "{:.2f} / {:.2f}".format(*MAMBA2_ISSUE[sh]) if sh in MAMBA2_ISSUE else ""
        peer = lambda x: scan_combined(x["x"], x["dt"], -torch.exp(x["A_log"]), x["Bm"], x["Cm"], chunk_size=256,
                                       D=x["D"], dt_bias=x["dt_bias"], dt_softplus=True)
        ours, o_ours = None, None
        for name, fwd in (("ours mamba2 core (triton)", mamba2_core), ("mamba_ssm chunk_scan_combined", peer)):
            try:
                if name.startswith("mamba_ssm") and isinstance(scan_combined, str):
                    raise RuntimeError(scan_combined)
                f, fb, peak = measure(fwd, x, leaves)
                with torch.no_grad():
                    o = fwd(x).float()
                ratio, diff = "", ""
                if ours is None:
                    ours, o_ours = (f, fb), o
                else:
                    ratio = f"{ours[0] / f:.2f} / {ours[1] / fb:.2f}"
                    diff = f"{((o_ours - o).norm() / o.norm()).item():.1e}"
                row([name, shape, f"{f:.2f}", f"{fb:.2f}", f"{peak:.0f}", ratio, diff,
                     ref if name.startswith("ours") else ""], widths)
            except Exception as e:  # noqa: BLE001
                row([name, shape, first_line(e)], widths)
            torch.cuda.empty_cache()
        del x, o_ours
        torch.cuda.empty_cache()


def bench_scalar_decode(batches, variants):
    """One token, one layer: the Triton step (kernels.linear_attn_step_triton) vs the torch step, state in place."""
    print("\ndecode step, one layer, fp32 state, bf16 inputs (median ms)", flush=True)
    widths = (40, 6, 9, 12)
    row(["kernel", "batch", "ms", "triton/torch"], widths)
    # RetNet H=16 D=128; Mamba2 32 heads x 64, d_state 128, one group
    setups = {"retnet": (16, 16, 128, 128), "mamba2": (32, 1, 128, 64), "gla": (16, 16, 128, 128)}  # H, q/k heads,
    # Dk, Dv
    for B in batches:
        for variant in variants:
            H, HK, DK, DV = setups[variant]
            gen = torch.Generator(device=DEVICE).manual_seed(0)
            q, k = (torch.randn(B, HK, DK, device=DEVICE, generator=gen, dtype=torch.bfloat16) for _ in range(2))
            v = torch.randn(B, H, DV, device=DEVICE, generator=gen, dtype=torch.bfloat16)
            g = retnet_gate(H) if variant == "retnet" else -torch.rand(
                (B, H, DK) if variant == "gla" else (B, H), device=DEVICE, generator=gen)
            state = torch.randn(B, H, DK, DV, device=DEVICE, generator=gen)
            t_torch = None
            for name, step in (("torch step", kernels.linear_attn_step_torch),
                               ("triton step", kernels.linear_attn_step_triton)):
                label = f"ours {name} ({variant}, H={H} {DK}x{DV})"
                try:
                    with torch.no_grad():
                        step(q, k, v, g, state)
                        t = bench_ms(lambda: step(q, k, v, g, state))
                    ratio = f"{t / t_torch:.2f}" if t_torch and name == "triton step" else ""
                    t_torch = t if name == "torch step" else t_torch
                    row([label, B, f"{t:.4f}", ratio], widths)
                except Exception as e:  # noqa: BLE001
                    row([label, B, first_line(e, 60)], (40, 6, 60))


def model_decode(mixers, contexts, batches, device, steps=64, compile=True, long_context=65536):
    """Generation speed of whole models: the 124M configs of --train (config/owt.py with the mixer,
    config/kda_hybrid.py), through model.Decoder as sample.py runs it on CUDA: static caches, the one-token step (forward,
    sampling at temperature 1 with top_k 200, the token written out) torch.compile'd and captured as a CUDA graph;
    after a prefill of each context (random tokens, in pieces of 64k tokens), the mean time of `steps` replays
    between CUDA events. Softmax is measured the same way: its static K/V cache holds the context plus the steps,
    attention runs over all of it with the unused slots masked. Mixers without a softmax layer also run at
    long_context. cache MiB: the static caches at the largest context. Then the eager path (one Python forward per
    token, GPT.generate's) at batch 1 and the first context, for reference. bf16 autocast on CUDA; on CPU fp32,
    eager steps, no graph."""
    from model import GPT, Decoder
    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    ctx = torch.amp.autocast(device_type="cuda", dtype=dtype) if cuda else nullcontext()
    how = ("CUDA graph of the " + ("compiled " if compile else "") + "step") if cuda else "eager steps (CPU)"
    print(f"\ndecode ms per token ({how}; mean of {steps} after the prefill), tokens/s = batch / that, {device}")
    for mixer in mixers:
        torch._dynamo.reset()  # a fresh compile cache per model (Dynamo keeps a few variants of a function, then runs it eagerly)
        torch.manual_seed(0)
        ctxs = contexts + ([long_context] if long_context and "softmax" not in mixer and long_context not in contexts else [])
        model = GPT(train_model_config(mixer, max(ctxs))).to(device).eval()
        print(f"{mixer}: {model.get_num_params() / 1e6:.0f}M params, {', '.join(sorted(set(model.mixers)))}")
        widths = (7, 10) + (9,) * len(ctxs) + (14,)
        row(["batch", "cache MiB"] + [f"T={T}" for T in ctxs] + ["tokens/s @4k"], widths)
        for B in batches:
            cells, tps, mib = [], "", float("nan")
            for T in ctxs:
                max_len = (max(ctxs) if "softmax" not in mixer else T) + steps + 8
                try:
                    dec = Decoder(model, B, max_len, temperature=1.0, top_k=200, n_vocab=50257, dtype=dtype,
                                  compile=compile)
                    idx = torch.randint(0, 50257, (B, T), device=device)
                    dec.prefill(idx, piece=max(1, 65536 // B))
                    dec.decode(4)  # the first replays outside the timing
                    start = time.perf_counter()
                    if cuda:
                        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                        ev[0].record()
                        dec.decode(steps)
                        ev[1].record()
                        torch.cuda.synchronize()
                        ms = ev[0].elapsed_time(ev[1]) / steps
                    else:
                        dec.decode(steps)
                        ms = (time.perf_counter() - start) * 1000 / steps
                    cells.append(f"{ms:.3f}")
                    if T == 4096:
                        tps = f"{B / ms * 1000:,.0f}"
                    mib = sum(model.cache_bytes(dec.caches)) / 2**20
                except torch.cuda.OutOfMemoryError:
                    cells.append("OOM")
                dec = None
                if cuda:
                    torch.cuda.empty_cache()
            row([str(B), f"{mib:.1f}"] + cells + [tps], widths)
        # the eager path for reference: one Python forward per token (what sample.py did before the graph)
        T = ctxs[0]
        with torch.no_grad(), ctx:
            caches = model.new_caches()
            logits, _ = model(torch.randint(0, 50257, (1, T), device=device), caches=caches)
            tok = logits[:, -1].argmax(-1, keepdim=True)
            model(tok, caches=caches)
            n = 8
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(n):
                logits, _ = model(tok, caches=caches)
            if cuda:
                torch.cuda.synchronize()
        print(f"  eager (one Python forward per token), batch 1, T={T}: {(time.perf_counter() - start) * 1000 / n:.2f} ms per token")
        del model, caches
        if cuda:
            torch.cuda.empty_cache()


def profile(variants, fla=None, shape=SHAPES[0], reps=5):
    """Where the time goes: each of our kernels' CUDA time per call of fwd and of fwd+bwd (torch.profiler, mean of
    reps runs after warm-up), fla's beside ours for the delta-rule variants when it is importable, then the registers and spilled values of every compiled Triton kernel of kernels.py
    (what ptxas reported; a spill means local-memory traffic). The tool behind notes/perf.md's per-kernel tables.
    Delta-rule variants at `shape`; retnet at RETNET_SHAPES[0], mamba2 (the core) at MAMBA2_SHAPES[0]."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    for variant in variants:
        if variant == "retnet":
            B, T, H, D = dims = RETNET_SHAPES[0]
            x = retnet_inputs(B, T, H, D)
            g = retnet_gate(H)
            fwd, leaves = (lambda x: kernels.linear_attn_triton(x["q"], x["k"], x["v"], g)[0]), ["q", "k", "v"]
        elif variant == "mamba2":
            dims = MAMBA2_SHAPES[0]
            x, fwd = mamba2_inputs(*dims), mamba2_core
            leaves = ["x", "Bm", "Cm", "dt", "A_log", "dt_bias", "D"]
        elif variant == "gla":
            B, T, H, D = dims = RETNET_SHAPES[0]
            x = retnet_inputs(B, T, H, D)
            x["g"] = F.logsigmoid(torch.randn(B, T, H, D, device=DEVICE)) / 16
            fwd, leaves = (lambda x: kernels.linear_attn_triton(x["q"], x["k"], x["v"], x["g"])[0]), ["q", "k", "v", "g"]
        else:
            B, T, H, D = dims = shape
            x = inputs(B, T, H, D, variant)
            leaves = ["q", "k", "v", "beta"] + (["g"] if x["g"] is not None else [])
            fwd = lambda x, variant=variant: run_chunk("ours", variant, x)
        profile_one("ours", variant, dims, fwd, x, leaves, reps, torch_profile, ProfilerActivity)
        if variant in VARIANTS and fla is not None and not isinstance(fla[variant][0], str):
            impl = fla[variant][0]  # the peer's kernels, stage by stage, at the same shape
            profile_one("fla", variant, dims, lambda x: run_chunk(impl, variant, x), x, leaves, reps,
                        torch_profile, ProfilerActivity)
    print("\nregisters / spilled values per compiled kernel (one line per specialisation)")
    for name in sorted(dir(kernels)):
        fn = getattr(kernels, name)
        if not isinstance(fn, triton.runtime.jit.JITFunction):
            continue
        for caches in fn.device_caches.values():
            for compiled in caches[0].values():
                compiled._init_handles()
                print(f"  {name:28s} regs {compiled.n_regs:4d}  spills {compiled.n_spills:5d}")


def profile_one(who, variant, dims, fwd, x, leaves, reps, torch_profile, ProfilerActivity):
    """profile()'s per-kernel table of one implementation."""
    xg = {n: (t.detach().requires_grad_() if n in leaves and t is not None else t) for n, t in x.items()}
    do = torch.randn_like(fwd(x))
    params = [xg[n] for n in leaves if xg[n] is not None]

    def fwd_bwd():
        for p in params:  # no autograd accumulation into .grad: its adds are not the kernel's
            p.grad = None
        fwd(xg).backward(do)
    for name, fn, grad in (("fwd", lambda: fwd(x), False), ("fwd+bwd", fwd_bwd, True)):
        with torch.set_grad_enabled(grad):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            total = do_bench(fn, return_mode="median")
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    fn()
                torch.cuda.synchronize()
        per_kernel = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.device_time / reps / 1000
        print(f"\n{who} {variant} {name}, shape {','.join(map(str, dims))}: {total:.3f} ms (do_bench median); "
              f"per kernel, ms (sum {sum(per_kernel.values()):.3f}):")
        for k, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:14]:
            print(f"  {ms:8.3f}  {k[:100]}")


def chunk_sweep(chunks, variants):
    """The scalar-decay kernels' chunk size by measurement: ours at RETNET_SHAPES[0] / MAMBA2_SHAPES[0] with
    kernels.TRITON_CHUNK set to each size (the kernels take it as a compile-time constant), and each output's
    relative RMS difference from the chunk-64 output (a correctness check of the other sizes)."""
    print("\nscalar-decay chunk size sweep (ours, Triton)", flush=True)
    widths = (10, 6, 24, 7, 10, 8, 12)
    row(["variant", "chunk", "shape", "fwd ms", "fwd+bwd ms", "peak MiB", "o vs chunk 64"], widths)
    default = kernels.TRITON_CHUNK
    for variant in variants:
        if variant == "retnet":
            sh = RETNET_SHAPES[0]
            x, g = retnet_inputs(*sh), retnet_gate(sh[2])
            fwd, leaves = (lambda x: kernels.linear_attn_triton(x["q"], x["k"], x["v"], g)[0]), "qkv"
        else:
            sh = MAMBA2_SHAPES[0]
            x, fwd = mamba2_inputs(*sh), mamba2_core
            leaves = ["x", "Bm", "Cm", "dt", "A_log", "dt_bias", "D"]
        with torch.no_grad():
            o64 = fwd(x).float()
        for C in chunks:
            kernels.TRITON_CHUNK = C
            try:
                f, fb, peak = measure(fwd, x, leaves)
                with torch.no_grad():
                    o = fwd(x).float()
                row([variant, C, ",".join(map(str, sh)), f"{f:.2f}", f"{fb:.2f}", f"{peak:.0f}",
                     f"{((o - o64).norm() / o64.norm()).item():.1e}"], widths)
            except Exception as e:  # noqa: BLE001
                row([variant, C, ",".join(map(str, sh)), first_line(e)], (10, 6, 24, 70))
            finally:
                kernels.TRITON_CHUNK = default
            torch.cuda.empty_cache()
        del x, o64
        torch.cuda.empty_cache()


# -----------------------------------------------------------------------------
# --tiles: kernels.TUNING's candidates, each checked against the fp64 reference in its own process, then timed

# family -> {candidate: {TUNING entry: {key: value}}}, each a change of kernels.TUNING (the rest stays as it is);
# 'default' is kernels.TUNING itself, timed beside the others (the column "÷ default")
TILE_CANDIDATES = {
    "delta": {
        "default": {},
        "wy_grads warps 16": {"wy_grads": dict(warps=16)},
        "wy_grads warps 4": {"wy_grads": dict(warps=4)},
        "wy_grads v 32": {"wy_grads": dict(v=32)},
        "wy_grads d64 deltanet 8": {"wy_grads": dict(warps_d64={0: 8, 1: 4})},
        "wy_grads d64 gdn 8": {"wy_grads": dict(warps_d64={0: 4, 1: 8})},
        "wy_grads stages 1": {"wy_grads": dict(stages=1)},
        "wy_grads stages 2": {"wy_grads": dict(stages=2)},
        "state warps 8": {"state": dict(warps=8, out_warps=8)},
        "state warps 2": {"state": dict(warps=2, out_warps=2)},
        "state v 32": {"state": dict(v=32)},
        "state kda_bwd_warps 4": {"state": dict(kda_bwd_warps=4)},
        "state min_v 16": {"state": dict(min_v=16)},
        "state out_warps 8": {"state": dict(out_warps=8)},
        "state stages 3": {"state": dict(stages=3, bwd_stages=3)},
        "state small-v stages 2": {"state": dict(small_v_stages=None)},
        "state small-v bwd at Dk 64": {"state": dict(small_v_bwd_min_k=64)},
        "state v 64": {"state": dict(v=64)},
        "state gn ahead off": {"state": dict(gn_ahead=False)},
        "state kda v 32": {"state": dict(v={0: 32, 1: 64, 2: 32})},
        "state one-wave off": {"state": dict(one_wave_v=None)},
        "state wu in pass off": {"state": dict(wu_in_pass=None)},
        "state wu in pass at Dk 128": {"state": dict(wu_in_pass=128)},
        "state w free": {"state": dict(w_free=True)},
        "state w free stages 2": {"state": dict(w_free=True, small_v_bwd_min_k=256)},
        "state w free bwd warps 8": {"state": dict(w_free=True, bwd_warps=8)},
        "state bwd warps 8": {"state": dict(bwd_warps=8)},
        "kda_grads k 32": {"kda_grads": dict(k=32)},
        "kda_grads warps 4": {"kda_grads": dict(warps=4)},
        "kda_grads wy 64/8": {"kda_grads": dict(wy_v=64)},
        "kda_grads wy maxnreg 128": {"kda_grads": dict(wy_maxnreg=128)},
        "grams kda_k 32": {"grams": dict(kda_k=32)},
        "wy_fwd warps 4": {"wy_fwd": dict(warps=None)},
        "wy_fwd split 1 warps 4": {"wy_fwd": dict(split=1, warps=None)},
        "wy_fwd split 1 at Dk 128": {"wy_fwd": dict(split=1)},
        "wy_fwd split 4 warps 2": {"wy_fwd": dict(split=4, split_d64=4, warps=2)},
        "wy_fwd d64 split 2": {"wy_fwd": dict(split_d64=2)},
        "wy_fwd d64 split 1": {"wy_fwd": dict(split_d64=1)},
        "cumsum d 64": {"cumsum": dict(d=64, warps=2)},
        "cumsum d 64 warps 4": {"cumsum": dict(d=64, warps=4)},
        "grams chunk maxnreg 128": {"grams": dict(chunk_maxnreg=128)},
        "grams k 32 warps 2": {"grams": dict(k=32, warps=2)},
        "grams k 128": {"grams": dict(k=128)},
        "grams chunk d64 k 32": {"grams": dict(chunk_k_d64=32)},
        "grams chunk d64 k 32 warps 8": {"grams": dict(chunk_k_d64=32, chunk_warps_d64=8)},
        "grams chunk d64 k 16": {"grams": dict(chunk_k_d64=16)},
        "grams chunk d64 warps 8": {"grams": dict(chunk_warps_d64=8)},
        "inverse warps 2": {"inverse": dict(warps=2)},
        "inverse warps 4": {"inverse": dict(warps=4)},
        "inverse prec tf32x3": {"inverse": dict(prec={"bf16": "tf32x3", "tf32": "tf32x3", "ieee": "ieee"})},
    },
    "scalar": {
        "default": {},
        "state stages 2": {"scalar": dict(state_stages=2)},
        "state cover 2": {"scalar": dict(state_cover=2)},
        "fused every gate": {"scalar": dict(fused_fwd=(int(kernels.GATE_NONE), int(kernels.GATE_SCALAR),
                                                       int(kernels.GATE_CONST)))},
        "fused none": {"scalar": dict(fused_fwd=())},
        "fused warps 8": {"scalar": dict(fused_warps=8)},
        "state cover d64 1": {"scalar": dict(state_cover_d64=1)},
        "group k 32": {"scalar": dict(group_k=32)},
        "group stages 1": {"scalar": dict(group_stages=1)},
    },
    "conv": {
        "default": {},
        "fwd ahead 8": {"conv_fwd": dict(ahead=8, unroll=8)},
        "fwd L 64": {"conv_fwd": dict(L=64)},
        "bwd L 64": {"conv_bwd": dict(L=64)},
        "bwd ahead 4": {"conv_bwd": dict(ahead=4, unroll=4)},
        "bwd 2 channels": {"conv_bwd": dict(warps=2, heads=2)},
        "bwd persist 256": {"conv_bwd": dict(parts=256)},
    },
}
# relative RMS error bounds against the fp64 reference (test_kernels.py's): bf16 inputs, fp32 inputs (IEEE dots)
TILE_TOL = {"o": (5e-3, 1e-4), "y": (1e-2, 2e-5), "ht": (5e-3, 1e-4), "beta": (2e-2, 1e-3), "g": (2e-2, 1e-3)}
TILE_TOL_GRAD = (8e-3, 1e-4)  # every other input's gradient

# --tuning: named settings of kernels.TUNING that change what the kernels do, not only their tiles, measured side by
# side with --train (each cell's process applies its preset) or one per kernel-table run
TUNING_PRESETS = {
    "default": {},
    "recompute": {"keep": False},  # the backward recomputes the forward's states (W, h[c], Delta) instead of reading them
}


class tuned:
    """with tuned(overrides): kernels.TUNING with overrides {entry: {key: value}} (or {entry: value} for a plain
    entry such as 'keep') applied, restored afterwards; a key that TUNING does not have is an error (a candidate that
    names a setting kernels.py no longer has)."""

    def __init__(self, overrides):
        self.overrides = overrides

    def __enter__(self):
        self.saved = {e: kernels.TUNING[e] for e in self.overrides}
        for entry, kv in self.overrides.items():
            if not isinstance(kernels.TUNING[entry], dict):
                kernels.TUNING[entry] = kv
                continue
            unknown = set(kv) - set(kernels.TUNING[entry])
            if unknown:
                raise KeyError(f"kernels.TUNING[{entry!r}] has no {sorted(unknown)}")
            kernels.TUNING[entry] = dict(kernels.TUNING[entry], **kv)

    def __exit__(self, *exc):
        kernels.TUNING.update(self.saved)


def rel_rms(a, ref):
    a, ref = a.double(), ref.double()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def reference_errors(fn, ref_fn, x, diff, seed=0, names=("o", "ht"), no_grad=False):
    """fn(**x) -> (o, final state | None) against ref_fn on fp64 copies: {name: relative RMS error} of the output, the
    final state and the gradients of x[diff] (random cotangents for both outputs); no_grad: also the outputs of fn
    called without autograd ('<name> no grad': the path the timed forward takes, which may differ)."""
    leaves = {n: (t.detach().clone().requires_grad_(n in diff) if torch.is_tensor(t) else t) for n, t in x.items()}
    ref = {n: (t.detach().double().requires_grad_(n in diff) if torch.is_tensor(t) else t) for n, t in x.items()}
    out, rout = fn(**leaves), ref_fn(**ref)
    gen = torch.Generator().manual_seed(seed)
    loss = rloss = 0
    errs = {}
    for name, a, b in zip(names, out, rout):
        if b is None:
            continue
        w = torch.randn(b.shape, generator=gen, dtype=torch.float64).to(b.device)
        loss, rloss = loss + (a.double() * w).sum(), rloss + (b * w).sum()
        errs[name] = rel_rms(a, b)
    grads = torch.autograd.grad(loss, [leaves[n] for n in diff])
    rgrads = torch.autograd.grad(rloss, [ref[n] for n in diff])
    errs |= {n: rel_rms(a, b) for n, a, b in zip(diff, grads, rgrads)}
    if no_grad:
        with torch.no_grad():
            out = fn(**{n: (t.detach() if torch.is_tensor(t) else t) for n, t in x.items()})
        errs |= {f"{name} no grad": rel_rms(a, b) for name, a, b in zip(names, out, rout) if b is not None}
    return errs


def tile_cases(family, device, tiny):
    """The inputs a candidate is checked on: [(label, fn, ref_fn, x, diff, dtype)]; tiny: CPU-sized (the interpreter)."""
    gen = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=gen)
    cases = []
    if family == "delta":
        shapes = [(1, 65, 2, 16, torch.float32)] if tiny else \
            [(2, 1000, 2, 128, torch.bfloat16), (2, 65, 2, 64, torch.bfloat16), (2, 65, 2, 128, torch.float32)]
        for (B, T, H, D, dtype), gate in itertools.product(shapes, ("deltanet", "gdn", "kda")):
            x = dict(q=F.normalize(rnd(B, T, H, D), dim=-1), k=F.normalize(rnd(B, T, H, D), dim=-1), v=rnd(B, T, H, D),
                     beta=torch.sigmoid(rnd(B, T, H)))
            if gate == "gdn":
                x["g"] = F.logsigmoid(rnd(B, T, H)) / 16
            if gate == "kda":  # strong: a tenth of the gates at -1000
                g = -5 - 5 * torch.rand(B, T, H, D, generator=gen)
                x["g"] = torch.where(torch.rand(B, T, H, D, generator=gen) < 0.1, -1000.0, g)
            x = {n: t.to(device, dtype) for n, t in x.items()} | dict(initial_state=rnd(B, H, D, D).to(device),
                                                                      output_final_state=True)
            cases.append((f"{gate} B{B} T{T} H{H} D{D} {str(dtype)[6:]}", kernels.delta_rule_triton,
                          kernels.delta_rule_recurrent, x, [n for n in x if n not in ("output_final_state",)], dtype))
    elif family == "scalar":
        shapes = [(1, 65, 2, 1, 16, 32, torch.float32)] if tiny else \
            [(2, 1000, 4, 4, 128, 128, torch.bfloat16), (2, 1000, 8, 1, 128, 64, torch.bfloat16)]
        for B, T, H, HK, DK, DV, dtype in shapes:
            for gate in ("retnet", "mamba2"):
                if gate == "retnet":  # RetNet's constant gate (not differentiated), one q/k head per head
                    hk, g = H, torch.log(1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float32)))
                else:  # Mamba2's per-token gate, strong: -A_h softplus(3x + 2), A_h in [1, 16]
                    hk, g = HK, -(1 + 15 * torch.rand(H, generator=gen)) * F.softplus(3 * rnd(B, T, H) + 2)
                x = dict(q=rnd(B, T, hk, DK).to(device, dtype), k=rnd(B, T, hk, DK).to(device, dtype),
                         v=rnd(B, T, H, DV).to(device, dtype), g=g.to(device), initial_state=rnd(B, H, DK, DV).to(device),
                         output_final_state=True, scale=1.0)
                diff = ["q", "k", "v", "initial_state"] + (["g"] if gate == "mamba2" else [])
                cases.append((f"{gate} B{B} T{T} H{H}/{hk} Dk{DK} Dv{DV} {str(dtype)[6:]}", kernels.linear_attn_triton,
                              kernels.linear_attn_recurrent, x, diff, dtype))
    else:  # conv: (B, T, D, norm, bias, x a column slice of a wider tensor)
        shapes = [(2, 40, 32, 16, False, False), (2, 40, 24, 0, True, True)] if tiny else \
            [(3, 1000, 384, 0, True, True), (3, 1000, 384, 128, False, False), (8, 4096, 768, 128, False, False)]
        dtype = torch.float32 if tiny else torch.bfloat16
        for B, T, D, norm, bias, wide in shapes:
            x = dict(xw=rnd(B, T, D + (8 if wide else 0)).to(device, dtype), weight=(rnd(D, 4) / 2).to(device),
                     bias=rnd(D).to(device) if bias else None)  # x: the first D columns of xw (a slice when wide)
            run = lambda xw, weight, bias, D=D, norm=norm: (
                kernels.short_conv(xw[..., :D], weight, bias, norm=norm, path="triton"), None)
            ref = lambda xw, weight, bias, D=D, norm=norm: (kernels.short_conv_torch(xw[..., :D], weight, bias, norm), None)
            cases.append((f"conv B{B} T{T} D{D} norm {norm}{' bias slice' if wide else ''}", run, ref, x,
                          ["xw", "weight"] + (["bias"] if bias else []), dtype))
    return cases


def tiles_check(family, name, device="cuda", tiny=False):
    """Check candidate `name` of TILE_CANDIDATES[family] on tile_cases -> {case: errors}; AssertionError naming the
    errors over the bounds (TILE_TOL; 2.5x for bf16 on CPU, where the interpreter truncates instead of rounding)."""
    failed, out = [], {}
    with tuned(TILE_CANDIDATES[family][name]):
        for label, fn, ref, x, diff, dtype in tile_cases(family, device, tiny):
            errs = out[label] = reference_errors(fn, ref, x, diff, names=("y" if family == "conv" else "o", "ht"),
                                                 no_grad=True)
            j = 0 if dtype == torch.bfloat16 else 1
            slack = 2.5 if (j == 0 and device == "cpu") else 1.0
            bad = {n: e for n, e in errs.items()
                   if not e < slack * TILE_TOL.get(n.removesuffix(" no grad"), TILE_TOL_GRAD)[j]}
            print(f"  {name}: {label}: " + " ".join(f"{n}={e:.1e}" for n, e in errs.items()), flush=True)
            if bad:
                failed.append(f"{label}: {bad}")
    assert not failed, f"{name}: errors over the bounds: " + "; ".join(failed)
    return out


def tile_timings(family, name, variants, shapes=None):
    """fwd / fwd+bwd ms and peak MiB of candidate `name` -> {(variant, shape): (fwd, fwd+bwd, peak)}: the delta rule
    at `shapes` (B, T, H, D; default SHAPES), the scalar decay at RETNET_SHAPES and MAMBA2_SHAPES, the short conv at
    KDA's [8, 4096, 768] bf16 with and without the norm."""
    out = {}
    with tuned(TILE_CANDIDATES[family][name]):
        if family == "delta":
            for variant in [v for v in VARIANTS if v in variants]:
                for B, T, H, D in shapes or SHAPES:
                    x = inputs(B, T, H, D, variant)
                    out[variant, (B, T, H, D)] = measure(lambda x, v=variant: run_chunk("ours", v, x), x,
                                                         ["q", "k", "v", "beta", "g"])
        elif family == "scalar":
            if "retnet" in variants:
                for sh in RETNET_SHAPES:
                    x, g = retnet_inputs(*sh), retnet_gate(sh[2])
                    out["retnet", sh] = measure(lambda x: kernels.linear_attn_triton(x["q"], x["k"], x["v"], g)[0],
                                                x, "qkv")
            if "mamba2" in variants:
                for sh in MAMBA2_SHAPES:
                    out["mamba2", sh] = measure(mamba2_core, mamba2_inputs(*sh),
                                                ["x", "Bm", "Cm", "dt", "A_log", "dt_bias", "D"])
        else:
            for norm in (0, 128):  # KDA's convs: v without the norm, q and k with it (heads of 128)
                x = dict(x=torch.randn(8, 4096, 768, device=DEVICE, dtype=torch.bfloat16),
                         w=torch.randn(768, 4, device=DEVICE) / 2)
                out[f"norm {norm}", (8, 4096, 768)] = measure(
                    lambda x, norm=norm: kernels.short_conv(x["x"], x["w"], norm=norm, path="triton"), x, ["x", "w"])
        torch.cuda.empty_cache()
    return out


def tiles(family, only, variants, jobs, tiny, shapes=None):
    """--tiles: check every chosen candidate in its own process (jobs at a time; an illegal address or a miscompile
    cannot touch the others, and the processes fill Triton's disk cache), then time those that passed, one by one,
    next to 'default'."""
    names = [n for n in TILE_CANDIDATES[family] if not only or n == "default" or
             any(n.startswith(p) for p in only.split(","))]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cmd = [sys.executable, os.path.abspath(__file__), "--tiles", family, "--tiles_check"]
    env = dict(os.environ, TRITON_INTERPRET="1") if device == "cpu" else None  # CPU: the kernels through the interpreter
    ok = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = {n: pool.submit(subprocess.run, cmd + [n] + (["--tiny"] if tiny else []), capture_output=True,
                               text=True, env=env) for n in names}
        for n, r in runs.items():
            p = r.result()
            ok[n] = p.returncode == 0
            why = "" if ok[n] else " ".join((p.stderr.strip().splitlines() or ["?"])[-1:])[:150]
            print(f"check {family} {n:26s} {'ok' if ok[n] else 'FAILED ' + why}", flush=True)
    if device != "cuda":
        print("timing needs CUDA: checks only")
        return ok
    print(f"\n{family} candidates that passed, fwd / fwd+bwd ms ({TIMING} timing), peak MiB, fwd+bwd ÷ default's",
          flush=True)
    widths = (26, 10, 22, 7, 10, 8, 9)
    row(["candidate", "variant", "shape", "fwd ms", "fwd+bwd ms", "peak MiB", "÷ default"], widths)
    base = tile_timings(family, "default", variants, shapes) if ok.get("default") else {}
    for n in names:
        if not ok[n]:
            continue
        got = base if n == "default" else tile_timings(family, n, variants, shapes)
        for (variant, shape), (f, fb, peak) in got.items():
            ratio = f"{fb / base[variant, shape][1]:.3f}" if (variant, shape) in base else "-"
            row([n, variant, ",".join(map(str, shape)), f"{f:.3f}", f"{fb:.3f}", f"{peak:.0f}", ratio], widths)
    return ok


# -----------------------------------------------------------------------------
# --ptxas: registers, spills and shared memory of every Triton launch of kernels.py, compiled offline for sm_90a

SHARED_LIMIT_KB = 227  # Hopper's shared memory per block
TORCH_TO_TRITON = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
                   torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
                   torch.bool: "i1"}


class LaunchRecorder:
    """Stands in for a Triton kernel of kernels.py: kernel[grid](*args) records (name, {runtime argument: type},
    {constexpr: value}, warps, stages) and runs nothing."""

    def __init__(self, name, kernel, out):
        params = inspect.signature(kernel.fn).parameters
        self.name, self.out, self.arg_names = name, out, list(params)
        self.constexpr = {n for n, p in params.items() if "constexpr" in str(p.annotation)}
        self.defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}

    def __getitem__(self, grid):
        def launch(*args, num_warps=4, num_stages=3, **kw):
            values = dict(self.defaults) | dict(zip(self.arg_names, args)) | kw
            sig, const = {}, {}
            for n in self.arg_names:
                v = values[n]
                if n in self.constexpr or v is None:
                    const[n] = v
                elif torch.is_tensor(v):
                    sig[n] = "*" + TORCH_TO_TRITON[v.dtype]
                elif isinstance(v, bool):
                    sig[n] = "i1"
                elif isinstance(v, int):
                    sig[n] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
                else:
                    sig[n] = "fp32"
            self.out.append((self.name, sig, const, num_warps, num_stages))
        return launch


def record_launches(D, dtypes, H=4):
    """Every Triton launch of the public calls at Dk = Dv = D, T = 65 (a partial last chunk), B = 1, H heads, in each
    dtype: the delta rule (DeltaNet, GDN, KDA; with and without the gate formed in the kernels) and the scalar decay
    (plain, RetNet, Mamba2 with H heads on one q/k head and dt, D, GLA), forward, backward and decode step; the short conv
    (with and without the norm, bias, documents), forward, backward and step. kernels.py's Triton kernels are replaced
    by LaunchRecorders while they run, so nothing is computed (the calls only allocate by shape) -> the unique
    launches. CPU tensors on the Triton path: needs TRITON_INTERPRET=1. One SM on CPU: the state passes take the tiles
    of a large B*H. Under TUNING_PRESETS 'default' and 'recompute' (kernels they compile differently)."""
    out = []
    found = {n: k for n, k in vars(kernels).items()
             if n.endswith("_kernel") and isinstance(k, triton.runtime.jit.KernelInterface)}
    for n, k in found.items():
        setattr(kernels, n, LaunchRecorder(n, k, out))
    try:
        T = 65
        rnd = lambda *s, dtype=torch.float32: torch.randn(*s, dtype=dtype, requires_grad=True)
        for dtype, preset in itertools.product(dtypes, ("default", "recompute")):
            with tuned(TUNING_PRESETS[preset]):
                for gate, fn in itertools.product((None, "gdn", "kda"), (False, True)):
                    if fn and gate is None:
                        continue
                    g = None if gate is None else rnd(*((1, T, H) if gate == "gdn" else (1, T, H, D)))
                    gate_fn = dict(A_log=rnd(H), dt_bias=rnd(*g.shape[2:])) if fn else {}
                    o, ht = kernels.delta_rule_triton(rnd(1, T, H, D, dtype=dtype), rnd(1, T, H, D, dtype=dtype),
                                                      rnd(1, T, H, D, dtype=dtype), rnd(1, T, H, dtype=dtype), g,
                                                      initial_state=rnd(1, H, D, D), output_final_state=True, **gate_fn)
                    (o.float().sum() + ht.sum()).backward()
                    gs = None if g is None else g.detach()[:, 0]
                    kernels.delta_rule_step_triton(*(torch.zeros(1, H, D, dtype=dtype) for _ in "qkv"),
                                                   torch.zeros(1, H, dtype=dtype), gs, torch.zeros(1, H, D, D))
                for gate in (None, "retnet", "mamba2", "gla"):
                    hk = 1 if gate in ("mamba2", "gla") else H
                    g = {None: None, "retnet": torch.full((H,), -0.1), "mamba2": -rnd(1, T, H).detach().abs(),
                         "gla": -rnd(1, T, H, D).detach().abs()}[gate]
                    ssd = dict(dt=rnd(1, T, H), D=rnd(H)) if gate == "mamba2" else {}
                    o, ht = kernels.linear_attn_triton(rnd(1, T, hk, D, dtype=dtype), rnd(1, T, hk, D, dtype=dtype),
                                                       rnd(1, T, H, D, dtype=dtype), g, initial_state=rnd(1, H, D, D),
                                                       output_final_state=True, **ssd)
                    (o.float().sum() + ht.sum()).backward()
                    gs = None if g is None else (g if g.dim() == 1 else g[:, 0])
                    z = lambda *shape: torch.zeros(*shape, dtype=dtype)
                    kernels.linear_attn_step_triton(z(1, hk, D), z(1, hk, D), z(1, H, D), gs, torch.zeros(1, H, D, D))
                for norm, bias, pos in ((0, False, False), (16, True, False), (0, True, True)):
                    x = rnd(2, T, 64, dtype=dtype)
                    doc_pos = torch.zeros(2, T, dtype=torch.uint8) if pos else None
                    kernels.short_conv(x, rnd(64, 4), rnd(64) if bias else None, norm=norm, path="triton",
                                       doc_pos=doc_pos).float().sum().backward()
                    kernels.short_conv_step(x.detach()[:, 0], torch.zeros(2, 3, 64, dtype=dtype), rnd(64, 4).detach(),
                                            None, norm=norm, path="triton")
    finally:
        for n, k in found.items():
            setattr(kernels, n, k)
    unique = {json.dumps(launch, sort_keys=True): launch for launch in out}
    return list(unique.values())


def ptxas_report(name, sig, constexprs, warps, stages):
    """-> (registers, spill-store bytes, shared KB) of one recorded launch compiled for sm_90a: Triton lowers it to PTX
    and its bundled ptxas assembles it; nothing is launched. Pointer arguments are taken 16-byte aligned, as Triton
    specialises them on torch tensors (without it every access is scalar and the counts are far from the GPU's)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    fn = getattr(kernels, name)
    names = fn.arg_names
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig.get(n, "").startswith("*")}
    src = ASTSource(fn=fn, signature={n: sig.get(n, "constexpr") for n in names},
                    constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as f:
            f.write(k.asm["ptx"])
        err = ""
        for ptxas in ("ptxas", "ptxas-blackwell"):  # the first that accepts this PTX version
            p = subprocess.run([os.path.join(bin_dir, ptxas), "-v", "-arch=sm_90a", "k.ptx", "-o", "k.cubin"], cwd=d,
                               capture_output=True, text=True)
            err = p.stderr
            if p.returncode == 0:
                break
    regs, spill = re.search(r"Used (\d+) registers", err), re.search(r"(\d+) bytes spill stores", err)
    if not regs:
        raise RuntimeError(f"ptxas failed: {err[-300:]}")
    return int(regs.group(1)), int(spill.group(1)) if spill else 0, k.metadata.shared // 1024


PTXAS_KEYS = ("GATE", "DK", "DV", "BK", "BV", "GROUP", "DECAYED", "OUTPUT", "SNAPSHOTS", "BOUNDED", "GATE_BWD",
              "SKIP_DONE", "SSD", "NORM", "POS", "L", "BD", "AHEAD")


def ptxas(D, dtypes, only):
    """--ptxas: every launch of the public calls at Dk = Dv = D in each dtype (record_launches, in a process with
    TRITON_INTERPRET=1), compiled here without the interpreter for sm_90a, with the current kernels.TUNING. Indicative:
    the local Triton may differ from the GPU machine's; spills are not time (time candidates with --tiles)."""
    if os.environ.get("TRITON_INTERPRET"):  # the compiler needs triton without the interpreter: run again without it
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        argv = ["--ptxas", "--shape", f"1,65,4,{D}", "--dtypes", ",".join(dtypes)] + (["--only", only] if only else [])
        return subprocess.run([sys.executable, os.path.abspath(__file__)] + argv, env=env).returncode
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--ptxas_record", str(D), ",".join(dtypes)],
                       env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"recording the launches failed:\n{p.stderr[-2000:]}")
    launches = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"triton {triton.__version__}, sm_90a; every launch of the public calls at Dk = Dv = {D}, "
          f"{'/'.join(dtypes)} inputs", flush=True)
    for name, sig, const, warps, stages in sorted(launches, key=lambda x: (x[0], json.dumps(x[2], sort_keys=True))):
        if only and not any(name.startswith(o) for o in only.split(",")):
            continue
        dtype = next((t[1:] for n, t in sorted(sig.items()) if n in ("q_ptr", "k_ptr", "x_ptr", "v_ptr")), "-")
        what = " ".join(f"{k}={const[k]}" for k in PTXAS_KEYS if k in const)
        try:
            regs, spill, shared = ptxas_report(name, sig, const, warps, stages)
            flag = f"  OVER {SHARED_LIMIT_KB} KB" if shared > SHARED_LIMIT_KB else ""
            res = f"regs {regs:3d}, spill stores {spill:5d} B, shared {shared:3d} KB{flag}"
        except Exception as e:  # noqa: BLE001 (one that does not compile is reported in its row)
            res = "FAILED " + first_line(e, 120)
        print(f"  {name:28s} {dtype:4s} {what:52s} warps={warps} stages={stages}: {res}", flush=True)
    return 0


# -----------------------------------------------------------------------------
# whole-model training: tokens/s, MFU, peak memory and where the GPU time goes, per mixer and context

TRAIN_CONFIGS = {"kda*3,softmax": "kda_hybrid"}  # mixer pattern -> config/<file>.py when not config/owt.py (run with
HYBRID = "kda*3,softmax"                          # that mixer); --train's default: every MIXERS entry and the hybrid
TRAIN_CONTEXTS = "1024,4096,8192,16384"
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
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config",
                        TRAIN_CONFIGS.get(mixer, "owt") + ".py")
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
        # kept on disk, and timed beside the other warm processes it was noisy (one RMSNorm kernel 7x slower in one
        # run than in another: notes/perf.md 2026-11-24 (o)); the measure phase, alone, times and keeps it
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
        # steps) and the kernels (more busy time), so the two bracket the truth (notes/perf.md 2026-11-26 (x))
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
    """Run train_cell in a fresh `python bench.py --train_cell` process -> its dict, or {'error': first line}.
    Also keeps the 'kernels: ...' lines (which path each mixer took) of its output."""
    cmd = [sys.executable, os.path.abspath(__file__), "--train_cell", mixer, str(T), "--tokens", str(args.tokens),
           "--steps", str(args.steps), "--device", args.device] + ["--tiny"] * args.tiny + ["--warm"] * warm + [
           "--documents"] * documents + ["--compile_mode", mode, "--tuning", tuning]
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = p.stdout.splitlines()
    cell = next((json.loads(s[5:]) for s in reversed(lines) if s.startswith("CELL ")), None)
    if cell is None:  # died without a word (a crash, killed for memory): the last line it wrote to stderr
        err = [s for s in p.stderr.splitlines() if s.strip()]
        cell = dict(mixer=mixer, T=T, B=max(1, args.tokens // T), documents=documents, mode=mode, tuning=tuning,
                    error=err[-1] if err else f"exit code {p.returncode}")
    cell["paths"] = sorted({s for s in lines if s.startswith("kernels: ")})
    return cell


MULTI_GPU_ENV = dict(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")


def train_run(nproc, overrides, steps, tag, gpus=None):
    """train.py config/kda_hybrid.py under torchrun with nproc ranks (on GPUs `gpus`, e.g. "1"): its iter lines
    parsed -> dict(tokens_s (median of the steps after the first third), peak_gib, losses {iter: loss}, error)."""
    out = os.path.join(tempfile.gettempdir(), f"bench-multi-{tag}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py",
           "config/kda_hybrid.py", "--dataset=pystdlib", f"--max_iters={steps}", "--eval_interval=1000000",
           "--eval_iters=1", "--log_interval=1", f"--out_dir={out}", "--wandb_log=False"] + overrides  # later wins
    env = dict(os.environ, **MULTI_GPU_ENV)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    lines = re.findall(r"^iter (\d+)/\d+: loss ([\d.]+).*?tok/s ([\d,]+).*?peak ([\d.]+) GiB", p.stdout, re.M)
    rec = dict(tag=tag, nproc=nproc, overrides=overrides, wall_s=round(time.perf_counter() - t0, 1),
               T=int(next(o for o in overrides if o.startswith("--block_size=")).split("=")[1]),
               losses={int(i): float(l) for i, l, _, _ in lines})
    timed = [float(t.replace(",", "")) for i, _, t, _ in lines if int(i) >= steps // 3]
    rec["tokens_s_by_step"] = {int(i): float(t.replace(",", "")) for i, _, t, _ in lines}
    if p.returncode != 0 or not timed:  # the rank's own exception line, not torchrun's report around it
        text = (p.stdout + p.stderr).splitlines()
        err = ([l for l in text if "out of memory" in l.lower()] or
               [l for l in text if re.match(r"^\s*([\w]+\.)*\w*(Error|Exception): ", l) and "ChildFailedError" not in l])
        rec["error"] = (err[-1] if err else (p.stdout + p.stderr)[-300:]).strip()[:300]
        rec["stderr_tail"] = p.stderr[-4000:]
    if timed:
        q = statistics.quantiles(timed, n=4) if len(timed) > 1 else [timed[0]] * 3
        rec.update(tokens_s=statistics.median(timed), quartiles=(q[0], q[2]),
                   peak_gib=max(float(pk) for *_, pk in lines))
    print(f"{tag}: " + (f"{rec['tokens_s']:,.0f} tokens/s (quartiles {rec['quartiles'][0]:,.0f}–"
                        f"{rec['quartiles'][1]:,.0f}), peak {rec['peak_gib']:.1f} GiB" if timed else "")
          + (f" ERROR {rec['error']}" if "error" in rec else "") + f" ({rec['wall_s']:.0f} s)", flush=True)
    return rec


def long_rows_dataset():
    """'pystdlib_long': the pystdlib train shard as both splits (symlinks in data/pystdlib_long/), for the context-
    parallel runs, whose rows (up to 2 × 98,304 tokens) are longer than the whole pystdlib val split (156,690 tokens).
    Only the speed runs use it: their end-of-run eval then reads training tokens."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = os.path.join(root, "data", "pystdlib", "pystdlib_train_000000.bin")
    if not os.path.exists(src):
        sys.exit("--multi_gpu needs the pystdlib shards: python data/pystdlib/prepare.py")
    out = os.path.join(root, "data", "pystdlib_long")
    os.makedirs(out, exist_ok=True)
    for split in ("train", "val"):
        dst = os.path.join(out, f"pystdlib_long_{split}_000000.bin")
        if not os.path.exists(dst):
            os.symlink(src, dst)
    return "pystdlib_long"


def multi_gpu_bench(parts, gpus, cp_context, steps=30, cp_multiples=("1", "n"), dp_batch=32):
    """--multi_gpu: the tables of README's 'Several GPUs' (see the module docstring)."""
    print(f"device {torch.cuda.get_device_name()} x {torch.cuda.device_count()}, torch {torch.__version__}, "
          f"triton {triton.__version__}")
    print("command: python " + " ".join(sys.argv), flush=True)
    results = {}
    if "dp" in parts:
        rows = []
        for n in [1] + gpus:  # DDP and FSDP at each GPU count in the same minutes (this host's speed drifts): side by
            # side on GPUs 0..n-1 and n..2n-1 where the host has 2n, else one after the other
            layouts = (("DDP", []), ("FSDP", ["--fsdp=True"]))
            side = 2 * n <= torch.cuda.device_count()
            def run(i, n=n):  # layout i (on GPUs i*n .. i*n+n-1 when side by side)
                layout, flag = layouts[i]
                gpus_i = ",".join(str(i * n + g) for g in range(n)) if side else None
                return train_run(n, flag + ["--block_size=1024", f"--batch_size={dp_batch}",
                                            f"--gradient_accumulation_steps={2 * n}"], 2 * steps, f"{layout}-{n}", gpus_i)
            with ThreadPoolExecutor(2 if side else 1) as pool:
                rows += [(layouts[i][0], n, r) for i, r in enumerate(pool.map(run, range(len(layouts))))]
        rows.sort(key=lambda x: x[0] != "DDP")
        print(f"T = 1,024, {dp_batch} sequences x 2 micro-steps per GPU")
        print("| layout | GPUs | tokens/s (quartiles of the steps) | per GPU | per GPU ÷ 1 GPU | ÷ DDP | peak GiB per GPU |")
        print("|---|---|---|---|---|---|---|")
        base = {(l, n): r.get("tokens_s") for l, n, r in rows}
        for layout, n, r in rows:
            if "tokens_s" not in r:
                print(f"| {layout} | {n} | {r.get('error')} | | | | |")
                continue
            t = r["tokens_s"]
            one, ddp = base[(layout, 1)], base[("DDP", n)]
            print(f"| {layout} | {n} | {t:,.0f} ({r['quartiles'][0]:,.0f}–{r['quartiles'][1]:,.0f}) | {t / n:,.0f} | {t / n / one:.2f} | "
                  f"{t / ddp:.2f} | {r['peak_gib']:.1f} |" if one and ddp else f"| {layout} | {n} | {t:,.0f} | | | | |")
        results["dp"] = rows
    if "cp" in parts:
        step = 16384
        common = ["--batch_size=1", "--gradient_accumulation_steps=1", f"--dataset={long_rows_dataset()}"]
        single, pair = [], (cp_context, cp_context + step)  # the context and one step longer, side by side
        while True:  # on two GPUs; where neither fits (a smaller card), the two contexts below, and so on down
            with ThreadPoolExecutor(2) as pool:
                tried = list(pool.map(lambda c: train_run(1, common + [f"--block_size={c[1]}"], steps,
                                                          f"1GPU-T{c[1]}", gpus=str(c[0])), enumerate(pair)))
            single = tried + single
            fit = [r for r in tried if "tokens_s" in r]
            pair = tuple(c for c in (pair[0] - 2 * step, pair[0] - step) if c > 0)
            if fit or not pair:
                break
        if not fit:
            print(f"no context fit one GPU: {single[0].get('error')}")
            return results
        one = fit[-1]
        T1 = one["T"]
        # over n GPUs: at the one-GPU context (the speed-up) and at n times it (what n GPUs add)
        cps = []
        for n in gpus:
            for m in [n if m == "n" else int(m) for m in cp_multiples]:
                ac = ["--activation_checkpointing=True"] if m >= n else []
                cps.append(train_run(n, common + [f"--block_size={m * T1}", f"--context_parallel={n}"] + ac, steps,
                                     f"CP{n}-T{m * T1}" + ("-AC" if ac else "")))
        print(f"| layout | GPUs | context | tokens/s | × 1 GPU | peak GiB per GPU | ÷ 1 GPU's peak |")
        print("|---|---|---|---|---|---|---|")
        for r in single + cps:
            n, T = r["nproc"], r["T"]
            name = "1 GPU" if n == 1 else f"CP over {n}" + (", recompute" if r["tag"].endswith("-AC") else "")
            if "tokens_s" not in r:
                print(f"| {name} | {n} | {T:,} | {r.get('error')} | | | |")
                continue
            print(f"| {name} | {n} | {T:,} | {r['tokens_s']:,.0f} | "
                  f"{r['tokens_s'] / one['tokens_s']:.2f} | {r['peak_gib']:.1f} | {r['peak_gib'] / one['peak_gib']:.2f} |")
        for r in cps:  # same data, same init: the losses of CP and one GPU at the one-GPU context, step by step
            same = [abs(r["losses"][i] - one["losses"][i]) for i in one["losses"] if i in r["losses"]]
            if r["T"] == T1 and same:
                last = max(one["losses"])
                print(f"losses at T={T1:,}, 1 GPU vs CP over {r['nproc']}, steps 0-{last}: largest difference "
                      f"{max(same):.4f} (first {one['losses'][0]:.4f} / {r['losses'].get(0, float('nan')):.4f}, "
                      f"last {one['losses'][last]:.4f} / {r['losses'].get(last, float('nan')):.4f})")
        results["cp"] = dict(single=single, cp=cps)
    return results


def train_bench(args, mixers, contexts):
    """Phase 1 (warm): every cell once, args.jobs processes at a time, to compile (the Inductor and Triton caches
    on disk are shared, so phase 2 compiles from them). A warm run that fails (e.g. out of memory while sharing
    the GPU) is measured anyway. Phase 2 (measure): each cell alone, one after the other. Then the table."""
    mixers = ["softmax"] + [m for m in mixers if m != "softmax"]  # every row is a ratio to softmax at its T
    modes = args.compile_mode
    presets = args.tuning  # softmax (no linear-mixer kernels) runs under the first preset only
    cells = [(m, T, d, mode, p) for mode in modes for T in contexts for p in presets for m in mixers
             for d in ((False, True) if args.documents else (False,)) if m != "softmax" or p == presets[0]]
    label = lambda r: (r["mixer"] + (" +docs" if r.get("documents") else "")
                       + (f" [{r['mode']}]" if len(modes) > 1 else "")
                       + (f" [{r.get('tuning')}]" if len(presets) > 1 and r["mixer"] != "softmax" else ""))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        for w in pool.map(lambda c: run_cell(c[0], c[1], args, True, c[2], c[3], c[4]), cells):
            status = f"error: {w['error']}" if "error" in w else f"{WARM_STEPS} steps in {w['warm_s']:.0f} s, compiling included"
            print(f"warm {label(w)} T={w['T']} B={w['B']}: {status} ({time.perf_counter() - t0:.0f} s in)",
                  flush=True)
    results = []
    for m, T, d, mode, p in cells:
        r = run_cell(m, T, args, False, d, mode, p)
        status = f"error: {r['error']}" if "error" in r else f"{r['ms']:.1f} ms/step, {r['tokens_per_s']:,.0f} tokens/s"
        print(f"measure {label(r)} T={T} B={r['B']}: {status} ({time.perf_counter() - t0:.0f} s in)", flush=True)
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


def warm_kernel_table(args, delta, scalar, shapes):
    """--jobs > 1: before the timed run, each warm unit (a delta-rule variant at one shape, or a scalar-decay variant
    at all of its shapes) runs the table's calls once in its own process, args.jobs at a time, so that the Triton
    kernels of ours and the peers (fla's autotuned configs) compile in parallel into the disk cache the timed run then
    loads from; the timed run itself is unchanged (it still autotunes, now without compiling). A unit that fails is
    reported and the timed run goes on."""
    def run(unit):
        v, shape = unit
        cmd = [sys.executable, os.path.abspath(__file__), "--warm_kernels", "--variants", v, "--kda_gate", args.kda_gate,
               "--tuning", args.tuning[0], "--timing", args.timing] + ["--quick"] * args.quick
        if shape is not None:
            cmd += ["--shape", ",".join(map(str, shape))]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        err = "" if p.returncode == 0 else " FAILED: " + ((p.stderr or p.stdout).strip().splitlines() or ["?"])[-1][:160]
        return f"warm {v}{'' if shape is None else ' ' + ','.join(map(str, shape))}: {time.perf_counter() - t0:.0f} s{err}"
    t0 = time.perf_counter()
    units = [(v, shape) for shape in shapes for v in delta] + [(v, None) for v in scalar]
    with ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(run, units):
            print(line, flush=True)
    print(f"warm phase: {time.perf_counter() - t0:.0f} s, {args.jobs} processes at a time", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one shape, decode at batch 1")
    ap.add_argument("--profile", action="store_true", help="per-kernel times and registers/spills of ours")
    ap.add_argument("--shape", default="", help="--profile, --tiles delta, the kernel table: the delta-rule variants "
                    "at this B,T,H,D (default the first of SHAPES / all of them / SHAPES); --ptxas: Dk = Dv = its last "
                    "number")
    ap.add_argument("--chunks", default="", help="retnet/mamba2: time our kernels at these chunk sizes, e.g. 32,64,128")
    ap.add_argument("--model_decode", action="store_true",
                    help="per-token decode latency of whole 12-layer models vs context length (runs on CPU too)")
    ap.add_argument("--train", action="store_true",
                    help="whole-model training per mixer x context: tokens/s, MFU, peak memory, GPU time by category")
    ap.add_argument("--mixers", nargs="+", default=None,
                    help="--model_decode / --train: mixer patterns, space-separated (a pattern may hold commas: "
                         "'kda*3,softmax'); default softmax retnet mamba2 kda 'kda*3,softmax' / model.MIXERS and the hybrid")
    ap.add_argument("--contexts", default="", help="--model_decode: prefill lengths (default 256,1024,4096,16384); "
                                                   f"--train: context lengths (default {TRAIN_CONTEXTS})")
    ap.add_argument("--batches", default="1,64", help="--model_decode: batch sizes")
    ap.add_argument("--decode_steps", type=int, default=64, help="--model_decode: timed tokens per cell")
    ap.add_argument("--long_context", type=int, default=65536,
                    help="--model_decode: one more context for the mixers without softmax layers (0: none)")
    ap.add_argument("--no_compile", action="store_true", help="--model_decode: capture the step without torch.compile")
    ap.add_argument("--device", default="", help="--model_decode / --train: '' = cuda if available, else cpu")
    ap.add_argument("--tokens", type=int, default=32768, help="--train: tokens per step; batch = tokens // T")
    ap.add_argument("--compile_mode", nargs="+", default=[TRAIN_COMPILE_MODE], choices=COMPILE_MODES,
                    help=f"--train: torch.compile mode(s), each a set of rows (default {TRAIN_COMPILE_MODE}, "
                         "train.py's on CUDA)")
    ap.add_argument("--steps", type=int, default=10, help="--train: timed steps per cell (the median is reported)")
    ap.add_argument("--jobs", type=int, default=2, help="--train: cells compiled at once in the warm phase; --tiles: "
                    "candidates checked at once; the kernel table: processes compiling its kernels at once before it "
                    "is timed (1: none)")
    ap.add_argument("--warm_kernels", action="store_true", help=argparse.SUPPRESS)  # internal: one warm unit
    ap.add_argument("--json", default="", help="--train: also write the results to this JSON file")
    ap.add_argument("--tiny", action="store_true", help="--train: a 4-layer x 64 model (CPU smoke run); --tiles: "
                    "CPU-sized check inputs (the interpreter)")
    ap.add_argument("--tiles", choices=tuple(TILE_CANDIDATES), default=None,
                    help="check kernels.TUNING's candidates (TILE_CANDIDATES) of one family against the fp64 "
                         "reference, then time those that pass (CUDA; checks only on CPU)")
    ap.add_argument("--only", default="", help="--tiles: candidates whose names start with one of these "
                    "(comma-separated; 'default' always runs); --ptxas: kernels whose names start with one of these")
    ap.add_argument("--ptxas", action="store_true", help="registers / spills / shared memory of every Triton launch, "
                    "compiled offline for sm_90a (no GPU needed), at Dk = Dv = the last number of --shape (128)")
    ap.add_argument("--dtypes", default="bf16,fp32", help="--ptxas: input dtypes (bf16, fp16, fp32)")
    ap.add_argument("--tiles_check", default="", help=argparse.SUPPRESS)  # internal: one candidate of --tiles
    ap.add_argument("--ptxas_record", nargs=2, metavar=("D", "DTYPES"), help=argparse.SUPPRESS)  # internal
    ap.add_argument("--multi_gpu", default="", help="train.py under torchrun: 'dp' (DDP and FSDP at T=1024), 'cp' "
                    "(context parallelism at --cp_context), or 'dp,cp'")
    ap.add_argument("--dp_batch", type=int, default=32, help="--multi_gpu dp: sequences per micro-step per GPU (owt.py's "
                    "is 12, where the step is host-bound)")
    ap.add_argument("--gpus", default="2", help="--multi_gpu: GPU counts of the multi-GPU runs, e.g. 2 or 2,4,8")
    ap.add_argument("--cp_context", type=int, default=98304, help="--multi_gpu cp: the context expected to be the "
                    "longest one GPU trains at batch 1 (also tried: it + 16,384)")
    ap.add_argument("--cp_multiples", default="1,n", help="--multi_gpu cp: contexts of the CP runs as multiples of "
                    "the longest that fit one GPU ('n': the GPU count); above n with activation checkpointing")
    ap.add_argument("--documents", action="store_true",
                    help="--train: every mixer also with documents=True (EOTs in its tokens): a row '+docs', ÷ off")
    ap.add_argument("--train_cell", nargs=2, metavar=("MIXER", "T"), help=argparse.SUPPRESS)  # internal: one cell
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)  # internal: --train_cell's warm phase
    ap.add_argument("--timing", choices=("graph", "eager"), default="graph",
                    help="kernel tables: CUDA-graph replay (GPU time; default) or do_bench from Python (with launches)")
    ap.add_argument("--kda_gate", choices=KDA_GATES, default="given",
                    help="the kernel table's KDA gate: log-decays given (default), or formed in the kernels from "
                         f"its input, unbounded or bounded at {SAFE_BOUND} (model.py's kda_gate_bound; fla's safe_gate)")
    ap.add_argument("--tuning", nargs="+", choices=tuple(TUNING_PRESETS), default=["default"],
                    help="settings of kernels.TUNING by name (TUNING_PRESETS): --train takes several (each linear "
                         "mixer's rows under each), the other runs one")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of " + ",".join(VARIANTS + SCALAR_VARIANTS))
    args = ap.parse_args()
    if len(args.tuning) > 1 and not args.train:
        sys.exit("--tuning takes one preset except with --train: run the kernel table once per preset")
    if not args.train:
        tuned(TUNING_PRESETS[args.tuning[0]]).__enter__()  # for the whole run
    global TIMING, KDA_GATE, WARM
    TIMING, KDA_GATE, WARM = args.timing, args.kda_gate, args.warm_kernels
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS + SCALAR_VARIANTS):
        sys.exit(f"--variants must be a subset of {VARIANTS + SCALAR_VARIANTS}, got {args.variants!r}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.ptxas_record:  # --ptxas's first step, in a process with TRITON_INTERPRET=1: one JSON line
        names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        launches = record_launches(int(args.ptxas_record[0]), [names[d] for d in args.ptxas_record[1].split(",")])
        print(json.dumps(launches))
        return
    if args.ptxas:  # needs no GPU
        D = int(args.shape.split(",")[-1]) if args.shape else 128
        sys.exit(ptxas(D, [d for d in args.dtypes.split(",") if d], args.only))
    if args.tiles_check:  # one candidate of --tiles, in its own process
        tiles_check(args.tiles, args.tiles_check, "cuda" if torch.cuda.is_available() else "cpu", args.tiny)
        return
    if args.tiles:  # the checks run on CPU too (--tiny)
        if args.tiles == "scalar" and variants == list(VARIANTS):
            variants = list(SCALAR_VARIANTS)
        shapes = [tuple(map(int, args.shape.split(",")))] if args.shape else None
        ok = tiles(args.tiles, args.only, variants, args.jobs, args.tiny, shapes)
        sys.exit(0 if all(ok.values()) else 1)
    if args.model_decode:  # needs no GPU
        mixers = args.mixers or ["softmax", "kda*3,softmax", "kda", "gdn", "mamba2"]
        return model_decode(mixers, [int(t) for t in (args.contexts or "256,1024,4096,16384").split(",")],
                            [int(b) for b in args.batches.split(",")], device, args.decode_steps,
                            not args.no_compile, args.long_context)
    if args.train_cell:  # one cell of --train, in its own process: one JSON line for the parent
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
    if args.multi_gpu:
        res = multi_gpu_bench(args.multi_gpu.split(","), [int(n) for n in args.gpus.split(",")], args.cp_context,
                              cp_multiples=args.cp_multiples.split(","), dp_batch=args.dp_batch)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        return
    if args.train:  # runs on CPU too (--tiny)
        args.device = device
        contexts = [int(t) for t in (args.contexts or TRAIN_CONTEXTS).split(",")]
        from model import MIXERS
        return train_bench(args, args.mixers or list(MIXERS) + [HYBRID], contexts)
    delta = [v for v in variants if v in VARIANTS]
    scalar = [v for v in variants if v in SCALAR_VARIANTS]
    if not torch.cuda.is_available():
        sys.exit("bench.py needs a CUDA GPU (the Triton path of kernels.py runs on CUDA only)")
    shapes = [tuple(map(int, args.shape.split(",")))] if args.shape else QUICK_SHAPES if args.quick else SHAPES
    if args.jobs > 1 and not (args.warm_kernels or args.profile or args.chunks):
        warm_kernel_table(args, delta, scalar, shapes)
    fla, fla_version = load_fla()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"fla-core {fla_version}")
    print("command: python " + " ".join(sys.argv), flush=True)
    print(f"timing: {TIMING} ({'CUDA-graph replay of 10 calls, median of 30' if TIMING == 'graph' else 'do_bench median'})")
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.profile:
        return profile(delta + scalar, fla, tuple(map(int, args.shape.split(","))) if args.shape else SHAPES[0])
    if args.chunks:
        return chunk_sweep([int(c) for c in args.chunks.split(",")], scalar)
    if delta:
        bench_chunked(shapes, delta, fla)
        if not args.warm_kernels or shapes[0] == (QUICK_SHAPES if args.quick else SHAPES)[0]:  # warm: once a variant
            bench_decode((1,) if args.quick else (1, 64), delta, fla)
    if scalar:
        chunk_retention, scan_combined = load_scalar_peers()
        if "retnet" in scalar:
            bench_retnet(QUICK_SHAPES if args.quick else RETNET_SHAPES, chunk_retention)
        if "mamba2" in scalar:
            bench_mamba2(MAMBA2_SHAPES[:1] if args.quick else MAMBA2_SHAPES, scan_combined)
        if "gla" in scalar:
            try:
                from fla.ops.gla import chunk_gla
            except Exception as e:  # noqa: BLE001 (not installed, or fails to import)
                chunk_gla = f"import chunk_gla: {first_line(e)}"
            bench_gla([tuple(map(int, args.shape.split(",")))] if args.shape else QUICK_SHAPES if args.quick
                      else RETNET_SHAPES, chunk_gla)
        bench_scalar_decode((1,) if args.quick else (1, 64), scalar)


if __name__ == "__main__":
    main()
