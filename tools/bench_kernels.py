"""
Kernel benchmark (CUDA): the Triton delta-rule kernels of kernels.py — DeltaNet (no gate), Gated DeltaNet (g [B,T,H])
and KDA (g [B,T,H,Dk]) — side by side with flash-linear-attention (fla-core: chunk_delta_rule,
chunk_gated_delta_rule, chunk_kda, when importable) and causal softmax attention (F.scaled_dot_product_attention)
at the same shapes; then the one-token decode step against fla's fused recurrent kernels.
The scalar-decay family (variants retnet, mamba2, gla; not in the default run) has its own tables: RetNet's kernels
(kernels.linear_attn_triton, the CUDA default) vs fla chunk_retention, SDPA and the chunked torch path; the Mamba2
core (Δ = softplus(dt + dt_bias), g = Δ·A, the scan with the value Δ·x and the skip + D·x inside the kernels:
model.py's math between the conv output and the gated norm) at two mamba_ssm shapes (MAMBA2_SHAPES), next to
mamba_ssm's mamba_chunk_scan_combined in the same run when importable (its Triton SSD is pure Python: a source tree
of state-spaces/mamba on PYTHONPATH is enough, without building its CUDA extensions, import_mamba_ssd); GLA (a decay
per key channel) vs fla chunk_gla at RetNet's shapes; then a decode-step row per mixer (Triton step vs the torch step).

    python tools/bench_kernels.py            # B=8 T=4096 H=16 D=128; B=2 T=16384 H=16 D=128; B=8 T=4096 H=12 D=64;
                                             # decode at 1 and 64
    python tools/bench_kernels.py --quick    # B=2 T=4096 H=16 D=128; decode at batch 1
    python tools/bench_kernels.py --variants kda,gdn     # a subset of kda, gdn, deltanet
    python tools/bench_kernels.py --variants retnet,mamba2   # scalar decay: RetNet at B=8 T=4096, B=2 T=16384
                                             # (H=16 D=128), B=8 D=64; Mamba2 at B=8 T=4096, 32 heads x 64, d_state
                                             # 128, 1 group, and 16 heads x 128, 16 groups; decode at batch 1 and 64
    python tools/bench_kernels.py --profile --variants deltanet,kda   # per-kernel CUDA time of ours (fwd, fwd+bwd)
                                             # at the first shape, then registers / spills of every compiled kernel
    python tools/bench_kernels.py --chunks 32,64,128 --variants retnet,mamba2   # the scalar-decay kernels at
                                             # several chunk sizes
    python tools/bench_kernels.py --tuning recompute --kda_gate safe   # under a kernels.TUNING preset; KDA's gate
                                             # formed in the kernels, bounded
    python tools/bench_kernels.py --jobs 6   # six processes compiling at once before the timed run (a 16-core host)

A cold run (empty Triton cache) spends minutes compiling, most of it fla's autotuned compiles. So the table first
runs each of its calls once in its own process, --jobs at a time (a delta-rule variant at one shape, or a
scalar-decay variant, per process: warm_kernel_table), which fills Triton's disk cache; the timed run then loads the
kernels (and still autotunes fla's, without compiling). --jobs 1 skips the warm phase.

Inputs and times: tools/benchlib.py's docstring (CUDA-graph replay by default; --timing eager for do_bench). Ours
runs first and prints at once; fla's row then carries "ours/fla" = ours ÷ that fla kernel at the same shape
(fwd / fwd+bwd; on our GDN row: ours ÷ our DeltaNet, "÷dn") and "o vs fla", the relative RMS difference of the two
outputs. A kernel that refuses or fails is reported in its row.

fla on a machine without internet: pip download --no-deps -d .whl fla-core==0.6.0 (pure Python; needs einops), then
    pip install --no-deps --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site python tools/bench_kernels.py
"""

import argparse
import importlib
import importlib.util
import os
import subprocess
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules
import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback
import time
import types
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import benchlib
import kernels
from benchlib import (DEVICE, KDA_GATES, MAMBA2_SHAPES, QUICK_SHAPES, RETNET_SHAPES, SAFE_BOUND, SCALAR_VARIANTS,
                      SHAPES, TUNING_PRESETS, VARIANTS, bench_ms, first_line, inputs, mamba2_core, mamba2_inputs,
                      measure, retnet_gate, retnet_inputs, row, run_chunk, tuned)

# mamba_ssm's mamba_chunk_scan_combined at these shapes from an earlier mamba_ssm run (H200, torch 2.11, Triton 3.6,
# bf16, chunk 256): (fwd ms, fwd+bwd ms); printed for reference only, not measured here
MAMBA2_EARLIER = {MAMBA2_SHAPES[0]: (0.59, 3.15), MAMBA2_SHAPES[1]: (0.73, 4.52)}


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
            if variant == "kda" and benchlib.KDA_GATE != "given":
                fla_name += f" (gate in kernel{', safe' if benchlib.KDA_GATE == 'safe' else ''})"
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
                        if ours:  # three decimals: the targets (0.70 fwd, 0.65 fwd+bwd) are given to two
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
        ref = "{:.2f} / {:.2f}".format(*MAMBA2_EARLIER[sh]) if sh in MAMBA2_EARLIER else ""
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


def warm_kernel_table(args, delta, scalar, shapes):
    """--jobs > 1: before the timed run, each warm unit (a delta-rule variant at one shape, or a scalar-decay variant
    at all of its shapes) runs the table's calls once in its own process, args.jobs at a time, so that the Triton
    kernels of ours and the peers (fla's autotuned configs) compile in parallel into the disk cache the timed run then
    loads from; the timed run itself is unchanged (it still autotunes, now without compiling). A unit that fails is
    reported and the timed run goes on."""
    def run(unit):
        v, shape = unit
        cmd = [sys.executable, os.path.abspath(__file__), "--warm_kernels", "--variants", v, "--kda_gate", args.kda_gate,
               "--tuning", args.tuning, "--timing", args.timing] + ["--quick"] * args.quick
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
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of " + ",".join(VARIANTS + SCALAR_VARIANTS))
    ap.add_argument("--shape", default="", help="the delta-rule variants (and GLA) at this B,T,H,D (default SHAPES; "
                    "--profile: the first of SHAPES)")
    ap.add_argument("--profile", action="store_true", help="per-kernel times and registers/spills of ours")
    ap.add_argument("--chunks", default="", help="retnet/mamba2: time our kernels at these chunk sizes, e.g. 32,64,128")
    ap.add_argument("--jobs", type=int, default=2, help="processes compiling the table's kernels at once before it "
                    "is timed (1: none)")
    ap.add_argument("--timing", choices=("graph", "eager"), default="graph",
                    help="CUDA-graph replay (GPU time; default) or do_bench from Python (with launches)")
    ap.add_argument("--kda_gate", choices=KDA_GATES, default="given",
                    help="KDA's gate: log-decays given (default), or formed in the kernels from its input, unbounded "
                         f"or bounded at {SAFE_BOUND} (model.py's kda_gate_bound; fla's safe_gate)")
    ap.add_argument("--tuning", choices=tuple(TUNING_PRESETS), default="default",
                    help="a setting of kernels.TUNING by name (TUNING_PRESETS) for the whole run")
    ap.add_argument("--warm_kernels", action="store_true", help=argparse.SUPPRESS)  # internal: one warm unit
    args = ap.parse_args()
    tuned(TUNING_PRESETS[args.tuning]).__enter__()  # for the whole run
    benchlib.TIMING, benchlib.KDA_GATE, benchlib.WARM = args.timing, args.kda_gate, args.warm_kernels
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS + SCALAR_VARIANTS):
        sys.exit(f"--variants must be a subset of {VARIANTS + SCALAR_VARIANTS}, got {args.variants!r}")
    delta = [v for v in variants if v in VARIANTS]
    scalar = [v for v in variants if v in SCALAR_VARIANTS]
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA GPU (the Triton path of kernels.py runs on CUDA only)")
    shapes = [tuple(map(int, args.shape.split(",")))] if args.shape else QUICK_SHAPES if args.quick else SHAPES
    if args.jobs > 1 and not (args.warm_kernels or args.profile or args.chunks):
        warm_kernel_table(args, delta, scalar, shapes)
    fla, fla_version = load_fla()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"fla-core {fla_version}")
    print("command: python " + " ".join(sys.argv), flush=True)
    print(f"timing: {args.timing} "
          f"({'CUDA-graph replay of 10 calls, median of 30' if args.timing == 'graph' else 'do_bench median'})")
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
