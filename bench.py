"""
Kernel benchmark (CUDA): the Triton delta-rule kernels of kernels.py — DeltaNet (no gate), Gated DeltaNet (g [B,T,H])
and KDA (g [B,T,H,Dk]) — side by side with flash-linear-attention (fla-core: chunk_delta_rule,
chunk_gated_delta_rule, chunk_kda, when importable) and causal softmax attention (F.scaled_dot_product_attention)
at the same shapes; then the one-token decode step against fla's fused recurrent kernels.
The scalar-decay family (variants retnet, mamba2; not in the default run) has its own tables: RetNet's Triton kernels
(kernels.linear_attn_triton, the CUDA default) vs fla chunk_retention, SDPA and the chunked torch path (the CUDA
default before 2026-11-23); the Mamba2 core (Δ = softplus(dt + dt_bias), v = Δ·x, g = Δ·A, the scan, + D·x: model.py's math between
the conv output and the gated norm) in absolute times at the mamba_ssm shapes of issue 5, next to mamba_ssm's
mamba_chunk_scan_combined when importable; then a decode-step row per mixer (Triton step vs the torch step).

    python bench.py            # B=8 T=4096 H=16 D=128; B=2 T=16384 H=16 D=128; B=8 T=4096 H=12 D=64; decode at 1 and 64
    python bench.py --quick    # B=2 T=4096 H=16 D=128; decode at batch 1
    python bench.py --variants kda,gdn     # a subset of kda, gdn, deltanet
    python bench.py --profile --variants deltanet,kda   # per-kernel CUDA time of ours (fwd, fwd+bwd) at the first
                                                         # shape, then registers / spills of every compiled kernel
    python bench.py --chunks 32,64,128 --variants retnet,mamba2   # the scalar-decay kernels at several chunk sizes
    python bench.py --model_decode --mixers softmax 'kda*3,softmax'   # per-token decode latency of whole 12-layer models
                                                         # (GPT-2 small shape) after prefills of 256..16384 tokens
    python bench.py --variants retnet,mamba2   # scalar decay: RetNet at B=8 T=4096 and B=2 T=16384 (H=16 D=128);
                                               # Mamba2 at B=8 T=4096, 32 heads x 64, d_state 128, 1 group, and
                                               # 16 heads x 128, 16 groups; decode at batch 1 and 64
A cold run (empty Triton cache) spends minutes compiling before it measures anything: on an H200 (Triton 3.6),
the first shape of the full run got through SDPA, DeltaNet (ours, fla) and GDN (ours) in about 4.5 minutes, with our
kernels already compiled by the tests and fla's chunk_kda backward still compiling.

fla on a machine without internet: pip download --no-deps -d .whl fla-core==0.6.0 (pure Python; needs einops), then
    pip install --no-deps --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site python bench.py

Inputs: bf16 q, k (L2-normalised), v; beta = sigmoid(randn) in bf16; gates fp32 logsigmoid(randn)/16 (mild; the same
tensors for ours and fla); scale Dk^-0.5; no initial or final state. Times are medians of triton.testing.do_bench
(ms). fwd runs without autograd; fwd+bwd is one forward and the backward of <o, do>. Peak MiB is
torch.cuda.max_memory_allocated() during one forward+backward minus what was allocated before it (inputs, do and
the gradients of the previous run excluded). Ours runs first and prints at once; fla's row then carries
"ours/fla" = ours ÷ that fla kernel at the same shape (fwd / fwd+bwd; on our GDN row: ours ÷ our DeltaNet, "÷dn") and
"o vs fla", the relative RMS difference
of the two outputs. A kernel that refuses or fails is reported in its row.
"""

import argparse
import math
import sys
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import kernels

SHAPES = [(8, 4096, 16, 128), (2, 16384, 16, 128), (8, 4096, 12, 64)]  # B, T, H, D (Dk = Dv = D)
QUICK_SHAPES = [(2, 4096, 16, 128)]
VARIANTS = ("kda", "deltanet", "gdn")  # KDA first (the headline target); DeltaNet before GDN, whose row is also
                                       # divided by our DeltaNet's at the same shape
SCALAR_VARIANTS = ("retnet", "mamba2")  # issue 5, not in the default run: --variants retnet,mamba2
RETNET_SHAPES = [(8, 4096, 16, 128), (2, 16384, 16, 128)]  # B, T, H, D
MAMBA2_SHAPES = [(8, 4096, 32, 64, 128, 1), (8, 4096, 16, 128, 128, 16)]  # B, T, heads, headdim P, d_state N, groups
# mamba_ssm's mamba_chunk_scan_combined at these shapes as issue 5 quotes it (H200, torch 2.11, Triton 3.6, bf16,
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


def inputs(B, T, H, D, variant, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device=DEVICE, generator=gen)
    x = dict(q=F.normalize(rnd(B, T, H, D), dim=-1).bfloat16(), k=F.normalize(rnd(B, T, H, D), dim=-1).bfloat16(),
             v=rnd(B, T, H, D).bfloat16(), beta=torch.sigmoid(rnd(B, T, H)).bfloat16())
    x["g"] = {"deltanet": None, "gdn": F.logsigmoid(rnd(B, T, H)) / 16, "kda": F.logsigmoid(rnd(B, T, H, D)) / 16}[variant]
    return x


def run_chunk(impl, variant, x):
    """One forward of a chunked kernel -> o [B, T, H, D]."""
    q, k, v, beta, g = x["q"], x["k"], x["v"], x["beta"], x["g"]
    if impl == "ours":
        return kernels.delta_rule(q, k, v, beta, g)[0]
    if variant == "deltanet":
        return impl(q, k, v, beta)[0]
    return impl(q, k, v, g, beta)[0]  # chunk_gated_delta_rule and chunk_kda: (q, k, v, g, beta)


def first_line(e, n=70):
    s = f"{type(e).__name__}: {e}".strip().splitlines()[0]
    return s if len(s) <= n else s[:n - 3] + "..."


def measure(fwd, x, leaves):
    """-> (fwd ms, fwd+bwd ms, peak MiB) of fwd(x) -> o, with gradients w.r.t. x[leaves]."""
    with torch.no_grad():
        t_fwd = do_bench(lambda: fwd(x), return_mode="median")
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
            leaves = ["q", "k", "v", "beta"] + (["g"] if x["g"] is not None else [])
            fla_name = {"deltanet": "chunk_delta_rule", "gdn": "chunk_gated_delta_rule", "kda": "chunk_kda"}[variant]
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
                        if ours:
                            ratio = f"{ours[0] / f:.2f} / {ours[1] / fb:.2f}"
                        if o_ours is not None:
                            diff = f"{((o_ours - o).norm() / o.norm()).item():.1e}"
                    row([name, shape, f"{f:.2f}", f"{fb:.2f}", f"{peak:.0f}", ratio, diff])
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
            x = {n: (t[:, 0] if t is not None else None) for n, t in inputs(B, 1, H, D, variant).items()}
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
                    t_fla = do_bench(call, return_mode="median")
                row([name, B, f"{t_fla:.4f}", ""], widths=(40, 6, 9, 9))
            except Exception as e:  # noqa: BLE001
                row([name, B, first_line(e, 60)], widths=(40, 6, 60))
            try:
                with torch.no_grad():
                    t = do_bench(lambda: kernels.delta_rule_step(x["q"], x["k"], x["v"], x["beta"], x["g"], state),
                                 return_mode="median")
                row([f"ours delta_rule_step ({variant})", B, f"{t:.4f}", f"{t / t_fla:.2f}" if t_fla else ""],
                    widths=(40, 6, 9, 9))
            except Exception as e:  # noqa: BLE001
                row([f"ours delta_rule_step ({variant})", B, first_line(e, 60)], widths=(40, 6, 60))


# -----------------------------------------------------------------------------
# scalar-decay family (issue 5): RetNet and the Mamba2 core

def load_scalar_peers():
    """(fla chunk_retention, mamba_ssm mamba_chunk_scan_combined), each a function or the import error string."""
    out = []
    for mod, name in (("fla.ops.retention", "chunk_retention"), ("mamba_ssm.ops.triton.ssd_combined",
                                                                 "mamba_chunk_scan_combined")):
        try:
            out.append(getattr(__import__(mod, fromlist=[name]), name))
        except Exception as e:  # noqa: BLE001 (not installed, or fails to import)
            out.append(f"import {name}: {first_line(e)}")
    return tuple(out)


def retnet_gate(H):
    return torch.log(1 - 2.0 ** (-5.0 - torch.arange(H, device=DEVICE, dtype=torch.float32)))  # as fla and model.py


def retnet_inputs(B, T, H, D, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return {n: torch.randn(B, T, H, D, device=DEVICE, generator=gen, dtype=torch.bfloat16) for n in "qkv"}


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
        ours, o_ours = None, None
        for name, fwd in impls:
            try:
                if isinstance(fwd, str):
                    raise RuntimeError(fwd)  # the import failed
                f, fb, peak = measure(fwd, x, "qkv")
                with torch.no_grad():
                    o = fwd(x).float()
                ratio, diff = "", ""
                if ours is None:
                    ours, o_ours = (f, fb), o  # the Triton row: the others are compared with it
                elif name.startswith("fla"):
                    ratio = f"{ours[0] / f:.2f} / {ours[1] / fb:.2f}"
                    diff = f"{((o_ours - o).norm() / o.norm()).item():.1e}"
                row([name, shape, f"{f:.2f}", f"{fb:.2f}", f"{peak:.0f}", ratio, diff])
            except Exception as e:  # noqa: BLE001
                row([name, shape, first_line(e)])
            torch.cuda.empty_cache()
        del x, o_ours
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
    v = (x["x"].float() * dt[..., None]).to(x["x"].dtype)            # Δ·x
    y = kernels.linear_attn_triton(x["Cm"], x["Bm"], v, g, scale=1.0)[0]
    return y + x["D"][:, None].to(y.dtype) * x["x"]


def bench_mamba2(shapes, scan_combined):
    print("\nMamba2 core (conv output -> before the gated norm), absolute times; mamba_ssm figures of issue 5 "
          "(H200, chunk 256) for reference", flush=True)
    widths = (30, 26, 7, 10, 8, 15)
    row(["kernel", "shape (B,T,H,P,N,groups)", "fwd ms", "fwd+bwd ms", "peak MiB", "issue: mamba_ssm"], widths)
    row(["-" * w for w in widths], widths)
    leaves = ["x", "Bm", "Cm", "dt", "A_log", "dt_bias", "D"]
    for sh in shapes:
        B, T, H, P, N, G = sh
        shape = ",".join(map(str, sh))
        x = mamba2_inputs(B, T, H, P, N, G)
        ref = "{:.2f} / {:.2f}".format(*MAMBA2_ISSUE[sh]) if sh in MAMBA2_ISSUE else ""
        peer = lambda x: scan_combined(x["x"], x["dt"], -torch.exp(x["A_log"]), x["Bm"], x["Cm"], chunk_size=256,
                                       D=x["D"], dt_bias=x["dt_bias"], dt_softplus=True)
        for name, fwd in (("ours mamba2 core (triton)", mamba2_core), ("mamba_ssm chunk_scan_combined", peer)):
            try:
                if name.startswith("mamba_ssm") and isinstance(scan_combined, str):
                    raise RuntimeError(scan_combined)
                f, fb, peak = measure(fwd, x, leaves)
                row([name, shape, f"{f:.2f}", f"{fb:.2f}", f"{peak:.0f}", ref if name.startswith("ours") else ""],
                    widths)
            except Exception as e:  # noqa: BLE001
                row([name, shape, first_line(e)], widths)
            torch.cuda.empty_cache()
        del x
        torch.cuda.empty_cache()


def bench_scalar_decode(batches, variants):
    """One token, one layer: the Triton step (kernels.linear_attn_step_triton) vs the torch step, state in place."""
    print("\ndecode step, one layer, fp32 state, bf16 inputs (median ms)", flush=True)
    widths = (40, 6, 9, 12)
    row(["kernel", "batch", "ms", "triton/torch"], widths)
    # RetNet H=16 D=128; Mamba2 32 heads x 64, d_state 128, one group
    setups = {"retnet": (16, 16, 128, 128), "mamba2": (32, 1, 128, 64)}  # H, q/k heads, Dk, Dv
    for B in batches:
        for variant in variants:
            H, HK, DK, DV = setups[variant]
            gen = torch.Generator(device=DEVICE).manual_seed(0)
            q, k = (torch.randn(B, HK, DK, device=DEVICE, generator=gen, dtype=torch.bfloat16) for _ in range(2))
            v = torch.randn(B, H, DV, device=DEVICE, generator=gen, dtype=torch.bfloat16)
            g = retnet_gate(H) if variant == "retnet" else -torch.rand(B, H, device=DEVICE, generator=gen)
            state = torch.randn(B, H, DK, DV, device=DEVICE, generator=gen)
            t_torch = None
            for name, step in (("torch step", kernels.linear_attn_step_torch),
                               ("triton step", kernels.linear_attn_step_triton)):
                label = f"ours {name} ({variant}, H={H} {DK}x{DV})"
                try:
                    with torch.no_grad():
                        t = do_bench(lambda: step(q, k, v, g, state), return_mode="median")
                    ratio = f"{t / t_torch:.2f}" if t_torch and name == "triton step" else ""
                    t_torch = t if name == "torch step" else t_torch
                    row([label, B, f"{t:.4f}", ratio], widths)
                except Exception as e:  # noqa: BLE001
                    row([label, B, first_line(e, 60)], (40, 6, 60))


def model_decode(mixers, contexts, device, steps=32):
    """Per-token decode latency of a whole model, 12 layers x 768 (GPT-2 small's shape, head_dim 64, d_state 128,
    batch 1), after a prefill of each context length: flat in the context for the linear mixers (a fixed-size state
    per layer) and growing for softmax (its K/V cache). Mean wall time of `steps` successive one-token forwards
    through the caches (what sample.py does per token, sampling excluded); bf16 autocast on CUDA, fp32 on CPU. The
    kernels' path (torch or Triton) is whatever kernels.py picks and prints; KERNELS_PATH=triton forces Triton."""
    from model import GPT, GPTConfig
    cuda = device.startswith("cuda")
    ctx = torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16) if cuda else nullcontext()
    print(f"\nper-token decode latency, 12 x 768 model, batch 1, {device} (mean ms over {steps} steps after the prefill)")
    widths = (16, 10) + (10,) * len(contexts)
    row(["mixer", "params"] + [f"T={T}" for T in contexts], widths)
    for mixer in mixers:
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, head_dim=64, d_state=128, vocab_size=50304,
                              block_size=max(contexts) + steps, mixer=mixer)).to(device).eval()
        cells = []
        for T in contexts:
            idx = torch.randint(0, 50257, (1, T), device=device)
            with torch.no_grad(), ctx:
                caches = model.new_caches()
                logits, _ = model(idx, caches=caches)  # prefill in one forward
                tok = logits[:, -1].argmax(-1, keepdim=True)
                model(tok, caches=caches)  # a first step outside the timing (compiles the step kernels)
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(steps):
                    logits, _ = model(tok, caches=caches)
                if cuda:
                    torch.cuda.synchronize()
            cells.append(f"{(time.perf_counter() - t0) / steps * 1000:.2f}")
            del caches
        row([mixer, f"{model.get_num_params() / 1e6:.0f}M"] + cells, widths)
        del model
        if cuda:
            torch.cuda.empty_cache()


def profile(variants, shape=SHAPES[0], reps=5):
    """Where the time goes: each of our kernels' CUDA time per call of fwd and of fwd+bwd (torch.profiler, mean of
    reps runs after warm-up), then the registers and spilled values of every compiled Triton kernel of kernels.py
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
        else:
            B, T, H, D = dims = shape
            x = inputs(B, T, H, D, variant)
            fwd = lambda x, variant=variant: run_chunk("ours", variant, x)
            leaves = ["q", "k", "v", "beta"] + (["g"] if x["g"] is not None else [])
        xg = {n: (t.detach().requires_grad_() if n in leaves and t is not None else t) for n, t in x.items()}
        do = torch.randn_like(fwd(x))
        for name, fn, grad in (("fwd", lambda: fwd(x), False), ("fwd+bwd", lambda: fwd(xg).backward(do), True)):
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
            print(f"\nours {variant} {name}, shape {','.join(map(str, dims))}: {total:.3f} ms (do_bench median); "
                  "per kernel, ms:")
            for k, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:12]:
                print(f"  {ms:8.3f}  {k[:100]}")
    print("\nregisters / spilled values per compiled kernel (one line per specialisation)")
    for name in sorted(dir(kernels)):
        fn = getattr(kernels, name)
        if not isinstance(fn, triton.runtime.jit.JITFunction):
            continue
        for caches in fn.device_caches.values():
            for compiled in caches[0].values():
                compiled._init_handles()
                print(f"  {name:28s} regs {compiled.n_regs:4d}  spills {compiled.n_spills:5d}")


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one shape, decode at batch 1")
    ap.add_argument("--profile", action="store_true", help="per-kernel times and registers/spills of ours")
    ap.add_argument("--chunks", default="", help="retnet/mamba2: time our kernels at these chunk sizes, e.g. 32,64,128")
    ap.add_argument("--model_decode", action="store_true",
                    help="per-token decode latency of whole 12-layer models vs context length (runs on CPU too)")
    ap.add_argument("--mixers", nargs="+", default=["softmax", "retnet", "mamba2", "kda", "kda*3,softmax"],
                    help="--model_decode: mixer patterns, space-separated (a pattern may hold commas: 'kda*3,softmax')")
    ap.add_argument("--contexts", default="256,1024,4096,16384", help="--model_decode: prefill lengths")
    ap.add_argument("--device", default="", help="--model_decode: '' = cuda if available, else cpu")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of " + ",".join(VARIANTS + SCALAR_VARIANTS))
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS + SCALAR_VARIANTS):
        sys.exit(f"--variants must be a subset of {VARIANTS + SCALAR_VARIANTS}, got {args.variants!r}")
    if args.model_decode:  # needs no GPU
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        return model_decode(args.mixers, [int(t) for t in args.contexts.split(",")], device)
    delta = [v for v in variants if v in VARIANTS]
    scalar = [v for v in variants if v in SCALAR_VARIANTS]
    if not torch.cuda.is_available():
        sys.exit("bench.py needs a CUDA GPU (the Triton path of kernels.py runs on CUDA only)")
    fla, fla_version = load_fla()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"fla-core {fla_version}")
    print("command: python " + " ".join(sys.argv), flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.profile:
        return profile(delta + scalar)
    if args.chunks:
        return chunk_sweep([int(c) for c in args.chunks.split(",")], scalar)
    if delta:
        bench_chunked(QUICK_SHAPES if args.quick else SHAPES, delta, fla)
        bench_decode((1,) if args.quick else (1, 64), delta, fla)
    if scalar:
        chunk_retention, scan_combined = load_scalar_peers()
        if "retnet" in scalar:
            bench_retnet(QUICK_SHAPES if args.quick else RETNET_SHAPES, chunk_retention)
        if "mamba2" in scalar:
            bench_mamba2(MAMBA2_SHAPES[:1] if args.quick else MAMBA2_SHAPES, scan_combined)
        bench_scalar_decode((1,) if args.quick else (1, 64), scalar)


if __name__ == "__main__":
    main()
