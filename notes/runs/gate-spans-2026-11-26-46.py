"""The 124M hybrid's initial KDA gates on random tokens (CPU): the share of (chunk of 64, 64-channel key tile) pairs
in each tier of the Gram backward, with the first row as the reference (session x5) and with the midpoint (46)."""
import sys, torch
sys.path.insert(0, ".")
import bench, kernels, model
torch.manual_seed(0)
cfg = bench.train_model_config("kda*3,softmax", 1024)
m = model.GPT(cfg).eval()
spans = []
def hook(mod, args, out):
    pass
orig = model.KDA.decay
def decay(self, p, fused=False):
    g = orig(self, p, False)                      # the gate's values [B, T, H, dk]
    spans.append(g.detach().float())
    return orig(self, p, fused)
model.KDA.decay = decay
x = torch.randint(0, 50257, (4, 1024))
with torch.no_grad():
    m(x)
tot = {"first": [0, 0, 0], "mid": [0, 0, 0]}
for g in spans:
    B, T, H, D = g.shape
    G = g.view(B, T // 64, 64, H, D // 64, 64).cumsum(2)          # [B, chunk, row, H, tile, ch]
    whole_first = (G[:, :, :1] - G).abs().amax((2, 5))              # per (B, chunk, H, tile)
    mid = (G[:, :, :1] + G[:, :, -1:]) / 2
    whole_mid = (G - mid).abs().amax((2, 5))
    G16 = G.view(B, T // 64, 4, 16, H, D // 64, 64)
    by16 = (G16[:, :, :, :1] - G16).abs().amax((2, 3, 6))
    for name, w in (("first", whole_first), ("mid", whole_mid)):
        t = tot[name]
        t[0] += (w <= 60).sum().item(); t[1] += ((w > 60) & (by16 <= 60)).sum().item(); t[2] += ((w > 60) & (by16 > 60)).sum().item()
for name, (a, b, c) in tot.items():
    n = a + b + c
    print(f"reference {name}: S=64 {a / n:.1%}, S=16 {b / n:.1%}, S=1 {c / n:.1%} of {n} (chunk, tile) pairs over {len(spans)} KDA layers")
