"""
The model: one GPTConfig, the token mixers, the pre-norm block and the GPT.

    python -m pytest test_model.py -q          # shapes, loss at init, decode == forward, causality

Reading order: config → mixer pattern → shared pieces (RMSNorm, RoPE, short conv, MLP) → the mixers
(softmax, then the linear ones) → MIXERS (the one place mixers are named) → Block → GPT.

Every mixer has the same interface:
    forward(x, cache=None) -> y          x, y: [B, T, C]
    - cache is None: training / plain forward over the whole sequence.
    - cache is a dict (start with {}): the mixer continues from what the dict holds and updates it in
      place — prefill is a call with T > 1 tokens, decode a call with T = 1. Softmax keeps K/V (grows
      with the context); the linear mixers keep a fixed-size fp32 state plus their short-conv inputs.
    core_flops_per_token(T) -> forward FLOPs of the sequence-mixing core (projections are counted
    from the parameter count), used for MFU.
"""
import math
import os
import re
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F



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


# ------------------------------------------------------------------------------------------------
# Mixer pattern: a comma-separated list tiled over the layers; 'name*k' repeats a name k times.
#   'kda' → every layer;  'kda,kda,kda,softmax' = 'kda*3,softmax' → the 3:1 hybrid;  one per layer → explicit.

def parse_mixer_pattern(pattern, n_layer):
    if not isinstance(pattern, str) or not pattern.strip():
        raise ValueError(f"mixer must be a non-empty string like 'kda*3,softmax', got {pattern!r}")
    names = []
    for item in pattern.replace(' ', '').split(','):
        m = re.fullmatch(r'([a-z0-9_]+)(?:\*(\d+))?', item)
        if m is None:
            raise ValueError(f"cannot parse '{item}' in mixer pattern '{pattern}' (expected name or name*count)")
        name, count = m.group(1), int(m.group(2) or 1)
        if name not in MIXERS:
            raise ValueError(f"unknown mixer '{name}' in pattern '{pattern}'; valid mixers: {', '.join(MIXERS)}")
        if count < 1:
            raise ValueError(f"repeat count must be >= 1 in '{item}' of pattern '{pattern}'")
        names += [name] * count
    if n_layer % len(names) != 0:
        raise ValueError(f"mixer pattern '{pattern}' has {len(names)} layers, which does not tile n_layer={n_layer}")
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


def apply_rope(x, pos0, base):
    """Rotary embedding, rotate-half pairing (dim i with i + hs/2). x: [B, T, nh, hs]; positions pos0..pos0+T-1."""
    B, T, nh, hs = x.shape
    inv_freq = 1.0 / (base ** (torch.arange(0, hs, 2, device=x.device, dtype=torch.float32) / hs))  # [hs/2]
    pos = torch.arange(pos0, pos0 + T, device=x.device, dtype=torch.float32)
    angles = pos[:, None] * inv_freq[None, :]                               # [T, hs/2]
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]  # [1, T, 1, hs/2]
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

    def forward(self, x):
        return self.dropout(self.c_proj(F.silu(self.c_fc(x)) * self.c_gate(x)))


# ------------------------------------------------------------------------------------------------
# Softmax attention: causal, RoPE, optional GQA, F.scaled_dot_product_attention.
#   o_t = Σ_{i≤t} softmax_i(q_t·k_i / √hs) v_i      cache: K, V of every past token (grows with T)

class CausalSelfAttention(nn.Module):
    cache_grows = True

    def __init__(self, config, layer_idx=0):
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
        self.rope_base = config.rope_base

    def forward(self, x, cache=None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split([self.n_head * self.hs, self.n_kv_head * self.hs, self.n_kv_head * self.hs], dim=2)
        q = q.view(B, T, self.n_head, self.hs)
        k = k.view(B, T, self.n_kv_head, self.hs)
        v = v.view(B, T, self.n_kv_head, self.hs)
        past = cache['k'].size(2) if cache else 0   # tokens already in the cache = position of x[:, 0]
        q, k = apply_rope(q, past, self.rope_base), apply_rope(k, past, self.rope_base)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, nh, T, hs]
        if cache is not None:
            if past:
                k, v = torch.cat([cache['k'], k], dim=2), torch.cat([cache['v'], v], dim=2)
            cache['k'], cache['v'] = k, v
        if past and T > 1:
            # prefill after earlier tokens: query i sees keys j <= past + i (is_causal would align top-left)
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv_head != self.n_head)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1 and not past,
                                               dropout_p=self.dropout if self.training else 0.0,
                                               enable_gqa=self.n_kv_head != self.n_head)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # [B, T, nh*hs]
        return self.resid_dropout(self.c_proj(y))

    def core_flops_per_token(self, T):
        # q·k and p·v: 2 FLOPs per multiply-add, 2 matmuls, T/2 keys on average under the causal mask
        return 2 * self.n_head * self.hs * T


# (the linear mixers are added below by the linear-mixer section)

# ------------------------------------------------------------------------------------------------
# The one place mixers are named. Adding a mixer = one class above + one line here.

MIXERS = {
    'softmax': CausalSelfAttention,
}


# ------------------------------------------------------------------------------------------------
# Block and GPT

class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config, mixer_name, layer_idx):
        super().__init__()
        self.mixer_name = mixer_name
        self.ln_1 = RMSNorm(config.n_embd)
        self.attn = MIXERS[mixer_name](config, layer_idx)  # nanoGPT's name for the token mixer
        self.ln_2 = RMSNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache)
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
            h=nn.ModuleList([Block(config, name, i) for i, name in enumerate(self.mixers)]),
            ln_f=RMSNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied embeddings
        self.apply(self._init_weights)

    def _init_weights(self, module):
        # GPT-2 init: N(0, 0.02); projections that write into the residual stream get 0.02/sqrt(2·n_layer).
        # Mixer-specific parameters (decay rates, convs, norms) are initialised by their own modules.
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(2 * self.config.n_layer) if getattr(module, 'residual_out', False) else 0.02
            torch.nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None and not getattr(module, 'keep_bias_init', False):
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def describe(self):
        """The resolved per-layer mixer list and parameters per mixer, printed at start."""
        per_layer = {}
        for block in self.transformer.h:
            per_layer.setdefault(block.mixer_name, sum(p.numel() for p in block.attn.parameters()))
        lines = [f"mixers per layer: {' '.join(self.mixers)}"]
        for name, n in per_layer.items():
            lines.append(f"  {name}: {self.mixers.count(name)} layers, {n:,} mixer parameters per layer")
        lines.append(f"number of parameters: {self.get_num_params() / 1e6:.2f}M")
        return '\n'.join(lines)

    def forward(self, idx, targets=None, caches=None):
        """idx [B, T] → logits [B, T, V] (and the mean cross-entropy if targets is given; -1 targets
        are ignored). With caches (a list from new_caches), only the last position's logits are
        returned and the caches advance by T tokens."""
        x = self.transformer.drop(self.transformer.wte(idx))
        for i, block in enumerate(self.transformer.h):
            x = block(x, None if caches is None else caches[i])
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
            return logits, loss
        if caches is not None:
            return self.lm_head(x[:, [-1], :]), None  # generation needs only the next-token logits
        return self.lm_head(x), None

    # --- decoding -------------------------------------------------------------------------------

    def new_caches(self):
        """One empty cache per layer; each mixer fills its own dict on the first (prefill) call."""
        return [{} for _ in self.transformer.h]

    def cache_bytes(self, caches):
        """(fixed, growing): bytes held by fixed-size states (linear mixers) and by K/V caches (softmax)."""
        fixed = growing = 0
        for block, cache in zip(self.transformer.h, caches):
            n = sum(t.numel() * t.element_size() for t in cache.values() if torch.is_tensor(t))
            if getattr(block.attn, 'cache_grows', False):
                growing += n
            else:
                fixed += n
        return fixed, growing

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, caches=None):
        """Prefill idx [B, T] in one forward, then decode token by token through the caches.
        Returns (idx extended by max_new_tokens, caches)."""
        caches = self.new_caches() if caches is None else caches
        logits, _ = self(idx, caches=caches)
        for _ in range(max_new_tokens):
            logits = logits[:, -1, :].float()
            if temperature == 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float('inf')
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
            logits, _ = self(idx_next, caches=caches)
        return idx, caches

    # --- training helpers -----------------------------------------------------------------------

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW; matrices (dim >= 2) decay, vectors (norms, biases, decay rates, dt biases) do not,
        nor any parameter a mixer marks with `_no_weight_decay = True`."""
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2 and not getattr(p, '_no_weight_decay', False)]
        no_decay = [p for p in params.values() if p.dim() < 2 or getattr(p, '_no_weight_decay', False)]
        groups = [{'params': decay, 'weight_decay': weight_decay}, {'params': no_decay, 'weight_decay': 0.0}]
        print(f"num decayed parameter tensors: {len(decay)}, with {sum(p.numel() for p in decay):,} parameters")
        print(f"num non-decayed parameter tensors: {len(no_decay)}, with {sum(p.numel() for p in no_decay):,} parameters")
        fused = device_type == 'cuda'
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    def flops_per_token(self, T):
        """Training FLOPs per token: 6 per parameter (fwd 2 + bwd 4) + 3× the mixers' forward core FLOPs."""
        core = sum(block.attn.core_flops_per_token(T) for block in self.transformer.h)
        return 6 * self.get_num_params() + 3 * core


# ------------------------------------------------------------------------------------------------
# Checkpoints: written atomically so an interrupted save never destroys the previous one.

def save_checkpoint(checkpoint, path):
    tmp = path + '.tmp'
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)  # atomic on POSIX: readers see the old file or the new one, never half


def load_checkpoint(path, map_location='cpu'):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path} (train one first, or check out_dir)")
    try:
        return torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:
        raise RuntimeError(f"cannot read checkpoint {path}: {e}") from e
