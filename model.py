"""
The model: one GPTConfig, the token mixers, the pre-norm block and the GPT.

    python -m pytest -q tests/test_model.py tests/test_mixers.py   # shapes, decode == forward, causality, equations

Reading order: config → mixer pattern → shared pieces (RMSNorm, RoPE, MLP, short conv, the recurrence call `scan`)
→ the mixers (softmax, then the linear ones), each read as its equations → MIXERS (the one place mixers are named)
→ speed: the fused input projections the mixers call, apart so that the mixers read as math → Block → GPT →
Decoder (generation through a replayed CUDA graph). Each mixer's math, and the kernels behind it: docs/mixers.md.

Every mixer is built as Mixer(config) and has the same interface:
    forward(x, cache=None, docs=None) -> y          x, y: [B, T, C]
    - cache is None: training / plain forward over the whole sequence.
    - cache is a dict (start with {}): the mixer continues from what the dict holds and updates it in
      place — prefill is a call with T > 1 tokens, decode a call with T = 1. Softmax keeps K/V (grows
      with the context); the linear mixers keep a fixed-size fp32 state plus their short-conv inputs.
    - docs (config.documents, training and plain forwards only; GPT.documents builds it once per forward): where
      the documents of the packed rows start; the mixer then treats each document as its own sequence.
    core_flops_per_token(T) -> forward FLOPs of the sequence-mixing core (projections are counted
    from the parameter count), used for MFU.
"""
import contextlib
import copy
import functools
import math
import os
import re
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

import parallel
import kernels
from configurator import UserError
from optim import Muon
try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # torch < 2.5: documents=True attends through SDPA with a dense mask
    create_block_mask = flex_attention = None


def causal_lower_right(T, S):
    """SDPA's causal mask for T queries that end at the last of S keys (a prompt continued past cached tokens).
    Imported at first use: torch.nn.attention.bias imports torch._dynamo, slower to import than torch itself, which
    sample.py and the tools otherwise never need."""
    from torch.nn.attention.bias import causal_lower_right
    return causal_lower_right(T, S)


@dataclass
class GPTConfig:
    block_size: int = 1024     # training context length
    vocab_size: int = 50304    # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12           # heads of the softmax mixer (the linear mixers size their own heads, see below)
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False         # bias in Linear layers (no bias is a little better and faster)
    mixer: str = 'softmax'     # per-layer pattern, e.g. 'kda*3,softmax' (see parse_mixer_pattern)
    n_kv_head: int = 0         # softmax GQA: number of K/V heads; 0 = same as n_head
    rope_base: float = 10000.0
    tie_embeddings: bool = True  # the input embedding is the output layer's weight (GPT-2, nanoGPT); False: two matrices
    head_dim: int = 64         # linear mixers: per-head key dim (values: see each mixer); Mamba2: headdim P
    d_state: int = 128         # Mamba2: state size N per head (the d_k of its recurrence)
    kernels: str = 'auto'      # path of the linear mixers' kernels.py calls: 'auto' (Triton on CUDA, chunked torch
                               # elsewhere) | 'torch' (chunked) | 'recurrent' (the slow reference) | 'triton'
    documents: bool = False    # each document of a packed row is its own sequence: no state, conv window or attention
                               # crosses a document start (GPT.documents). Off by default: nanoGPT's behaviour, and
                               # faster (per-token gates, masked convs, masked attention; measured by tools/bench_train.py
                               # --documents); checkpoints from before the key load with it off
    eot_token: int = 50256     # with documents: the token that starts a document (GPT-2's <|endoftext|>, which
                               # data/*/prepare.py writes before every document)
    kda_gate_bound: float = 0.0  # KDA's gate: 0.0 = the released Kimi Linear gate −exp(A)·softplus(u + b) (default);
                               # lb in [-5, 0) = fla's safe gate lb·sigmoid(exp(A)·(u + b)) ∈ (lb, 0), A_log = 0 at
                               # init (-5.0 is fla's; Gram kernels without the dyadic split); checkpoints from before
                               # the key load with it off

    def __post_init__(self):
        """Refuse, naming the field, any setting that cannot build a model that trains (a UserError: one line)."""
        for k in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'head_dim', 'd_state', 'n_kv_head'):
            v, least = getattr(self, k), (0 if k == 'n_kv_head' else 1)
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise UserError(f"{k}={v!r} must be an integer >= {least}")
        if not 0 <= self.dropout < 1:
            raise UserError(f"dropout={self.dropout!r} must be in [0, 1)")
        if isinstance(self.rope_base, bool) or not isinstance(self.rope_base, (int, float)) or not self.rope_base > 1:
            raise UserError(f"rope_base={self.rope_base!r} must be a number > 1 (10000 as in most models; larger for long contexts)")
        if not isinstance(self.kernels, str) or self.kernels not in kernels.PATHS:
            raise UserError(f"kernels={self.kernels!r} must be one of {', '.join(map(repr, kernels.PATHS))}")
        for k in ('documents', 'tie_embeddings'):
            if not isinstance(getattr(self, k), bool):
                raise UserError(f"{k}={getattr(self, k)!r} must be True or False")
        b = self.kda_gate_bound
        if not (isinstance(b, (int, float)) and not isinstance(b, bool) and (b == 0 or -5 <= b < 0)):
            raise UserError(f"kda_gate_bound={b!r} must be 0 (KDA's softplus gate) or in [-5, 0) (the bounded gate)")
        if self.documents and not (isinstance(self.eot_token, int) and 0 <= self.eot_token < self.vocab_size):
            raise UserError(f"eot_token={self.eot_token!r} must be a token id below vocab_size={self.vocab_size} with "
                            f"documents=True (no other token marks where a document starts)")
        mixers = set(parse_mixer_pattern(self.mixer, self.n_layer))
        C, nh, hd = self.n_embd, self.n_head, self.head_dim
        if 'softmax' in mixers and (C % nh or (C // nh) % 2):
            raise UserError(f"n_embd={C} must split into n_head={nh} softmax heads of an even size (RoPE rotates pairs): "
                            f"choose n_head so that n_embd/n_head is an even integer")
        if 'softmax' in mixers and nh % (self.n_kv_head or nh):
            raise UserError(f"n_head={nh} is not divisible by n_kv_head={self.n_kv_head}")
        linear = sorted(mixers - {'softmax'})
        if linear and (C % hd or hd % 2):
            raise UserError(f"head_dim={hd} must be even and divide n_embd={C} (mixers {', '.join(linear)}): "
                            f"choose another head_dim (64 for n_embd=768) or n_embd")


# ------------------------------------------------------------------------------------------------
# Mixer pattern: a comma-separated list tiled over the layers; 'name*k' repeats a name k times.
#   'kda' → every layer;  'kda,kda,kda,softmax' = 'kda*3,softmax' → the 3:1 hybrid;  one per layer → explicit.

def parse_mixer_pattern(pattern, n_layer):
    if not isinstance(pattern, str) or not pattern.strip():
        raise UserError(f"mixer must be a non-empty string like 'kda*3,softmax', got {pattern!r}")
    names = []
    for item in pattern.replace(' ', '').split(','):
        m = re.fullmatch(r'([a-z0-9_]+)(?:\*(\d+))?', item)
        if m is None:
            raise UserError(f"cannot parse '{item}' in mixer pattern '{pattern}' (expected name or name*count)")
        name, count = m.group(1), int(m.group(2) or 1)
        if name not in MIXERS:
            raise UserError(f"unknown mixer '{name}' in pattern '{pattern}'; valid mixers: {', '.join(MIXERS)}")
        if not 1 <= count <= n_layer:  # (a count past n_layer cannot tile it; a huge one would fill the memory)
            raise UserError(f"repeat count must be in [1, n_layer={n_layer}] in '{item}' of pattern '{pattern}'")
        names += [name] * count
    if n_layer % len(names) != 0:
        raise UserError(f"mixer pattern '{pattern}' has {len(names)} layers, which does not tile n_layer={n_layer}")
    return names * (n_layer // len(names))


# ------------------------------------------------------------------------------------------------
# Shared pieces

class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) · w, computed in fp32 (bf16 sums of squares lose precision)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x.float(), (x.size(-1),), self.weight.float(), self.eps).type_as(x)


def rope_inv_freq(hs, base, device=None):
    return 1.0 / (base ** (torch.arange(0, hs, 2, device=device, dtype=torch.float32) / hs))  # [hs/2]


def rope_angles(pos0, n, hs, base, device=None):
    """(cos, sin) [n, hs/2] fp32 of the rotary angles pos·base^(−2i/hs) at positions pos0 .. pos0+n−1."""
    inv_freq = rope_inv_freq(hs, base, device)
    angles = torch.arange(pos0, pos0 + n, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


class Rotary(nn.Module):
    """Rotary embedding, rotate-half pairing (dim i with i + hs/2), x: [B, T, nh, hs] at positions pos0..pos0+T−1.

    The cos/sin tables of the first block_size positions are computed once (fp32 buffers, not saved in
    checkpoints): recomputing them every step is a kernel of transcendentals per element of q and k."""

    def __init__(self, hs, base, block_size):
        super().__init__()
        self.hs, self.base = hs, base
        cos, sin = rope_angles(0, block_size, hs, base)
        self.register_buffer('cos', cos, persistent=False)
        self.register_buffer('sin', sin, persistent=False)
        self.register_buffer('inv_freq', rope_inv_freq(hs, base), persistent=False)

    def forward(self, x, pos0=0):
        """pos0: an int, or a 0-dim int64 tensor (decoding through static caches, one token: no Python value that
        changes per token; inside the table the same values as an int gives, past it the same formula)."""
        T = x.size(1)
        if torch.is_tensor(pos0) and T > 1:  # a prefill piece through static caches: a host sync, once per piece
            pos0 = int(pos0)
        if torch.is_tensor(pos0):
            n = self.cos.size(0)
            i = pos0.clamp(max=n - 1).view(1)
            angles = pos0.float() * self.inv_freq                               # [hs/2], as rope_angles
            cos = torch.where(pos0 < n, self.cos.index_select(0, i), angles.cos())
            sin = torch.where(pos0 < n, self.sin.index_select(0, i), angles.sin())
        elif pos0 + T <= self.cos.size(0):
            cos, sin = self.cos[pos0:pos0 + T], self.sin[pos0:pos0 + T]
        else:  # past the table (decoding beyond block_size): compute these positions
            cos, sin = rope_angles(pos0, T, self.hs, self.base, x.device)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]              # [1, T, 1, hs/2]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class MLP(nn.Module):
    """SwiGLU: c_proj(silu(c_fc(x)) ⊙ c_gate(x)).

    SwiGLU rather than GELU because the peers this trainer is compared with (Kimi Linear, fla's
    DeltaNet/GDN/KDA models, Llama-style baselines) all use it, and it trains slightly better at equal
    parameters. The hidden width 8/3·C (rounded up to a multiple of 64) keeps the parameter count of
    GPT-2's 4·C GELU MLP: 3 · C · 8C/3 = 8C².
    """

    def __init__(self, config):
        super().__init__()
        hidden = 64 * math.ceil(8 * config.n_embd / 3 / 64)
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_gate = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.c_proj.residual_out = True  # scaled init, see GPT._init_weights
        self.dropout = nn.Dropout(config.dropout)

    projections = ('c_fc', 'c_gate')  # the Linear layers that read x (linears)

    def forward(self, x):
        a, b = linears(self, x, self.projections)  # x W_fcᵀ, x W_gateᵀ (linears: speed section)
        return self.dropout(self.c_proj(F.silu(a) * b))


class ShortConv(nn.Module):
    """Depthwise causal conv of width W over time, then SiLU: y_t = silu(Σ_j w[:, j]·x_{t−W+1+j} (+ b)).

    norm = G > 0: then y ← y / sqrt(|y|² + 1e−6) over each group of G channels (the delta rule's unit q and k:
    with unit keys I − βkkᵀ is non-expansive), computed in fp32 inside the same kernel.
    kernels.short_conv (path 'auto': Triton on CUDA, F.conv1d elsewhere). Decode cache: the last W−1 *raw* inputs
    (before SiLU) under `cache[name]`; a one-token call shifts them in place (kernels.short_conv_step)."""

    def __init__(self, dim, name, width=4, bias=False, norm=0, path='auto'):
        super().__init__()
        self.name, self.width, self.norm, self.path = name, width, norm, path  # path: GPTConfig.kernels
        conv = nn.Conv1d(dim, dim, width, groups=dim, bias=bias)  # PyTorch's init: U(±1/sqrt(width))
        self.weight = nn.Parameter(conv.weight.detach().squeeze(1))  # [dim, W]
        self.weight._no_muon = True  # W taps per channel, not a linear map between spaces: AdamW's (optim.Muon)
        self.bias = nn.Parameter(conv.bias.detach()) if bias else None

    def forward(self, x, cache=None, split=None, doc_pos=None, cp=None):
        """x [B, T, D] -> y [B, T, D]; with split (channel counts summing to D), one y per part, each convolved
        straight from its column slice of x, and x's gradient written whole (no cat of the parts' gradients).
        doc_pos [B, T] (documents: GPT.documents' conv_pos) | None: no tap reaches into an earlier document.
        cp: x is this rank's pieces of split sequences; each window starts on the previous piece's last W−1 inputs."""
        if cp is not None:
            return parallel.short_conv(cp, x, self.weight, self.bias, self.norm, self.path, doc_pos, split)
        prev = None if cache is None else cache.get(self.name)
        if prev is not None and x.size(1) == 1:
            y = kernels.short_conv_step(x[:, 0], prev, self.weight, self.bias, self.norm, path=self.path)[:, None]
            return y if split is None else y.split(split, dim=-1)
        y = kernels.short_conv(x, self.weight, self.bias, initial=prev, norm=self.norm, path=self.path, doc_pos=doc_pos,
                               split=split)
        if cache is not None:  # the last W−1 raw inputs (zeros before the start), kept for the next call
            W1 = self.width - 1
            xx = torch.cat([x.new_zeros(x.size(0), W1, x.size(2)) if prev is None else prev.to(x.dtype), x], dim=1)
            cache[self.name] = xx[:, -W1:].contiguous()
        return y


def init_decay_rates(n, dt_min=1e-3, dt_max=0.1, a_min=1.0, a_max=16.0):
    """Mamba-style gate g = −exp(A_log)·softplus(u + dt_bias): A ~ U(a_min, a_max), softplus(dt_bias) = dt
    with dt log-uniform in [dt_min, dt_max], so per-step decays start in ≈ [0.2, 0.999]."""
    A_log = torch.log(torch.empty(n).uniform_(a_min, a_max))
    dt = torch.exp(torch.empty(n).uniform_(math.log(dt_min), math.log(dt_max))).clamp(min=1e-4)
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    A_log, dt_bias = nn.Parameter(A_log), nn.Parameter(dt_bias)
    A_log._no_weight_decay = dt_bias._no_weight_decay = True
    return A_log, dt_bias


# Documents (GPTConfig.documents). A log-gate of RESET_GATE at a document's first token empties the state: exp(-1000)
# is exactly 0 in fp32 (and bf16). Not -inf: the kernels sum the gates over a chunk, and -inf - (-inf) = NaN there;
# kernels.py forms its decays as segment sums, exact after such a gate (test_kernels.py: gates at -1000).
RESET_GATE = -1000.0


def reset_gate(g, docs):
    """Log-decays g with RESET_GATE at each document start after position 0 (docs['reset'] [B, T]; at position 0 the
    state is the initial one anyway); docs None: g as it is. g: [B, T, H], [B, T, H, Dk] (every key channel), or a
    constant per head [H] (RetNet's), which becomes a gate per token [B, T, H]."""
    if docs is None:
        return g
    reset = docs['reset']
    if isinstance(g, DecayGate):  # a gate the kernels would form from its input (speed section): formed here
        g = kernels.decay_gate(g.u, g.A_log, g.dt_bias, g.lower_bound)
    if g.dim() == 1:  # one constant per head: the same for every token
        g = g.expand(reset.shape + g.shape)
    return g.masked_fill(reset.view(reset.shape + (1,) * (g.dim() - 2)), RESET_GATE)


def document_block_mask(doc, block=128):
    """flex_attention's BlockMask of causal attention within each document, from document ids doc [B, T] (int32,
    nondecreasing along T), by create_block_mask: it evaluates the mask on every (query, key) pair once per forward
    (B T^2 comparisons, no [T, T] tensor kept). A mask assembled from each block's first and last id
    (BlockMask.from_kv_blocks) had the same blocks but gave wrong gradients inside a torch.compile'd model
    (test_model.py::test_documents_compiled_model_equals_dense_mask), so this one is built the documented way."""
    B, T = doc.shape

    def same_document(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc[b, q_idx] == doc[b, kv_idx])

    return create_block_mask(same_document, B, None, T, T, device=doc.device, BLOCK_SIZE=block)


@functools.cache
def compiled_flex_attention():
    """flex_attention compiled on its own, for eager models (uncompiled it runs an unfused reference, slow and
    O(T^2) in memory); inside a torch.compile'd model the plain function is traced and fused instead."""
    return torch.compile(flex_attention, dynamic=False)


def scan(cache, q, k, v, g=None, beta=None, scale=None, path='auto', ssd=None, cp=None):
    """Run one of the two recurrences of kernels.py over T tokens (beta given: delta rule), on kernels.py's path
    `path` (GPTConfig.kernels). g: the log-decays, None (no decay), a constant per head [H], one per head and token
    [B, T, H] or per key channel [B, T, H, Dk]; or a DecayGate (delta rule only; speed section): the kernels form
    the log-decay from its input themselves. ssd (dt, D) | None (Mamba2): v is x, the value dt·x and the output gains
    D·x (kernels.linear_attn's dt=, D=).

    cache None: plain chunked forward. Otherwise continue from cache['state'] (fp32 [B, H, Dk, Dv]) and
    store the final state there: a one-token call (decode) uses the step kernel, longer ones (prefill)
    the chunked kernel. cp (a parallel.ContextParallel, training only): q, k, v are this rank's two pieces
    of sequences split over cp's group, and each piece's state comes from the earlier pieces (parallel.py)."""
    gate = None
    if isinstance(g, DecayGate):  # the gate's input u, and (A_log, dt_bias, lower_bound) to form it from
        g, gate = g.u, (g.A_log, g.dt_bias, g.lower_bound)
    if cp is not None:
        gate = dict(zip(('A_log', 'dt_bias', 'lower_bound'), gate or ()))
        if beta is None:
            return parallel.linear_attn(cp, q, k, v, g, scale=scale, path=path,
                                                **({} if ssd is None else dict(dt=ssd[0], D=ssd[1])))
        return parallel.delta_rule(cp, q, k, v, beta, g, scale=scale, path=path, **gate)
    state = None if cache is None else cache.get('state')
    if state is not None and q.size(1) == 1:
        if gate is not None:
            g = kernels.decay_gate(g, *gate)
        g1 = g if g is None or g.dim() == 1 else g[:, 0]   # [H] constants stay; [B,1,H(,Dk)] → [B,H(,Dk)]
        if ssd is not None:
            x, (dt, D) = v, ssd
            v = (x.float() * dt[..., None]).to(x.dtype)
        if beta is None:
            o = kernels.linear_attn_step(q[:, 0], k[:, 0], v[:, 0], g1, state, scale=scale, path=path)
            if ssd is not None:
                o = o + D[:, None].to(o.dtype) * x[:, 0]
        else:
            o = kernels.delta_rule_step(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], g1, state, scale=scale, path=path)
        return o[:, None]
    if beta is None:
        o, final = kernels.linear_attn(q, k, v, g, scale=scale, initial_state=state, output_final_state=cache is not None,
                                       path=path, **({} if ssd is None else dict(dt=ssd[0], D=ssd[1])))
    else:
        o, final = kernels.delta_rule(q, k, v, beta, g, scale=scale, initial_state=state, output_final_state=cache is not None,
                                      path=path, **dict(zip(('A_log', 'dt_bias', 'lower_bound'), gate or ())))
    if cache is not None:
        cache['state'] = final
    return o


# ------------------------------------------------------------------------------------------------
# Softmax attention: causal, RoPE, optional GQA, F.scaled_dot_product_attention.
#   o_t = Σ_{i≤t} softmax_i(q_t·k_i / √hs) v_i      cache: K, V of every past token (grows with T)

class CausalSelfAttention(nn.Module):
    cache_grows = True
    cp = None  # parallel.ContextParallel while training on split sequences (GPT.set_context_parallel)

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head or config.n_head
        if config.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={config.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_head % self.n_kv_head != 0:
            raise ValueError(f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}")
        self.hs = config.n_embd // self.n_head
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.hs, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj.residual_out = True
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.rope = Rotary(self.hs, config.rope_base, config.block_size)

    def forward(self, x, cache=None, docs=None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split([self.n_head * self.hs, self.n_kv_head * self.hs, self.n_kv_head * self.hs], dim=2)
        q = q.view(B, T, self.n_head, self.hs)
        k = k.view(B, T, self.n_kv_head, self.hs)
        v = v.view(B, T, self.n_kv_head, self.hs)
        if cache is not None and torch.is_tensor(cache.get('pos')):
            return self.resid_dropout(self.c_proj(self.static_step(q, k, v, cache).reshape(B, T, C)))
        past = cache['k'].size(2) if cache else 0   # tokens already in the cache = position of x[:, 0]
        if self.cp is not None:  # pieces of split sequences: their global positions
            q, k = self.cp.rope(self.rope, q), self.cp.rope(self.rope, k)
        else:
            q, k = self.rope(q, past), self.rope(k, past)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, nh, T, hs]
        if cache is not None:
            if past:
                k, v = torch.cat([cache['k'], k], dim=2), torch.cat([cache['v'], v], dim=2)
            cache['k'], cache['v'] = k, v
        if self.cp is not None:  # the keys and values of every piece up to this one
            y = parallel.attention(self.cp, q, k, v, self.n_kv_head != self.n_head, docs)
        elif docs is not None:
            # each query sees the keys of its own document only. RoPE positions do not restart per document: a RoPE
            # score q_m·k_n depends on the offset m − n alone, so restarting them would change nothing but rounding
            gqa = self.n_kv_head != self.n_head
            if 'block_mask' in docs:  # CUDA: FlexAttention, skipping the blocks outside every document
                flex = flex_attention if torch.compiler.is_compiling() else compiled_flex_attention()
                y = flex(q, k, v, block_mask=docs['block_mask'], enable_gqa=gqa)
            else:  # SDPA with a dense mask [B, 1, T, T] (CPU, torch < 2.5, or attention dropout)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=docs['mask'],
                                                   dropout_p=self.dropout if self.training else 0.0, enable_gqa=gqa)
        elif past and T > 1:
            # prefill after earlier tokens: query i sees keys j <= past + i (is_causal would align top-left)
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv_head != self.n_head)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1 and not past,
                                               dropout_p=self.dropout if self.training else 0.0,
                                               enable_gqa=self.n_kv_head != self.n_head)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # [B, T, nh*hs]
        return self.resid_dropout(self.c_proj(y))

    def static_step(self, q, k, v, cache):
        """One token through a static cache (GPT.static_caches): K, V [B, n_kv, L, hs] preallocated, the new key and
        value written at position pos, attention over all L slots with the ones after pos masked. Fixed shapes and
        addresses, no host sync: the step can be captured as a CUDA graph. -> y [B, 1, nh, hs].
        T > 1 tokens (a prefill piece, never in a graph): written at pos .. pos+T−1, attention over the first pos+T
        slots, query i seeing keys up to pos+i (the causal mask aligned bottom-right: flash attention, no mask in memory)."""
        pos, K, V = cache['pos'], cache['k'], cache['v']
        gqa = self.n_kv_head != self.n_head
        T = q.size(1)
        if T > 1:
            p = int(pos)  # a host sync: fine once per piece
            if p + T > K.size(2):
                raise ValueError(f"{p + T} tokens do not fit static caches of {K.size(2)} positions")
            q, k = self.rope(q, p), self.rope(k, p)
            K[:, :, p:p + T] = k.transpose(1, 2)
            V[:, :, p:p + T] = v.transpose(1, 2)
            q, K, V = q.transpose(1, 2), K[:, :, :p + T], V[:, :, :p + T]
            if p and gqa:  # the bottom-right causal bias has no GQA form: each key head repeated for its queries
                K, V = (t.repeat_interleave(self.n_head // self.n_kv_head, dim=1) for t in (K, V))
            y = F.scaled_dot_product_attention(q, K, V, attn_mask=causal_lower_right(T, p + T) if p else None,
                                               is_causal=not p, enable_gqa=gqa and not p)
            return y.transpose(1, 2)
        q, k = self.rope(q, pos), self.rope(k, pos)
        K.index_copy_(2, pos.view(1), k.transpose(1, 2).to(K.dtype))
        V.index_copy_(2, pos.view(1), v.transpose(1, 2).to(V.dtype))
        mask = (torch.arange(K.size(2), device=K.device) <= pos).view(1, 1, 1, -1)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), K, V, attn_mask=mask, enable_gqa=gqa)
        return y.transpose(1, 2)

    def core_flops_per_token(self, T):
        # q·k and p·v: 2 FLOPs per multiply-add, 2 matmuls, T/2 keys on average under the causal mask
        return 2 * self.n_head * self.hs * T


# ------------------------------------------------------------------------------------------------
# The linear mixers. Each keeps a fixed-size fp32 state [B, H, d_k, d_v] (+ short-conv inputs) in
# its cache, so decoding costs O(1) per token whatever the context length.
#
# Sizing rule: at every width, each mixer's head count is chosen so that its parameters per layer
# are within 20% of the softmax layer's 4·C² (C = n_embd); at C = 768, head_dim = 64 the counts are
# in each class docstring (measured by test_model.py::test_param_budget).
#
# Glossary (docs/mixers.md §0.1): S state, q/k/v query/key/value, g = log-decay (≤ 0), β write strength,
# Δ (Mamba2 dt) step size, A decay rate, B/C Mamba2's input/output projections (= k/q), D skip.


class RetNet(nn.Module):
    """Multi-scale retention (RetNet; fla's layer without the score normalisations, docs/mixers.md §2.2):
        S_t = γ_h S_{t−1} + k_t v_tᵀ,  o_t = S_tᵀ q_t / √d_k,  γ_h = 1 − 2^(−5−h)  (fixed per head)
        y = W_o [RMSNorm(o_h) ⊙ SiLU(W_g x)_h]_h           q, k with RoPE; d_k = d_v = head_dim
    Params ≈ 5·C·H·hd (q, k, v, g, o); H = round(0.8·C/hd): C=768, hd=64 → H=10, 2,457,664 (1.04× softmax)."""
    cache_grows = False
    projections = ('q_proj', 'k_proj', 'v_proj', 'g_proj')  # the Linear layers that read x (linears)
    cp = None  # parallel.ContextParallel while training on split sequences (GPT.set_context_parallel)

    def __init__(self, config):
        super().__init__()
        C, hd = config.n_embd, config.head_dim
        self.H, self.hd = max(1, round(0.8 * C / hd)), hd
        self.kernels = config.kernels  # the path of its kernels.py calls
        self.rope = Rotary(hd, config.rope_base, config.block_size)
        inner = self.H * hd
        self.q_proj, self.k_proj = nn.Linear(C, inner, bias=config.bias), nn.Linear(C, inner, bias=config.bias)
        self.v_proj, self.g_proj = nn.Linear(C, inner, bias=config.bias), nn.Linear(C, inner, bias=config.bias)
        self.o_norm = RMSNorm(hd, eps=1e-5)  # one weight shared by the heads, as in fla
        self.c_proj = nn.Linear(inner, C, bias=config.bias)
        self.c_proj.residual_out = True
        self.register_buffer('log_gamma', torch.log(1 - 2.0 ** (-5.0 - torch.arange(self.H, dtype=torch.float32))),
                             persistent=False)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, cache=None, docs=None):
        B, T, C = x.shape
        shape = (B, T, self.H, self.hd)
        past = cache.get('pos', 0) if cache else 0  # an int; a tensor in static caches (GPT advances it)
        q, k, v, gate = linears(self, x, self.projections)  # x W_qᵀ, x W_kᵀ, x W_vᵀ, x W_gᵀ (linears: speed section)
        if self.cp is not None:  # pieces of split sequences: their global positions
            q, k = self.cp.rope(self.rope, q.view(shape)), self.cp.rope(self.rope, k.view(shape))
        else:  # not restarted per document (as softmax)
            q, k = self.rope(q.view(shape), past), self.rope(k.view(shape), past)
        # log γ_h [H]; documents: a gate per token [B, T, H], RESET_GATE at the document starts
        g = reset_gate(self.log_gamma, docs)
        o = scan(cache, q, k, v.view(shape), g=g, path=self.kernels, cp=self.cp)
        if cache is not None and not torch.is_tensor(past):
            cache['pos'] = past + T  # RoPE position of the next token
        o = self.o_norm(o) * F.silu(gate.view(shape))
        return self.resid_dropout(self.c_proj(o.reshape(B, T, -1)))

    def core_flops_per_token(self, T, chunk=64):
        return self.H * (4 * self.hd * self.hd + 2 * chunk * 2 * self.hd)


class Mamba2(nn.Module):
    """Mamba2 / SSD (docs/mixers.md §2.3), expand = 1, one group (B, C shared by all heads):
        [z, xBC, dt] = in_proj(x);  x, B, C = split(SiLU(conv(xBC)));  Δ = softplus(dt + dt_bias);  A = −exp(A_log)
        S_t = exp(Δ_t A_h) S_{t−1} + B_t (Δ_t x_t)ᵀ,   y_t = S_tᵀ C_t + D_h x_t       (state N × P per head)
        out = out_proj(RMSNorm(y ⊙ SiLU(z)))   — the gate goes before the norm, over all of d_inner
    Mapped onto kernels.linear_attn with q = C, k = B (one shared head), v = Δ·x, g = Δ·A, scale 1.
    expand = 1 (not Mamba's 2) because this block also has an MLP; params ≈ 3C² + 2CN + CH:
    C=768, P=64 (H=12), N=128 → 1,981,220 (0.84× softmax)."""
    cache_grows = False
    cp = None  # parallel.ContextParallel while training on split sequences (GPT.set_context_parallel)

    def __init__(self, config):
        super().__init__()
        C, self.P, self.N = config.n_embd, config.head_dim, config.d_state
        if C % self.P != 0:
            raise ValueError(f"mamba2: n_embd={C} is not divisible by head_dim={self.P}")
        self.d_inner, self.H = C, C // self.P
        self.kernels = config.kernels  # the path of its kernels.py calls
        self.in_proj = nn.Linear(C, 2 * self.d_inner + 2 * self.N + self.H, bias=config.bias)
        self.conv = ShortConv(self.d_inner + 2 * self.N, 'conv_xBC', bias=True, path=config.kernels)
        self.A_log, self.dt_bias = init_decay_rates(self.H)
        self.D = nn.Parameter(torch.ones(self.H))
        self.D._no_weight_decay = True
        self.norm = RMSNorm(self.d_inner, eps=1e-5)
        self.c_proj = nn.Linear(self.d_inner, C, bias=config.bias)
        self.c_proj.residual_out = True
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, cache=None, docs=None):
        B, T, C = x.shape
        z, xBC, dt = self.in_proj(x).split([self.d_inner, self.d_inner + 2 * self.N, self.H], dim=-1)
        xs, Bm, Cm = self.conv(xBC, cache, split=[self.d_inner, self.N, self.N],
                               doc_pos=None if docs is None else docs['conv_pos'], cp=self.cp)
        dt = F.softplus(dt.float() + self.dt_bias)                   # Δ, [B, T, H], fp32
        g = reset_gate(-torch.exp(self.A_log.float()) * dt, docs)    # log-decay Δ·A ≤ 0
        xs = xs.view(B, T, self.H, self.P)
        # the value Δ·x and the skip connection D·x are formed inside the kernels (scan's ssd)
        y = scan(cache, Cm.view(B, T, 1, self.N), Bm.view(B, T, 1, self.N), xs, g=g, scale=1.0, path=self.kernels,
                 ssd=(dt, self.D), cp=self.cp)
        y = self.norm(y.reshape(B, T, self.d_inner) * F.silu(z))
        return self.resid_dropout(self.c_proj(y))

    def core_flops_per_token(self, T, chunk=64):
        return 2 * chunk * self.N + self.H * (4 * self.N * self.P + 2 * chunk * self.P)


class DeltaNet(nn.Module):
    """DeltaNet (docs/mixers.md §2.4): q, k = L2(SiLU(conv(W x))), v = SiLU(conv(W_v x)), β = σ(W_b x)
        S_t = S_{t−1} + β_t k_t (v_t − S_{t−1}ᵀ k_t)ᵀ,   o_t = S_tᵀ q_t / √d_k,   y = W_o [RMSNorm(o_h)]_h
    H = C / hd, d_k = d_v = hd: C=768, hd=64 → H=12, 2,377,792 params (1.01× softmax)."""
    cache_grows = False
    projections = ('q_proj', 'k_proj', 'v_proj', 'b_proj')  # the Linear layers that read x (linears); q, k, v first
    cp = None  # parallel.ContextParallel while training on split sequences (GPT.set_context_parallel)

    def __init__(self, config, n_head=None, v_dim=None):
        super().__init__()
        C, hd = config.n_embd, config.head_dim
        self.H = n_head or max(1, C // hd)
        self.dk, self.dv = hd, v_dim or hd
        self.kernels = config.kernels  # the path of its kernels.py calls
        self.q_proj = nn.Linear(C, self.H * self.dk, bias=config.bias)
        self.k_proj = nn.Linear(C, self.H * self.dk, bias=config.bias)
        self.v_proj = nn.Linear(C, self.H * self.dv, bias=config.bias)
        self.b_proj = nn.Linear(C, self.H, bias=config.bias)
        self.q_conv = ShortConv(self.H * self.dk, 'conv_q', norm=self.dk, path=config.kernels)  # L2-normalised per head
        self.k_conv = ShortConv(self.H * self.dk, 'conv_k', norm=self.dk, path=config.kernels)
        self.v_conv = ShortConv(self.H * self.dv, 'conv_v', path=config.kernels)
        self.o_norm = RMSNorm(self.dv, eps=1e-5)
        self.c_proj = nn.Linear(self.H * self.dv, C, bias=config.bias)
        self.c_proj.residual_out = True
        self.resid_dropout = nn.Dropout(config.dropout)

    gate_fn = None  # the output gate's activation (GDN: 'silu', KDA: 'sigmoid'), None: no output gate

    def decay(self, p):
        """The log-decay from the projections p (name -> x W_nameᵀ): none here (DeltaNet forgets nothing)."""
        return None

    def gate_input(self, p):
        """The output gate's pre-activation [B, T, H·d_v] from the projections p (with gate_fn set)."""
        return None

    def output_gate(self, p, o):
        if self.gate_fn is None:
            return o
        z = self.gate_input(p).view(o.shape)
        return o * (F.silu(z) if self.gate_fn == 'silu' else torch.sigmoid(z))

    def forward(self, x, cache=None, docs=None):
        B, T, C = x.shape
        if cache is not None and T == 1 and 'state' in cache:  # decode: the lines below in one kernel (speed section)
            return self.resid_dropout(self.c_proj(delta_rule_decode(self, x, cache).reshape(B, T, -1)))
        # q, k = L2(SiLU(conv(W_q x))), L2(SiLU(conv(W_k x))) per head, v = SiLU(conv(W_v x)); p: the other
        # projections of x (β's, the gates') by name (delta_rule_inputs: speed section)
        q, k, v, p = delta_rule_inputs(self, x, cache, docs)
        q, k, v = q.view(B, T, self.H, self.dk), k.view(B, T, self.H, self.dk), v.view(B, T, self.H, self.dv)
        beta = torch.sigmoid(p['b_proj'].float())                    # [B, T, H]
        g = self.decay(p)
        if docs is not None and g is None:  # DeltaNet with documents: a gate of 0 but at the document starts, which
            g = beta.new_zeros(B, T, self.H)  # runs the Gated DeltaNet kernels (a little slower: they also form dg)
        o = scan(cache, q, k, v, g=reset_gate(g, docs), beta=beta, path=self.kernels, cp=self.cp)
        o = self.output_gate(p, self.o_norm(o))                      # [B, T, H, dv]
        return self.resid_dropout(self.c_proj(o.reshape(B, T, -1)))

    def core_flops_per_token(self, T, chunk=64):
        dk, dv = self.dk, self.dv
        return self.H * (6 * dk * dv + 2 * chunk * (3 * dk + 2 * dv) + 0.6 * chunk * chunk)


class GatedDeltaNet(DeltaNet):
    """Gated DeltaNet (docs/mixers.md §2.5): DeltaNet plus a scalar decay per head and a SiLU output gate
        g = −exp(A_log)·softplus(W_a x + dt_bias);  S̃ = exp(g_t) S_{t−1};  S_t = S̃ + β_t k_t (v_t − S̃ᵀ k_t)ᵀ
        y = W_o [RMSNorm(o_h) ⊙ SiLU(W_g x)_h]_h
    d_v = 2·d_k (fla's expand_v = 2), H = C / (2 hd): C=768, hd=64 → H=6, 2,374,796 params (1.01× softmax)."""

    projections = DeltaNet.projections + ('a_proj', 'g_proj')

    def __init__(self, config):
        C, hd = config.n_embd, config.head_dim
        super().__init__(config, n_head=max(1, C // (2 * hd)), v_dim=2 * hd)
        self.a_proj = nn.Linear(C, self.H, bias=False)
        self.A_log, self.dt_bias = init_decay_rates(self.H)
        self.g_proj = nn.Linear(C, self.H * self.dv, bias=config.bias)

    gate_fn = 'silu'

    def decay(self, p):
        return -torch.exp(self.A_log.float()) * F.softplus(p['a_proj'].float() + self.dt_bias)  # [B, T, H]

    def gate_input(self, p):
        return p['g_proj']


class KDA(DeltaNet):
    """Kimi Delta Attention (docs/mixers.md §2.6): Gated DeltaNet with a decay per head AND key channel
        g = −exp(A_log[h])·softplus(W_f↑ W_f↓ x + dt_bias)  ∈ R^{H×d_k};  S̃ = Diag(exp g_t) S_{t−1}
        S_t = S̃ + β_t k_t (v_t − S̃ᵀ k_t)ᵀ;   y = W_o [RMSNorm(o_h) ⊙ σ(W_g↑ W_g↓ x + b_g)_h]_h
    Low-rank (rank hd) gate and output-gate projections. H = C / hd, d_k = d_v = hd:
    C=768, hd=64 → H=12, 2,575,948 params (1.09× softmax); hd=128 → H=6, 2,768,006 (1.17×).
    config.kda_gate_bound = lb ∈ [−5, 0) (0: off, the gate above): fla's safe gate (docs/mixers.md §1.4 item 2)
        g = lb·sigmoid(exp(A_log[h])·(W_f↑ W_f↓ x + dt_bias))  ∈ (lb, 0)^{d_k}
    with A_log = 0 at init (fla's safe-gate init: A = 1, g ≈ lb·sigmoid(dt_bias), per-step decays ≈ 0.62–0.995
    for lb = −5 at u ≈ 0); dt_bias as above. Its kernels need no dyadic split (kernels.py 3.1, the bounded gate)."""

    projections = DeltaNet.projections + ('f_down', 'g_down')
    low_rank = (('f_down', 'f_up'), ('g_down', 'g_up'))  # (down, up): decode_copy multiplies each into one matrix

    def __init__(self, config):
        super().__init__(config)
        C, hd, H = config.n_embd, self.dk, self.H
        self.f_down, self.f_up = nn.Linear(C, hd, bias=False), nn.Linear(hd, H * hd, bias=False)
        self.g_down, self.g_up = nn.Linear(C, hd, bias=False), nn.Linear(hd, H * self.dv, bias=True)
        self.A_log, _ = init_decay_rates(H)
        _, self.dt_bias = init_decay_rates(H * hd)   # one dt bias per (head, key channel)
        self.gate_bound = float(config.kda_gate_bound) or None  # kernels' lower_bound: None = the softplus gate
        if self.gate_bound is not None:
            nn.init.zeros_(self.A_log)  # fla's safe-gate init (after the draw: the other weights init as without it)

    def decay(self, p):
        u = self.f_up(p['f_down']).unflatten(-1, (self.H, self.dk))  # the gate's input, [B, T, H, dk]
        # −exp(A)·softplus(u + b), or lb·sigmoid(exp(A)·(u + b)) with the bound: kernels.decay_gate, [B, T, H, dk],
        # formed by the delta-rule kernels from u (DecayGate: speed section)
        return DecayGate(u, self.A_log, self.dt_bias, self.gate_bound)

    gate_fn = 'sigmoid'

    def gate_input(self, p):
        return self.g_up(p['g_down'])


class GLA(nn.Module):
    """Gated linear attention (GLA, Yang et al. 2024; fla's layer with its defaults, docs/mixers.md §2.7): a decay per
    head and key channel, no delta rule
        α_t = σ(W_α↑ W_α↓ x_t + b_α)^(1/16)  ∈ (0, 1)^{d_k},  i.e.  g_t = log α_t = logsigmoid(·) / 16
        S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ,   o_t = S_tᵀ q_t / √d_k,   y = W_o [RMSNorm(o_h) ⊙ SiLU(W_g x)_h]_h
    No short conv, no RoPE, no feature map. Low-rank (16) gate projection; d_v = 2·d_k (fla's expand_k = 0.5,
    expand_v = 1), H = C / (2 hd): C=768, hd=64 → H=6, 2,378,240 params (1.01× softmax)."""
    cache_grows = False
    projections = ('q_proj', 'k_proj', 'v_proj', 'g_proj', 'f_down')  # the Linear layers that read x (linears)
    gate_rank, gate_norm = 16, 16  # fla's gate_low_rank_dim and gate_logit_normalizer
    cp = None  # parallel.ContextParallel while training on split sequences (GPT.set_context_parallel)

    def __init__(self, config):
        super().__init__()
        C, hd = config.n_embd, config.head_dim
        self.H, self.dk, self.dv = max(1, C // (2 * hd)), hd, 2 * hd
        self.kernels = config.kernels  # the path of its kernels.py calls
        self.q_proj = nn.Linear(C, self.H * self.dk, bias=config.bias)
        self.k_proj = nn.Linear(C, self.H * self.dk, bias=config.bias)
        self.v_proj = nn.Linear(C, self.H * self.dv, bias=config.bias)
        self.g_proj = nn.Linear(C, self.H * self.dv, bias=config.bias)  # the output gate
        self.f_down = nn.Linear(C, self.gate_rank, bias=False)
        self.f_up = nn.Linear(self.gate_rank, self.H * self.dk, bias=True)
        self.o_norm = RMSNorm(self.dv, eps=1e-5)
        self.c_proj = nn.Linear(self.H * self.dv, C, bias=config.bias)
        self.c_proj.residual_out = True
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, cache=None, docs=None):
        B, T, C = x.shape
        q, k, v, gate, f = linears(self, x, self.projections)  # x Wᵀ of each (linears: speed section)
        g = F.logsigmoid(self.f_up(f).float()) / self.gate_norm  # log-decay ≤ 0 per key channel, [B, T, H·dk]
        g = reset_gate(g.view(B, T, self.H, self.dk), docs)
        o = scan(cache, q.view(B, T, self.H, self.dk), k.view(B, T, self.H, self.dk), v.view(B, T, self.H, self.dv),
                 g=g, path=self.kernels, cp=self.cp)
        o = self.o_norm(o) * F.silu(gate.view(B, T, self.H, self.dv))
        return self.resid_dropout(self.c_proj(o.reshape(B, T, -1)))

    def core_flops_per_token(self, T, chunk=16):
        # state read and write (2·dk·dv each), the intra-chunk scores and their use (chunk 16 for this gate)
        return self.H * (4 * self.dk * self.dv + 2 * chunk * (self.dk + self.dv))


# ------------------------------------------------------------------------------------------------
# The one place mixers are named. Adding a mixer = one class above + one line here: every test, grid.py and
# tools/bench_train.py take their mixer lists from MIXERS. What a mixer class provides (check_mixer says what is missing):
#   __init__(self, config)                 sizes itself from config (n_embd, head_dim, ...) so that a layer has
#                                          0.8-1.2x a softmax layer's 4·n_embd² parameters (models with different
#                                          mixers compare; test_model.py's test_param_budget)
#   forward(self, x, cache=None, docs=None) -> y [B, T, C]   (the interface in this file's docstring)
#   core_flops_per_token(self, T)          forward FLOPs per token of the sequence-mixing core, for MFU (the Linear
#                                          layers are counted from the parameters)
#   cache_grows = False | True             class attribute: a fixed-size decode state (every tensor in the cache keeps
#                                          its shape from token to token, so Decoder can capture one CUDA graph) or
#                                          one that grows with the context: each of its tensors then holds one entry
#                                          per token along dim 2 ([B, heads, T, hs], as softmax's K/V); the Decoder's
#                                          static caches give them max_len entries there, and the mixer, finding a
#                                          tensor cache['pos'], writes the new token at pos (softmax's static_step)
#   projections = ('q_proj', ...)          optional: the nn.Linear attributes that all read x, fetched with
#                                          linears(self, x, self.projections), which computes them in fewer matmuls
#                                          (the speed section below); the Decoder stacks them into one
#   cp = None                              optional: context parallelism (train.py --context_parallel): GPT sets it
#                                          to a parallel.ContextParallel and forward then gets two pieces of
#                                          each sequence (scan(..., cp=self.cp), ShortConv(..., cp=self.cp) and
#                                          parallel.attention do the crossing; RoPE by cp.rope)
# The cache: a dict the mixer fills on its first call and advances on each later one; 'state' for scan's
# recurrent state, any other key for the mixer's own tensors. 'pos' is the number of tokens seen so far: a mixer
# that needs positions (RoPE) reads cache.get('pos', 0) and, where it is a plain int, stores past + T back (in the
# static caches of the Decoder it is one shared tensor, which GPT advances).


def check_mixer(name, mixer, n_embd):
    """Refuse a mixer instance that lacks what the rest of the code uses (the list above): a TypeError that says
    what to add."""
    where = f"mixer {name!r} ({type(mixer).__name__})"
    if not callable(getattr(mixer, 'core_flops_per_token', None)):
        raise TypeError(f"{where}: add core_flops_per_token(self, T) -> forward FLOPs per token of its "
                        f"sequence-mixing core (used for MFU)")
    if not isinstance(getattr(type(mixer), 'cache_grows', None), bool):
        raise TypeError(f"{where}: add the class attribute cache_grows = False (a fixed-size decode state) or True "
                        f"(a cache that grows with the context, like softmax's K/V)")
    for p in getattr(mixer, 'projections', ()):
        layer = getattr(mixer, p, None)
        if not isinstance(layer, nn.Linear) or layer.in_features != n_embd:
            raise TypeError(f"{where}: projections names {p!r}, which is not an nn.Linear attribute reading x; "
                            f"list only the Linear layers whose input is the mixer's input x")


MIXERS = {
    'softmax': CausalSelfAttention,
    'retnet': RetNet,
    'mamba2': Mamba2,
    'deltanet': DeltaNet,
    'gdn': GatedDeltaNet,
    'kda': KDA,
    'gla': GLA,
}


# ------------------------------------------------------------------------------------------------
# Speed: the mixers' input projections, fused. The mixers above call these by what they compute, and read without
# them; each gives the values of its plain form in fewer kernels (notes/perf.md has the measurements):
#   linears(module, x, names)                  [getattr(module, name)(x) for name in names]
#   delta_rule_inputs(mixer, x, cache, docs)   DeltaNet's, GDN's and KDA's q, k, v (projection, short conv, L2 of q
#                                              and k), and the mixer's other projections of x by name
#   delta_rule_decode(mixer, x, cache)         their one-token step from the projections to the output gate (convs,
#                                              β, decay, state, RMSNorm, gate) in one kernel (kernels.delta_rule_decode)
#   DecayGate(u, A_log, dt_bias, lower_bound)  KDA's log-decay kernels.decay_gate(u, A_log, dt_bias, lower_bound),
#                                              formed from u inside the delta-rule kernels (scan and reset_gate take it)
# The Decoder stacks each mixer's projections into one matrix (decode_copy), which linears then uses.

NARROW = 128  # linears: Linear layers with at most this many outputs are stacked into one matmul


def linears(module, x, names):
    """[module.<name>(x) for name in names]: the Linear layers that all read x. Stacked by a Decoder into
    `module.stacked` for one-token steps (each small matmul would be a kernel launch of its own). Otherwise the
    narrow ones (β, the gates' low-rank inputs: ≤ NARROW outputs) run as one matmul on their weights stacked per
    call (StackedLinear), as they run far below the matmul rate one by one and each adds a [B, T, C] term to x's
    gradient; a lone narrow layer goes the same way when its width is not a multiple of 8 (β of 6 or 12 heads ran
    on cuBLAS's slow Ampere align-2 kernels). The wide ones run one by one: stacking them too was slower (the cat
    of their gradients, and cuBLAS's Ampere kernels at widths that are not multiples of 8; notes/perf.md)."""
    stacked = getattr(module, 'stacked', None)
    if stacked is not None:
        weight, bias, sizes, linear = stacked
        return linear(x, weight, bias).split(sizes, dim=-1)
    layers = [getattr(module, n) for n in names]
    # widest first and zero rows to a multiple of 8 outputs: every part starts 16-byte aligned, as cuBLAS's fast
    # kernels want of a matmul that reads it (KDA's low-rank gate inputs)
    # (by index, not id(): a compiled block's graph must not depend on which block's layers these are: an id()
    # made torch.compile recompile per block when each block is compiled on its own, as under FSDP)
    order = sorted((i for i, m in enumerate(layers) if m.out_features <= NARROW), key=lambda i: -layers[i].out_features)
    narrow = [layers[i] for i in order]
    if not narrow or (len(narrow) == 1 and narrow[0].out_features % 8 == 0):
        return [m(x) for m in layers]
    sizes = [m.out_features for m in narrow]
    pad = -sum(sizes) % 8
    w0 = narrow[0].weight
    weight = torch.cat([m.weight for m in narrow] + [w0.new_zeros(pad, w0.shape[1])])
    bias = None if all(m.bias is None for m in narrow) else torch.cat(
        [m.bias if m.bias is not None else w0.new_zeros(m.out_features) for m in narrow] + [w0.new_zeros(pad)])
    xs = x
    if torch.is_autocast_enabled(x.device.type):  # the casts F.linear would make, made here: the backward's matmuls
        dt = torch.get_autocast_dtype(x.device.type)  # run on what the forward's did
        xs, weight, bias = x.to(dt), weight.to(dt), None if bias is None else bias.to(dt)
    part = dict(zip(order, StackedLinear.apply(xs, weight, bias, sizes + [pad])))
    return [part[i] if i in part else m(x) for i, m in enumerate(layers)]


class StackedLinear(torch.autograd.Function):
    """x [..., C], weight [N, C] (the row-stack of several Linear layers'), bias [N] | None -> the parts of
    x Wᵀ + b, split into `sizes` along the last dim (views of one matmul's output). The backward runs as one opaque
    op, stacked_linear_bwd: Inductor, given the cat of the parts' gradients, fused it into their producers' kernels,
    which made one slow kernel of them (notes/perf.md)."""

    @staticmethod
    def forward(ctx, x, weight, bias, sizes):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return tuple(F.linear(x, weight, bias).split(sizes, dim=-1))

    @staticmethod
    def backward(ctx, *dys):
        x, weight = ctx.saved_tensors
        dx, dw, db = stacked_linear_bwd(list(dys), x, weight, ctx.has_bias)
        return dx, dw, db if ctx.has_bias else None, None


@torch.library.custom_op("model::stacked_linear_bwd", mutates_args=())
def stacked_linear_bwd(dys: list[torch.Tensor], x: torch.Tensor, weight: torch.Tensor, has_bias: bool
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """StackedLinear's backward: dy = the parts' gradients side by side -> dx = dy W, dW = dyᵀ x, db = Σ dy
    (empty without a bias)."""
    dy = torch.cat([d.to(x.dtype) for d in dys], dim=-1).flatten(0, -2)
    dx = (dy @ weight).view(x.shape)
    dw = dy.t() @ x.flatten(0, -2)
    return dx, dw, dy.sum(0) if has_bias else dy.new_empty(0)


@stacked_linear_bwd.register_fake
def _(dys, x, weight, has_bias):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), x.new_empty(weight.shape[0] if has_bias else 0)


def delta_rule_inputs(m, x, cache=None, docs=None):
    """DeltaNet's (GDN's, KDA's) q, k [B, T, H·d_k] = L2(SiLU(conv(x W_qᵀ))), L2(SiLU(conv(x W_kᵀ))) per head,
    v [B, T, H·d_v] = SiLU(conv(x W_vᵀ)), and its other projections (β's, the gates') as a dict name -> x Wᵀ.
    Training (no cache): x W_qkvᵀ as one matmul on the three weights stacked (as softmax's c_attn), and the three
    convs as one op on its column slices, whose backward writes the gradient of that [B, T, 2·H·d_k + H·d_v] output
    whole: x's gradient is one matmul, with no cat of three gradients and no sum of three [B, T, C] terms. Prefill and
    decode: every projection by linears (one matmul under a Decoder), then each conv, which keeps its own inputs."""
    names, convs = m.projections, (m.q_conv, m.k_conv, m.v_conv)  # names: q, k, v first
    pos = None if docs is None else docs['conv_pos']
    if cache is None:
        projs = (m.q_proj, m.k_proj, m.v_proj)
        bias = None if projs[0].bias is None else torch.cat([lin.bias for lin in projs])
        y = F.linear(x, torch.cat([lin.weight for lin in projs]), bias)
        conv = kernels.short_conv if m.cp is None else functools.partial(parallel.short_conv, m.cp)
        q, k, v = conv(y, torch.cat([c.weight for c in convs]), None, norm=[c.norm for c in convs], path=m.kernels,
                       doc_pos=pos, split=[lin.out_features for lin in projs])
        return q, k, v, dict(zip(names[3:], linears(m, x, names[3:])))
    p = dict(zip(names, linears(m, x, names)))
    q, k, v = (conv(p[name], cache, doc_pos=pos) for conv, name in zip(convs, names[:3]))
    return q, k, v, p


def delta_rule_decode(m, x, cache):
    """DeltaNet's (GDN's, KDA's) one-token step, x [B, 1, C] -> the output gate's output [B, 1, H, d_v]: the
    projections by linears (one matmul under a Decoder), then kernels.delta_rule_decode: the three short convs,
    β = σ(W_b x), the decay (KDA's DecayGate formed there), the state update, the RMSNorm and the output gate, which
    on CUDA are one kernel instead of about seven."""
    names, convs = m.projections, (m.q_conv, m.k_conv, m.v_conv)
    p = dict(zip(names, linears(m, x, names)))
    g, gate = m.decay(p), {}
    if isinstance(g, DecayGate):
        g, gate = g.u, dict(A_log=g.A_log, dt_bias=g.dt_bias, lower_bound=g.lower_bound)
    z = m.gate_input(p)
    o = kernels.delta_rule_decode(*(p[n][:, 0] for n in names[:3]), [cache[c.name] for c in convs],
                                  [c.weight for c in convs], p['b_proj'][:, 0],
                                  None if g is None else g[:, 0].flatten(1), cache['state'], **gate,
                                  norm=(m.o_norm.weight, m.o_norm.eps), gate=None if z is None else z[:, 0],
                                  gate_fn=m.gate_fn, path=m.kernels)
    return o[:, None]


class DecayGate(NamedTuple):
    """KDA's log-decay kernels.decay_gate(u, A_log, dt_bias, lower_bound) [B, T, H, Dk], which the delta-rule kernels
    form from u (kernels.delta_rule's A_log=, dt_bias=, lower_bound=): its fp32 values are never written out and its
    backward is one pass. scan hands it to the kernels; reset_gate (documents) forms it, as it edits the values."""
    u: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    lower_bound: float | None  # None: the softplus gate


# ------------------------------------------------------------------------------------------------
# Block and GPT

class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config, mixer_name):
        super().__init__()
        self.mixer_name = mixer_name
        self.ln_1 = RMSNorm(config.n_embd)
        self.mixer = MIXERS[mixer_name](config)  # the token mixer (nanoGPT's `attn`; old checkpoints are remapped on load)
        check_mixer(mixer_name, self.mixer, config.n_embd)
        self.ln_2 = RMSNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, cache=None, docs=None):
        x = x + self.mixer(self.ln_1(x), cache, docs)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        if not isinstance(config.vocab_size, int) or config.vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {config.vocab_size!r}")
        self.config = config
        self.mixers = parse_mixer_pattern(config.mixer, config.n_layer)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),  # no wpe: positions come from RoPE / recurrence
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, name) for name in self.mixers]),
            ln_f=RMSNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.cp = None  # context parallelism (set_context_parallel)
        self.recompute = False  # activation checkpointing while training (train.py's activation_checkpointing)
        self.loss_only = False  # without gradients, a forward with targets returns the loss alone (train.py's eval
                                # without a task): the logits made LOSS_CHUNK tokens at a time, never whole
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)

    def _init_weights(self, module):
        # GPT-2 init: N(0, 0.02); projections that write into the residual stream get 0.02/sqrt(2·n_layer).
        # Mixer-specific parameters (decay rates, convs, norms) are initialised by their own modules.
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(2 * self.config.n_layer) if getattr(module, 'residual_out', False) else 0.02
            torch.nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def describe(self):
        """The resolved per-layer mixer list and parameters per mixer, printed at start."""
        per_layer = {}
        for block in self.transformer.h:
            per_layer.setdefault(block.mixer_name, sum(p.numel() for p in block.mixer.parameters()))
        lines = [f"mixers per layer: {' '.join(self.mixers)}"]
        for name, n in per_layer.items():
            lines.append(f"  {name}: {self.mixers.count(name)} layers, {n:,} mixer parameters per layer")
        lines.append(f"number of parameters: {self.get_num_params() / 1e6:.2f}M")
        return '\n'.join(lines)

    def set_context_parallel(self, cp):
        """Train on pieces of sequences split over cp's ranks (a parallel.ContextParallel; None: whole
        sequences): forward(idx, targets) then takes this rank's pieces of each row (cp.take), and its loss is this rank's share
        (parallel.py's context-parallel section says how averaging it over the ranks gives the mean over every token)."""
        for block in self.transformer.h:
            if cp is not None and not hasattr(type(block.mixer), 'cp'):
                raise UserError(f"mixer {block.mixer_name!r} does not support context parallelism (its class has no "
                                f"`cp` attribute, model.py's mixer list says what it takes): train without "
                                f"--context_parallel")
        if cp is not None and self.config.dropout > 0:
            raise UserError(f"context parallelism runs without dropout (attention over gathered keys has none): "
                            f"--dropout=0 (now {self.config.dropout})")
        for block in self.transformer.h:
            block.mixer.cp = cp
        self.cp = cp

    def length_warning(self, T):
        """One line when T tokens of context run past what softmax layers were trained on (block_size), else None:
        their RoPE rotations for distances beyond it were never seen, and such models usually get worse there (the
        linear mixers carry a state, not positions, and run at any length)."""
        if T > self.config.block_size and 'softmax' in self.mixers:
            return (f"warning: {T:,} tokens of context > block_size {self.config.block_size:,}, the length its softmax "
                    f"layers were trained on: past it their positions are unseen and predictions usually degrade")
        return None

    def forward(self, idx, targets=None, caches=None):
        """idx [B, T] → logits [B, T, V] (and the mean cross-entropy if targets is given; -1 targets are ignored; the
        logits then come back detached, or None: loss_head). With caches (a list
        from new_caches), only the last position's logits are returned and the caches advance by T tokens.
        config.documents: each document of a row is its own sequence (see documents); not with caches: a prompt, and
        what is decoded after it, is one document."""
        if self.cp is not None and caches is not None:
            raise ValueError("a model training with context parallelism cannot decode: set_context_parallel(None) first")
        docs = self.documents(idx) if self.config.documents and caches is None else None
        x = self.transformer.drop(self.transformer.wte(idx))
        recompute = self.recompute and caches is None and torch.is_grad_enabled()
        static = caches is not None and torch.is_tensor(caches[0].get('pos'))  # the Decoder's (static_caches)
        for i, block in enumerate(self.transformer.h):
            if recompute:  # keep only the block's input; its activations are recomputed in the backward
                x = torch.utils.checkpoint.checkpoint(block, x, None, docs, use_reentrant=False)
            elif static and idx.size(1) > 1:  # a prefill piece: the mixer may replace its state tensors; their
                before = dict(caches[i])     # new values go into the static ones, whose addresses a graph holds
                x = block(x, caches[i], docs)
                for key, t in before.items():
                    if caches[i][key] is not t:
                        t.copy_(caches[i][key])
                        caches[i][key] = t
            else:
                x = block(x, None if caches is None else caches[i], docs)
        x = self.transformer.ln_f(x)
        if static:
            caches[0]['pos'] += idx.size(1)  # static caches: one position tensor shared by every layer
        if targets is not None:
            return self.loss_head(x, targets)
        if caches is not None:
            return self.lm_head(x[:, -1:, :]), None  # generation needs only the next-token logits
        return self.lm_head(x), None

    LOSS_CHUNK = 8192  # tokens per piece of the output layer and loss under recompute (training) or loss_only (eval)

    def loss_head(self, x, targets):
        """(logits, loss) from the final norm's output x: the output layer and the mean cross-entropy (-1 targets
        ignored; under context parallelism this rank's share, parallel.loss). A method of its own so that
        train.py can compile it apart from the blocks under FSDP. With self.recompute while training, or
        self.loss_only without gradients (an eval), the logits come back None: they are made LOSS_CHUNK tokens at a
        time (while training recomputed in the backward), so that the [tokens, vocab] logits (and their gradient)
        never exist whole, which at long contexts outweighs the blocks."""
        grad = torch.is_grad_enabled()
        if (self.recompute if grad else self.loss_only) and targets.numel() > self.LOSS_CHUNK:
            xs, ts = x.flatten(0, 1).split(self.LOSS_CHUNK), targets.flatten().split(self.LOSS_CHUNK)
            if grad:
                total = sum(torch.utils.checkpoint.checkpoint(self._loss_sum, a, b, use_reentrant=False)
                            for a, b in zip(xs, ts))
            else:
                total = sum(self._loss_sum(a, b) for a, b in zip(xs, ts))
            count = (targets != -1).sum().float()
            if self.cp is not None:  # this rank's share (parallel.loss)
                return None, total * self.cp.size / self.cp.total(count)
            return None, total / count
        logits = self.lm_head(x)
        if self.cp is not None:
            loss = parallel.loss(self.cp, logits, targets)
        else:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        # detached: the gradient flows through the loss; a differentiable logits output would make the backward
        # start from a zero-filled [B, T, V] gradient for it (bf16: 32,768 tokens × 50,304 × 2 B = 3.3 GB)
        return logits.detach(), loss

    def _loss_sum(self, x, targets):
        """The summed cross-entropy of tokens x [n, C] (loss_head's pieces)."""
        return F.cross_entropy(self.lm_head(x).float(), targets, ignore_index=-1, reduction='sum')

    def documents(self, idx):
        """Where the documents of the rows idx [B, T] start, for every layer of one forward (config.documents). A
        token starts a document if it is the row's first or the end-of-text token (config.eot_token): prepare.py
        writes EOT *before* each document, so a document is [EOT, its tokens], its EOT predicts the first token from
        nothing earlier (as a sample.py prompt of '<|endoftext|>' does), and two EOTs in a row make a document of
        one token. No pass over the data: one comparison of the batch. -> dict of
          reset     [B, T] bool, the starts after position 0: the linear mixers' gates become RESET_GATE there
          conv_pos  [B, T] uint8, the position inside the document clipped at 3: the short convs' doc_pos
          and with softmax layers block_mask (CUDA, flex_attention; document_block_mask) or mask [B, 1, T, T] bool
          (SDPA: CPU, torch < 2.5, or attention dropout while training)."""
        B, T = idx.shape
        if self.cp is not None:
            return self.split_documents(idx)
        t = torch.arange(T, device=idx.device)
        start = (idx == self.config.eot_token) | (t == 0)
        first = torch.where(start, t, 0).cummax(dim=1).values        # [B, T] the position of each token's document start
        docs = dict(reset=start & (t > 0), conv_pos=(t - first).clamp(max=3).to(torch.uint8))
        if 'softmax' in self.mixers:
            doc = start.cumsum(dim=1, dtype=torch.int32)             # [B, T] document ids, nondecreasing
            if idx.is_cuda and flex_attention is not None and not (self.training and self.config.dropout > 0):
                docs['block_mask'] = document_block_mask(doc)
            else:
                docs['mask'] = ((doc[:, :, None] == doc[:, None, :]) & (t[:, None] >= t[None, :]))[:, None]
        return docs

    def split_documents(self, idx):
        """documents() for this rank's two pieces idx [B, 2l] of rows split over self.cp's ranks: the same keys, with
        positions and document ids of the whole row; softmax's masks, one per own piece, over the keys of every
        piece up to it ('cp_block_mask' or 'cp_mask' [B, 1, l, (p+1)·l], parallel.attention)."""
        reset, conv_pos, pieces = parallel.documents(self.cp, idx, self.config.eot_token)
        docs = dict(reset=reset, conv_pos=conv_pos)
        if 'softmax' in self.mixers:
            masks, block_masks = [], []
            for (doc, keys, t), p in zip(pieces, self.cp.pieces):
                B, l, S = doc.size(0), doc.size(1), keys.size(1)
                if idx.is_cuda and flex_attention is not None:
                    def same_document(b, h, q_idx, kv_idx, doc=doc, keys=keys, off=p * l):
                        return (q_idx + off >= kv_idx) & (doc[b, q_idx] == keys[b, kv_idx])
                    block_masks.append(create_block_mask(same_document, B, None, l, S, device=idx.device,
                                                         BLOCK_SIZE=128))
                else:
                    masks.append(((doc[:, :, None] == keys[:, None, :]) &
                                  (t[:, None] >= torch.arange(S, device=idx.device)[None, :]))[:, None])
            docs['cp_block_mask' if block_masks else 'cp_mask'] = block_masks or masks
        return docs

    # --- decoding -------------------------------------------------------------------------------

    def new_caches(self):
        """One empty cache per layer; each mixer fills its own dict on the first (prefill) call."""
        return [{} for _ in self.transformer.h]

    def cache_bytes(self, caches):
        """(fixed, growing): bytes held by fixed-size states (linear mixers) and by K/V caches (softmax)."""
        fixed = growing = 0
        for block, cache in zip(self.transformer.h, caches):
            n = sum(t.numel() * t.element_size() for t in cache.values() if torch.is_tensor(t) and t.dim())  # not 'pos'
            if getattr(block.mixer, 'cache_grows', False):
                growing += n
            else:
                fixed += n
        return fixed, growing

    @torch.no_grad()
    def generation_bytes(self, batch, prompt, context, device):
        """A lower bound on the memory that generating `batch` sequences of `context` tokens from a `prompt`-token
        prompt through a Decoder holds at once: their caches (each tensor's size per sequence from a one-token
        prefill; run it under the decode's autocast), the token buffer, the residual stream of a prefill piece and the
        last logits. Returns (total, per sequence)."""
        caches = self.new_caches()
        self(torch.zeros(1, 1, dtype=torch.long, device=device), caches=caches)
        fixed, per_position = self.cache_bytes(caches)
        piece = min(prompt, max(1, Decoder.PIECE // batch))
        per_sequence = (fixed + (per_position + 8) * context
                        + 4 * (piece * self.config.n_embd + self.config.vocab_size))
        return batch * per_sequence, per_sequence

    def static_caches(self, batch, max_len, device):
        """Decode caches of fixed size and address, zero-filled (what Decoder captures once as a CUDA graph): per layer
        the linear mixer's state and conv windows, or a growing cache's tensors (softmax's K/V) for max_len positions,
        and one 0-dim int64 'pos' (tokens so far) shared by every layer. Shapes and dtypes come from a one-token
        prefill (run it under the decode's autocast); Decoder.prefill runs a prompt into them, in pieces."""
        caches = self.new_caches()
        with torch.no_grad():
            self(torch.zeros(batch, 1, dtype=torch.long, device=device), caches=caches)
        pos = torch.zeros((), dtype=torch.long, device=device)
        for block, cache in zip(self.transformer.h, caches):
            for key, t in list(cache.items()):
                if torch.is_tensor(t) and block.mixer.cache_grows:  # one entry per token along dim 2 (MIXERS' notes)
                    cache[key] = t.new_zeros(t.shape[:2] + (max_len,) + t.shape[3:])
                elif torch.is_tensor(t):
                    t.zero_()
            cache['pos'] = pos
        return caches

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, caches=None, n_vocab=None, timings=None):
        """Prefill idx [B, T] in one forward, then decode token by token through the caches (eager: one Python
        forward per token; Decoder replays a CUDA graph instead).
        n_vocab: the tokenizer's vocabulary (50257 for GPT-2); ids in the padding above it are never drawn.
        timings: a dict that receives 'prefill' and 'decode' seconds. Returns (idx extended by max_new_tokens, caches)."""
        clock = Clock(idx.device)
        caches = self.new_caches() if caches is None else caches
        logits, _ = self(idx, caches=caches)
        prefill = clock()
        for _ in range(max_new_tokens):
            idx_next = sample_next(logits[:, -1], temperature, top_k, n_vocab)
            idx = torch.cat((idx, idx_next), dim=1)
            logits, _ = self(idx_next, caches=caches)
        if timings is not None:
            timings.update(prefill=prefill, decode=clock())
        return idx, caches

    # --- training helpers -----------------------------------------------------------------------

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, optimizer='adamw'):
        """AdamW; matrices (dim >= 2) decay, vectors (norms, biases, decay rates, dt biases) do not, nor any parameter
        a mixer marks with `_no_weight_decay = True`. optimizer='muon' (optim.Muon): the blocks' weight matrices
        (2-D, not marked `_no_muon = True` as a conv kernel is) by Muon, with weight decay; the rest as with AdamW."""
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        muon = [p for n, p in params.items() if optimizer == 'muon' and n.startswith('transformer.h.') and p.dim() == 2
                and not getattr(p, '_no_muon', False) and not getattr(p, '_no_weight_decay', False)]
        in_muon = {id(p) for p in muon}
        rest = [p for p in params.values() if id(p) not in in_muon]
        decay = [p for p in rest if p.dim() >= 2 and not getattr(p, '_no_weight_decay', False)]
        no_decay = [p for p in rest if p.dim() < 2 or getattr(p, '_no_weight_decay', False)]
        groups = [{'params': decay, 'weight_decay': weight_decay}, {'params': no_decay, 'weight_decay': 0.0}]
        if int(os.environ.get('RANK', '0')) == 0:  # once, not once per DDP rank
            if muon:
                print(f"num Muon parameter tensors: {len(muon)}, with {sum(p.numel() for p in muon):,} parameters")
            print(f"num decayed parameter tensors: {len(decay)}, with {sum(p.numel() for p in decay):,} parameters")
            print(f"num non-decayed parameter tensors: {len(no_decay)}, with {sum(p.numel() for p in no_decay):,} parameters")
        if optimizer == 'muon':
            return Muon([{'params': muon, 'weight_decay': weight_decay, 'muon': True}] + groups, lr=learning_rate,
                        betas=betas)
        # fused: one kernel a step on CUDA; and it can skip a step on the device (found_inf), which lets train.py
        # read each step's loss a step late without a non-finite step reaching the weights
        fused = device_type in ('cuda', 'cpu')
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    def flops_per_token(self, T):
        """Training FLOPs per token: 6 per parameter (fwd 2 + bwd 4) + 3× the mixers' forward core FLOPs."""
        core = sum(block.mixer.core_flops_per_token(T) for block in self.transformer.h)
        return 6 * self.get_num_params() + 3 * core



# ------------------------------------------------------------------------------------------------
# Fast generation: the one-token step over static caches, captured once as a CUDA graph and replayed per token.

def sample_next(logits, temperature=1.0, top_k=None, n_vocab=None):
    """logits [B, V] -> next token ids [B, 1] on logits' device, with no host sync (so that it can run inside a CUDA
    graph; torch.multinomial checks its input on the host): greedy at temperature 0, else a draw from
    softmax(logits / temperature) restricted to the top_k of the first n_vocab ids, as the exponential race
    argmax(logits / temperature − log E), E ~ Exp(1) i.i.d. The top_k threshold is found in the logits' own dtype
    (bf16: a radix select of two passes, not four's of fp32)."""
    logits = logits[:, :n_vocab]
    if temperature == 0:
        return argmax_rows(logits.float())
    y = logits.float() / temperature - torch.empty_like(logits, dtype=torch.float32).exponential_().log()
    if top_k is not None and top_k < logits.size(-1):
        v, _ = torch.topk(logits, top_k, sorted=False)  # (their order is not needed: no sort kernel)
        y = y.masked_fill(logits < v.amin(-1, keepdim=True), -float("inf"))
    return argmax_rows(y)


def argmax_rows(y, chunk=1024):
    """y.argmax(-1, keepdim=True) for y [B, V] (the first of equal maxima), over chunks of each row first, then over
    the chunks' maxima: compiled, a program per chunk, where one row's argmax is one program that walks all of
    GPT-2's 50,257 logits alone (its time: notes/results.md §7)."""
    B, V = y.shape
    if V <= chunk:
        return y.argmax(-1, keepdim=True)
    pad = -V % chunk
    y = F.pad(y, (0, pad), value=-float("inf")).view(B, (V + pad) // chunk, chunk)
    best, at = y.max(-1)                  # [B, chunks]: each chunk's maximum and where it is
    c = best.argmax(-1, keepdim=True)     # the first chunk that holds the row's maximum
    return c * chunk + at.gather(-1, c)


def decode_copy(model, dtype=None):
    """A copy of model for decoding (the Decoder's; made once, so later changes to model's weights are not seen):
    the weights of its Linear layers stored in dtype (autocast's: the very values autocast would cast them to at every
    call, one cast kernel per weight per token), the embedding kept as it is (the residual stream stays in its
    dtype, as under autocast; tied to the output layer in model, untied here), each low-rank pair a mixer names in
    `low_rank` multiplied into one matrix (KDA's gates: a wider matmul is cheaper than a second kernel per token), and
    the Linear layers that read the same input stacked into one matrix per module (linears: their weights become
    views of it); every matmul through kernels.linear_step (a GEMV for one-token steps on CUDA; F.linear where
    GPTConfig.kernels forces the torch paths)."""
    m = copy.deepcopy(model)
    step_linear = functools.partial(kernels.linear_step, path=model.config.kernels)
    for module in list(m.modules()):  # a mixer's low-rank pairs y = U (D x): one [out, in] matrix UD (one matmul)
        for down, up in getattr(module, 'low_rank', ()):
            d, u = getattr(module, down), getattr(module, up)
            fused = nn.Linear(d.in_features, u.out_features, bias=u.bias is not None or d.bias is not None,
                              device=d.weight.device, dtype=d.weight.dtype)
            with torch.no_grad():
                fused.weight.copy_(u.weight @ d.weight)
                if fused.bias is not None:  # U (D x + b_D) + b_U
                    bias = u.bias if u.bias is not None else torch.zeros_like(fused.bias)
                    fused.bias.copy_(bias + u.weight @ d.bias if d.bias is not None else bias)
            setattr(module, down, fused)
            setattr(module, up, nn.Identity())
    low = dtype not in (None, torch.float32)
    if low:
        m.lm_head.weight = nn.Parameter(m.lm_head.weight.detach().clone())  # untie: wte stays in its dtype
    for module in m.modules():
        if low and isinstance(module, nn.Linear):
            module.weight.data = module.weight.data.to(dtype)
            if module.bias is not None:
                module.bias.data = module.bias.data.to(dtype)
    for module in m.modules():
        names = getattr(module, 'projections', None)
        if names:
            layers = [getattr(module, n) for n in names]
            weight = torch.cat([l.weight.detach() for l in layers])
            bias = None
            if any(l.bias is not None for l in layers):
                bias = torch.cat([l.bias.detach() if l.bias is not None else l.weight.new_zeros(l.out_features)
                                  for l in layers])
            sizes = [l.out_features for l in layers]
            for l, w in zip(layers, weight.split(sizes)):
                l.weight = nn.Parameter(w, requires_grad=False)
            module.stacked = (weight, bias, sizes, step_linear)
    for module in m.modules():
        if type(module) is nn.Linear:
            module.__class__ = StepLinear  # (the same module, its forward by linear_step)
            module.path = model.config.kernels
    return m.requires_grad_(False).eval()


class StepLinear(nn.Linear):
    """A Linear layer of a Decoder's copy: kernels.linear_step, which sends one-token inputs on CUDA to a GEMV (a
    batch-1 step is some fifty matmuls whose cost is each kernel's, not the bytes; notes/results.md §7). path:
    GPTConfig.kernels ('torch': F.linear always)."""
    path = 'auto'

    def forward(self, x):
        return kernels.linear_step(x, self.weight, self.bias, path=self.path)


class Decoder:
    """Generation at a small, constant cost per token. Static caches for `batch` sequences of up to `max_len` tokens
    (prompt included); the one-token step (forward through them, sampling on the GPU, the token written into the
    output buffer) built once — its forward and draw torch.compile'd when compile=True, which fuses the many small
    kernels of a one-token forward — and on CUDA captured as a CUDA graph that is replayed per token: no Python and
    no host sync per token. On CPU (or graph=False) the same step runs eagerly.

        dec = Decoder(model, batch=2, max_len=1024, temperature=0.8, top_k=200, n_vocab=50257, dtype=torch.bfloat16)
        out = dec.generate(idx, max_new_tokens)      # idx [2, T] -> [2, T + max_new_tokens]

    A generate call with another batch size, or longer than max_len, reallocates the caches and captures the step
    again for its shape (the compiled step is reused: softmax's K/V length is symbolic to the compiler); nothing is
    ever read or written past the caches. The weights are those of `model` when the Decoder was built."""

    def __init__(self, model, batch, max_len, temperature=1.0, top_k=None, n_vocab=None, dtype=None,
                 graph=True, compile=True):
        self.model = decode_copy(model, dtype)
        self.temperature, self.top_k, self.n_vocab = temperature, top_k, n_vocab
        self.device = next(model.parameters()).device
        kind = self.device.type  # (not self inside the lambda: a reference cycle, as below)
        self.autocast = lambda: (torch.autocast(kind, dtype=dtype) if dtype not in (None, torch.float32)
                                 else contextlib.nullcontext())
        cuda = self.device.type == 'cuda'
        # the function, not the bound method: self.next = self._next would be a reference cycle, which keeps
        # the caches (GBs at long contexts) alive after the last reference to the Decoder goes, until a gc pass
        self.next = Decoder._next
        if compile and cuda:  # Inductor's kernels with programmatic dependent launch too, where the GEMV has it
            from torch._inductor import config as inductor
            pdl = (kernels.pdl(self.device) and hasattr(inductor.triton, 'enable_pdl')
                   and model.config.kernels in ('auto', 'triton'))  # (as the GEMV's: not with the torch paths)
            self.next = torch.compile(Decoder._next, fullgraph=True, options={'triton.enable_pdl': True} if pdl else None)
        self.use_graph = cuda and graph
        self._build(batch, max_len)

    def _build(self, batch, max_len):
        """Static caches for batch x max_len tokens, and (CUDA) the step captured for them."""
        self.batch, self.max_len, self.graph = batch, max_len, None
        with self.autocast():
            self.caches = self.model.static_caches(batch, max_len, self.device)
        self.pos = self.caches[0]['pos']                          # tokens in the caches (shared by every layer)
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=self.device)        # the token being fed
        self.out = torch.zeros(batch, max_len + 1, dtype=torch.long, device=self.device)  # every token, by position
        for block, cache in zip(self.model.transformer.h, self.caches):  # one compiled step for every max_len: the
            for key, t in cache.items():                                   # length of a growing cache is symbolic
                if block.mixer.cache_grows and key != 'pos':
                    torch._dynamo.maybe_mark_dynamic(t, 2)
        if self.use_graph:
            side = torch.cuda.Stream()  # warm-up off the default stream, as CUDA graph capture requires
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # compiles, autotunes, and runs every Triton kernel once before the capture
                    self._step()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._step()

    @torch.no_grad()
    def _forward(self):
        with self.autocast():
            return self.model(self.tok, caches=self.caches)[0][:, -1]   # advances pos

    @torch.no_grad()
    def _next(self):  # the forward and the draw, compiled together: the draw's small kernels fuse too
        return sample_next(Decoder._forward(self), self.temperature, self.top_k, self.n_vocab)

    @torch.no_grad()
    def _step(self):
        nxt = self.next(self)
        self.tok.copy_(nxt)
        self.out.index_copy_(1, self.pos.view(1), nxt)

    PIECE = 16384  # tokens per prefill forward, over the batch: bounds the prefill's working memory

    @torch.no_grad()
    def prefill(self, idx, piece=None):
        """Run the prompt idx [batch, T] through the model into the static caches, in pieces of `piece` tokens
        (default PIECE // batch) so that what a forward holds besides the caches is bounded by the piece, not the
        prompt: the linear mixers carry their state from piece to piece, softmax writes its K/V straight into their
        slots. Then draw the first new token from the last logits. -> T"""
        B, T = idx.shape
        if T < 1:
            raise ValueError("the prompt is empty: give at least one token (e.g. <|endoftext|>, a document start)")
        if B != self.batch or T >= self.max_len:
            raise ValueError(f"this Decoder holds {self.batch} sequences of up to {self.max_len} tokens; got a prompt "
                             f"of {B} x {T}: build a Decoder with batch={B}, max_len>{T}")
        for cache in self.caches:  # a fresh start: empty states, and no stale K/V (or NaN) behind the mask
            for t in cache.values():
                t.zero_()
        piece = piece or max(1, self.PIECE // B)
        with self.autocast():
            for s in range(0, T, piece):
                logits, _ = self.model(idx[:, s:s + piece], caches=self.caches)
        nxt = sample_next(logits[:, -1], self.temperature, self.top_k, self.n_vocab)
        self.out[:, :T].copy_(idx)
        self.out[:, T:T + 1].copy_(nxt)
        self.tok.copy_(nxt)
        self.T, self.steps = T, 0
        return T

    def seek(self, T):
        """Set the position to T with no prompt, the caches as they are: for benchmarks of the step, whose cost
        depends on the position (the K/V slots read), not on what the caches hold."""
        if not 0 < T < self.max_len:
            raise ValueError(f"this Decoder holds up to {self.max_len} tokens: cannot seek to {T}")
        self.pos.fill_(T)
        self.T, self.steps = T, 0

    @torch.no_grad()
    def decode(self, n):
        """n more tokens (n replays of the graph, or eager steps). The caller checks nothing per token: the
        positions were checked here, before any replay."""
        if self.T + 1 + self.steps + n > self.max_len:
            raise ValueError(f"this Decoder holds {self.batch} sequences of up to {self.max_len} tokens; "
                             f"{self.T + 1 + self.steps} are there, {n} more do not fit: build a Decoder with a larger max_len")
        for _ in range(n):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._step()
        self.steps += n

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, timings=None):
        """idx [batch, T] -> [batch, T + max_new_tokens]: prefill, then max_new_tokens − 1 steps.
        Reallocates (and captures again) when the batch differs or the tokens do not fit. timings: a dict that receives
        'prefill' and 'decode' seconds."""
        B, T = idx.shape
        if max_new_tokens == 0:
            if timings is not None:
                timings.update(prefill=0.0, decode=0.0)
            return idx
        if B != self.batch or T + max_new_tokens > self.max_len:
            self.graph = self.caches = None  # freed before the new ones are allocated
            self._build(B, max(T + max_new_tokens, self.max_len if B == self.batch else 0))
        clock = Clock(idx.device)
        self.prefill(idx)
        prefill = clock()
        self.decode(max_new_tokens - 1)
        out = self.out[:, :T + max_new_tokens].clone()
        if timings is not None:
            timings.update(prefill=prefill, decode=clock())
        return out


class Clock:
    """Seconds since the last call (the first: since construction), after the device's queued work has finished."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == 'cuda'
        self.t = self.now()

    def now(self):
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def __call__(self):
        t, self.t = self.t, self.now()
        return self.t - t



def gpu_peak_flops(name):
    """Dense bf16 peak FLOP/s of a GPU by its name (torch.cuda.get_device_name), or None when unknown (MFU is then
    not printed). Used by train.py and tools/bench_train.py."""
    for key, flops in (('H200', 989e12), ('H100 PCIe', 756e12), ('H100', 989e12), ('A100', 312e12), ('L40S', 362e12),
                       ('4090', 165e12), ('A10', 125e12), ('L4', 121e12), ('V100', 125e12), ('3090', 71e12)):
        if key in name:
            return flops
    return None
