# the hybrid's batch-1 decode step at 4k: V-tile (128 = one program a head, None = auto) x the one-token matmuls
# (cuBLAS; the Triton GEMV of .gpu/gemv.py; Inductor reductions, with or without coordinate-descent tuning);
# each variant's logits of one eager step against the first's
# usage: python .gpu/decgemv.py MIXER VARIANT... ; a variant is V:LINEAR[:OPT...], V auto|128|N, LINEAR cublas|triton|reduce,
# OPT cdt (coordinate-descent tuning), pdl (Inductor's programmatic dependent launch), mag (max-autotune GEMMs),
# fmlp (the MLP's one-token step as two fused GEMVs: .gpu/fmlp.py)
import os, sys, time
sys.path[:0] = ['.', 'tools']
import torch, torch.nn.functional as F
import kernels
sys.path.insert(0, '.gpu')
import gemv  # (before F.linear is replaced: it keeps cuBLAS's for wider inputs)
import fmlp
from model import GPT, Decoder
from bench_train import train_model_config
from bench_decode import at_batch
mixer = sys.argv[1] if len(sys.argv) > 1 else 'kda*3,softmax'
variants = sys.argv[2:] or ['auto:cublas', 'auto:triton', 'auto:reduce', '128:cublas', 'auto:reduce:cdt']
cublas = F.linear

def reduction_linear(x, w, b=None):
    """x W^T + b as a product and a sum over C (Inductor: one reduction kernel reading W once) for one-token inputs"""
    if x.numel() > 8 * x.shape[-1]:
        return cublas(x, w, b)
    dt = torch.get_autocast_dtype('cuda') if torch.is_autocast_enabled('cuda') else x.dtype
    y = (x.unsqueeze(-2).float() * w.float()).sum(-1)
    return (y if b is None else y + b.float()).to(dt)

def profile(model, dt, n=20):
    from torch.profiler import profile as prof, ProfilerActivity
    dec = Decoder(model, 1, 4096 + 300, temperature=1.0, top_k=200, n_vocab=50257, dtype=dt)
    dec.seek(4096)
    dec.decode(4)
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        dec.decode(n)
        torch.cuda.synchronize()
    ev = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by = {}
    for e in ev:
        t = by.setdefault(e.name[:60], [0, 0.0])
        t[0] += 1
        t[1] += e.device_time
    total = sum(t for _, t in by.values())
    print(f"  profile: {len(ev) / n:.0f} kernels a step, busy {total / n / 1000:.3f} ms a step")
    for name, (k, t) in sorted(by.items(), key=lambda x: -x[1][1])[:14]:
        print(f"  {t / n / 1000:7.4f} ms  {k / n:4.0f}x  {name}")

torch.manual_seed(0)
dev = 'cuda' if torch.cuda.is_available() else 'cpu'  # (cpu: a dry run of the script, tiny model, eager)
dt = torch.bfloat16 if dev == 'cuda' else torch.float32
model = GPT(train_model_config(mixer, 4096, tiny=dev == 'cpu')).to(dev).eval()
torch._dynamo.config.recompile_limit = 64
ref = None
for spec in variants:
    v, lin, *opts = spec.split(':')
    v = None if v == 'auto' else int(v)
    torch._dynamo.reset()
    kernels.TUNING['step']['decode_v'] = v
    F.linear = dict(reduce=reduction_linear, triton=gemv.triton_linear, cublas=cublas)[lin]
    torch._inductor.config.coordinate_descent_tuning = 'cdt' in opts
    if hasattr(torch._inductor.config.triton, 'enable_pdl'):  # (an Inductor without it: the GEMV's PDL only)
        torch._inductor.config.triton.enable_pdl = 'pdl' in opts
    elif 'pdl' in opts:
        print("  (this Inductor has no triton.enable_pdl: only the GEMV launches with PDL)")
    gemv.PDL = 'pdl' in opts
    torch._inductor.config.max_autotune_gemm = 'mag' in opts
    cdt = '+'.join(opts) or '-'
    undo = fmlp.patch() if 'fmlp' in opts else None  # the MLP's one-token step in two fused GEMVs
    t0 = time.time()
    try:
        ms = [at_batch(model, 1, 4096, 4096 + 300, 256 if dev == 'cuda' else 4, dev, dt, dev == 'cuda') for _ in range(2)]
        # the same step's logits, for a check that the variants compute the same thing
        dec = Decoder(model, 1, 64, temperature=1.0, top_k=None, n_vocab=model.config.vocab_size, dtype=dt)
        for cache in dec.caches:  # empty caches at position 0 (the warm-up steps drew random tokens into them)
            for t in cache.values():
                t.zero_()
        dec.tok.fill_(123)
        with torch.no_grad():
            logits = dec._forward().float()
        d = 0.0 if ref is None else (logits - ref).abs().max().item()
        ref = logits if ref is None else ref
        if os.environ.get('PROF') and dev == 'cuda':  # the step's kernels by GPU time (20 graph replays)
            profile(model, dt)
        print(f"{mixer} 4k batch 1 decode_v={v} linear={lin} opts={cdt}: ms/token {min(ms):.4f} ({ms[0]:.4f} {ms[1]:.4f}); "
              f"|logits - first| {d:.3g}; built+timed in {time.time() - t0:.0f} s", flush=True)
    except Exception as e:
        print(f"decode_v={v} linear={lin} opts={cdt}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    if undo:
        undo()
F.linear = cublas
