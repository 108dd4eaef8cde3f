# rank 1 of 2's attention at 98,304 tokens: PrefixCausalAttention (two flash calls merged by LSE) vs one lower-right SDPA
import sys, torch, torch.nn.functional as F
sys.path.insert(0, '.')
from torch.nn.attention.bias import causal_lower_right
from triton.testing import do_bench
from context_parallel import PrefixCausalAttention
def check(L, P, H=12, D=64, dt=torch.bfloat16):
    torch.manual_seed(0)
    q = torch.randn(1, H, L, D, device='cuda', dtype=dt, requires_grad=True)
    K = torch.randn(1, H, P + L, D, device='cuda', dtype=dt, requires_grad=True)
    V = torch.randn(1, H, P + L, D, device='cuda', dtype=dt, requires_grad=True)
    ref = lambda: F.scaled_dot_product_attention(q, K, V, attn_mask=causal_lower_right(L, P + L))
    new = lambda: PrefixCausalAttention.apply(q, K[:, :, :P], V[:, :, :P], K[:, :, P:], V[:, :, P:])
    comp = torch.compile(lambda q, K, V: PrefixCausalAttention.apply(q, K[:, :, :P], V[:, :, :P], K[:, :, P:], V[:, :, P:]))
    do = torch.randn(1, H, L, D, device='cuda', dtype=dt)
    # fp32 reference from the fp64-free math path: SDPA with a dense mask in fp32 at small sizes only
    outs = {}
    for name, f in (('lower-right sdpa', ref), ('prefix+causal', new), ('prefix+causal compiled', lambda: comp(q, K, V))):
        o = f(); g = torch.autograd.grad(o, (q, K, V), do)
        outs[name] = (o, g)
    r = outs['lower-right sdpa']
    for name in ('prefix+causal', 'prefix+causal compiled'):
        o, g = outs[name]
        rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()
        print(f"L={L} P={P} {name} vs lower-right: o {rel(o, r[0]):.2e}, dq {rel(g[0], r[1][0]):.2e}, dK {rel(g[1], r[1][1]):.2e}, dV {rel(g[2], r[1][2]):.2e}", flush=True)
    def fb(f):
        def run():
            o = f(); torch.autograd.grad(o, (q, K, V), do)
        return run
    for name, f in (('lower-right sdpa', ref), ('prefix+causal', new)):
        print(f"L={L} P={P} {name}: fwd+bwd {do_bench(fb(f), rep=100):.1f} ms", flush=True)
check(1000, 2000)
check(49152, 49152)
