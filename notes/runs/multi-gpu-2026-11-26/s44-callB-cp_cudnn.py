# Issue 43, first GPU check of session 44: PrefixCausalAttention on cuDNN (context_parallel.CUDNN = True) against
# FA2 (False) and one SDPA call with a lower-right causal mask (the reference), eager and compiled; times fwd+bwd at
# the balanced layout's shapes (98,304 tokens over 2 ranks: pieces of 24,576) and the whole causal square.
# Exits 1 when cuDNN's outputs or gradients are off (gpu_call.sh then runs the CP bench on FA2).
import sys, torch, torch.nn.functional as F
sys.path.insert(0, '.')
from torch.nn.attention.bias import causal_lower_right
from triton.testing import do_bench
import context_parallel as C

bad = False


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def case(L, P, H=12, D=64, dt=torch.bfloat16, time=True, compiled=False):
    global bad
    torch.manual_seed(0)
    q = torch.randn(1, H, L, D, device='cuda', dtype=dt, requires_grad=True)
    K = torch.randn(1, H, P + L, D, device='cuda', dtype=dt, requires_grad=True)
    V = torch.randn(1, H, P + L, D, device='cuda', dtype=dt, requires_grad=True)
    do = torch.randn(1, H, L, D, device='cuda', dtype=dt)
    ref = lambda: F.scaled_dot_product_attention(q, K, V, attn_mask=causal_lower_right(L, P + L))
    split = lambda: C.PrefixCausalAttention.apply(q, K[:, :, :P].contiguous(), V[:, :, :P].contiguous(),
                                                  K[:, :, P:].contiguous(), V[:, :, P:].contiguous())
    args = lambda q, K, V: C.PrefixCausalAttention.apply(q, K[:, :, :P].contiguous(), V[:, :, :P].contiguous(),
                                                         K[:, :, P:].contiguous(), V[:, :, P:].contiguous())
    o_r = ref(); g_r = torch.autograd.grad(o_r, (q, K, V), do)
    for cud in (True, False):
        C.CUDNN = cud
        fs = [('eager', split)]
        if compiled:
            fs += [('compiled (args)', lambda c=torch.compile(args): c(q, K, V)), ('compiled (closure)', torch.compile(split))]
        for name, f in fs:
            tag = f"L={L} P={P} {'cudnn' if cud else 'fa2'} {name}"
            try:
                o = f(); g = torch.autograd.grad(o, (q, K, V), do)
                errs = [rel(o, o_r)] + [rel(a, b) for a, b in zip(g, g_r)]
                print(f"{tag}: o {errs[0]:.1e} dq {errs[1]:.1e} dK {errs[2]:.1e} dV {errs[3]:.1e}", flush=True)
                if cud and max(errs) > 2e-2 and 'closure' not in name:
                    bad = True
            except Exception as e:
                print(f"{tag}: {type(e).__name__}: {str(e)[:400]}", flush=True)
                if cud and 'closure' not in name:
                    bad = True
        torch._dynamo.reset()
    if not time:
        return
    def fb(f, *xs):
        def run():
            o = f(); torch.autograd.grad(o, xs, do if o.shape == do.shape else torch.ones_like(o))
        return run
    qf = torch.randn(1, H, P + L, D, device='cuda', dtype=dt, requires_grad=True)
    for cud in (True, False):
        C.CUDNN = cud
        print(f"L={L} P={P} {'cudnn' if cud else 'fa2'} split: fwd+bwd {do_bench(fb(split, q, K, V), rep=100):.1f} ms",
              flush=True)
    print(f"L={L} P={P} lower-right sdpa: fwd+bwd {do_bench(fb(ref, q, K, V), rep=100):.1f} ms", flush=True)
    whole = lambda: F.scaled_dot_product_attention(qf, K, V, is_causal=True)
    print(f"whole causal {P + L}: fwd+bwd {do_bench(fb(whole, qf, K, V), rep=100):.1f} ms", flush=True)
    C.CUDNN = True


case(256, 512, time=False, compiled=True)
case(200, 136, time=False)          # not multiples of 64/128
case(24576, 73728)                  # balanced layout at 98,304 over 2 ranks: rank 0's piece 3
print("cuDNN split", "FAILED" if bad else "ok")
sys.exit(1 if bad else 0)
