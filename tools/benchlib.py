"""
What the kernel benchmarks share (tools/bench_kernels.py's tables, tools/tune.py's tile timings, the tools that run
under a kernels.TUNING preset): the shapes, the inputs of the delta-rule and scalar-decay kernels, the timers, the
table row, and the TUNING presets. TIMING, KDA_GATE and WARM are settings the tools set from their options (read
them as benchlib.TIMING: a name imported from here would not see the change). Not run by itself; the tools use it:

    python tools/bench_kernels.py --timing eager   # TIMING: do_bench instead of CUDA-graph replay
    python tools/tune.py --tiles delta              # measure() of each candidate at SHAPES

Inputs: bf16 q, k (L2-normalised), v; beta = sigmoid(randn) in bf16; gates fp32 logsigmoid(randn)/16 (mild; the same
tensors for ours and the peers); scale Dk^-0.5; no initial or final state. Times (ms): by default the median over 30
replays of a CUDA graph holding 10 calls, divided by 10 — the GPU's time without Python's launch cost, which at
Dk = 64 and in the decode step made do_bench's medians move between runs; TIMING = "eager" gives
triton.testing.do_bench's median (each call launched from Python, L2 flushed before it). fwd runs without autograd;
fwd+bwd is one forward and the backward of <o, do>. Peak MiB is torch.cuda.max_memory_allocated() during one
forward+backward minus what was allocated before it (inputs, do and the gradients of the previous run excluded).
"""

import math
import os
import statistics
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import kernels

SHAPES = [(8, 4096, 16, 128), (2, 16384, 16, 128), (8, 4096, 16, 64)]  # B, T, H, D (Dk = Dv = D): the delta rule's
QUICK_SHAPES = [(2, 4096, 16, 128)]                                        # three, and --quick's one
VARIANTS = ("kda", "deltanet", "gdn")  # KDA first (the headline target); DeltaNet before GDN, whose row is also
                                       # divided by our DeltaNet's at the same shape
SCALAR_VARIANTS = ("retnet", "mamba2", "gla")  # not in the default run: --variants retnet,mamba2,gla
RETNET_SHAPES = [(8, 4096, 16, 128), (2, 16384, 16, 128), (8, 4096, 16, 64)]  # B, T, H, D
MAMBA2_SHAPES = [(8, 4096, 32, 64, 128, 1), (8, 4096, 16, 128, 128, 16)]  # B, T, heads, headdim P, d_state N, groups
DEVICE = "cuda"


KDA_GATE = "given"  # bench_kernels.py --kda_gate: KDA's g given as log-decays, or its input u with the gate formed
KDA_GATES = ("given", "in_kernel", "safe")  # in the kernels, unbounded (model.KDA's default) or bounded at SAFE_BOUND
                                            # (model.py's kda_gate_bound)
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


TIMING = "graph"  # the tools' --timing: "graph" (CUDA-graph replay, the default) or "eager" (do_bench)


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


WARM = False  # bench_kernels.py's warm phase (--warm_kernels): one call of each timed function (compiles and
              # autotunes into Triton's disk cache)


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


def retnet_gate(H):
    return torch.log(1 - 2.0 ** (-5.0 - torch.arange(H, device=DEVICE, dtype=torch.float32)))  # as fla and model.py


def retnet_inputs(B, T, H, D, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return {n: torch.randn(B, T, H, D, device=DEVICE, generator=gen, dtype=torch.bfloat16) for n in "qkv"}


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


# --tuning: named settings of kernels.TUNING that change what the kernels do, not only their tiles, measured side by
# side by bench_train.py (each cell's process applies its preset) or one per bench_kernels.py run
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
