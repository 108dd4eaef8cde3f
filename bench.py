"""
Kernel benchmark (CUDA): the Triton delta-rule kernels of kernels.py — DeltaNet (no gate), Gated DeltaNet (g [B,T,H])
and KDA (g [B,T,H,Dk]) — side by side with flash-linear-attention (fla-core: chunk_delta_rule,
chunk_gated_delta_rule, chunk_kda, when importable) and causal softmax attention (F.scaled_dot_product_attention)
at the same shapes; then the one-token decode step against fla's fused recurrent kernels.

    python bench.py            # B=8 T=4096 H=16 D=128; B=2 T=16384 H=16 D=128; B=8 T=4096 H=12 D=64; decode at 1 and 64
    python bench.py --quick    # B=2 T=4096 H=16 D=128; decode at batch 1
    python bench.py --variants kda,gdn     # a subset of kda, gdn, deltanet
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
"ours/fla" = ours ÷ that fla kernel at the same shape (fwd / fwd+bwd) and "o vs fla", the relative RMS difference
of the two outputs. A kernel that refuses or fails is reported in its row.
"""

import argparse
import sys

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import kernels

SHAPES = [(8, 4096, 16, 128), (2, 16384, 16, 128), (8, 4096, 12, 64)]  # B, T, H, D (Dk = Dv = D)
QUICK_SHAPES = [(2, 4096, 16, 128)]
VARIANTS = ("kda", "gdn", "deltanet")  # KDA first: the headline target of issue 4
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one shape, decode at batch 1")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS):
        sys.exit(f"--variants must be a subset of {VARIANTS}, got {args.variants!r}")
    if not torch.cuda.is_available():
        sys.exit("bench.py needs a CUDA GPU (the Triton path of kernels.py runs on CUDA only)")
    fla, fla_version = load_fla()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"fla-core {fla_version}")
    print("command: python " + " ".join(sys.argv), flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    bench_chunked(QUICK_SHAPES if args.quick else SHAPES, variants, fla)
    bench_decode((1,) if args.quick else (1, 64), variants, fla)


if __name__ == "__main__":
    main()
