"""Kernels of one decode step replayed as a CUDA graph (model.Decoder), from torch.profiler: count per token and GPU
time per kernel, for the 124M configs. Usage: python notes/decode_profile.py MIXER BATCH CONTEXT [--no_compile]"""
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, '.')
from bench import train_model_config  # noqa: E402
from model import GPT, Decoder  # noqa: E402

mixer, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
compile = '--no_compile' not in sys.argv
torch.manual_seed(0)
model = GPT(train_model_config(mixer, T)).cuda().eval()
dec = Decoder(model, B, T + 64, temperature=1.0, top_k=200, n_vocab=50257, dtype=torch.bfloat16, compile=compile)
dec.prefill(torch.randint(0, 50257, (B, T), device='cuda'))
dec.decode(4)
torch.cuda.synchronize()
N = 20
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    dec.decode(N)
    torch.cuda.synchronize()
per = defaultdict(lambda: [0, 0.0])
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        per[e.name][0] += 1
        per[e.name][1] += e.device_time_total
n = sum(c for c, _ in per.values()) / N
busy = sum(t for _, t in per.values()) / N / 1000
print(f"{mixer} batch {B} T={T} compile={compile}: {n:.0f} kernels per token, GPU busy {busy:.3f} ms per token")
for name, (c, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"{c / N:6.1f} x {t / c:7.2f} us = {t / N / 1000:6.3f} ms  {name[:110]}")
