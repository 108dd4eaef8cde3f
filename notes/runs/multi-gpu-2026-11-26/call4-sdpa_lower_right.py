# causal attention of the second half of a 98,304-token sequence over all of it (CP rank 1 of 2) vs the whole causal
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.nn.attention.bias import causal_lower_right
from triton.testing import do_bench
T, H, D = 98304, 12, 64
L = T // 2
q = torch.randn(1, H, L, D, device='cuda', dtype=torch.bfloat16, requires_grad=True)
qf = torch.randn(1, H, T, D, device='cuda', dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(1, H, T, D, device='cuda', dtype=torch.bfloat16, requires_grad=True)
v = torch.randn_like(k, requires_grad=True)
def fb(f):
    def run():
        o = f(); o.backward(torch.ones_like(o))
    return run
full = lambda: F.scaled_dot_product_attention(qf, k, v, is_causal=True)
lr = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, T))
def lr_flash():
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, T))
def lr_eff():
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, T))
for name, f in [('full causal T (1 GPU)', full), ('lower-right L x T default', lr), ('lower-right flash', lr_flash), ('lower-right efficient', lr_eff)]:
    try:
        print(f"{name}: fwd+bwd {do_bench(fb(f), rep=200):.1f} ms", flush=True)
    except Exception as e:
        print(f"{name}: {type(e).__name__}: {str(e)[:150]}", flush=True)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
    fb(lr)()
print(p.key_averages().table(sort_by='cuda_time_total', row_limit=6))
