"""
GPU check of documents=True's attention (issue 19): one forward + backward of a small softmax GPT at T = 4096 with
EOTs at random positions, bf16 autocast, with the flex BlockMask (document_block_mask) compiled and eager, against SDPA with the dense [B, 1, T, T] mask. Prints the loss, the gradient norm and each
variant's largest relative gradient difference to the dense one.

$ python notes/doc_mask_check.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


def grads(variant, idx, tgt, compiled):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=idx.shape[1], vocab_size=50304, n_layer=2, n_head=4, n_embd=256, documents=True)
    m = GPT(cfg).cuda()
    saved = model.flex_attention
    if variant == "dense":
        model.flex_attention = None
    try:
        f = torch.compile(m) if compiled else m
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = f(idx, tgt)
        loss.backward()
    finally:
        model.flex_attention = saved
    g = torch.cat([p.grad.float().flatten() for p in m.parameters() if p.grad is not None])
    return loss.item(), g


def main():
    B, T = 2, 4096
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 50000, (B, T + 1), generator=gen)
    idx[torch.rand(B, T + 1, generator=gen) < 1 / 300] = 50256
    idx = idx.cuda()
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; B {B} T {T}, "
          f"{int((x == 50256).sum())} EOTs", flush=True)
    ref_loss, ref = grads("dense", x, y, compiled=False)
    print(f"dense SDPA eager: loss {ref_loss:.4f} grad norm {ref.norm():.4e}", flush=True)
    for variant, compiled in (("flex", False), ("flex", True), ("dense", True)):
        try:
            loss, g = grads(variant, x, y, compiled)
            rel = ((g - ref).norm() / ref.norm()).item()
            print(f"{variant:18s} compiled={compiled!s:5s}: loss {loss:.4f} grad norm {g.norm():.4e} "
                  f"finite {bool(torch.isfinite(g).all())} rel diff {rel:.2e}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{variant:18s} compiled={compiled!s:5s}: {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
