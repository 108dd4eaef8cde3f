"""
Context parallelism: one sequence split over N ranks (train.py --context_parallel=N).

Rank r of a group of N holds tokens [r·L, (r+1)·L) of every row (L = T / N, contiguous pieces); the rest of the model
(embeddings, MLPs, norms, the projections) is per token and needs nothing from the other pieces. What crosses a piece
boundary, and how it crosses:

  linear mixers   every recurrence here is affine in its state: over a piece S_end = M·S_0 + S_local, where
                  S_local is the end state from S_0 = 0 and M (d_k × d_k) the product of the per-token maps
                  A_t = (I − β_t k_t k_tᵀ)·Diag(exp g_t) (the delta rule) or exp(g_t) (scalar / per-channel decay).
                  Each rank computes its (S_local, M), ONE all-gather gives every rank all of them, and each folds
                  its predecessors' in fp32 (h ← M_j·h + S_j) into its true initial state h_r. Its outputs are those
                  from a zero start plus h_r's part, o_t += (P_tᵀ q_t)ᵀ h_r with P_t = A_t ⋯ A_1: for the delta rule
                  P_tᵀ q_t (and M = P_L) come from the same kernel run with v = 0 and S_0 = I; for the decays
                  P_t = exp(Σ_{s≤t} g_s) is a cumulative sum. (fla's fla/ops/cp and LASP-2 pass states the same way.)
  short convs     the last W − 1 = 3 raw inputs of the previous piece (a halo), passed as the conv's `initial`
  softmax         K and V of every piece (all-gathered); a query at global position r·L + i sees keys ≤ r·L + i
  RoPE, documents global positions; document starts seen across the boundary (GPT.documents)
  the loss        N × (this piece's summed token losses) / (the group's token count): averaged over the ranks,
                  which is what DDP does to gradients and train.py's eval to losses, it is the mean over every
                  token, exactly as one process computes it

Every exchange is an all-gather from torch.distributed's functional collectives, which autograd differentiates (its
backward is a reduce-scatter: each rank gets the gradients of the copies of its tensor). All ranks must therefore run
the same collectives in the same order in the forward AND the backward: rank 0, whose initial state is zero and
which has no halo, still takes its share from the gathered tensors (zeroed), so its backward meets the others'.
"""

import torch
import torch.nn.functional as F
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import kernels

# differentiable all-gather along dim 0 (its backward a reduce-scatter); renamed in torch 2.13, the old name kept for 2.11
_all_gather = getattr(fc, 'all_gather_single_autograd', None) or fc.all_gather_tensor_autograd


class ContextParallel:
    """The N ranks that share each row's sequence: `group` (a torch.distributed process group of N ranks, in piece
    order) and this rank's place in it."""

    def __init__(self, group, rank, size):
        if size < 2:
            raise ValueError(f"context parallelism needs at least 2 ranks in its group, got {size}")
        self.group, self.rank, self.size = group, rank, size

    def __repr__(self):
        return f"ContextParallel(rank {self.rank} of {self.size})"

    def offset(self, L):
        """Global position of this rank's first token, its pieces being L tokens long."""
        return self.rank * L

    def gather(self, x):
        """[N, *x.shape]: x of every rank of the group, in piece order; differentiable."""
        return _all_gather(x.contiguous(), 0, self.group).view(self.size, *x.shape)

    def gather_tokens(self, x, dim):
        """x of every rank concatenated along its token dimension `dim` (the whole sequence); differentiable."""
        xs = self.gather(x.movedim(dim, 0))                         # [N, L, ...]
        return xs.flatten(0, 1).movedim(0, dim)

    def previous(self, x):
        """The previous rank's x (zeros on rank 0); differentiable. Every rank gathers, rank 0 included (see top)."""
        prev = self.gather(x)[(self.rank - 1) % self.size]
        return prev.masked_fill(torch.tensor(self.rank == 0, device=x.device), 0)

    def initial_state(self, S, M, apply):
        """This rank's initial state (fp32): Σ_{j<r} M_{r−1}⋯M_{j+1}·S_j, from every rank's end state from zero S
        [B, H, d_k, d_v] and transition M; apply(M_j, h) = M_j·h. All N starts are formed on every rank and this
        rank's is picked, so that each rank's backward reaches the all-gather (see top)."""
        Ss, Ms = self.gather(S.float()), self.gather(M.float())
        h = torch.zeros_like(Ss[0])
        starts = [h]
        for j in range(self.size - 1):
            h = apply(Ms[j], h) + Ss[j]
            starts.append(h)
        return torch.stack(starts)[self.rank]

    def total(self, x):
        """x summed over the group (no gradient): token counts."""
        return fc.all_reduce(x.detach(), 'sum', self.group)


# ---------------------------------------------------------------------------------------------------------------------
# The linear mixers' recurrences (model.scan's calls, split over the group)

def delta_rule(cp, q, k, v, beta, g=None, scale=None, path='auto', **gate):
    """kernels.delta_rule over this rank's piece of a sequence split over cp's group -> o [B, L, H, d_v]."""
    o, S = kernels.delta_rule(q, k, v, beta, g, scale=scale, output_final_state=True, path=path, **gate)
    B, L, H, dk = k.shape
    eye = torch.eye(dk, device=k.device, dtype=torch.float32).expand(B, H, dk, dk).contiguous()
    # the same recurrence with v = 0 from S_0 = I: its outputs are P_tᵀ q_t, its end state M = P_L
    qP, M = kernels.delta_rule(q, k, torch.zeros_like(k), beta, g, scale=scale, initial_state=eye,
                               output_final_state=True, path=path, **gate)
    h0 = cp.initial_state(S, M, lambda M, h: M @ h)
    return (o.float() + torch.einsum('bthk,bhkv->bthv', qP.float(), h0)).to(o.dtype)


def linear_attn(cp, q, k, v, g=None, scale=None, path='auto', dt=None, D=None):
    """kernels.linear_attn (scalar decay g [H] or [B, T, H]; per-channel [B, T, H, d_k]) over this rank's piece of a
    sequence split over cp's group -> o [B, L, H, d_v]. q, k may have one head shared by all (Mamba2)."""
    ssd = {} if dt is None else dict(dt=dt, D=D)
    o, S = kernels.linear_attn(q, k, v, g, scale=scale, output_final_state=True, path=path, **ssd)
    B, L, H = v.shape[:3]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if g is None:
        g = q.new_zeros(H, dtype=torch.float32)
    if g.dim() == 1:  # a constant per head (RetNet): Σ_{s≤t} g_s = (t + 1)·g
        G = torch.arange(1, L + 1, device=q.device, dtype=torch.float32)[:, None] * g.float()   # [L, H]
        G = G.expand(B, L, H)
    else:
        G = g.float().cumsum(dim=1)                                  # [B, L, H] or [B, L, H, d_k]
    decay = G.exp() if G.dim() == 4 else G.exp()[..., None]          # P_t, as a factor of q's channels
    M = decay[:, -1]                                                 # [B, H, 1] or [B, H, d_k]
    qP = scale * q.float() * decay                                   # [B, L, H, d_k]
    h0 = cp.initial_state(S, M, lambda M, h: M[..., None] * h)
    return (o.float() + torch.einsum('bthk,bhkv->bthv', qP, h0)).to(o.dtype)


# ---------------------------------------------------------------------------------------------------------------------
# Softmax attention over the whole sequence's keys

def _flash(q, k, v, causal):
    """(o, lse, state for _flash_bwd): PyTorch's flash-attention forward (bf16/fp16 on CUDA; its CPU kernel on CPU)."""
    if q.is_cuda:
        o, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        return o, lse, (cq, ck, mq, mk, seed, offset)
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return o, lse, None


def _flash_bwd(do, q, k, v, o, lse, causal, state):
    if q.is_cuda:
        cq, ck, mq, mk, seed, offset = state
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(do, q, k, v, o, lse, cq, ck, mq, mk, 0.0,
                                                                           causal, seed, offset)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, causal)


class PrefixCausalAttention(torch.autograd.Function):
    """Attention of queries q [B, h, L, d] over every key of the earlier pieces (k_pre, v_pre [B, h, P, d], no mask)
    and causally over their own piece's (k, v [B, h, L, d]): two flash calls merged by their log-sum-exps,
    o = Σ_j exp(lse_j − lse)·o_j, lse = log Σ_j exp(lse_j). The backward runs flash's backward on each part with the
    MERGED o and lse (its softmax weights exp(s − lse) and rowsum(dO ∘ O) are then the whole row's), as ring
    attention does; dq is the sum of the parts'. As fast as one SDPA call with a lower-right causal mask over P + L
    keys, and the CP run of the 124M hybrid at 98,304 tokens held 36.8 GiB per GPU with it against 41.6 with that
    mask (notes/perf.md, issue 43)."""

    @staticmethod
    def forward(ctx, q, k_pre, v_pre, k, v):
        o1, lse1, st1 = _flash(q, k_pre, v_pre, False)
        o2, lse2, st2 = _flash(q, k, v, True)
        lse = torch.logaddexp(lse1, lse2)
        L = q.size(2)
        w1, w2 = ((l - lse)[..., :L, None].exp() for l in (lse1, lse2))
        o = (o1.float() * w1 + o2.float() * w2).to(q.dtype)
        ctx.save_for_backward(q, k_pre, v_pre, k, v, o, lse)
        ctx.states = (st1, st2)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k_pre, v_pre, k, v, o, lse = ctx.saved_tensors
        do = do.contiguous()
        dq1, dk_pre, dv_pre = _flash_bwd(do, q, k_pre, v_pre, o, lse, False, ctx.states[0])
        dq2, dk, dv = _flash_bwd(do, q, k, v, o, lse, True, ctx.states[1])
        return dq1 + dq2, dk_pre, dv_pre, dk, dv


def attention(cp, q, k, v, enable_gqa=False, docs=None):
    """Causal attention of this rank's queries q [B, h, L, hs] over the keys and values of its own and every earlier
    piece (k, v [B, h_kv, L, hs], gathered): query i sees keys ≤ r·L + i. docs: GPT.documents' dict under context
    parallelism ('cp_mask' [B, 1, L, (r+1)·L] bool or 'cp_block_mask')."""
    L, r = q.size(2), cp.rank
    K = cp.gather_tokens(k, 2)[:, :, :(r + 1) * L]
    V = cp.gather_tokens(v, 2)[:, :, :(r + 1) * L]
    flash_ok = (q.dtype in (torch.float16, torch.bfloat16)) if q.is_cuda else q.dtype == torch.float32
    if docs is None and r > 0 and flash_ok:
        if enable_gqa:
            K = K.repeat_interleave(q.size(1) // K.size(1), dim=1)
            V = V.repeat_interleave(q.size(1) // V.size(1), dim=1)
        P = r * L
        return PrefixCausalAttention.apply(q.contiguous(), K[:, :, :P].contiguous(), V[:, :, :P].contiguous(),
                                           K[:, :, P:].contiguous(), V[:, :, P:].contiguous())
    if docs is not None:
        if 'cp_block_mask' in docs:
            from torch.nn.attention.flex_attention import flex_attention
            return flex_attention(q, K, V, block_mask=docs['cp_block_mask'], enable_gqa=enable_gqa)
        return F.scaled_dot_product_attention(q, K, V, attn_mask=docs['cp_mask'], enable_gqa=enable_gqa)
    if r == 0:
        return F.scaled_dot_product_attention(q, K, V, is_causal=True, enable_gqa=enable_gqa)
    if enable_gqa:  # the lower-right causal bias takes equal head counts
        K = K.repeat_interleave(q.size(1) // K.size(1), dim=1)
        V = V.repeat_interleave(q.size(1) // V.size(1), dim=1)
    from torch.nn.attention.bias import causal_lower_right
    return F.scaled_dot_product_attention(q, K, V, attn_mask=causal_lower_right(L, K.size(2)))


# ---------------------------------------------------------------------------------------------------------------------
# Documents and the loss

def documents(cp, idx, eot_token, block_mask_fn=None):
    """GPT.documents for this rank's piece idx [B, L] of rows split over cp's group: document starts (the row's
    first token, and every EOT) at GLOBAL positions, seen across the piece boundaries. -> (reset, conv_pos, doc ids
    of this piece's queries [B, L] and of the keys of every piece up to this one [B, (r+1)·L]) — see GPT.documents."""
    B, L = idx.shape
    t = torch.arange(L, device=idx.device) + cp.offset(L)            # global positions
    start = (idx == eot_token) | (t == 0)
    # the conv's window reaches 3 tokens back: the previous piece's last 3 starts decide the first tokens' positions
    prev = cp.previous(start[:, -3:].to(torch.uint8)).bool() if L >= 3 else None
    if prev is None:
        raise ValueError(f"documents under context parallelism need pieces of at least 3 tokens, got {L}")
    ext = torch.cat([prev, start], dim=1)                            # [B, 3 + L]
    te = torch.arange(-3, L, device=idx.device)
    first = torch.where(ext, te, -4).cummax(dim=1).values[:, 3:]     # local position of each token's document start
    conv_pos = (torch.arange(L, device=idx.device) - first).clamp(max=3).to(torch.uint8)
    # document ids: starts counted from the row's beginning, over every piece
    counts = cp.gather(start.sum(dim=1, dtype=torch.int32))          # [N, B]
    before = counts[:cp.rank].sum(dim=0, dtype=torch.int32)  # (zeros on rank 0; int32 on every rank)
    doc = start.cumsum(dim=1, dtype=torch.int32) + before[:, None]   # [B, L]
    keys = cp.gather_tokens(doc, 1)[:, :(cp.rank + 1) * L]           # [B, (r+1)·L]
    return start & (t > 0), conv_pos, doc, keys


def loss(cp, logits, targets):
    """Cross-entropy of this rank's piece (targets −1 ignored), as its share of the group's mean times N (see top)."""
    total = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                            ignore_index=-1, reduction='sum')
    count = cp.total((targets != -1).sum().float())
    return total * cp.size / count
