"""Optimizer step cost on one GPU: the 124M model at T=4096, batch 8, bf16, compiled; AdamW (fused) vs Muon.
AdamW fused; Muon with its update compiled (train.py) and eager. Median over 20 steps of (a) the whole training step and (b) opt.step alone, by CUDA events."""
import os, sys, statistics, time
sys.path.insert(0, os.getcwd())
import torch
from model import GPT, GPTConfig
import optim
sys.path.insert(0, 'tools')
from bench_train import train_model_config

def bench(mixer, which, steps=20, compiled=False):
    torch.manual_seed(0)
    cfg = train_model_config(mixer, 4096)
    raw = GPT(cfg).cuda()
    raw.loss_only = True
    model = torch.compile(raw)
    opt = raw.configure_optimizers(0.1, 6e-4, (0.9, 0.95), 'cuda', optimizer=which)
    if compiled:
        opt.compile_update()  # as train.py does with compile=True
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
    print(f"{mixer:16s} {which + ('+c' if compiled else ''):8s} step {t:7.2f} ms  opt.step {o:6.2f} ms  ({o / t * 100:4.1f}% of the step)  loss {loss.item():.3f}", flush=True)
    return t, o

if __name__ == '__main__':
    print(torch.cuda.get_device_name(), torch.__version__)
    res = {}
    mixers = sys.argv[1:] or ['kda*3,softmax', 'softmax']
    for mixer in mixers:
        for which, c in [('adamw', False), ('muon', True), ('muon', False)]:
            res[(mixer, which, c)] = bench(mixer, which, compiled=c)
    for mixer in mixers:
        (ta, oa) = res[(mixer, 'adamw', False)]
        for c in (True, False):
            tm, om = res[(mixer, 'muon', c)]
            print(f"{mixer}: muon{' compiled' if c else ' eager'} step / adamw step = {tm / ta:.3f}; its opt.step {om:.2f} ms "
                  f"= {om / tm * 100:.1f}% of its step, {om / ta * 100:.1f}% of AdamW's step")
