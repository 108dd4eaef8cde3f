# causality at the training shape: logits before position p must not change when the tokens from p on change
import dataclasses, sys, torch
sys.path.insert(0, '.')
from model import GPT, GPTConfig
torch.backends.cuda.matmul.allow_tf32 = True
for mixer in sys.argv[1:]:
    g = {'mixer': mixer, '__file__': 'config/pkgtext.py'}
    exec(open('config/pkgtext.py').read(), g)
    args = {f.name: g[f.name] for f in dataclasses.fields(GPTConfig) if f.name in g}
    args.update(mixer=mixer, vocab_size=50304)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**args)).cuda().eval()
    B, T = 8, args['block_size']
    x = torch.randint(0, 50257, (B, T), device='cuda')
    for compiled in ((False, True) if mixer == sys.argv[1] else (False,)):
        f = torch.compile(model) if compiled else model
        with torch.no_grad(), torch.autocast('cuda', torch.bfloat16):
            base = f(x)[0].float()
            for p in (1, 63, 1000, 2049, 4095):
                y = x.clone()
                y[:, p:] = torch.randint(0, 50257, (B, T - p), device='cuda')
                out = f(y)[0].float()
                before = (out[:, :p] - base[:, :p]).abs().max().item()
                after = (out[:, p:] - base[:, p:]).abs().max().item()
                print(f"{mixer:>14} {'compiled' if compiled else 'eager':>8} p={p:5d}: max |dlogit| before p {before:.3g}, from p {after:.3g}"
                      + ("  LEAK" if before > 1e-2 else ""), flush=True)
    del model
