# An experiment: a Triton GEMV for one-token linears (x [M <= 8, K] @ W [N, K]^T + b, fp32 accumulation), as a
# torch custom op, so that a compiled decode step calls it inside its CUDA graph. Not in kernels.py until measured.
import torch
import triton
import triton.language as tl

CONFIGS = [triton.Config(dict(BN=bn, BK=bk), num_warps=w) for bn, bk, w in
           [(2, 512, 2), (4, 256, 2), (4, 512, 4), (8, 256, 4), (8, 512, 4), (16, 128, 4), (16, 256, 8), (32, 128, 8)]]


@triton.autotune(CONFIGS, key=['M', 'N', 'K'])
@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, swn, sym, HAS_B: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
    # PDL (programmatic dependent launch, Hopper): the weights' first tile is read before waiting for the previous
    # kernel (they are not its output), and the next kernel may start its own prologue as soon as this one runs
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    w = tl.load(w_ptr + rn[:, None] * swn + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(x_ptr + rm[:, None] * sxm + (k0 + rk)[None, :], mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
        kn = k0 + BK + rk
        w = tl.load(w_ptr + rn[:, None] * swn + kn[None, :], mask=(rn[:, None] < N) & (kn[None, :] < K), other=0.0)
    if HAS_B:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


PDL = False  # set by the experiment


@torch.library.custom_op("gemv_exp::gemv", mutates_args=())
def gemv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    M, K = x2.shape
    N = w.shape[0]
    y = x2.new_empty(M, N)
    BM = max(1, triton.next_power_of_2(M))
    _gemv_kernel[lambda meta: (triton.cdiv(N, meta['BN']),)](x2, w, b if b is not None else w, y, M, N, K,
                                                             x2.stride(0), w.stride(0), y.stride(0), HAS_B=b is not None, BM=BM,
                                                             PDL=PDL, **(dict(launch_pdl=True) if PDL else {}))
    return y.view(*x.shape[:-1], N)


@gemv.register_fake
def _(x, w, b):
    return x.new_empty(*x.shape[:-1], w.shape[0])


def triton_linear(x, w, b=None, _linear=torch.nn.functional.linear):
    """F.linear, through the GEMV for at most 8 rows of x (under autocast: x, w, b in its dtype, as F.linear's)"""
    if x.numel() > 8 * x.shape[-1] or x.device.type != 'cuda' or not w.is_contiguous():
        return _linear(x, w, b)
    if torch.is_autocast_enabled('cuda'):
        dt = torch.get_autocast_dtype('cuda')
        x, w, b = x.to(dt), w.to(dt), None if b is None else b.to(dt)
    return gemv(x, w, b)
