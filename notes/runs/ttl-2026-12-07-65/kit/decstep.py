# the decode step's new parts, before/after in one process (one H100): batch-1 ms per token at 4k of MIXERS (default
# the hybrid; argv) with (a) cuBLAS matmuls, no PDL, the one-program argmax and fp32 top-k (the step before), (b) the
# GEMV + PDL, old draw, (c) the GEMV + PDL + the new draw (the defaults); then batch 8 and 64 of (a), (c); logits of one
# eager step against (a)'s
import sys, time
sys.path[:0] = ['.', 'tools']
import torch
import kernels, model
from model import GPT, Decoder
from bench_train import train_model_config
from bench_decode import at_batch

def old_sample_next(logits, temperature=1.0, top_k=None, n_vocab=None):  # the draw before (model.py at 3204407)
    logits = logits[:, :n_vocab].float()
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        v, _ = torch.topk(logits, top_k, sorted=False)
        logits = logits.masked_fill(logits < v.amin(-1, keepdim=True), -float("inf"))
    return (logits - torch.empty_like(logits).exponential_().log()).argmax(-1, keepdim=True)

new_sample_next = model.sample_next
VARIANTS = {'a': (0, False, old_sample_next), 'b': (8, True, old_sample_next), 'c': (8, True, new_sample_next)}
torch._dynamo.config.recompile_limit = 64
dev = 'cuda' if torch.cuda.is_available() else 'cpu'  # (cpu: a dry run, tiny model, eager, 4 steps)
dt = torch.bfloat16 if dev == 'cuda' else torch.float32
for mixer in sys.argv[1:] or ['kda*3,softmax']:
    torch.manual_seed(0)
    m = GPT(train_model_config(mixer, 4096, tiny=dev == 'cpu')).to(dev).eval()
    ref = None
    for name, B in [('a', 1), ('b', 1), ('c', 1), ('a', 8), ('c', 8), ('a', 64), ('c', 64)]:
        gemv, pdl, draw = VARIANTS[name]
        kernels.TUNING['step'].update(gemv=gemv, pdl=pdl)
        model.sample_next = draw
        torch._dynamo.reset()
        t0 = time.time()
        try:
            ms = [at_batch(m, B, 4096, 4096 + 300, 256 if dev == 'cuda' else 4, dev, dt, dev == 'cuda') for _ in range(2)]
            d = ''
            if B == 1:
                dec = Decoder(m, 1, 64, temperature=0, n_vocab=m.config.vocab_size, dtype=dt)
                for cache in dec.caches:
                    for t in cache.values():
                        t.zero_()
                dec.tok.fill_(123)
                with torch.no_grad():
                    logits = dec._forward().float()
                ref = logits if ref is None else ref
                d = f"; |logits - (a)| {(logits - ref).abs().max().item():.3g}"
            print(f"{mixer} 4k batch {B} ({name}: gemv {gemv}, pdl {pdl}, {draw.__name__}): ms/token {min(ms):.4f} "
                  f"({ms[0]:.4f} {ms[1]:.4f}){d}; {time.time() - t0:.0f} s", flush=True)
        except Exception as e:
            print(f"{mixer} batch {B} ({name}): failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    kernels.TUNING['step'].update(gemv=8, pdl=True)
    model.sample_next = new_sample_next
