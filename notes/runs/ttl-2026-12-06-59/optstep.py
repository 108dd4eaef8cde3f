"""Optimizer step cost on one GPU: the 124M model at T=4096, batch 8, bf16, compiled; AdamW (fused) vs Muon.
Median over 20 steps of (a) the whole training step and (b) opt.step alone, by CUDA events."""
import os, sys, statistics, time
sys.path.insert(0, os.getcwd())
import torch
from model import GPT, GPTConfig
import optim

def bench(mixer, which, steps=20):
    torch.manual_seed(0)
    hd = 128 if 'kda' in mixer else 64
    cfg = GPTConfig(n_layer=12, n_head=12, n_embd=768, head_dim=hd, d_state=128, block_size=4096, vocab_size=50304,
                    mixer=mixer, kernels='auto')
    raw = GPT(cfg).cuda()
    raw.loss_only = True
    model = torch.compile(raw)
    opt = raw.configure_optimizers(0.1, 6e-4, (0.9, 0.95), 'cuda', optimizer=which)
    x = torch.randint(0, 50257, (8, 4097), device='cuda')
    X, Y = x[:, :-1].contiguous(), x[:, 1:].contiguous()
    tot, ost = [], []
    for i in range(steps + 5):
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        with torch.autocast('cuda', torch.bfloat16):
            _, loss = model(X, Y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
        e1.record()
        opt.found_inf = torch.zeros((), device='cuda')
        opt.step()
        e2.record()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= 5:
            tot.append(e0.elapsed_time(e2)); ost.append(e1.elapsed_time(e2))
    t, o = statistics.median(tot), statistics.median(ost)
    print(f"{mixer:16s} {which:6s} step {t:7.2f} ms  opt.step {o:6.2f} ms  ({o / t * 100:4.1f}% of the step)  loss {loss.item():.3f}", flush=True)
    return t, o

if __name__ == '__main__':
    print(torch.cuda.get_device_name(), torch.__version__)
    res = {}
    mixers = sys.argv[1:] or ['kda*3,softmax', 'softmax']
    for mixer in mixers:
        for which in ['adamw', 'muon']:
            res[(mixer, which)] = bench(mixer, which)
    for mixer in mixers:
        (ta, oa), (tm, om) = res[(mixer, 'adamw')], res[(mixer, 'muon')]
        print(f"{mixer}: muon step / adamw step = {tm / ta:.3f}; muon opt.step {om:.2f} ms = {om / tm * 100:.1f}% of its step")
