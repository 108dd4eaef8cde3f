"""
All sequence-mixing math of the linear mixers behind one small API.

Two families (per head; state S is [Dk, Dv], key-major, so the readout is S^T q):

  scalar-decay linear attention (plain linear attention, RetNet, Mamba2/SSD)
      S_t = exp(g_t) * S_{t-1} + k_t v_t^T                      o_t = scale * S_t^T q_t
  delta rule (DeltaNet, Gated DeltaNet, KDA): decay first, then delta-correct against the decayed state
      S~  = Diag(exp g_t) S_{t-1}
      S_t = S~ + beta_t k_t (v_t - S~^T k_t)^T  = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T
                                                                o_t = scale * S_t^T q_t

Layout: activations [B, T, H, D]; recurrent state [B, H, Dk, Dv] in fp32. g is a log-decay (g <= 0).

    linear_attn(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False) -> (o, final_state | None)
        q, k [B, T, Hk, Dk], v [B, T, H, Dv], H % Hk == 0 (head h reads q/k head h // (H // Hk): Mamba2's
        shared B/C); g None | [H] (constant per head, RetNet; not differentiated) | [B, T, H] (Mamba2's dt*A)
    linear_attn_step(q, k, v, g, state, scale=None) -> o
        one token: q, k [B, Hk, Dk], v [B, H, Dv], g None | [H] | [B, H]; updates state in place; o [B, H, Dv]
    delta_rule(q, k, v, beta, g=None, scale=None, initial_state=None, output_final_state=False) -> (o, final_state | None)
        q, k [B, T, H, Dk] (L2-normalised by the caller), v [B, T, H, Dv], beta [B, T, H],
        g None (DeltaNet) | [B, T, H] (Gated DeltaNet) | [B, T, H, Dk] (KDA, per key channel)
    delta_rule_step(q, k, v, beta, g, state, scale=None) -> o
        one token: q, k [B, H, Dk], v [B, H, Dv], beta [B, H], g None | [B, H] | [B, H, Dk]; state in place

scale defaults to Dk ** -0.5. Outputs come back in v's dtype; states are fp32 (fp64 if the inputs are fp64),
an initial state must be fp32 or fp64. Every call has three paths with the same meaning:
  *_recurrent   token-by-token loop, fp32 (fp64 stays fp64), autograd: the reference the tests trust
  *_chunked     chunkwise-parallel torch version (mixers.md §4.1, §4.3), autograd: CPU training and prefill
                (chunk 64; 16 for per-key-channel gates, where the exact pairwise decays cost C*Dk per token)
  Triton        not written yet; on CUDA the chunked torch path runs for now, and the log says so.
The public calls pick the path from the device and print it once per (function, path). Set the environment
variable KERNELS_PATH=recurrent|chunked to force a path (debugging).

Tests: python -m pytest test_kernels.py -q
"""

import os

import torch
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# argument checks (shared by every path; a wrong shape fails here with its name, not deep inside an einsum)

def _fail(name, msg):
    raise ValueError(f"{name}: {msg}")

def _shape(x):
    return tuple(x.shape)

def _check_state(name, state, B, H, Dk, Dv, what):
    if state is None:
        return
    if _shape(state) != (B, H, Dk, Dv):
        _fail(name, f"{what} must be [B, H, Dk, Dv] = {(B, H, Dk, Dv)}, got {_shape(state)}")
    if state.dtype not in (torch.float32, torch.float64):
        _fail(name, f"{what} must be float32 (or float64), got {state.dtype}")

def _check_linear_attn(name, q, k, v, g, state, step=False):
    nd = 3 if step else 4
    layout = "[B, Hk, Dk]" if step else "[B, T, Hk, Dk]"
    for x, n in ((q, "q"), (k, "k"), (v, "v")):
        if x.ndim != nd:
            _fail(name, f"{n} must have {nd} dims, got shape {_shape(x)}")
        if not x.is_floating_point():
            _fail(name, f"{n} must be a floating-point tensor, got {x.dtype}")
    if q.shape != k.shape:
        _fail(name, f"q and k must have the same shape {layout}, got {_shape(q)} and {_shape(k)}")
    if v.shape[:-2] != q.shape[:-2]:
        _fail(name, f"v {_shape(v)} must share the leading dims {_shape(q)[:-2]} of q and k")
    Hk, Dk, H, Dv = q.shape[-2], q.shape[-1], v.shape[-2], v.shape[-1]
    if H % Hk:
        _fail(name, f"v has H={H} heads, which is not a multiple of the Hk={Hk} q/k heads")
    lead = tuple(v.shape[:-2])  # (B,) or (B, T)
    if g is not None and _shape(g) not in ((H,), lead + (H,)):
        _fail(name, f"g must be None, [H] = {(H,)} or {lead + (H,)}, got {_shape(g)}")
    if step and state is None:
        _fail(name, "state [B, H, Dk, Dv] is required")
    _check_state(name, state, v.shape[0], H, Dk, Dv, "state" if step else "initial_state")

def _check_delta_rule(name, q, k, v, beta, g, state, step=False):
    nd = 3 if step else 4
    for x, n in ((q, "q"), (k, "k"), (v, "v")):
        if x.ndim != nd:
            _fail(name, f"{n} must have {nd} dims, got shape {_shape(x)}")
        if not x.is_floating_point():
            _fail(name, f"{n} must be a floating-point tensor, got {x.dtype}")
    if q.shape != k.shape:
        _fail(name, f"q and k must have the same shape, got {_shape(q)} and {_shape(k)}")
    if v.shape[:-1] != q.shape[:-1]:
        _fail(name, f"v {_shape(v)} must share the leading dims {_shape(q)[:-1]} of q and k (no head sharing here)")
    lead, Dk, Dv = tuple(q.shape[:-1]), q.shape[-1], v.shape[-1]  # lead = (B, T, H) or (B, H)
    if _shape(beta) != lead:
        _fail(name, f"beta must have shape {lead}, got {_shape(beta)}")
    if g is not None and _shape(g) not in (lead, lead + (Dk,)):
        _fail(name, f"g must be None, {lead} (scalar per head) or {lead + (Dk,)} (per key channel), got {_shape(g)}")
    if step and state is None:
        _fail(name, "state [B, H, Dk, Dv] is required")
    _check_state(name, state, q.shape[0], q.shape[-2], Dk, Dv, "state" if step else "initial_state")

def _compute_dtype(x):
    # fp64 inputs stay fp64 (tight tests); everything else (bf16, fp16, fp32) computes in fp32
    return torch.float64 if x.dtype == torch.float64 else torch.float32

def _expand_heads(x, H):
    """[B, T, Hk, D] -> [B, T, H, D]: head h reads q/k head h // (H // Hk) (group sharing)."""
    return x if x.shape[2] == H else x.repeat_interleave(H // x.shape[2], dim=2)

def _scalar_gate(g, B, T, H, dtype, device):
    """None | [H] | [B, T, H] -> [B, T, H] log-decays. A constant [H] gate is not differentiated (RetNet)."""
    if g is None:
        return torch.zeros(B, T, H, dtype=dtype, device=device)
    if g.ndim == 1:
        return g.detach().to(dtype).expand(B, T, H)
    return g.to(dtype)

# -----------------------------------------------------------------------------
# reference recurrences: one token at a time, fp32 (fp64 stays fp64), differentiable by autograd
#   linear attention:  S_t = exp(g_t) S_{t-1} + k_t v_t^T;                            o_t = s S_t^T q_t
#   delta rule:        S~ = Diag(exp g_t) S_{t-1};  S_t = S~ + beta_t k_t (v_t - S~^T k_t)^T;  o_t = s S_t^T q_t

def linear_attn_recurrent(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False):
    _check_linear_attn("linear_attn", q, k, v, g, initial_state)
    B, T, H, Dv = v.shape
    Dk, dt = q.shape[-1], _compute_dtype(q)
    scale = Dk ** -0.5 if scale is None else scale
    qf, kf, vf = _expand_heads(q, H).to(dt), _expand_heads(k, H).to(dt), v.to(dt)
    a = _scalar_gate(g, B, T, H, dt, q.device).exp()  # per-step decay in [0, 1]
    S = torch.zeros(B, H, Dk, Dv, dtype=dt, device=q.device) if initial_state is None else initial_state.to(dt)
    o = []
    for t in range(T):
        S = a[:, t, :, None, None] * S + kf[:, t, :, :, None] * vf[:, t, :, None, :]
        o.append(scale * torch.einsum("bhk,bhkv->bhv", qf[:, t], S))
    return torch.stack(o, dim=1).to(v.dtype), (S if output_final_state else None)

def delta_rule_recurrent(q, k, v, beta, g=None, scale=None, initial_state=None, output_final_state=False):
    _check_delta_rule("delta_rule", q, k, v, beta, g, initial_state)
    B, T, H, Dk = q.shape
    Dv, dt = v.shape[-1], _compute_dtype(q)
    scale = Dk ** -0.5 if scale is None else scale
    qf, kf, vf, bf = q.to(dt), k.to(dt), v.to(dt), beta.to(dt)
    # decay multiplies the rows of S: [B, T, H, 1, 1] for a scalar gate, [B, T, H, Dk, 1] per key channel
    a = None if g is None else (g.to(dt).exp()[..., None, None] if g.ndim == 3 else g.to(dt).exp()[..., None])
    S = torch.zeros(B, H, Dk, Dv, dtype=dt, device=q.device) if initial_state is None else initial_state.to(dt)
    o = []
    for t in range(T):
        if a is not None:
            S = a[:, t] * S
        err = vf[:, t] - torch.einsum("bhk,bhkv->bhv", kf[:, t], S)  # what the decayed memory gets wrong
        S = S + kf[:, t, :, :, None] * (bf[:, t, :, None] * err)[:, :, None, :]
        o.append(scale * torch.einsum("bhk,bhkv->bhv", qf[:, t], S))
    return torch.stack(o, dim=1).to(v.dtype), (S if output_final_state else None)

# -----------------------------------------------------------------------------
# chunked torch paths (mixers.md §4). Time is cut into chunks of C tokens; inside a chunk G_r = Σ_{j<=r} g_j is
# the chunk-local cumulative log-decay (restarts every chunk, so it stays bounded for any T), Γ_r = exp(G_r), and n
# is the chunk's last row. Only exp(G_r - G_i) with r >= i (a segment sum, see _causal_decay), exp(G_r) and
# exp(G_n - G_r) are used: never the exp of a positive number. Everything is fp32 (fp64 for fp64 inputs).
# The last chunk is zero-padded (q = k = v = beta = g = 0), which is exact: padded keys write nothing and padded
# gates decay nothing, so the padded chunk ends with the state of the last real token.
#
#   scalar decay, D_ri = exp(G_r - G_i)[r >= i]:
#     O     = s (Diag(Γ) Q S + ((Q K^T) ⊙ D) V)
#     S_new = Γ_n S + K^T Diag(exp(G_n - G)) V
#   delta rule, WY/UT form (G per key channel; scalar gates broadcast, DeltaNet has G = 0):
#     L_ri  = beta_r Σ_c k_rc k_ic exp(G_rc - G_ic)  (i < r),   A = (I + L)^{-1}   (unit lower triangular)
#     U     = A Diag(beta) V,   W = A Diag(beta) (K ⊙ Γ)                             (parallel over chunks)
#     Δ     = U - W S                                                                (sequential over chunks)
#     O     = s (Q ⊙ Γ) S + Tril(P) Δ,   P_ri = s Σ_c q_rc k_ic exp(G_rc - G_ic)  (i <= r)
#     S_new = Diag(Γ_n) S + (K ⊙ exp(G_n - G))^T Δ

def _to_chunks(x, C, dtype):
    """[B, T, H, *rest] -> [B, H, N, C, *rest] in dtype, zero-padded at the end of T to N*C tokens."""
    B, T, H = x.shape[:3]
    rest = tuple(x.shape[3:])
    N = -(-T // C)
    x = x.to(dtype).movedim(1, 2)  # [B, H, T, *rest]
    if N * C != T:
        x = F.pad(x, (0, 0) * len(rest) + (0, N * C - T))
    return x.reshape(B, H, N, C, *rest)

def _from_chunks(o, T):
    """[B, H, N, C, D] -> [B, T, H, D], dropping the padding."""
    B, H, N, C, D = o.shape
    return o.reshape(B, H, N * C, D)[:, :, :T].transpose(1, 2).contiguous()

def _chunk_gates(g, B, T, H, C, dtype, device):
    """Gates -> per-chunk log-decays [B, H, N, C, 1] (none or scalar per token) or [B, H, N, C, Dk] (per key channel)."""
    if g is None or g.ndim <= 3:
        return _to_chunks(_scalar_gate(g, B, T, H, dtype, device), C, dtype)[..., None]
    return _to_chunks(g, C, dtype)

def _causal_decay(g):
    """Decays between the positions of one chunk: g [..., C, 1|Dk] -> D [..., C(r), C(i), 1|Dk],
    D_ri = exp(G_r - G_i) = exp(Σ_{i<j<=r} g_j) for i <= r. Above the diagonal the segment is empty and D is 1
    (finite): callers mask the [C, C] scores with tril, which is cheaper than masking D, and since there is
    never an exp of a positive number there is no inf and no 0 * inf = NaN in the backward (mixers.md §7 #1).
    The exponent is a segment sum, not the difference of two cumsums: after a -1000 gate G is ~ -6e4, where one
    fp32 ulp is 0.004, and G_r - G_i would carry that error into every later decay of the chunk (measured: 4e-4
    relative output error, vs 2e-7 this way). The segment sums come from one matmul with the constant 0/1 matrix
    M[(r, i), j] = [i < j <= r] (sums of same-sign terms; 3-5x faster on CPU than a cumsum over the expanded
    tensor). Per key channel D is C*C*Dk per chunk, so the cost per token grows with C (see delta_rule)."""
    C = g.shape[-2]
    r, i, j = (torch.arange(C, device=g.device).view(shape) for shape in ((C, 1, 1), (1, C, 1), (1, 1, C)))
    M = ((i < j) & (j <= r)).to(g.dtype).view(C * C, C)
    # fp64 on CUDA: train scripts enable TF32 matmuls, which would round the exponents to 10 bits
    seg = (M.double() @ g.double()).to(g.dtype) if g.is_cuda else M @ g  # [..., C*C, 1|Dk]
    return seg.unflatten(-2, (C, C)).exp()

def linear_attn_chunked(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    _check_linear_attn("linear_attn", q, k, v, g, initial_state)
    B, T, H, Dv = v.shape
    Dk, dt = q.shape[-1], _compute_dtype(q)
    scale = Dk ** -0.5 if scale is None else scale
    C = min(chunk_size, T)
    Q, K = _to_chunks(_expand_heads(q, H), C, dt), _to_chunks(_expand_heads(k, H), C, dt)  # [B, H, N, C, Dk]
    V = _to_chunks(v, C, dt)  # [B, H, N, C, Dv]
    g = _chunk_gates(g, B, T, H, C, dt, q.device)  # [B, H, N, C, 1]
    D = _causal_decay(g)  # [B, H, N, C, C, 1]
    Gamma = g.cumsum(-2).exp()  # [B, H, N, C, 1] decay from the chunk start; Gamma[..., -1, :] over the whole chunk
    # parallel over chunks: the intra-chunk outputs and what each chunk adds to the state
    intra = ((Q @ K.mT) * D[..., 0]).tril() @ V  # [B, H, N, C, Dv]
    local = (K * D[..., -1, :, :]).mT @ V  # [B, H, N, Dk, Dv]; D's last row is exp(G_n - G_i)
    # sequential over chunks, cheap: S_start(n+1) = Γ_n S_start(n) + local_n
    S = torch.zeros(B, H, Dk, Dv, dtype=dt, device=q.device) if initial_state is None else initial_state.to(dt)
    starts = []
    # unbind, not local[:, :, n]: the backward of each index op would zero-fill a full-size gradient (O(N^2))
    for decay, add in zip(Gamma[..., -1:, :].unbind(2), local.unbind(2)):  # [B, H, 1, 1], [B, H, Dk, Dv]
        starts.append(S)
        S = decay * S + add
    S0 = torch.stack(starts, dim=2)  # [B, H, N, Dk, Dv] chunk-start states
    O = scale * ((Q * Gamma) @ S0 + intra)
    return _from_chunks(O, T).to(v.dtype), (S if output_final_state else None)

def delta_rule_chunked(q, k, v, beta, g=None, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    _check_delta_rule("delta_rule", q, k, v, beta, g, initial_state)
    B, T, H, Dk = q.shape
    Dv, dt = v.shape[-1], _compute_dtype(q)
    scale = Dk ** -0.5 if scale is None else scale
    C = min(chunk_size, T)
    Q, K, V = _to_chunks(q, C, dt), _to_chunks(k, C, dt), _to_chunks(v, C, dt)  # [B, H, N, C, Dk|Dv]
    b = _to_chunks(beta, C, dt)[..., None]  # [B, H, N, C, 1]
    g = _chunk_gates(g, B, T, H, C, dt, q.device)  # [B, H, N, C, 1|Dk]
    Gamma = g.cumsum(-2).exp()  # [B, H, N, C, 1|Dk] decay from the chunk start
    # parallel over chunks: key-key and query-key scores with their decays, i <= r
    D = _causal_decay(g)  # [B, H, N, C, C, 1|Dk]
    if g.shape[-1] == 1:  # none or scalar gate: the decay factors out of the dot products
        KK, QK = (K @ K.mT) * D[..., 0], (Q @ K.mT) * D[..., 0]
    else:  # per key channel: the decay sits inside the sum over c
        Kdec = D * K[:, :, :, None]  # [B, H, N, C(r), C(i), Dk]: k_ic exp(G_rc - G_ic)
        KK, QK = (Kdec @ torch.stack((K, Q), dim=-1)).unbind(-1)  # [B, H, N, C(r), C(i)] each
    L, QK = (b * KK).tril(-1), QK.tril()
    # UT transform: solve (I + L) [U W] = Diag(beta) [V, K ⊙ Γ] rather than forming A = (I + L)^{-1}
    eye = torch.eye(C, dtype=dt, device=q.device)
    UW = torch.linalg.solve_triangular(eye + L, b * torch.cat((V, K * Gamma), dim=-1), upper=False, unitriangular=True)
    U, W = UW.split((Dv, Dk), dim=-1)  # [B, H, N, C, Dv], [B, H, N, C, Dk]
    Kd = K * D[..., -1, :, :]  # keys decayed to the chunk end, exp(G_n - G_i)
    # sequential over chunks: Δ = U - W S needs the state at the chunk start (fp32 or fp64, never lower)
    S = torch.zeros(B, H, Dk, Dv, dtype=dt, device=q.device) if initial_state is None else initial_state.to(dt)
    starts, deltas = [], []
    # unbind, not U[:, :, n]: the backward of each index op would zero-fill a full-size gradient (O(N^2))
    for u, w, kd, decay in zip(U.unbind(2), W.unbind(2), Kd.unbind(2), Gamma[..., -1:, :].mT.unbind(2)):
        starts.append(S)
        delta = u - w @ S  # [B, H, C, Dv] the corrections actually written
        deltas.append(delta)
        S = decay * S + kd.mT @ delta  # decay the rows of S ([B, H, 1|Dk, 1]), then write
    S0, Delta = torch.stack(starts, dim=2), torch.stack(deltas, dim=2)  # [B, H, N, Dk, Dv], [B, H, N, C, Dv]
    O = scale * ((Q * Gamma) @ S0 + QK @ Delta)
    return _from_chunks(O, T).to(v.dtype), (S if output_final_state else None)

# -----------------------------------------------------------------------------
# decode steps: one token, the state [B, H, Dk, Dv] (fp32) is updated in place; same equations as the recurrences

def linear_attn_step(q, k, v, g, state, scale=None):
    _check_linear_attn("linear_attn_step", q, k, v, g, state, step=True)
    H, dt = v.shape[1], state.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = _expand_heads(q[:, None], H)[:, 0].to(dt), _expand_heads(k[:, None], H)[:, 0].to(dt)  # [B, H, Dk]
    if g is not None:
        state.mul_(g.to(dt).exp().expand(v.shape[:2])[:, :, None, None])  # [H] or [B, H] -> [B, H, 1, 1]
    state.add_(k[:, :, :, None] * v.to(dt)[:, :, None, :])
    return (scale * torch.einsum("bhk,bhkv->bhv", q, state)).to(v.dtype)

def delta_rule_step(q, k, v, beta, g, state, scale=None):
    _check_delta_rule("delta_rule_step", q, k, v, beta, g, state, step=True)
    dt = state.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = q.to(dt), k.to(dt)
    if g is not None:  # [B, H] -> [B, H, 1, 1];  [B, H, Dk] -> [B, H, Dk, 1] (rows of S are key channels)
        state.mul_(g.to(dt).exp()[..., None, None] if g.ndim == 2 else g.to(dt).exp()[..., None])
    err = beta.to(dt)[..., None] * (v.to(dt) - torch.einsum("bhk,bhkv->bhv", k, state))  # against the decayed state
    state.add_(k[:, :, :, None] * err[:, :, None, :])
    return (scale * torch.einsum("bhk,bhkv->bhv", q, state)).to(v.dtype)

# -----------------------------------------------------------------------------
# public calls: pick the path from the device, say it once in the log

# TODO: the Triton kernels (chunked fwd/bwd, decode) are not written yet. Until they are, CUDA tensors also
# run the chunked torch path, and the log line says so. They will slot in as `_pick_path` returning "triton".
HAVE_TRITON_KERNELS = False
CHUNK_SIZE = 64  # chunk of the chunked torch path
CHUNK_SIZE_PER_CHANNEL = 16  # KDA: pairwise decays cost C*Dk per token, the chunk loop is cheap: 2-3x faster on CPU
_PATHS = ("recurrent", "chunked")
_logged = set()

def _pick_path(x):
    """'recurrent' | 'chunked' (later 'triton' on CUDA). KERNELS_PATH=recurrent|chunked forces a path."""
    forced = os.environ.get("KERNELS_PATH", "")
    if forced:
        if forced not in _PATHS:
            raise ValueError(f"KERNELS_PATH must be one of {_PATHS}, got {forced!r}")
        return forced
    return "chunked"  # CPU, and CUDA while HAVE_TRITON_KERNELS is False

def _log_path(fn, path, x):
    if (fn, path) not in _logged:
        _logged.add((fn, path))
        note = " (Triton kernels are not written yet)" if x.is_cuda and not HAVE_TRITON_KERNELS else ""
        print(f"kernels: {fn} uses the {path} torch path on {x.device.type}{note}")

def linear_attn(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False):
    """Scalar-decay linear attention over a whole sequence; see the module docstring. -> (o, final_state | None)"""
    path = _pick_path(q)
    _log_path("linear_attn", path, q)
    if path == "recurrent":
        return linear_attn_recurrent(q, k, v, g, scale, initial_state, output_final_state)
    return linear_attn_chunked(q, k, v, g, scale, initial_state, output_final_state, chunk_size=CHUNK_SIZE)

def delta_rule(q, k, v, beta, g=None, scale=None, initial_state=None, output_final_state=False):
    """(Gated) delta rule over a whole sequence; see the module docstring. -> (o, final_state | None)"""
    path = _pick_path(q)
    _log_path("delta_rule", path, q)
    if path == "recurrent":
        return delta_rule_recurrent(q, k, v, beta, g, scale, initial_state, output_final_state)
    C = CHUNK_SIZE_PER_CHANNEL if g is not None and g.ndim == 4 else CHUNK_SIZE
    return delta_rule_chunked(q, k, v, beta, g, scale, initial_state, output_final_state, chunk_size=C)
