"""
Each linear mixer layer against an independent fp64 re-implementation of its equations (docs/mixers.md §2–§3),
written token by token from the paper form with the layer's own weights. This pins the parametrisation
(gate placement, decay formula, norm order, skip, conv, RoPE), which the decode and causality tests
cannot, since they compare the model with itself.

$ python -m pytest tests/test_mixers.py -q
"""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from model import GPTConfig, MIXERS

CFG = GPTConfig(n_layer=1, n_head=4, n_embd=64, head_dim=16, d_state=16, vocab_size=50)


def conv(x, w, b=None):
    """Causal depthwise conv, zeros before the start, then SiLU. x [B, T, D], w [D, W]."""
    W = w.shape[1]
    xp = torch.cat([x.new_zeros(x.shape[0], W - 1, x.shape[2]), x], 1)
    y = torch.stack([(xp[:, t:t + W] * w.T).sum(1) for t in range(x.shape[1])], 1)
    return F.silu(y if b is None else y + b)


def rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def l2(x):
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def rope(x, base=10000.0):
    """Rotate-half RoPE, pairing channel i with i + d/2, positions 0..T-1. x [B, T, H, d]."""
    T, d = x.shape[1], x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    ang = torch.arange(T, dtype=x.dtype)[:, None] * theta           # [T, d/2]
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
    a, b = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def delta_ref(m, x, kind):
    B, T, _ = x.shape
    H, dk, dv = m.H, m.dk, m.dv
    q = l2(conv(m.q_proj(x), m.q_conv.weight).view(B, T, H, dk))
    k = l2(conv(m.k_proj(x), m.k_conv.weight).view(B, T, H, dk))
    v = conv(m.v_proj(x), m.v_conv.weight).view(B, T, H, dv)
    beta = torch.sigmoid(m.b_proj(x))
    if kind == 'gdn':    # one log-decay per head
        g = (-torch.exp(m.A_log) * F.softplus(m.a_proj(x) + m.dt_bias))[..., None].expand(B, T, H, dk)
    elif kind == 'kda' and m.gate_bound is None:  # one log-decay per head and key channel
        g = -torch.exp(m.A_log)[:, None] * F.softplus(m.f_up(m.f_down(x)).view(B, T, H, dk) + m.dt_bias.view(H, dk))
    elif kind == 'kda':  # GPTConfig.kda_gate_bound = lb: fla's safe gate lb·sigmoid(exp(A_log)·(u + dt_bias)) ∈ (lb, 0)
        u = m.f_up(m.f_down(x)).view(B, T, H, dk)
        g = m.gate_bound * torch.sigmoid(torch.exp(m.A_log)[:, None] * (u + m.dt_bias.view(H, dk)))
    else:
        g = torch.zeros(B, T, H, dk, dtype=x.dtype)
    S, out = torch.zeros(B, H, dk, dv, dtype=x.dtype), []
    for t in range(T):
        S = torch.exp(g[:, t])[..., None] * S                        # decay first ...
        err = v[:, t] - torch.einsum('bhk,bhkv->bhv', k[:, t], S)    # ... then correct against the decayed state
        S = S + torch.einsum('bhk,bhv->bhkv', k[:, t], beta[:, t, :, None] * err)
        out.append(torch.einsum('bhk,bhkv->bhv', q[:, t], S) / math.sqrt(dk))
    o = rms(torch.stack(out, 1), m.o_norm.weight)
    if kind == 'gdn':
        o = o * F.silu(m.g_proj(x).view(B, T, H, dv))
    if kind == 'kda':
        o = o * torch.sigmoid(m.g_up(m.g_down(x)).view(B, T, H, dv))
    return m.c_proj(o.reshape(B, T, -1))


def retnet_ref(m, x):
    """Parallel form: o_t = Σ_{i≤t} γ_h^(t−i) (q_t·k_i) v_i / √d."""
    B, T, _ = x.shape
    H, hd = m.H, m.hd
    q, k = rope(m.q_proj(x).view(B, T, H, hd)), rope(m.k_proj(x).view(B, T, H, hd))
    v = m.v_proj(x).view(B, T, H, hd)
    gamma = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(H)], dtype=x.dtype)
    t = torch.arange(T)
    decay = gamma[:, None, None] ** (t[:, None] - t[None, :]).clamp(min=0).to(x.dtype) * (t[:, None] >= t[None, :])
    o = torch.einsum('bhts,bshd->bthd', torch.einsum('bthd,bshd->bhts', q, k) * decay / math.sqrt(hd), v)
    o = rms(o, m.o_norm.weight) * F.silu(m.g_proj(x).view(B, T, H, hd))
    return m.c_proj(o.reshape(B, T, -1))


def mamba2_ref(m, x):
    """Mamba's own layout: state [P, N] per head, S_t = exp(Δ_t A) S_{t−1} + (Δ_t x_t) B_tᵀ, y = S C + D x."""
    B, T, _ = x.shape
    H, P, N, di = m.H, m.P, m.N, m.d_inner
    z, xBC, dt = m.in_proj(x).split([di, di + 2 * N, H], -1)
    xs, Bm, Cm = conv(xBC, m.conv.weight, m.conv.bias).split([di, N, N], -1)
    dt, A = F.softplus(dt + m.dt_bias), -torch.exp(m.A_log)
    xs = xs.view(B, T, H, P)
    S, ys = torch.zeros(B, H, P, N, dtype=x.dtype), []
    for t in range(T):
        S = torch.exp(dt[:, t] * A)[..., None, None] * S + torch.einsum('bhp,bn->bhpn', dt[:, t, :, None] * xs[:, t], Bm[:, t])
        ys.append(torch.einsum('bhpn,bn->bhp', S, Cm[:, t]) + m.D[:, None] * xs[:, t])
    y = rms(torch.stack(ys, 1).reshape(B, T, di) * F.silu(z), m.norm.weight)  # gate before the norm
    return m.c_proj(y)


def gla_ref(m, x):
    """GLA's paper form (Yang et al. 2024, eq. 3-4): α_t = σ(W_α x_t)^(1/16) per key channel,
    S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ q_t / √d_k; y = W_o [RMSNorm(o_h) ⊙ SiLU(W_g x)_h]."""
    B, T, _ = x.shape
    H, dk, dv = m.H, m.dk, m.dv
    q, k, v = m.q_proj(x).view(B, T, H, dk), m.k_proj(x).view(B, T, H, dk), m.v_proj(x).view(B, T, H, dv)
    alpha = torch.sigmoid(m.f_up(m.f_down(x))).view(B, T, H, dk) ** (1 / 16)
    S, out = torch.zeros(B, H, dk, dv, dtype=x.dtype), []
    for t in range(T):
        S = alpha[:, t, :, :, None] * S + torch.einsum('bhk,bhv->bhkv', k[:, t], v[:, t])
        out.append(torch.einsum('bhk,bhkv->bhv', q[:, t], S) / math.sqrt(dk))
    o = rms(torch.stack(out, 1), m.o_norm.weight) * F.silu(m.g_proj(x).view(B, T, H, dv))
    return m.c_proj(o.reshape(B, T, -1))


# Optional per mixer (README, "How to add a mixer", step 3): a mixer with no entry here is still run through every
# other test by its MIXERS line.
REFS = {'deltanet': lambda m, x: delta_ref(m, x, 'deltanet'), 'gdn': lambda m, x: delta_ref(m, x, 'gdn'),
        'kda': lambda m, x: delta_ref(m, x, 'kda'), 'retnet': retnet_ref, 'mamba2': mamba2_ref, 'gla': gla_ref}


@pytest.mark.parametrize('kernels', ['auto', 'recurrent'])  # CPU: the chunked torch path, then the reference
@pytest.mark.parametrize('name', [n for n in REFS if n in MIXERS])
def test_mixer_matches_its_equations(name, kernels):
    torch.manual_seed(0)
    m = MIXERS[name](dataclasses.replace(CFG, kernels=kernels))
    with torch.no_grad():  # move the weights off their init so every term matters
        for n, p in m.named_parameters():
            if 'A_log' not in n and 'dt_bias' not in n:
                p.add_(0.3 * torch.randn_like(p))
    m = m.double().eval()
    x = torch.randn(2, 37, CFG.n_embd, dtype=torch.float64)
    with torch.no_grad():
        got, want = m(x), REFS[name](m, x)
    # the model's RMSNorms compute in fp32 (as in training), so agreement is to fp32 precision
    assert (got - want).abs().max() <= 1e-5 * want.abs().max(), (got - want).abs().max()



@pytest.mark.parametrize('kernels', ['auto', 'recurrent'])
def test_kda_bounded_gate_matches_its_equations(kernels):
    # GPTConfig.kda_gate_bound: the bounded gate in the model (A_log = 0 at init, moved here so that exp(A_log)
    # matters), the forward and prefill + decode (scan's step forms the gate with kernels.decay_gate) against delta_ref
    torch.manual_seed(0)
    m = MIXERS['kda'](dataclasses.replace(CFG, kernels=kernels, kda_gate_bound=-5.0))
    assert m.gate_bound == -5.0 and torch.equal(m.A_log, torch.zeros_like(m.A_log))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if 'dt_bias' not in n:
                p.add_((0.5 if 'A_log' in n else 0.3) * torch.randn_like(p))
    m = m.double().eval()
    x = torch.randn(2, 37, CFG.n_embd, dtype=torch.float64)
    with torch.no_grad():
        want = delta_ref(m, x, 'kda')
        cache = {}
        steps = torch.cat([m(x[:, :20], cache)] + [m(x[:, t:t + 1], cache) for t in range(20, 37)], 1)
        for got in (m(x), steps):
            assert (got - want).abs().max() <= 1e-5 * want.abs().max(), (got - want).abs().max()
