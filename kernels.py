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

    linear_attn(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False, dt=None, D=None)
        -> (o, final_state | None)
        q, k [B, T, Hk, Dk], v [B, T, H, Dv], H % Hk == 0 (head h reads q/k head h // (H // Hk): Mamba2's
        shared B/C); g None | [H] (constant per head, RetNet; not differentiated) | [B, T, H] (Mamba2's dt*A)
        | [B, T, H, Dk] (GLA: one log-decay per key channel, S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T);
        Mamba2's SSD: with dt [B, T, H] and D [H] (both or neither) the value of token t is dt_t v_t (Δ·x) and
        the output gains D_h v_t (the skip connection), formed inside the Triton kernels
    linear_attn_step(q, k, v, g, state, scale=None) -> o
        one token: q, k [B, Hk, Dk], v [B, H, Dv], g None | [H] | [B, H] | [B, H, Dk]; updates state in place;
        o [B, H, Dv]
    delta_rule(q, k, v, beta, g=None, scale=None, initial_state=None, output_final_state=False, A_log=None,
               dt_bias=None, lower_bound=None, keep=None) -> (o, final_state | None)
        q, k [B, T, H, Dk] (L2-normalised by the caller), v [B, T, H, Dv], beta [B, T, H],
        g None (DeltaNet) | [B, T, H] (Gated DeltaNet) | [B, T, H, Dk] (KDA, per key channel);
        with A_log [H] and dt_bias (g's last dims) also given, g is the gate's input u and the log-decay is
        decay_gate(u, A_log, dt_bias) = -exp(A_log) softplus(u + dt_bias), formed inside the Triton kernels;
        with lower_bound lb in [-5, 0) as well, the bounded gate decay_gate(u, A_log, dt_bias, lb) =
        lb sigmoid(exp(A_log) (u + dt_bias)) in (lb, 0) instead (fla's safe_gate; KDA's Grams then skip the
        dyadic split: "The bounded gate" in section 3.1); keep: this call's TUNING['keep'] (None: TUNING's)
    delta_rule_step(q, k, v, beta, g, state, scale=None) -> o
        one token: q, k [B, H, Dk], v [B, H, Dv], beta [B, H], g None | [B, H] | [B, H, Dk]; state in place
    delta_rule_decode(q, k, v, conv_states, conv_weights, beta, g, state, scale=None, A_log=None, dt_bias=None,
                      lower_bound=None, norm=None, gate=None, gate_fn=None) -> o [B, H, Dv]
        a delta-rule mixer's whole decode step from its projections: q, k [B, H*Dk], v [B, H*Dv] before the short
        convs (width 4; conv_states their last 3 inputs [B, 3, .], updated in place, conv_weights [., 4]);
        q, k = L2(silu(conv(.))) per head, v = silu(conv(v)), then delta_rule_step with beta = sigmoid(beta)
        (beta: the logits [B, H]) and g None | [B, H] | [B, H*Dk] (the log-decay, or with A_log, dt_bias the gate's
        input as in delta_rule); then norm (weight [Dv], eps): RMSNorm per head, and gate [B, H*Dv] | None:
        o * gate_fn(gate), gate_fn 'sigmoid' | 'silu'; the Triton path is one kernel (a one-token step is
        launch-bound)
    linear_step(x, weight, bias=None, path='auto') -> F.linear(x, weight, bias)
        a decode step's matmul: at most TUNING['step']['gemv'] rows of x on CUDA through one Triton GEMV kernel

scale defaults to Dk ** -0.5. Outputs come back in v's dtype; states are fp32 (fp64 if the inputs are fp64),
an initial state must be fp32 or fp64. Every call has up to three paths with the same meaning:
  *_recurrent   token-by-token loop, fp32 (fp64 stays fp64), autograd: the reference the tests trust
  *_chunked     chunkwise-parallel torch version (docs/mixers.md §4.1, §4.3), autograd: CPU training and prefill
                (chunk 64; 16 for per-key-channel gates, where the exact pairwise decays cost C*Dk per token)
  *_triton      Triton chunked forward/backward (chunk 64; 16 for GLA) and a fused decode step, wrapped as
                torch.library custom ops (kernels::delta_rule_fwd/bwd/step, kernels::linear_attn_fwd/bwd/step,
                kernels::gla_fwd/bwd) so that torch.compile sees them as single nodes with no graph break
The public calls (and short_conv, short_conv_step below) also take path='auto' | 'torch' | 'recurrent' | 'triton'
(model.py passes GPTConfig.kernels) and print the path they take once per (function, path). 'auto' picks it from the
device: on CUDA the delta rule runs the Triton kernels (Dk, Dv powers of two in [16, 128], fp16/bf16/fp32 inputs;
anything else runs the chunked torch path and the log line says why), and so does the scalar-decay family; on CPU
everything runs the torch paths. 'torch' forces the chunked torch path, 'recurrent' the reference (the decode steps
and the short conv have one torch version for both), 'triton' the Triton kernels (on CPU it needs TRITON_INTERPRET=1
set before triton is imported, which runs them through Triton's interpreter).

Contents (read top to bottom):
  1. the public calls (delta_rule, delta_rule_step, linear_attn, linear_attn_step, short_conv, short_conv_step),
     _pick_path, the one place a path is chosen, and the argument checks
  2. the math: the token-by-token references (delta_rule_recurrent, decay_gate, linear_attn_recurrent,
     short_conv_torch) beside the chunked torch paths (delta_rule_chunked, linear_attn_chunked)
  3. the Triton kernels, forward, backward and custom ops: their numerical rules, then 3.1 the delta rule (DeltaNet,
     GDN, KDA), 3.2 scalar decay (RetNet, Mamba2, GLA), 3.3 the short convolution
  4. the decode steps (*_step_torch and the Triton step kernels), and the one-token matmuls (linear_step)
  5. TUNING: every launch setting of the Triton kernels (tiles, warps, stages), one table

Tests: python -m pytest test_kernels.py -q   (CPU: torch paths + the Triton kernels through the interpreter at
small shapes; with a GPU: the full Triton matrix of docs/mixers.md §8)
Benchmark: python tools/bench_kernels.py   (delta rule);  python tools/bench_kernels.py --variants retnet,mamba2   (scalar decay);
           python tools/tune.py --tiles delta|scalar|conv   (TUNING's candidates);  python tools/tune.py --ptxas
"""

import functools
import itertools
import math
import os
from typing import Optional

import torch
import torch.nn.functional as F

from configurator import UserError
try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # no triton wheel off Linux: the kernels below are defined but never run, the torch paths work
    import types
    HAVE_TRITON = False
    triton = types.SimpleNamespace(jit=lambda fn=None, **kw: fn if fn is not None else (lambda f: f))
    tl = types.SimpleNamespace(constexpr=int)  # only used in the kernels' signatures
# Triton reads TRITON_INTERPRET when it is imported and takes 1 / true / on / yes (any case) as "interpret"
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")

# Gate kinds, one vocabulary for both families: the kernels' GATE argument and the host's choice of kernels.
# tl.constexpr, so that the Triton kernels can compare against them; int(...) where the host needs a plain number.
GATE_NONE = tl.constexpr(0)     # no decay: DeltaNet, plain linear attention
GATE_SCALAR = tl.constexpr(1)   # one log-decay per token and head, g [B, T, H]: GDN, Mamba2 (Δ·A)
GATE_CHANNEL = tl.constexpr(2)  # one per token, head and key channel, g [B, T, H, Dk]: KDA, GLA
GATE_CONST = tl.constexpr(3)    # one per head for every token, g [H]: RetNet (log γ; not differentiated)

# =====================================================================================================================
# 1. The public calls, the one place a path is chosen (_pick_path), and the argument checks
# =====================================================================================================================

CHUNK_SIZE = 64  # chunk of the chunked torch path
CHUNK_SIZE_PER_CHANNEL = 16  # KDA: pairwise decays cost C*Dk per token, the chunk loop is cheap: 2-3x faster on CPU
PATHS = ("auto", "torch", "recurrent", "triton")  # the path argument of the public calls (model.py: GPTConfig.kernels)
_logged = set()

def check_path(path):
    """Refuse a path argument that is not one of PATHS: a one-line ValueError naming it and the allowed ones."""
    if not isinstance(path, str) or path not in PATHS:
        raise ValueError(f"kernels path must be one of {', '.join(map(repr, PATHS))}, got {path!r}")

def _pick_path(fn, x, v, state=None, path="auto"):
    """The one place a path is chosen: every public call asks here. -> (path, note for the log line):
    'recurrent' | 'chunked' | 'triton' for the two families, 'torch' | 'triton' for the short conv (fn 'short_conv*',
    v its weight [D, W]). x: q (the conv's x); state: a decode step's state. path 'auto': on CUDA the Triton kernels
    where they take the inputs (else the torch path, and the note says why), on CPU the torch paths; 'torch'
    (chunked), 'recurrent' and 'triton' force one ('recurrent' is the torch version for the short conv)."""
    check_path(path)
    conv = fn.startswith("short_conv")
    torch_path = "torch" if conv else "chunked"
    if conv and v.shape[1] != 4:
        return "torch", f" (the Triton kernels are written for width 4, got {v.shape[1]})"
    if path != "auto":
        if path == "triton" and not HAVE_TRITON:  # (UserError: a setting that cannot run here, said in one line)
            raise UserError(f"{fn}: kernels='triton' but triton is not installed (use kernels='auto' or 'torch')")
        if path == "triton" and not x.is_cuda and not _INTERPRETING:
            raise UserError(f"{fn}: kernels='triton' runs on a CUDA GPU, or on CPU with TRITON_INTERPRET=1 set before "
                            f"triton is imported (slow): use kernels='auto' or 'torch' here")
        if conv and path == "triton" and state is not None and not state.is_contiguous():
            return "torch", " (the Triton step needs a contiguous state)"
        if conv:
            return ("triton" if path == "triton" else "torch"), f" (kernels={path!r})"
        return ("chunked" if path == "torch" else path), f" (kernels={path!r})"
    if not x.is_cuda:
        return torch_path, ""
    why = _triton_unsupported(x, v, state, conv)
    return (torch_path, f" ({why})") if why else ("triton", "")

def _triton_unsupported(x, v, state=None, conv=False):
    """Why the Triton kernels cannot take these inputs, or None when they can (_pick_path's note, and the error of
    the *_triton calls). conv: the short conv (any channel count; v is its weight)."""
    if not HAVE_TRITON:
        return "triton is not installed"
    pow2 = lambda d: 16 <= d <= 128 and d & (d - 1) == 0
    if not conv and not (pow2(x.shape[-1]) and pow2(v.shape[-1])):
        return f"the Triton kernels need Dk, Dv powers of two in [16, 128], got {x.shape[-1]}, {v.shape[-1]}"
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"the Triton kernels take fp16/bf16/fp32 inputs, got {x.dtype}"
    if conv and state is not None and not state.is_contiguous():
        return "the Triton step needs a contiguous state"
    if not conv and state is not None and not (state.dtype == torch.float32 and state.is_contiguous()):
        return "the Triton step needs a contiguous fp32 state"
    return None

def _say_once(line):
    if line not in _logged:
        _logged.add(line)
        print(line)

def _log_path(fn, path, note, x):
    what = {"recurrent": "the recurrent torch path", "chunked": "the chunked torch path", "triton": "the Triton kernels",
            "step": "the torch step", "triton step": "the Triton step kernel", "torch": "torch"}[path]
    line = f"kernels: {fn} uses {what} on {x.device.type}{note}"
    if torch.compiler.is_compiling():
        # Dynamo cannot trace print: say it once while tracing (comptime runs at trace time), with no guard on
        # _logged (a guard would recompile the model once the line is logged). Imported here: torch._dynamo is
        # loaded by then, and importing it with kernels.py costs eager users seconds of start-up.
        from torch._dynamo.comptime import comptime
        comptime(lambda ctx: _say_once(ctx.get_local("line").as_python_constant()))
    else:
        _say_once(line)

def delta_rule(q, k, v, beta, g=None, scale=None, initial_state=None, output_final_state=False, path="auto",
               A_log=None, dt_bias=None, lower_bound=None, keep=None):
    """(Gated) delta rule over a whole sequence; see the module docstring. -> (o, final_state | None). keep: the
    Triton path's TUNING['keep'] for this call (None: TUNING's; the torch paths keep nothing)."""
    path, note = _pick_path("delta_rule", q, v, path=path)
    _log_path("delta_rule", path, note, q)
    if path == "triton":
        return delta_rule_triton(q, k, v, beta, g, scale, initial_state, output_final_state, A_log, dt_bias,
                                 lower_bound, keep)
    _check_gate_fn("delta_rule", g, A_log, dt_bias, lower_bound)
    if A_log is not None:  # the torch paths form the gate first
        g = decay_gate(g, A_log, dt_bias, lower_bound)
    if path == "recurrent":
        return delta_rule_recurrent(q, k, v, beta, g, scale, initial_state, output_final_state)
    C = CHUNK_SIZE_PER_CHANNEL if g is not None and g.ndim == 4 else CHUNK_SIZE
    return delta_rule_chunked(q, k, v, beta, g, scale, initial_state, output_final_state, chunk_size=C)

def delta_rule_step(q, k, v, beta, g, state, scale=None, path="auto"):
    """One delta-rule decode token (state updated in place); see the module docstring. -> o"""
    path, note = _pick_path("delta_rule_step", q, v, state, path=path)
    _log_path("delta_rule_step", "triton step" if path == "triton" else "step", note, q)
    if path == "triton":
        return delta_rule_step_triton(q, k, v, beta, g, state, scale)
    return delta_rule_step_torch(q, k, v, beta, g, state, scale)

def delta_rule_decode(q, k, v, conv_states, conv_weights, beta, g, state, scale=None, A_log=None, dt_bias=None,
                      lower_bound=None, norm=None, gate=None, gate_fn=None, path="auto"):
    """A delta-rule mixer's whole one-token step from its projections (before the short convs) to its output gate;
    see the module docstring. On the Triton path one kernel. -> o"""
    _check_delta_rule_decode(q, k, v, conv_states, conv_weights, beta, g, state, A_log, dt_bias, lower_bound, norm,
                             gate, gate_fn)
    path, note = _pick_path("delta_rule_decode", q.view(q.shape[0], state.shape[1], -1), v.view(v.shape[0],
                            state.shape[1], -1), state, path=path)
    _log_path("delta_rule_decode", "triton step" if path == "triton" else "step", note, q)
    if path == "triton":
        why = _triton_unsupported(q.view(q.shape[0], state.shape[1], -1), v.view(v.shape[0], state.shape[1], -1),
                                  state)
        if why:
            _fail("delta_rule_decode", why)
        return _delta_rule_decode_op(q, k, v, *conv_states, *conv_weights, beta, g, A_log, dt_bias, state,
                                     state.shape[2] ** -0.5 if scale is None else float(scale),
                                     0. if lower_bound is None else float(lower_bound),
                                     None if norm is None else norm[0], 0. if norm is None else float(norm[1]),
                                     gate, OUT_GATES.index(gate_fn))
    return delta_rule_decode_torch(q, k, v, conv_states, conv_weights, beta, g, state, scale, A_log, dt_bias,
                                   lower_bound, norm, gate, gate_fn)

def linear_attn(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False, path="auto", dt=None,
                D=None):
    """Scalar-decay linear attention over a whole sequence; see the module docstring. -> (o, final_state | None)"""
    path, note = _pick_path("linear_attn", q, v, path=path)
    _log_path("linear_attn", path, note, q)
    if path == "recurrent":
        return _ssd_torch(linear_attn_recurrent, q, k, v, g, scale, initial_state, output_final_state, dt, D)
    if path == "triton":
        return linear_attn_triton(q, k, v, g, scale, initial_state, output_final_state, dt, D)
    C = CHUNK_SIZE_PER_CHANNEL if g is not None and g.dim() == 4 else CHUNK_SIZE
    return _ssd_torch(linear_attn_chunked, q, k, v, g, scale, initial_state, output_final_state, dt, D, chunk_size=C)

def linear_attn_step(q, k, v, g, state, scale=None, path="auto"):
    """One scalar-decay decode token (state updated in place); see the module docstring. -> o"""
    path, note = _pick_path("linear_attn_step", q, v, state, path=path)
    _log_path("linear_attn_step", "triton step" if path == "triton" else "step", note, q)
    if path == "triton":
        return linear_attn_step_triton(q, k, v, g, state, scale)
    return linear_attn_step_torch(q, k, v, g, state, scale)

def short_conv(x, weight, bias=None, initial=None, norm=0, path="auto", doc_pos=None, split=None):
    """silu(causal depthwise conv) over x [B, T, D] with weight [D, 4], bias [D] | None; initial [B, 3, D] | None
    holds the raw inputs before x (zeros when None); norm G > 0 divides each group of G channels by its l2 norm.
    doc_pos [B, T] | None (documents): each token's position inside its document, any integer dtype (uint8 with
    values clipped at W-1 is enough); tap x_{t-j} is used only where j <= doc_pos_t, so no window reaches into an
    earlier document (None: every tap, the plain kernels). -> y [B, T, D] in x's dtype. split (channel counts summing
    to D): -> one contiguous y per part instead, norm then one value for all parts or one per part; x's gradient
    comes back whole (the parts of one matmul's output: no cat of their gradients). path 'auto': Triton on CUDA,
    torch elsewhere; 'triton' forces the kernels, 'torch' and 'recurrent' the torch version; differentiable in x,
    weight, bias (and initial)."""
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        _fail("short_conv", f"expects x [B, T, D] and weight [D, W], got x {_shape(x)}, weight {_shape(weight)}")
    sizes = [x.shape[-1]] if split is None else [int(n) for n in split]
    if sum(sizes) != x.shape[-1] or min(sizes) < 1:
        _fail("short_conv", f"split must be positive channel counts summing to D={x.shape[-1]}, got {split}")
    norms = [int(n) for n in norm] if isinstance(norm, (list, tuple)) else [int(norm)] * len(sizes)
    if len(norms) != len(sizes):
        _fail("short_conv", f"norm must be one value or one per part of split ({len(sizes)}), got {norm}")
    for n, g in zip(sizes, norms):
        if g and (n % g or g & (g - 1) or not 16 <= g <= 256):
            _fail("short_conv", f"norm groups must be a power of two in [16, 256] dividing D={n}, got {g}")
    if doc_pos is not None and (_shape(doc_pos) != _shape(x)[:2] or doc_pos.is_floating_point()):
        _fail("short_conv", f"doc_pos must be integers [B, T] = {_shape(x)[:2]}, got {doc_pos.dtype} {_shape(doc_pos)}")
    path, note = _pick_path("short_conv", x, weight, path=path)
    _log_path("short_conv", path, note, x)
    P = 0
    if initial is not None:  # prefill after earlier tokens: run over (initial, x) and drop the first W-1 outputs
        P = initial.shape[1]
        x = torch.cat([initial.to(x.dtype), x], dim=1)
        if doc_pos is not None:  # the initial rows' outputs are dropped; x's rows keep their positions
            doc_pos = torch.cat([doc_pos.new_full((x.shape[0], P), P), doc_pos], dim=1)
    if path == "triton":
        ys = _ShortConv.apply(x, weight, bias, sizes, norms, doc_pos)
    else:
        ys = [short_conv_torch(x[..., c0:c1], weight[c0:c1], None if bias is None else bias[c0:c1], g, doc_pos)
              for c0, c1, g in _conv_parts(sizes, norms)]
    ys = [y[:, P:] for y in ys] if P else ys
    return ys[0] if split is None else ys

def short_conv_step(x, state, weight, bias=None, norm=0, path="auto"):
    """One token: x [B, D], state [B, W-1, D] (the last W-1 raw inputs; updated in place) -> y [B, D]; path as
    short_conv."""
    path, note = _pick_path("short_conv_step", x, weight, state, path=path)
    _log_path("short_conv_step", "triton step" if path == "triton" else "step", note, x)
    if path == "triton":
        return _short_conv_step_op(x, state, weight, bias, norm)
    return short_conv_step_torch(x, state, weight, bias, norm)

# ---- argument checks (every path; a wrong shape fails here with its name, not deep inside an einsum) ----------------

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

def _check_linear_attn(name, q, k, v, g, state, step=False, dt=None, D=None):
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
    if g is not None and _shape(g) not in ((H,), lead + (H,), lead + (H, Dk)):
        _fail(name, f"g must be None, [H] = {(H,)}, {lead + (H,)} or {lead + (H, Dk)} (per key channel, GLA), "
                    f"got {_shape(g)}")
    if step and state is None:
        _fail(name, "state [B, H, Dk, Dv] is required")
    _check_state(name, state, v.shape[0], H, Dk, Dv, "state" if step else "initial_state")
    if (dt is None) != (D is None):
        _fail(name, "dt and D come together (Mamba2's SSD): give both or neither")
    if dt is not None and g is not None and g.dim() == nd:
        _fail(name, "dt and D (Mamba2's SSD) take a scalar gate per token, not a per-key-channel one")
    if dt is not None and _shape(dt) != lead + (H,):
        _fail(name, f"dt must be {lead + (H,)} (one step size per token and head), got {_shape(dt)}")
    if D is not None and _shape(D) != (H,):
        _fail(name, f"D must be [H] = {(H,)}, got {_shape(D)}")

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

def _check_delta_rule_decode(q, k, v, conv_states, conv_weights, beta, g, state, A_log, dt_bias, lower_bound, norm,
                             gate, gate_fn):
    name = "delta_rule_decode"
    if state is None or state.ndim != 4:
        _fail(name, f"state must be [B, H, Dk, Dv], got {None if state is None else _shape(state)}")
    B, H, Dk, Dv = state.shape
    for x, n, d in ((q, "q", H * Dk), (k, "k", H * Dk), (v, "v", H * Dv)):
        if _shape(x) != (B, d) or x.stride(-1) != 1:
            _fail(name, f"{n} must be [B, H*D] = {(B, d)} with unit stride along it, got {_shape(x)}")
    if len(conv_states) != 3 or len(conv_weights) != 3:
        _fail(name, "conv_states and conv_weights must hold three each (q's, k's, v's)")
    for s, w, x, n in zip(conv_states, conv_weights, (q, k, v), "qkv"):
        if _shape(s) != (B, 3, x.shape[1]) or not s.is_contiguous() or _shape(w) != (x.shape[1], 4):
            _fail(name, f"{n}'s conv state must be contiguous [B, 3, {x.shape[1]}] and its weight "
                        f"[{x.shape[1]}, 4], got {_shape(s)} and {_shape(w)}")
    if _shape(beta) != (B, H) or beta.stride(-1) != 1:
        _fail(name, f"beta (the logits) must be [B, H] = {(B, H)} with unit stride along it, got {_shape(beta)}")
    # (== and or, not `in` over shape tuples: with symbolic sizes under torch.compile `in` came out False)
    if g is not None and (not (_shape(g) == (B, H) or _shape(g) == (B, H * Dk)) or g.stride(-1) != 1):
        _fail(name, f"g must be None, [B, H] or [B, H*Dk] with unit stride along it, got {_shape(g)}")
    if norm is not None and (len(norm) != 2 or _shape(norm[0]) != (Dv,)):
        _fail(name, f"norm must be (weight [Dv] = [{Dv}], eps), got {norm!r}")
    if gate_fn not in OUT_GATES or (gate is None) != (gate_fn is None):
        _fail(name, f"gate and gate_fn go together, gate_fn one of {OUT_GATES[1:]}, got gate_fn {gate_fn!r}")
    if gate is not None and (_shape(gate) != (B, H * Dv) or gate.stride(-1) != 1):
        _fail(name, f"gate must be [B, H*Dv] = {(B, H * Dv)} with unit stride along it, got {_shape(gate)}")
    u = None if g is None else g.view(B, 1, H) if _shape(g) == (B, H) else g.view(B, 1, H, Dk)
    _check_gate_fn(name, u, A_log, dt_bias, lower_bound)
    _check_state(name, state, B, H, Dk, Dv, "state")

def _check_lower_bound(name, lower_bound):
    # fla's safe_gate range: the Grams' 16-row reference path needs every per-step log-decay >= -5 (section 3.1,
    # "The bounded gate")
    ok = isinstance(lower_bound, (int, float)) and not isinstance(lower_bound, bool) and -5 <= lower_bound < 0
    if lower_bound is not None and not ok:
        _fail(name, f"lower_bound must be None or a number in [-5, 0), got {lower_bound!r}")

def _check_gate_fn(name, u, A_log, dt_bias, lower_bound=None):
    _check_lower_bound(name, lower_bound)
    if A_log is None and dt_bias is None:
        if lower_bound is not None:
            _fail(name, "lower_bound needs A_log and dt_bias (it bounds the gate formed from g = u), got neither")
        return
    H = u.shape[2] if u is not None and u.dim() >= 3 else None
    if u is None or A_log is None or dt_bias is None:
        _fail(name, "A_log and dt_bias go together, with g holding the gate's input u")
    if _shape(A_log) != (H,) or dt_bias.numel() != math.prod(u.shape[2:]):
        _fail(name, f"A_log must be [H] = {(H,)} and dt_bias hold {math.prod(u.shape[2:])} values (g's last dims "
                    f"{_shape(u)[2:]}), got {_shape(A_log)} and {_shape(dt_bias)}")

# =====================================================================================================================
# 2. The math: the token-by-token references and the chunked torch paths, both families and the short conv
# docs/mixers.md §3 (recurrences), §4.1 and §4.3 (chunked), §1.1 (short conv). The references (*_recurrent) are the
# truth the tests trust; the chunked paths (*_chunked) train and prefill on CPU. fp32 (fp64 stays fp64), autograd.
# =====================================================================================================================

# ---- the references, one token at a time ----------------------------------------------------------------------------

# The delta rule (DeltaNet, GDN, KDA; docs/mixers.md §2.4-§2.6, §3):
# S~ = Diag(exp g_t) S_{t-1};  S_t = S~ + beta_t k_t (v_t - S~^T k_t)^T;  o_t = s S_t^T q_t
# and the gate of GDN and KDA, g = decay_gate(u, A_log, dt_bias) or the bounded one decay_gate(u, A_log, dt_bias, lb)
# (docs/mixers.md §1.4 items 1 and 2)

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

def decay_gate(u, A_log, dt_bias, lower_bound=None):
    """The Mamba-style log-decay g = -exp(A_log) softplus(u + dt_bias) in fp32 (GDN's and KDA's gate): u [B, T, H] or
    [B, T, H, Dk], A_log [H], dt_bias with u's last dims' values. delta_rule(..., g=u, A_log=, dt_bias=) forms the
    same gate inside its Triton kernels (the fp32 [B, T, H, Dk] gate of KDA is then never written out).
    lower_bound lb in [-5, 0): the bounded gate g = lb sigmoid(exp(A_log) (u + dt_bias)) in (lb, 0) instead (fla's
    safe_gate, docs/mixers.md §1.4 item 2; delta_rule(..., lower_bound=lb) forms it in its kernels the same way)."""
    _check_lower_bound("decay_gate", lower_bound)
    dt = _compute_dtype(u)
    A = torch.exp(A_log.to(dt)).view((-1,) + (1,) * (u.dim() - 3))
    x = u.to(dt) + dt_bias.to(dt).view(u.shape[2:])
    return -A * F.softplus(x) if lower_bound is None else lower_bound * torch.sigmoid(A * x)

# Scalar-decay linear attention (RetNet, Mamba2, GLA; docs/mixers.md §2.2, §2.3, §3):
# S_t = exp(g_t) S_{t-1} + k_t v_t^T;  o_t = s S_t^T q_t   (GLA: S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T, g_t [Dk])

def linear_attn_recurrent(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False):
    _check_linear_attn("linear_attn", q, k, v, g, initial_state)
    B, T, H, Dv = v.shape
    Dk, dt = q.shape[-1], _compute_dtype(q)
    scale = Dk ** -0.5 if scale is None else scale
    qf, kf, vf = _expand_heads(q, H).to(dt), _expand_heads(k, H).to(dt), v.to(dt)
    if g is not None and g.dim() == 4:  # GLA: one decay per key channel, the rows of S
        a = g.to(dt).exp()[..., None]  # [B, T, H, Dk, 1]
    else:
        a = _scalar_gate(g, B, T, H, dt, q.device).exp()[..., None, None]  # per-step decay in [0, 1], [B, T, H, 1, 1]
    S = torch.zeros(B, H, Dk, Dv, dtype=dt, device=q.device) if initial_state is None else initial_state.to(dt)
    o = []
    for t in range(T):
        S = a[:, t] * S + kf[:, t, :, :, None] * vf[:, t, :, None, :]
        o.append(scale * torch.einsum("bhk,bhkv->bhv", qf[:, t], S))
    return torch.stack(o, dim=1).to(v.dtype), (S if output_final_state else None)

def _ssd_torch(fn, q, k, v, g, scale, initial_state, output_final_state, dt, D, **kw):
    """The torch paths with Mamba2's dt and D (linear_attn's dt=, D=): value dt·v, output + D·v."""
    if dt is None:
        return fn(q, k, v, g, scale, initial_state, output_final_state, **kw)
    _check_linear_attn("linear_attn", q, k, v, g, initial_state, dt=dt, D=D)
    wide = torch.promote_types(v.dtype, torch.float32)
    o, ht = fn(q, k, (v.to(wide) * dt[..., None]).to(v.dtype), g, scale, initial_state, output_final_state, **kw)
    return (o.to(wide) + D[:, None] * v).to(o.dtype), ht

# The short convolution (docs/mixers.md §1.1) of DeltaNet, GDN, KDA (q, k, v) and Mamba2 (x, B, C); its torch
# path is its reference (F.conv1d, or the masked taps with documents):
#   p_t = b + w0 x_{t-3} + w1 x_{t-2} + w2 x_{t-1} + w3 x_t   (x_t = 0 for t < 0),   y_t = silu(p_t)   per channel
#   with norm (q and k of the delta rule): out_t = y_t / sqrt(|y_t|^2 + eps) over each group of G channels (a head)
#   backward: dy = r (dout - r^2 (y . dout) y) with r = (|y|^2 + eps)^-1/2 (norm), dp_t = dy_t silu'(p_t),
#             dx_t = w3 dp_t + w2 dp_{t+1} + w1 dp_{t+2} + w0 dp_{t+3},  dw_j = sum_t dp_t x_{t-3+j},  db = sum_t dp_t
#   decode:   the last 3 raw inputs are the state; one token shifts it by one
#   documents (doc_pos [B, T], the token's position inside its document, clipped at 3 or not): tap x_{t-j} is used
#             only if j <= doc_pos_t (x_{t-j} of an earlier document counts as 0, as before the sequence start), so
#             p_t = b + [pos>=3] w0 x_{t-3} + [pos>=2] w1 x_{t-2} + [pos>=1] w2 x_{t-1} + w3 x_t; the backward masks
#             the same products: dx_{t-j} gets w_{3-j} dp_t and dw_{3-j} gets dp_t x_{t-j} only where j <= doc_pos_t

NORM_EPS = 1e-6  # of the l2 norm of q and k (as model.l2norm)

def short_conv_torch(x, weight, bias=None, norm=0, doc_pos=None):
    """x [B, T, D], weight [D, W], bias [D] | None -> silu(causal depthwise conv) [B, T, D] in x's dtype; norm G > 0:
    then divided by its l2 norm over each group of G channels (in fp32). doc_pos [B, T] (integers, the position of
    each token inside its document) | None: tap x_{t-j} only where j <= doc_pos_t (W masked products, not F.conv1d)."""
    D, W = weight.shape
    b = None if bias is None else bias.to(x.dtype)
    if doc_pos is None:
        xx = F.pad(x.transpose(1, 2), (W - 1, 0))  # [B, D, W-1+T]: zeros before the start
        y = F.silu(F.conv1d(xx, weight.to(x.dtype)[:, None, :], b, groups=D)).transpose(1, 2)
    else:
        T, w = x.shape[1], weight.to(x.dtype)
        xx = F.pad(x, (0, 0, W - 1, 0))  # [B, W-1+T, D]: zeros before the start
        p = sum(torch.where((doc_pos >= W - 1 - j)[..., None], w[:, j] * xx[:, j:j + T], 0) for j in range(W))
        y = F.silu(p if b is None else p + b)
    if norm:
        yf = y.float().unflatten(-1, (D // norm, norm))
        y = (yf * torch.rsqrt(yf.pow(2).sum(-1, keepdim=True) + NORM_EPS)).flatten(-2).to(x.dtype)
    return y

# ---- the chunked torch paths: chunks and decays (docs/mixers.md §4.0) -----------------------------------------------

# Chunked torch paths (docs/mixers.md §4). Time is cut into chunks of C tokens; inside a chunk G_r = Σ_{j<=r} g_j is
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
    never an exp of a positive number there is no inf and no 0 * inf = NaN in the backward (docs/mixers.md §7 #1).
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

# The delta rule by chunks (WY/UT form, docs/mixers.md §4.3.1)

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

# Scalar decay by chunks (docs/mixers.md §4.1)

def linear_attn_chunked(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    _check_linear_attn("linear_attn", q, k, v, g, initial_state)
    B, T, H, Dv = v.shape
    Dk, dt = q.shape[-1], _compute_dtype(q)
    scale = Dk ** -0.5 if scale is None else scale
    C = min(chunk_size, T)
    Q, K = _to_chunks(_expand_heads(q, H), C, dt), _to_chunks(_expand_heads(k, H), C, dt)  # [B, H, N, C, Dk]
    V = _to_chunks(v, C, dt)  # [B, H, N, C, Dv]
    g = _chunk_gates(g, B, T, H, C, dt, q.device)  # [B, H, N, C, 1] (GLA: [B, H, N, C, Dk])
    D = _causal_decay(g)  # [B, H, N, C, C, 1|Dk]
    Gamma = g.cumsum(-2).exp()  # [B, H, N, C, 1|Dk] decay from the chunk start; Gamma[..., -1, :] over the chunk
    # parallel over chunks: the intra-chunk outputs and what each chunk adds to the state
    if g.shape[-1] == 1:  # none or scalar gate: the decay factors out of the dot products
        QK = (Q @ K.mT) * D[..., 0]
    else:  # GLA, per key channel: the decay sits inside the sum over c
        QK = ((D * K[:, :, :, None]) @ Q[..., None])[..., 0]  # [B, H, N, C(r), C(i)]: Σ_c q_rc k_ic exp(G_rc - G_ic)
    intra = QK.tril() @ V  # [B, H, N, C, Dv]
    local = (K * D[..., -1, :, :]).mT @ V  # [B, H, N, Dk, Dv]; D's last row is exp(G_n - G_i)
    # sequential over chunks, cheap: S_start(n+1) = Γ_n S_start(n) + local_n
    S = torch.zeros(B, H, Dk, Dv, dtype=dt, device=q.device) if initial_state is None else initial_state.to(dt)
    starts = []
    # unbind, not local[:, :, n]: the backward of each index op would zero-fill a full-size gradient (O(N^2))
    for decay, add in zip(Gamma[..., -1:, :].mT.unbind(2), local.unbind(2)):  # [B, H, 1|Dk, 1], [B, H, Dk, Dv]
        starts.append(S)
        S = decay * S + add
    S0 = torch.stack(starts, dim=2)  # [B, H, N, Dk, Dv] chunk-start states
    O = scale * ((Q * Gamma) @ S0 + intra)
    return _from_chunks(O, T).to(v.dtype), (S if output_final_state else None)

# ---- dtypes, heads and gates of the torch paths ---------------------------------------------------------------------

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

# =====================================================================================================================
# 3. The Triton kernels: chunked forward and backward of both families and the short conv, as custom ops
# =====================================================================================================================

# ---- numerical rules and device helpers of every chunked kernel -----------------------------------------------------

# Tokens per chunk of the Triton kernels: (I + L)^-1 is conditioned well enough at 64 (docs/mixers.md §4.3.3), 64 is
# faster than 32 for both families, and 128 does not fit in shared memory (tools/bench_kernels.py --chunks).
TRITON_CHUNK = 64
# KDA's Gram backward rescales rows by exp(G_r - G_ref) and exp(G_ref - G_i) about one reference per group of rows
# and key channel where |G_r - G_ref| <= EXP_SPAN for all of them: e^60 ~ 1e26 leaves fp32's and bf16's range (e^88)
# room for the products and the 64-term sums of the dots.
EXP_SPAN = tl.constexpr(60.0)

# Every chunked Triton kernel below (both families) keeps these rules (docs/mixers.md §4.5, §7):
# - all arithmetic in fp32 registers; dots accumulate in fp32, their operands rounded to bf16 for bf16 inputs (the
#   errors against fp64 stay within the tests' bounds and match fla's), tf32 for fp16, IEEE fp32 for fp32 (_dot);
# - the only decay exponents ever formed are G_r - G_i with r >= i, G_r and G_n - G_r inside one chunk
#   (G = chunk-local cumsum of g), so every exp is of a number <= 0 and lies in [0, 1];
# - masked entries are removed with a select (tl.where) before the exp, never by multiplying by 0, so padded rows
#   of a partial last chunk cannot make inf * 0 = NaN;
# - token offsets are int64 (B*T*H*D can pass 2^31).
# T, NT (chunks) and H are plain runtime integers (do_not_specialize): one compiled kernel serves every length and
# head count, so a new T or H costs no recompilation (Triton would otherwise specialise on x == 1 and x % 16 == 0).

_DOT_WIDEN = tl.constexpr(_INTERPRETING)

@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    # a @ b with fp32 accumulation. PREC 'bf16' (bf16 inputs): both operands rounded to bf16 first (full tensor-core
    # rate; the kernels round their stored intermediates to bf16 anyway); 'tf32' (fp16 inputs: rounding fp16 to bf16
    # would drop 3 mantissa bits) or 'ieee' (fp32 inputs): fp32 operands.
    if PREC == 'bf16':
        a = a.to(tl.bfloat16)
        b = b.to(tl.bfloat16)
        if _DOT_WIDEN:  # the interpreter multiplies 16-bit tiles wrongly: the same bf16 values, widened
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision='ieee')
        return tl.dot(a, b)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)

@triton.jit
def _softplus(x):
    # log(1 + e^x) without overflow or cancellation: max(x, 0) + log(1 + e^-|x|)
    return tl.maximum(x, 0.) + tl.log(1. + tl.exp(-tl.abs(x)))

@triton.jit
def _f32_if(x, F32: tl.constexpr):
    # a loaded tile in fp32 (F32) or in the dtype it was stored in
    if F32:  # a compile-time branch: one return, whose type Triton fixes per specialisation
        x = x.to(tl.float32)
    return x

def _storage(prec):
    # dtype of the [B, T, H, C] intermediates (P_qk, A, dP, dL), dh and dDelta: every reader uses them as dot
    # operands, which _dot rounds to bf16 for bf16 inputs anyway, so storing them in bf16 loses nothing there and
    # halves their bytes; fp32 with tf32 or IEEE dots
    return torch.bfloat16 if prec == 'bf16' else torch.float32

@functools.lru_cache(maxsize=None)
def _sm_count(device):
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == 'cuda' else 1

# Column sums of per-program partial sums [P, J, D] in a fixed order (deterministic, no atomics): the short conv's
# dw, db and the backward of GDN's and KDA's gate (dA_log, ddt_bias). One launch, where torch's .sum(0)
# would need a second pass for the transpose into dw's [D, 4] layout.
@triton.jit
def _column_sum_kernel(p_ptr, out_ptr, P, D, J: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr):
    # out[d * J + j] = sum_p part[p, j, d], in a fixed order (deterministic): the short conv's dw (J = 4; out is
    # dw [D, 4]) or db (J = 1), the gate backward's dA_log and ddt_bias sums (J = 2)
    c, j = tl.program_id(0), tl.program_id(1)
    d = c * BN + tl.arange(0, BN)
    rows = tl.arange(0, BP)
    acc = tl.zeros([BP, BN], dtype=tl.float32)
    for p0 in range(0, P, BP):
        pp = p0 + rows
        acc += tl.load(p_ptr + (pp[:, None] * J + j) * D + d[None, :], mask=(pp[:, None] < P) & (d[None, :] < D),
                       other=0.)
    tl.store(out_ptr + d * J + j, tl.sum(acc, 0), mask=d < D)

def _column_sums(part, D, J, out):
    """[P, J, D] fp32 per-program partial sums -> their sum, written to out [D, J] (J > 1) or [D] (J = 1)"""
    P, BN = part.shape[0], 32
    _column_sum_kernel[(triton.cdiv(D, BN), J)](part, out, P, D, J, min(128, triton.next_power_of_2(P)), BN,
                                                num_warps=4)

# ---------------------------------------------------------------------------------------------------------------------
# 3.1 The delta rule: DeltaNet, Gated DeltaNet (GDN), KDA; docs/mixers.md §4.3 (chunked forward), §5 (backward)
# Gate kinds: GATE_NONE (DeltaNet), GATE_SCALAR (GDN: g [B, T, H]), GATE_CHANNEL (KDA: g [B, T, H, Dk]).
# ---------------------------------------------------------------------------------------------------------------------

# ---- forward --------------------------------------------------------------------------------------------------------

# Kernels for DeltaNet (GATE_NONE), GDN (GATE_SCALAR, g [B, T, H]) and KDA (GATE_CHANNEL, g [B, T, H, Dk]); chunk
# C = TRITON_CHUNK = 64, Dk, Dv powers of two from 16 to 128 (the backward tiles Dk by 64).
# Per chunk (n <= C rows, chunk-start state S, docs/mixers.md §4.3.1):
#   L   = StrictTril(Diag(beta) (K K^T decayed by exp(G_r - G_i)))      A = (I + L)^-1
#   W   = A (beta * exp(G) * K)        U = A (beta * V)                 (parallel over chunks)
#   Delta = U - W S                    S <- Diag(exp G_n) S + (K * exp(G_n - G))^T Delta   (sequential)
#   O   = scale (Q * exp(G)) S + Tril(P_qk) Delta,   P_qk = scale (Q K^T decayed)   (with S, in the same pass)
# Kernels: _chunk_cumsum (G; with A_log, dt_bias it also forms GDN's / KDA's gate), _grams_block (P_qk, L; KDA's
# per-channel Gram), _inverse (A in place of L), _wy_fwd (W, U; KDA also Kd, Qg), _state_fwd (O; in the backward's
# recompute the snapshots h[c] = S and Delta instead, where TUNING['keep'] does not have the forward write them).
# TODO (speed): KDA's backward per-chunk gradients (_grads_bwd) are half of its forward+backward time, and the
# forward's _wy_fwd writes four [B, T, H, D] tensors (notes/perf.md).

# The decayed Gram products within a chunk, and KDA's per-channel gate in them (the dyadic split).
#
# Inside a chunk every intra-chunk matrix is a "decayed Gram" product
#     P[r, i] = sum_c a[r, c] b[i, c] exp(G[r, c] - G[i, c])          (i <= r)
# (P_qk with a=q, b=k; L with a=k, b=k and rows scaled by beta). A scalar gate (GDN) gives one
# [C, C] factor exp(G_r - G_i) applied after an ordinary dot. A per-channel gate (KDA) does not
# factor out of the sum over c, and splitting exp(G_r - G_i) = exp(G_r - nu) exp(nu - G_i) with a
# single reference nu overflows for strong gates (docs/mixers.md §7 item 3). We use a dyadic split
# instead: for a pair i < r take the smallest block size 2s (s = 1, 2, 4, ... C/2) with r and i in
# the same 2s-block but different halves; nu = G at the last row of the left half. Then
# r > nu_row >= i, so both factors are exp of a number <= 0: exact (up to rounding) and overflow
# free for any gate, at the cost of log2(C) dots instead of one. The diagonal has factor 1. The backward
# (_grams_bwd_channel) applies it to the whole chunk; the forward (_grams_block_kernel) only inside its 16 x 16
# diagonal blocks.

@triton.jit
def _inv16(Lb, IPREC: tl.constexpr):
    # (I + Lb)^-1 for one 16x16 strictly lower block, by forward substitution: row s of X is
    # e_s - sum_{m<s} Lb[s, m] X[m], and rows m < s are final by step s. Exact arithmetic, not powers of L
    # (which grow like binomials when keys are correlated).
    a = tl.arange(0, 16)
    X = tl.where(a[:, None] == a[None, :], 1., 0.)
    for s in tl.static_range(1, 16):
        X = tl.where(a[:, None] == s, X - tl.dot(Lb, X, input_precision=IPREC), X)
    return X

@triton.jit
def _block_ptrs(ptr, tok0, H, n, i, j):
    # pointers and row mask of the 16x16 block (i, j) of this chunk's [C=64, C] matrix (row r at token tok0 + r H)
    a = tl.arange(0, 16)
    rows = 16 * i + a
    return ptr + (tok0 + rows[:, None] * H) * 64 + 16 * j + a[None, :], (rows < n)[:, None]

@triton.jit
def _ld(ptr, tok0, H, n, i, j):
    p, m = _block_ptrs(ptr, tok0, H, n, i, j)
    return tl.load(p, mask=m, other=0.).to(tl.float32)

@triton.jit
def _st(ptr, tok0, H, n, x, i, j):
    p, m = _block_ptrs(ptr, tok0, H, n, i, j)
    tl.store(p, x.to(ptr.dtype.element_ty), mask=m)

@triton.jit
def _st_from(ptr, tok0, H, n, lo, x, i, j):
    # _st of the block's rows lo .. n - 1 of the chunk only
    p, m = _block_ptrs(ptr, tok0, H, n, i, j)
    tl.store(p, x.to(ptr.dtype.element_ty), mask=m & (16 * i + tl.arange(0, 16) >= lo)[:, None])

@triton.jit
def _load_gate(G_ptr, tok, valid, last_tok, GATE: tl.constexpr, C: tl.constexpr, DG: tl.constexpr,
               SG: tl.constexpr):
    # G [C, DG] of the chunk (0 on padded rows), G_n as a row [1, DG] and as a column [DG, 1];
    # SG = gate values per token (DG < SG reads a tile of key channels). DeltaNet (GATE_NONE) uses
    # G = 0: every decay factor becomes exp(0) = 1.
    cg = tl.arange(0, DG)
    if GATE != GATE_NONE:
        Gm = tl.load(G_ptr + tok[:, None] * SG + cg[None, :], mask=valid[:, None], other=0.)
        Gn = tl.load(G_ptr + last_tok * SG + cg)
    else:
        Gm = tl.zeros([C, DG], dtype=tl.float32)
        Gn = tl.zeros([DG], dtype=tl.float32)
    return Gm, Gn[None, :], Gn[:, None]

@triton.jit(do_not_specialize=["T", "H"])
def _chunk_cumsum_kernel(g_ptr, G_ptr, A_ptr, bias_ptr, lb, T, H, DG: tl.constexpr, C: tl.constexpr,
                         BD: tl.constexpr, GATE_FN: tl.constexpr, AG: tl.constexpr):
    # G_r = sum_{j <= r} g_j restarting at every chunk, in fp32: a global cumsum would reach
    # -1e4 over a long sequence and G_r - G_i would lose all its digits (docs/mixers.md §4.0).
    # One [C, BD] tile of one head per program (KDA: DG = Dk, in column tiles of BD); GDN's g [B, T, H] is launched
    # as H = 1, DG = its heads, so that one program takes a chunk of every head (BD: DG rounded up to a power of two).
    # GATE_FN (delta_rule's A_log, dt_bias): g holds the gate's input u and the log-decay is formed here, so that the
    # fp32 gate is never written out (A_log: one value per AG columns): 1, -exp(A_log) softplus(u + dt_bias);
    # 2 (lower_bound lb), lb sigmoid(exp(A_log) (u + dt_bias)), in [lb, 0] also after fp32 rounding (sigmoid <= 1).
    c = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    t = c * C + tl.arange(0, C)
    cd = tl.program_id(2) * BD + tl.arange(0, BD)  # this program's columns (TUNING['cumsum']['d'] at most)
    offs = ((b * T + t) * H + h)[:, None] * DG + cd[None, :]
    mask = (t < T)[:, None] & (cd < DG)[None, :]
    g = tl.load(g_ptr + offs, mask=mask, other=0.).to(tl.float32)
    if GATE_FN:
        col = h * DG + cd                                                   # the column of dt_bias [H * DG]
        x = g + tl.load(bias_ptr + col, mask=cd < DG, other=0.).to(tl.float32)[None, :]
        a = tl.exp(tl.load(A_ptr + col // AG, mask=cd < DG, other=0.).to(tl.float32))
        if GATE_FN == 1:
            g = tl.where(mask, -a[None, :] * _softplus(x), 0.)
        else:
            g = tl.where(mask, lb * tl.sigmoid(a[None, :] * x), 0.)
    tl.store(G_ptr + offs, tl.cumsum(g, axis=0), mask=mask)

# -----------------------------------------------------------------------------
# The Grams by 16 x 16 blocks (every gate kind)
#
# A chunk's rows fall into four sub-chunks of 16, the [C, C] matrices P_qk and L into 16 x 16 blocks (j, i), j >= i,
# one program per block. Block (j, i) of a decayed Gram is sum_c a[r, c] b[s, c] exp(G[r, c] - G[s, c]) for rows r
# of sub-chunk j and s of sub-chunk i:
# - below the diagonal (j > i, every s < r): KDA splits the decay at the first row nu of sub-chunk j,
#   exp(G_r - G_nu) exp(G_nu - G_s), both factors <= 1 (s < nu <= r), so the block is one plain tensor-core dot of
#   the rescaled rows; a scalar gate (GDN) multiplies the plain dot by exp(G_r - G_s) afterwards;
# - on the diagonal, KDA's pairs inside 16 rows: one dot of the rows rescaled about the block's first row when the
#   key tile's |G_r - G_nu| stay within EXP_SPAN, else the dyadic split above (levels 1, 2, 4, 8: four [16, BK] dots,
#   each masked to its pairs), exact for any gate. With the bounded gate (BOUNDED) always the first: see below.
#
# The bounded gate (delta_rule(..., lower_bound=lb), lb in [-5, 0); BOUNDED, set by the host only for the gate that
# the cumsum kernel forms, so that no caller's g can break it): every per-step log-decay lies in [lb, 0] (also after
# fp32 rounding: sigmoid <= 1 and fl(lb) >= -5), so inside one 16-row group G_r - G_nu sums at most 15 of them:
# |G_r - G_nu| <= 15 |lb| <= 75, below 88.7 = ln(3.4e38), the range of fp32 and of bf16 (the dots' operands; fp16
# inputs take tf32 dots, fp32's range). The factors exp(G_r - G_nu) <= 1 and exp(G_nu - G_i) <= e^75 = 3.7e32 are
# then finite, and so are their dots: the remaining headroom is e^13.7 ~ 9e5 for the sums they enter (forward: pairs
# s > r, masked after the dot, sum q_rc k_sc exp(G_rc - G_sc) <= ||q|| ||k|| e^75, and ||q|| = ||k|| = 1 for the
# L2-normalised q, k of the models; backward: <= 15 terms |dP| or |dL| times |k_c| <= 1 each, so dP, dL entries up to
# ~6e4). The fp32 cumsums add ~1e-5 to the span. So the 16-row reference is exact (up to rounding) and in range
# without its EXP_SPAN test, and the dyadic code is not compiled in: the forward's diagonal blocks take one dot per
# key tile (the unbounded code takes four where a strong gate spans more than EXP_SPAN = 60 in 16 rows, which lb = -5
# allows), and the backward's groups S = 16 (or the whole chunk, when its span test passes) are never S = 1 (six
# dyadic levels).
# Why blocks: one program per chunk with [C, C] tiles would take six dyadic levels of [C, C] dots for KDA (twelve
# [64, 64, 64] dots per key tile where the pairs need two) and spill; by blocks the work is the pairs' own, spread
# over ten small programs per chunk. The inverse stays its own kernel (_inverse): fused after the Grams, one program
# per chunk would walk ten blocks and sixteen substitution steps in a row at 255 registers, bound by latency.

@triton.jit
def _sub_rows(ptr, tok0, H, n, j, cols, D: tl.constexpr):
    # rows 16j .. 16j + 15 of this chunk of a [B, T, H, D] tensor, columns `cols`, fp32, 0 on padded rows
    rows = 16 * j + tl.arange(0, 16)
    return tl.load(ptr + (tok0 + rows[:, None] * H) * D + cols[None, :], mask=(rows < n)[:, None],
                   other=0.).to(tl.float32)

@triton.jit
def _gram_pair(q_ptr, k_ptr, G_ptr, tok0, H, n, j, i, DK: tl.constexpr,
               BK: tl.constexpr, GATE: tl.constexpr, PREC: tl.constexpr):
    # blocks (j, i), j > i, of P_qk and of K K^T, both decayed, [16, 16] fp32 (rows >= n are 0)
    a = tl.arange(0, 16)
    vj = (16 * j + a < n)[:, None]
    vi = (16 * i + a < n)[:, None]
    P = tl.zeros([16, 16], dtype=tl.float32)
    K = tl.zeros([16, 16], dtype=tl.float32)
    for kt in range(DK // BK):  # a loop, not unrolled: its tiles stay local to it
        ck = kt * BK + tl.arange(0, BK)
        qj = _sub_rows(q_ptr, tok0, H, n, j, ck, DK)
        kj = _sub_rows(k_ptr, tok0, H, n, j, ck, DK)
        ki = _sub_rows(k_ptr, tok0, H, n, i, ck, DK)
        if GATE == GATE_CHANNEL:  # KDA: rows rescaled about the sub-chunk's first row nu
            nu = tl.load(G_ptr + (tok0 + tl.minimum(16 * j, n - 1) * H) * DK + ck)[None, :]
            Gj = _sub_rows(G_ptr, tok0, H, n, j, ck, DK)
            Gi = _sub_rows(G_ptr, tok0, H, n, i, ck, DK)
            ej = tl.exp(tl.where(vj, Gj - nu, float('-inf')))     # exp(G_r - G_nu) <= 1
            ki = ki * tl.exp(tl.where(vi, nu - Gi, float('-inf')))  # exp(G_nu - G_s) <= 1
            qj = qj * ej
            kj = kj * ej
        P += _dot(qj, tl.trans(ki), PREC)
        K += _dot(kj, tl.trans(ki), PREC)
    if GATE == GATE_SCALAR:  # GDN: the [16, 16] decay after the plain dot
        gj = tl.load(G_ptr + tok0 + (16 * j + a) * H, mask=16 * j + a < n, other=0.)
        gi = tl.load(G_ptr + tok0 + (16 * i + a) * H, mask=16 * i + a < n, other=0.)
        decay = tl.exp(tl.where(vj, gj[:, None] - gi[None, :], float('-inf')))
        P = P * decay
        K = K * decay
    return P, K

@triton.jit
def _diag_about_first(qj, kj, Gj, nu, vj, r, s, PREC: tl.constexpr):
    # a diagonal block's pairs s < r about its first row nu: exp(G_r - G_s) = exp(G_r - G_nu) exp(G_nu - G_s), the
    # first factor <= 1, the second within e^EXP_SPAN (checked by the caller) or e^75 (the bounded gate, see above)
    eu = tl.exp(tl.where(vj, Gj - nu, float('-inf')))
    kl = kj * tl.exp(tl.where(vj, nu - Gj, float('-inf')))
    return (tl.where(s < r, _dot(qj * eu, tl.trans(kl), PREC), 0.),
            tl.where(s < r, _dot(kj * eu, tl.trans(kl), PREC), 0.))

@triton.jit
def _gram_diag(q_ptr, k_ptr, G_ptr, tok0, H, n, j, DK: tl.constexpr, BK: tl.constexpr,
               GATE: tl.constexpr, PREC: tl.constexpr, BOUNDED: tl.constexpr):
    # diagonal blocks (j, j) of P_qk (lower, with its diagonal) and of K K^T (strictly lower), decayed
    a = tl.arange(0, 16)
    r = a[:, None]
    s = a[None, :]
    vj = (16 * j + a < n)[:, None]
    P = tl.zeros([16, 16], dtype=tl.float32)
    K = tl.zeros([16, 16], dtype=tl.float32)
    for kt in range(DK // BK):  # a loop, not unrolled: its tiles stay local to it
        ck = kt * BK + tl.arange(0, BK)
        qj = _sub_rows(q_ptr, tok0, H, n, j, ck, DK)
        kj = _sub_rows(k_ptr, tok0, H, n, j, ck, DK)
        if GATE == GATE_CHANNEL:  # KDA: about the block's first row if in range, else by dyadic levels
            Gj = _sub_rows(G_ptr, tok0, H, n, j, ck, DK)
            P += tl.where(r == s, tl.sum(qj * kj, 1)[:, None], 0.)  # the diagonal, factor 1
            nu = tl.load(G_ptr + (tok0 + tl.minimum(16 * j, n - 1) * H) * DK + ck)[None, :]
            if BOUNDED:  # |G_r - G_nu| <= 75 by the bound (above): no test, no dyadic code
                dP, dK = _diag_about_first(qj, kj, Gj, nu, vj, r, s, PREC)
                P += dP
                K += dK
            else:
                # rows before the block's first row out of range (per key tile: exp factors per channel) about the
                # first row, exp(G_r - G_i) = exp(G_r - G_nu) exp(G_nu - G_i), both factors within e^EXP_SPAN; the
                # rows from it by dyadic levels. Per row, so that a row's form never depends on a later row's gate
                # (the entries of rows past f can be inf or NaN in the first form: the selects drop them).
                f = tl.min(tl.where(tl.max(tl.where(vj, tl.abs(Gj - nu), 0.), 1) <= EXP_SPAN, 16, a))
                if f > 0:
                    dP, dK = _diag_about_first(qj, kj, Gj, nu, vj, r, s, PREC)
                    P += tl.where(r < f, dP, 0.)
                    K += tl.where(r < f, dK, 0.)
                if f < 16:  # dyadic levels: pairs in different halves of a 2 half-row block, about the left half's last row
                    for lvl in tl.static_range(4):
                        half = 1 << lvl  # pairs in one block of 2 half, in different halves
                        ref = tl.minimum(16 * j + (a // (2 * half)) * (2 * half) + half - 1, n - 1)  # left half's last
                        Gref = tl.load(G_ptr + (tok0 + ref[:, None] * H) * DK + ck[None, :])
                        right = ((a % (2 * half)) >= half)[:, None]
                        e = tl.exp(tl.where(vj, tl.where(right, Gj - Gref, Gref - Gj), float('-inf')))  # both <= 1
                        up = tl.where(right, e, 0.)
                        kl = kj * tl.where(right, 0., e)
                        same = (r // (2 * half)) == (s // (2 * half))
                        P += tl.where(same & (r >= f), _dot(qj * up, tl.trans(kl), PREC), 0.)
                        K += tl.where(same & (r >= f), _dot(kj * up, tl.trans(kl), PREC), 0.)
        else:
            P += _dot(qj, tl.trans(kj), PREC)
            K += _dot(kj, tl.trans(kj), PREC)
    if GATE == GATE_SCALAR:  # GDN: the [16, 16] decay after the plain dot
        gj = tl.load(G_ptr + tok0 + (16 * j + a) * H, mask=16 * j + a < n, other=0.)
        decay = tl.exp(tl.where(vj & (s <= r), gj[:, None] - gj[None, :], float('-inf')))
        P = P * decay
        K = K * decay
    P = tl.where(s <= r, P, 0.)
    K = tl.where(s < r, K, 0.)
    return P, K

@triton.jit(do_not_specialize=["T", "H"])
def _grams_block_kernel(q_ptr, k_ptr, beta_ptr, G_ptr, P_ptr, L_ptr, T, H, DK: tl.constexpr, BK: tl.constexpr,
                        GATE: tl.constexpr, PREC: tl.constexpr, BOUNDED: tl.constexpr, done_ptr,
                        SKIP_DONE: tl.constexpr):
    # One 16 x 16 block (j, i), j >= i, of a chunk per program (grid: chunks, 10 blocks, B H): P_qk's block into P_ptr
    # (the intermediates' dtype; a diagonal program also writes the zero blocks right of it), L's (fp32) into L_ptr.
    # SKIP_DONE: the rows that _grams_chunk_kernel formed (done_ptr[b h, chunk] = how many, from row 0) are left as
    # they are; a block below them is not formed, a block across them stores only its rows past them.
    c = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)                            # blocks in row order: (0,0) (1,0) (1,1) (2,0) (2,1) (2,2) (3,0) ...
    j = (p >= 1).to(tl.int32) + (p >= 3).to(tl.int32) + (p >= 6).to(tl.int32)
    i = p - j * (j + 1) // 2
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // H, bh % H
    n = tl.minimum(T - c * 64, 64)
    tok0 = (b * T + c * 64) * H + h
    lo = 0
    if SKIP_DONE:
        lo = tl.load(done_ptr + bh * tl.num_programs(0) + c).to(tl.int32)
        if 16 * j + 16 <= lo:
            return
    if i == j:
        P, K = _gram_diag(q_ptr, k_ptr, G_ptr, tok0, H, n, j, DK, BK, GATE, PREC, BOUNDED)
        for z in range(j + 1, 4):
            _st_from(P_ptr, tok0, H, n, lo, tl.zeros([16, 16], dtype=tl.float32), j, z)
    else:
        P, K = _gram_pair(q_ptr, k_ptr, G_ptr, tok0, H, n, j, i, DK, BK, GATE, PREC)
    _st_from(P_ptr, tok0, H, n, lo, P, j, i)
    a = tl.arange(0, 16)
    beta = tl.load(beta_ptr + tok0 + (16 * j + a) * H, mask=16 * j + a < n, other=0.).to(tl.float32)
    _st_from(L_ptr, tok0, H, n, lo, K * beta[:, None], j, i)

@triton.jit(do_not_specialize=["T", "H"])
def _grams_chunk_kernel(q_ptr, k_ptr, beta_ptr, G_ptr, P_ptr, L_ptr, done_ptr, T, H, DK: tl.constexpr,
                        BK: tl.constexpr, PREC: tl.constexpr):
    # KDA: a chunk's P_qk and L by whole rows per program (grid: chunks, B H), in two halves of 32 rows, each
    # rescaled about its first row: nu1 = G_0 for rows 0-31, nu2 = G_32 for rows 32-63 (per key channel). Per half,
    # q exp(G - nu) and k exp(G - nu) (<= 1 for a gate <= 0) against k exp(nu - G):
    #   rows 0-31 x columns 0-31 about nu1, rows 32-63 x columns 0-63 about nu2
    # (columns 32-63 of rows 0-31 are above the diagonal: zero). Row r is formed here when every row up to r is in
    # range: |G_r - nu| <= EXP_SPAN over the key channels, and (rows from 32) nu2 - G_i <= EXP_SPAN for i < 32. The
    # rows formed (from row 0) go to done_ptr[b h, chunk]; _grams_block_kernel (SKIP_DONE) forms the rest by 16 x 16
    # blocks. Every factor of a formed row is within e^EXP_SPAN, its pairs i > r too (removed by the selects before
    # the stores), so none is inf or NaN.
    # Causal to the last bit: a row's reference is never after it, and neither is the test that decides its form.
    # (A reference at the chunk's midpoint, or one decision for the whole chunk, made the earlier rows' rounding
    # depend on the later gates: the operands are rounded to bf16 before the dots; docs/mixers.md §4.2.)
    C: tl.constexpr = 64
    c = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    n = tl.minimum(T - c * C, C)
    tok0 = ((bh // H) * T + c * C) * H + bh % H
    r1 = tl.arange(0, 32)        # the first half's rows
    r2 = 32 + r1                 # the second half's
    rows = tl.arange(0, C)       # every row, as columns of the second half
    v1 = (r1 < n)[:, None]
    v2 = (r2 < n)[:, None]
    valid = (rows < n)[:, None]
    out1 = tl.zeros([32], dtype=tl.float32)  # each row's largest |G_r - nu| over the key channels
    out2 = tl.zeros([32], dtype=tl.float32)
    for kt in range(DK // BK):
        ck = kt * BK + tl.arange(0, BK)
        nu1 = tl.load(G_ptr + tok0 * DK + ck)[None, :]
        nu2 = tl.load(G_ptr + (tok0 + tl.minimum(32, n - 1) * H) * DK + ck)[None, :]
        G1 = tl.load(G_ptr + (tok0 + r1[:, None] * H) * DK + ck[None, :], mask=v1, other=0.)
        G2 = tl.load(G_ptr + (tok0 + r2[:, None] * H) * DK + ck[None, :], mask=v2, other=0.)
        out1 = tl.maximum(out1, tl.max(tl.where(v1, tl.abs(G1 - nu1), 0.), 1))
        out2 = tl.maximum(out2, tl.max(tl.where(v2, tl.abs(G2 - nu2), 0.), 1))
        out2 = tl.maximum(out2, tl.max(tl.where(v1 & (n > 32), nu2 - G1, 0.)))  # columns < 32 of the second half
    first = tl.minimum(tl.min(tl.where(out1 <= EXP_SPAN, C, r1)), tl.min(tl.where(out2 <= EXP_SPAN, C, r2)))
    tl.store(done_ptr + bh * tl.num_programs(0) + c, first.to(tl.int8))
    if first > 0:
        P1 = tl.zeros([32, 32], dtype=tl.float32)
        K1 = tl.zeros([32, 32], dtype=tl.float32)
        P2 = tl.zeros([32, C], dtype=tl.float32)
        K2 = tl.zeros([32, C], dtype=tl.float32)
        for kt in range(DK // BK):
            ck = kt * BK + tl.arange(0, BK)
            nu1 = tl.load(G_ptr + tok0 * DK + ck)[None, :]
            nu2 = tl.load(G_ptr + (tok0 + tl.minimum(32, n - 1) * H) * DK + ck)[None, :]
            o1 = (tok0 + r1[:, None] * H) * DK + ck[None, :]
            o2 = (tok0 + r2[:, None] * H) * DK + ck[None, :]
            om = (tok0 + rows[:, None] * H) * DK + ck[None, :]
            f1 = v1 & (r1 < first)[:, None]         # the rows formed here: the others' factors may overflow
            f2 = v2 & (r2 < first)[:, None]
            fm = valid & (rows < first)[:, None]
            G1 = tl.load(G_ptr + o1, mask=f1, other=0.)
            G2 = tl.load(G_ptr + o2, mask=f2, other=0.)
            Gm = tl.load(G_ptr + om, mask=fm, other=0.)
            k1 = tl.load(k_ptr + o1, mask=f1, other=0.).to(tl.float32)
            k2 = tl.load(k_ptr + o2, mask=f2, other=0.).to(tl.float32)
            e1 = tl.exp(tl.where(f1, G1 - nu1, float('-inf')))                         # exp(G_r - nu1), 0 elsewhere
            e2 = tl.exp(tl.where(f2, G2 - nu2, float('-inf')))
            c1 = k1 * tl.exp(tl.where(f1, nu1 - G1, float('-inf')))                    # k_i exp(nu1 - G_i)
            km = tl.load(k_ptr + om, mask=fm, other=0.).to(tl.float32)
            c2 = km * tl.exp(tl.where(fm, nu2 - Gm, float('-inf')))                    # k_i exp(nu2 - G_i)
            P1 += _dot(tl.load(q_ptr + o1, mask=f1, other=0.).to(tl.float32) * e1, tl.trans(c1), PREC)
            K1 += _dot(k1 * e1, tl.trans(c1), PREC)
            if first > 32:  # (else no row of the second half is formed here)
                P2 += _dot(tl.load(q_ptr + o2, mask=f2, other=0.).to(tl.float32) * e2, tl.trans(c2), PREC)
                K2 += _dot(k2 * e2, tl.trans(c2), PREC)
        i1 = r1[None, :]
        i2 = rows[None, :]
        beta1 = tl.load(beta_ptr + tok0 + r1 * H, mask=r1 < n, other=0.).to(tl.float32)
        beta2 = tl.load(beta_ptr + tok0 + r2 * H, mask=r2 < n, other=0.).to(tl.float32)
        s1 = (tok0 + r1[:, None] * H) * C + i1       # rows 0-31, columns 0-31 (32-63: + 32)
        s2 = (tok0 + r2[:, None] * H) * C + i2       # rows 32-63, every column
        zero = tl.zeros([32, 32], dtype=tl.float32)
        f1 = v1 & (r1 < first)[:, None]
        f2 = v2 & (r2 < first)[:, None]
        tl.store(P_ptr + s1, tl.where(i1 <= r1[:, None], P1, 0.).to(P_ptr.dtype.element_ty), mask=f1)
        tl.store(P_ptr + s1 + 32, zero.to(P_ptr.dtype.element_ty), mask=f1)
        tl.store(L_ptr + s1, tl.where(i1 < r1[:, None], K1 * beta1[:, None], 0.), mask=f1)
        tl.store(L_ptr + s1 + 32, zero, mask=f1)
        tl.store(P_ptr + s2, tl.where(i2 <= r2[:, None], P2, 0.).to(P_ptr.dtype.element_ty), mask=f2)
        tl.store(L_ptr + s2, tl.where(i2 < r2[:, None], K2 * beta2[:, None], 0.), mask=f2)

@triton.jit(do_not_specialize=["T", "H"])
def _inverse_kernel(L_ptr, A_ptr, T, H, IPREC: tl.constexpr):
    # A = (I + L)^-1 from L (fp32, from _grams_block) into A_ptr (the storage dtype; may be L_ptr), by 16x16 blocks
    # (C = 64, docs/mixers.md §4.3.3): the four diagonal blocks by forward substitution, then block forward
    # substitution below them, X_ij = -X_ii sum_{j<=m<i} L_im X_mj.
    # The work is a chain of small dependent steps, so it runs in its own kernel with tiny tiles and few warps:
    # many programs per SM hide the latency (inside _wy_fwd, one 255-register program per SM could not).
    # IPREC: TUNING['inverse']['prec'], by the inputs' dot precision.
    c = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    n = tl.minimum(T - c * 64, 64)
    tok0 = (b * T + c * 64) * H + h                 # int64 token-head index of the chunk's first row
    L10 = _ld(L_ptr, tok0, H, n, 1, 0)
    L20 = _ld(L_ptr, tok0, H, n, 2, 0)
    L21 = _ld(L_ptr, tok0, H, n, 2, 1)
    L30 = _ld(L_ptr, tok0, H, n, 3, 0)
    L31 = _ld(L_ptr, tok0, H, n, 3, 1)
    L32 = _ld(L_ptr, tok0, H, n, 3, 2)
    X00 = _inv16(_ld(L_ptr, tok0, H, n, 0, 0), IPREC)
    X11 = _inv16(_ld(L_ptr, tok0, H, n, 1, 1), IPREC)
    X22 = _inv16(_ld(L_ptr, tok0, H, n, 2, 2), IPREC)
    X33 = _inv16(_ld(L_ptr, tok0, H, n, 3, 3), IPREC)
    tl.debug_barrier()  # every block of L is read before any of A is written (A may be written over L)
    X10 = -tl.dot(X11, tl.dot(L10, X00, input_precision=IPREC), input_precision=IPREC)
    X21 = -tl.dot(X22, tl.dot(L21, X11, input_precision=IPREC), input_precision=IPREC)
    X32 = -tl.dot(X33, tl.dot(L32, X22, input_precision=IPREC), input_precision=IPREC)
    X20 = -tl.dot(X22, tl.dot(L20, X00, input_precision=IPREC) + tl.dot(L21, X10, input_precision=IPREC),
                  input_precision=IPREC)
    X31 = -tl.dot(X33, tl.dot(L31, X11, input_precision=IPREC) + tl.dot(L32, X21, input_precision=IPREC),
                  input_precision=IPREC)
    X30 = -tl.dot(X33, tl.dot(L30, X00, input_precision=IPREC) + tl.dot(L31, X10, input_precision=IPREC)
                  + tl.dot(L32, X20, input_precision=IPREC), input_precision=IPREC)
    Z = tl.zeros([16, 16], dtype=tl.float32)   # the blocks above the diagonal
    _st(A_ptr, tok0, H, n, Z, 0, 1)
    _st(A_ptr, tok0, H, n, Z, 0, 2)
    _st(A_ptr, tok0, H, n, Z, 0, 3)
    _st(A_ptr, tok0, H, n, Z, 1, 2)
    _st(A_ptr, tok0, H, n, Z, 1, 3)
    _st(A_ptr, tok0, H, n, Z, 2, 3)
    _st(A_ptr, tok0, H, n, X00, 0, 0)
    _st(A_ptr, tok0, H, n, X10, 1, 0)
    _st(A_ptr, tok0, H, n, X11, 1, 1)
    _st(A_ptr, tok0, H, n, X20, 2, 0)
    _st(A_ptr, tok0, H, n, X21, 2, 1)
    _st(A_ptr, tok0, H, n, X22, 2, 2)
    _st(A_ptr, tok0, H, n, X30, 3, 0)
    _st(A_ptr, tok0, H, n, X31, 3, 1)
    _st(A_ptr, tok0, H, n, X32, 3, 2)
    _st(A_ptr, tok0, H, n, X33, 3, 3)

@triton.jit(do_not_specialize=["T", "H"])
def _wy_fwd_kernel(k_ptr, v_ptr, beta_ptr, G_ptr, A_ptr, w_ptr, u_ptr, q_ptr, kd_ptr, qg_ptr, T,
                   H, DK: tl.constexpr, DV: tl.constexpr, DG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   C: tl.constexpr, GATE: tl.constexpr, PREC: tl.constexpr, DECAYED: tl.constexpr):
    # W = A (beta exp(G) K), U = A (beta V) with A = (I + L)^-1 from _inverse. DECAYED (KDA): also Kd = K exp(G_n - G)
    # and Qg = Q exp(G), so that the sequential state passes read them instead of a [C, Dk] fp32 gate
    # tile and its exps (stored in k's dtype: their readers round them to it as dot operands anyway).
    # Every column of these is its own: program j of a chunk takes key columns j BK .. and value columns j BV ..
    # (TUNING['wy_fwd']['split'] programs a chunk, each with A; BK = Dk / split, BV = Dv / split).
    c = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    j = tl.program_id(2)
    b, h = bh // H, bh % H
    rows = tl.arange(0, C)
    t = c * C + rows
    valid = t < T
    n = tl.minimum(T - c * C, C)
    tok = (b * T + t) * H + h                       # [C] int64 token-head index
    tok0 = (b * T + c * C) * H + h
    X = tl.load(A_ptr + tok[:, None] * C + rows[None, :], mask=valid[:, None], other=0.).to(tl.float32)
    ck = j * BK + tl.arange(0, BK)
    cv = j * BV + tl.arange(0, BV)
    kk = tl.load(k_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.).to(tl.float32)
    vv = tl.load(v_ptr + tok[:, None] * DV + cv[None, :], mask=valid[:, None], other=0.).to(tl.float32)
    beta = tl.load(beta_ptr + tok, mask=valid, other=0.).to(tl.float32)
    if GATE == GATE_CHANNEL:  # this program's key channels of the gate
        Gm, Gn_row, Gn_col = _load_gate(G_ptr + j * BK, tok, valid, tok0 + (n - 1) * H, GATE, C, BK, DG)
    else:
        Gm, Gn_row, Gn_col = _load_gate(G_ptr, tok, valid, tok0 + (n - 1) * H, GATE, C, DG, DG)
    eg = tl.exp(tl.where(valid[:, None], Gm, float('-inf')))    # exp(G_r) <= 1, 0 on padded rows
    w = _dot(X, kk * eg * beta[:, None], PREC)
    u = _dot(X, vv * beta[:, None], PREC)
    tl.store(w_ptr + tok[:, None] * DK + ck[None, :], w.to(w_ptr.dtype.element_ty), mask=valid[:, None])
    tl.store(u_ptr + tok[:, None] * DV + cv[None, :], u.to(u_ptr.dtype.element_ty), mask=valid[:, None])
    if DECAYED:
        kd = kk * tl.exp(tl.where(valid[:, None], Gn_row - Gm, float('-inf')))
        tl.store(kd_ptr + tok[:, None] * DK + ck[None, :], kd.to(kd_ptr.dtype.element_ty), mask=valid[:, None])
        qq = tl.load(q_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.).to(tl.float32)
        tl.store(qg_ptr + tok[:, None] * DK + ck[None, :], (qq * eg).to(qg_ptr.dtype.element_ty), mask=valid[:, None])

@triton.jit(do_not_specialize=["T", "NT", "H"])
def _state_fwd_kernel(k_ptr, w_ptr, u_ptr, G_ptr, h_ptr, vn_ptr, h0_ptr, ht_ptr, q_ptr, P_ptr, o_ptr, scale, T, NT,
                      H, A_ptr, beta_ptr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                      DG: tl.constexpr, C: tl.constexpr, GATE: tl.constexpr, PREC: tl.constexpr,
                      HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, DECAYED: tl.constexpr, OUTPUT: tl.constexpr,
                      SNAPSHOTS: tl.constexpr, WU_IN_PASS: tl.constexpr = False):
    # One program per (V-tile, b, h) walks the chunks in order with the state tile in fp32 registers. The dot
    # operands are loaded in the inputs' dtype and go to the tensor cores as they are (fp32 copies of the [C, Dk] tiles
    # cost registers in this latency-bound loop); a scalar gate's decays act on rows, so they scale Delta and the
    # output's rows rather than K and Q. DECAYED (KDA): k_ptr holds Kd = K exp(G_n - G) and q_ptr Qg = Q exp(G) (from
    # _wy_fwd), and only G_n is read from G, one chunk ahead: G_n of chunk c + 1 is loaded during chunk c and carried
    # in registers. Loaded in its own chunk, G_n is the one load the pipeliner leaves synchronous (it feeds no dot
    # operand), and its conversion to the state's row layout (shared memory) waits for it before the first dot: a
    # full memory round trip a chunk that the third buffer's earlier tile loads cannot hide.
    # OUTPUT (the forward): O = scale (Qg S + P_qk Delta) formed here from the state in registers. SNAPSHOTS: the
    # chunk-start states h[c] and Delta stored for the backward (h is the pass's largest write: [Dk, Dv] per chunk,
    # twice a [C, Dk] tile at C = 64, and the pass is bound by bandwidth): in the backward's recompute (without
    # OUTPUT), or in the forward too where TUNING['keep'] has the backward reuse them instead of recomputing.
    # WU_IN_PASS (DeltaNet only, TUNING['state']['wu_in_pass']): no _wy_fwd before the pass. u_ptr holds V, and
    # Delta = U - W S = A diag(beta) (V - K S) is formed from A (A_ptr, 8 KB a chunk), beta and the K tile the
    # update reads anyway, so neither W nor U is read (K S replaces W S; one more [C, C] x [C, BV] dot). W itself
    # is not stored either: the backward pass forms W^T dDelta from A, beta and K (_state_bwd_kernel's W_FREE).
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = tl.arange(0, C)
    ck = tl.arange(0, DK)
    cv = iv * BV + tl.arange(0, BV)
    s_offs = ck[:, None] * DV + cv[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + bh * DK * DV + s_offs).to(tl.float32)
    else:
        S = tl.zeros([DK, BV], dtype=tl.float32)
    if DECAYED:  # chunk 0's G_n (its last row is min(T, C) - 1)
        Gn_ahead = tl.load(G_ptr + ((b * T + tl.minimum(T, C) - 1) * H + h) * DG + ck)
    if WU_IN_PASS:  # chunk 0's beta: loaded a chunk ahead, as KDA's G_n (below)
        beta_ahead = tl.load(beta_ptr + (b * T + rows) * H + h, mask=rows < T, other=0.)
    for c in range(NT):
        t = c * C + rows
        valid = t < T
        n = tl.minimum(T - c * C, C)
        tok = (b * T + t) * H + h
        tok0 = (b * T + c * C) * H + h
        if DECAYED:
            # exp(G_n) of this chunk from the value loaded a chunk ago (its register is then free for the next one)
            decay_n = tl.exp(Gn_ahead)[:, None]
            n1 = tl.minimum(T - (c + 1) * C, C)
            Gn_ahead = tl.load(G_ptr + ((b * T + (c + 1) * C + n1 - 1) * H + h) * DG + ck,
                               mask=ck < (NT - 1 - c) * DK, other=0.)  # none after the last chunk
        if SNAPSHOTS:
            tl.store(h_ptr + ((b * NT + c) * H + h) * DK * DV + s_offs, S.to(h_ptr.dtype.element_ty))
        if not DECAYED:
            Gm, Gn_row, Gn_col = _load_gate(G_ptr, tok, valid, tok0 + (n - 1) * H, GATE, C, DG, DG)
        if WU_IN_PASS:
            kk = tl.load(k_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
            vv = tl.load(u_ptr + tok[:, None] * DV + cv[None, :], mask=valid[:, None], other=0.).to(tl.float32)
            # beta of the next chunk now: its rows are H apart, too narrow for the pipeliner's asynchronous copies
            # (4 bytes at least), so a load in its own chunk would wait a memory round trip before the first dot
            beta = beta_ahead.to(tl.float32)
            beta_ahead = tl.load(beta_ptr + tok + C * H, mask=t + C < T, other=0.)  # (none after the last chunk)
            # A diag(beta): A's column j scaled by beta_j ([C, C], cheaper than scaling the [C, Dk] K tile);
            # zero on padded rows and columns
            Ab = tl.load(A_ptr + tok[:, None] * C + rows[None, :], mask=valid[:, None], other=0.).to(tl.float32)
            Ab = Ab * beta[None, :]
            # V - K S in fp32, so the residual is rounded against itself when it becomes a dot operand (it can
            # be tiny when the state already predicts v: docs/mixers.md §7 item 8)
            d = _dot(Ab, vv - _dot(kk, S, PREC), PREC)
        else:
            ww = tl.load(w_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
            uu = tl.load(u_ptr + tok[:, None] * DV + cv[None, :], mask=valid[:, None], other=0.).to(tl.float32)
            # Delta = U - W S, subtracted in fp32 before the single cast (the residual can be tiny
            # when the state already predicts v: docs/mixers.md §7 item 8)
            d = uu - _dot(ww, S, PREC)
        if SNAPSHOTS:
            tl.store(vn_ptr + tok[:, None] * DV + cv[None, :], d.to(vn_ptr.dtype.element_ty), mask=valid[:, None])
        if OUTPUT:
            qq = tl.load(q_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
            Pq = tl.load(P_ptr + tok[:, None] * C + rows[None, :], mask=valid[:, None], other=0.)
            qs = _dot(qq, S, PREC)
            if GATE == GATE_SCALAR:
                qs = qs * tl.exp(tl.where(valid[:, None], Gm, float('-inf')))  # (Q exp(G)) S, a row factor
            o = scale * (qs + _dot(Pq, d, PREC))
            tl.store(o_ptr + tok[:, None] * DV + cv[None, :], o.to(o_ptr.dtype.element_ty), mask=valid[:, None])
        if not WU_IN_PASS:  # (loaded above there)
            kk = tl.load(k_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
        if GATE == GATE_SCALAR:
            d = d * tl.exp(tl.where(valid[:, None], Gn_row - Gm, float('-inf')))  # (K exp(G_n - G))^T Delta
        if DECAYED:
            S = S * decay_n
        elif GATE != GATE_NONE:
            S = S * tl.exp(Gn_col)
        S += _dot(tl.trans(kk), d, PREC)
    if STORE_HT:
        tl.store(ht_ptr + bh * DK * DV + s_offs, S)

# ---- backward -------------------------------------------------------------------------------------------------------

# Triton backward (docs/mixers.md §5.2; P_qk and A are kept from the forward, W, h and Delta recomputed by its kernels
# or, with TUNING['keep'], kept too)
#
# _state_bwd, reverse over chunks, dS' = gradient of the state after the chunk (d final_state last):
#   dDelta = scale P_qk^T dO + Kd dS'                 Kd = K * exp(G_n - G)
#   dS     = Diag(exp G_n) dS' + scale (Q * exp G)^T dO - W^T dDelta   (after chunk 0: d initial_state)
# Then per chunk, with S = h[c], dS' = dh[c]:
#   dP = Tril(dO Delta^T);  dQg = scale dO S^T;  dKd = Delta dS'^T;  X = A^T dDelta
#   dL = -StrictTril(X Delta^T)      (below);   Y = A^T dW = -X S^T  (dW = -dDelta S^T)
#   dv = beta X;  dbeta = rowsum(X V) + rowsum(Y exp(G) K) + rowsum(M' K)
#   dq = dQg exp(G) + M;   dk = beta exp(G) Y + dKd exp(G_n - G) + N + beta M' + N'
#   dG = Y beta exp(G) K + dQg Qg - dKd Kd + Q M - K N + beta K M' - K N';  dG[n-1] += dG_n
#   dG_n = exp(G_n) rowsum(S dS') + colsum(dKd Kd);   dg = reverse cumsum of dG within the chunk
# with M, N the gated-Gram backward of P_qk (scale included) and M', N' that of L (_grams_bwd_channel; DeltaNet:
# _grams_bwd).
# dL: L enters only through Delta = U - W S = A R with R = beta V - beta exp(G) K S, which does not depend on L, so
# Delta = (I + L)^-1 R and dL = -A^T dDelta Delta^T = -X Delta^T: one [C, C] product per V-tile, without K, the
# gates or the state. Delta is the stored one (k's dtype), which the forward used for O and the state.
# The local part of dDelta (P_qk^T dO) is formed inside _state_bwd, which loads dO for dS anyway: no fp32 round trip.
# dh and dDelta are stored in the intermediates' dtype (bf16 for bf16 inputs): their readers use them as dot
# operands, rounded to bf16 in any case (_dot), except rowsum(S dS') of the gated kinds.
# The per-chunk gradients, by gate kind:
# - DeltaNet and GDN (no gate or a scalar one): _wy_grads_bwd, one program per chunk with whole Dk rows: the V-tiles
#   are read once, and every contraction over them (X, dP, dL, dv, dQg, dKd, Y) happens in the same pass; GDN at
#   Dk <= 64 in two passes instead (_wy_grads_bwd_phased: fewer live accumulators).
# - KDA: the per-channel gated Gram backward needs [C, BK] exp tiles (per row group or dyadic level), which do not
#   fit beside whole rows, so two kernels: _wy_bwd (per chunk: dP, dL, X, dv, rowsum(X V)) and _grads_bwd (per
#   chunk and key tile of BK channels; the row sums over channels come back as one partial per key tile, added up
#   outside).

@triton.jit(do_not_specialize=["T", "H"])
def _decay_gate_bwd_kernel(u_ptr, A_ptr, bias_ptr, dg_ptr, du_ptr, part_ptr, lb, T, H, DG: tl.constexpr,
                           C: tl.constexpr, BD: tl.constexpr, AG: tl.constexpr, BOUNDED: tl.constexpr):
    # The backward of g = -exp(A) softplus(u + b) (the cumsum kernel's GATE_FN), tiled as _chunk_cumsum_kernel:
    #   du = db_elem = -exp(A) sigmoid(u + b) dg,   dA = sum dg g   (over tokens; per A's columns)
    # BOUNDED, g = lb sigmoid(a x) with a = exp(A), x = u + b, s = sigmoid(a x) (dg/dA = a dg/da = x dg/dx):
    #   du = db_elem = lb a s (1 - s) dg,   dA = sum du x
    # with 1 - s = sigmoid(-a x), which keeps its digits where s rounds to 1 (a x > 17).
    # du in u's dtype; the column sums of du and of dg * g over this program's C rows go to the rows (c, b) of
    # [NT * B, 2, H * DG] partial sums (no atomics: deterministic), which the caller adds up in one kernel.
    c = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    t = c * C + tl.arange(0, C)
    cd = tl.arange(0, BD)
    offs = ((b * T + t) * H + h)[:, None] * DG + cd[None, :]
    mask = (t < T)[:, None] & (cd < DG)[None, :]
    dg = tl.load(dg_ptr + offs, mask=mask, other=0.)
    _gate_fn_bwd(u_ptr, A_ptr, bias_ptr, du_ptr, part_ptr, lb, dg, offs, mask, h * DG + cd, cd < DG,
                 (c * (tl.num_programs(1) // H) + b) * 2 * H * DG, H * DG, AG, BOUNDED)

@triton.jit
def _gate_fn_bwd(u_ptr, A_ptr, bias_ptr, du_ptr, part_ptr, lb, dg, offs, mask, col, cmask, row, HD, AG: tl.constexpr,
                 BOUNDED: tl.constexpr):
    # du and the partial sums of dA_log, ddt_bias of one [rows, cols] tile of the gate (the formulas above), from dg
    # (0 on masked rows): du stored at offs (u's dtype), the column sums at part_ptr + row + col (dA's) and + HD
    # (ddt_bias's). Shared by _decay_gate_bwd_kernel (GDN) and _grads_bwd_kernel (KDA).
    x = tl.load(u_ptr + offs, mask=mask, other=0.).to(tl.float32) \
        + tl.load(bias_ptr + col, mask=cmask, other=0.).to(tl.float32)[None, :]
    a = tl.exp(tl.load(A_ptr + col // AG, mask=cmask, other=0.).to(tl.float32))[None, :]
    if BOUNDED:
        du = lb * a * tl.sigmoid(a * x) * tl.sigmoid(-a * x) * dg
        dA = tl.sum(du * x, 0)
    else:
        du = -a * tl.sigmoid(x) * dg
        dA = tl.sum(-a * _softplus(x) * dg, 0)
    tl.store(du_ptr + offs, du.to(du_ptr.dtype.element_ty), mask=mask)
    tl.store(part_ptr + row + col, dA, mask=cmask)                                  # dA's
    tl.store(part_ptr + row + HD + col, tl.sum(du, 0), mask=cmask)                  # ddt_bias's

@triton.jit
def _ld_pairs(base, rs, r, i, cond):
    # rows r, columns i of a stored [C, C] tile of one chunk (dP or dL; rows rs apart), 0 where cond is not
    return tl.load(base + r * rs + i, mask=cond, other=0.)

@triton.jit
def _grams_bwd_groups(dP_ptr, dL_ptr, rs, beta, q, k, Gm, nuC, nu16, whole, valid, S, r, i, dq, dk, dG, dbeta,
                      PREC: tl.constexpr):
    # _grams_bwd_channel's pairs i < r inside each group of S rows, about the group's reference (the chunk's if whole)
    nu = tl.where(whole, nuC, nu16)
    eu = tl.exp(tl.where(valid, Gm - nu, float('-inf')))       # exp(G_r - G_ref), 0 on padded rows
    ed = tl.exp(tl.where(valid, nu - Gm, float('-inf')))       # exp(G_ref - G_i)
    same = ((r // S) == (i // S)) & (i < r) & valid
    kd = k * ed
    m = eu * _dot(_ld_pairs(dP_ptr, rs, r, i, same), kd, PREC)
    dq += m
    dG += q * m
    m = eu * _dot(_ld_pairs(dL_ptr, rs, r, i, same), kd, PREC)
    dk += beta[:, None] * m
    dG += beta[:, None] * k * m
    dbeta += tl.sum(m * k, 1)
    m = ed * _dot(tl.trans(_ld_pairs(dP_ptr, rs, r, i, same)), q * eu, PREC)
    dk += m
    dG -= k * m
    m = ed * _dot(tl.trans(_ld_pairs(dL_ptr, rs, r, i, same)), k * eu * beta[:, None], PREC)
    dk += m
    dG -= k * m
    return dq, dk, dG, dbeta

@triton.jit
def _grams_bwd_channel(dP_ptr, dL_ptr, rs, beta, q, k, Gm, g_ptr, sg, n, dq, dk, dG, dbeta, C: tl.constexpr,
                       DK: tl.constexpr, LOG2C: tl.constexpr, PREC: tl.constexpr, BOUNDED: tl.constexpr):
    # KDA's backward of the forward's P_qk and of L = Diag(beta) K (strict), given dP and dL [C, C] (zero outside
    # their triangles; stored, read here as pair tiles) and q, k [C, DK]: adds to dq, dk, dG [C, DK] and dbeta [C].
    # With D(X)[r, c] = sum_i X[r, i] k_ic exp(G_rc - G_ic) (row side) and D'(X, x)[i, c] = sum_r X[r, i] x_rc
    # exp(G_rc - G_ic) (column side):
    #   dq += D(dP);  dk += D'(dP, q) + beta D(dL) + D'(beta dL, k);  dbeta += rowsum(k D(dL))
    #   dG += q D(dP) - k D'(dP, q) + beta k D(dL) - k D'(beta dL, k)        (d/dG_r of exp(G_r - G_i) is +, of G_i -)
    # exp(G_r - G_i) factors as exp(G_r - G_ref) exp(G_ref - G_i) about any reference G_ref per key channel,
    # so that the pair sums become dots of rescaled rows. Groups of S rows share one reference, the midpoint
    # of each channel's G over the group ((G at its first row + G at its last) / 2: G is a cumsum of log-decays <= 0,
    # so half the group's span lies on either side; both factors can then exceed 1, but only pairs i <= r are ever
    # multiplied, the others are zeros of dP and dL), when every |G_r - G_ref| in them is at most EXP_SPAN (the
    # factors stay in fp32's and bf16's range): S = C (the whole chunk: four dots) when that holds for the chunk (a
    # span of up to 2 EXP_SPAN: the 124M model's initial gates, where a first-row reference took 16-row groups in 38%
    # of the tiles), else S = 16 when it holds for every 16-row group, else S = 1.
    # The pairs in different groups go by dyadic levels (pairs in different halves of a 2s-row block, about the left
    # half's last row: both exps of a number <= 0 whatever the gate), levels log2(S) .. log2(C) - 1, four dots each.
    # So a gate that decays by at most 2 EXP_SPAN over a chunk costs one level, an unbounded one six.
    # BOUNDED (the bounded gate, lb >= -5: 16 rows span at most 75, 37.5 about the midpoint; see "The bounded gate" in
    # 3.1): S = C or 16, with no by-16 test and no S = 1 (the group dots always run; levels 4, 5 for the pairs in
    # different groups).
    # dP and dL are read from memory (L2: this chunk's, 8 KB each) at every dot, masked to its pairs, not held as
    # [C, C] fp32 tiles: with q, k, G, dq, dk, dG beside them they made the program spill (one 8-warp program of
    # 255 registers per SM); and beta goes into the column side's right operand, not into a [C, C] copy of dL.
    r = tl.arange(0, C)[:, None]
    i = tl.arange(0, C)[None, :]
    valid = r < n
    cols = tl.arange(0, DK)[None, :]
    dPd = tl.load(dP_ptr + r * rs + r, mask=valid, other=0.).to(tl.float32)  # the diagonal of P (dL has none)
    dq += dPd * k
    dk += dPd * q
    # the group size S: the chunk's reference, then each 16-row group's, at their midpoints (rows past n - 1
    # read row n - 1: a padded group's span ends at the last row)
    top = r // 16 * 16
    nuC = (tl.load(g_ptr + cols) + tl.load(g_ptr + (n - 1) * sg + cols)) * 0.5
    nu16 = (tl.load(g_ptr + tl.minimum(top, n - 1) * sg + cols)
            + tl.load(g_ptr + tl.minimum(top + 15, n - 1) * sg + cols)) * 0.5
    whole = tl.max(tl.where(valid, tl.abs(Gm - nuC), 0.)) <= EXP_SPAN
    if BOUNDED:  # every 16-row group is in range (the bound): the group dots always, no S = 1
        S = tl.where(whole, C, 16)
        first = tl.where(whole, LOG2C, 4)                          # the first dyadic level still needed
        dq, dk, dG, dbeta = _grams_bwd_groups(dP_ptr, dL_ptr, rs, beta, q, k, Gm, nuC, nu16, whole, valid, S, r, i,
                                              dq, dk, dG, dbeta, PREC)
    else:
        by16 = tl.max(tl.where(valid, tl.abs(Gm - nu16), 0.)) <= EXP_SPAN
        S = tl.where(whole, C, tl.where(by16, 16, 1))
        first = tl.where(whole, LOG2C, tl.where(by16, 4, 0))       # the first dyadic level still needed
        if S > 1:  # the pairs inside a group, about its reference
            dq, dk, dG, dbeta = _grams_bwd_groups(dP_ptr, dL_ptr, rs, beta, q, k, Gm, nuC, nu16, whole, valid, S, r,
                                                  i, dq, dk, dG, dbeta, PREC)
    for lvl in range(first, LOG2C):  # the pairs in different groups, by dyadic levels
        s = 1 << lvl  # half-block size of this level
        ref = tl.minimum((r // (2 * s)) * (2 * s) + s - 1, n - 1)
        nu = tl.load(g_ptr + ref * sg + cols)
        right = (r % (2 * s)) >= s
        e = tl.exp(tl.where(valid, tl.where(right, Gm - nu, nu - Gm), float('-inf')))  # as in _grams
        up = tl.where(right, e, 0.)                                 # rows r (right half)
        dn = tl.where(right, 0., e)                                 # rows i (left half)
        same = ((r // (2 * s)) == (i // (2 * s))) & valid
        kdn = k * dn
        m = up * _dot(_ld_pairs(dP_ptr, rs, r, i, same), kdn, PREC)
        dq += m
        dG += q * m
        m = up * _dot(_ld_pairs(dL_ptr, rs, r, i, same), kdn, PREC)
        dk += beta[:, None] * m
        dG += beta[:, None] * k * m
        dbeta += tl.sum(m * k, 1)
        m = dn * _dot(tl.trans(_ld_pairs(dP_ptr, rs, r, i, same)), q * up, PREC)
        dk += m
        dG -= k * m
        m = dn * _dot(tl.trans(_ld_pairs(dL_ptr, rs, r, i, same)), k * up * beta[:, None], PREC)
        dk += m
        dG -= k * m
    return dq, dk, dG, dbeta

@triton.jit
def _grams_bwd(dP, dL, beta, q, k, dq, dk, dG, dbeta, PREC: tl.constexpr):
    # DeltaNet's Gram backward (no gate: plain dots), given dP and dL [C, C] (zero outside their triangles):
    #   dq += dP K;  dk += dP^T Q + beta dL K + (beta dL)^T K;  dbeta += rowsum(K (dL K));  dG: as _grams_bwd_channel's
    # (G = 0). GDN's gradient kernels form these terms themselves (_wy_grads_bwd, _wy_grads_bwd_phased).
    dLb = dL * beta[:, None]
    m = _dot(dP, k, PREC)
    dq += m
    dG += q * m
    m = _dot(tl.trans(dP), q, PREC)
    dk += m
    dG -= k * m
    m = _dot(dL, k, PREC)
    dk += beta[:, None] * m
    dG += beta[:, None] * k * m
    dbeta += tl.sum(m * k, 1)
    m = _dot(tl.trans(dLb), k, PREC)
    dk += m
    dG -= k * m
    return dq, dk, dG, dbeta

@triton.jit(do_not_specialize=["T", "NT", "H"])
def _state_bwd_kernel(q_ptr, k_ptr, w_ptr, G_ptr, P_ptr, do_ptr, dvn_ptr, dh_ptr, dht_ptr, dh0_ptr, scale, T, NT,
                      H, A_ptr, beta_ptr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                      DG: tl.constexpr, C: tl.constexpr, GATE: tl.constexpr,
                      PREC: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr, DECAYED: tl.constexpr,
                      W_FREE: tl.constexpr = False):
    # DECAYED (KDA): k_ptr and q_ptr hold Kd = K exp(G_n - G) and Qg = Q exp(G) (from _wy_fwd); only G_n is read
    # from G, one chunk ahead as in _state_fwd_kernel (here the next chunk is c - 1, a whole one).
    # W_FREE (DeltaNet where the forward pass formed Delta itself, _wu_in_pass): no W was stored; W = A diag(beta) K,
    # so W^T dDelta = K^T diag(beta) (A^T dDelta): A (8 KB a chunk against W's 16 at Dk = 128) and beta in W's place,
    # one more [C, C] x [C, BV] dot; beta, whose rows are H apart (too narrow for asynchronous copies), a chunk ahead.
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = tl.arange(0, C)
    ck = tl.arange(0, DK)
    cv = iv * BV + tl.arange(0, BV)
    s_offs = ck[:, None] * DV + cv[None, :]
    if HAS_DHT:
        dS = tl.load(dht_ptr + bh * DK * DV + s_offs).to(tl.float32)
    else:
        dS = tl.zeros([DK, BV], dtype=tl.float32)
    if DECAYED:  # the last chunk's G_n (row T - 1)
        Gn_ahead = tl.load(G_ptr + ((b * T + T - 1) * H + h) * DG + ck)
    if W_FREE:  # the last chunk's beta
        beta_ahead = tl.load(beta_ptr + (b * T + (NT - 1) * C + rows) * H + h, mask=(NT - 1) * C + rows < T, other=0.)
    for cc in range(NT):
        c = NT - 1 - cc
        t = c * C + rows
        valid = t < T
        n = tl.minimum(T - c * C, C)
        tok = (b * T + t) * H + h
        tok0 = (b * T + c * C) * H + h
        if DECAYED:
            decay_n = tl.exp(Gn_ahead)[:, None]  # this chunk's, loaded a chunk ago
            Gn_ahead = tl.load(G_ptr + ((b * T + c * C - 1) * H + h) * DG + ck,
                               mask=ck < c * DK, other=0.)  # chunk c - 1's last row; none before chunk 0
        tl.store(dh_ptr + ((b * NT + c) * H + h) * DK * DV + s_offs, dS.to(dh_ptr.dtype.element_ty))
        if not DECAYED:
            Gm, Gn_row, Gn_col = _load_gate(G_ptr, tok, valid, tok0 + (n - 1) * H, GATE, C, DG, DG)
        dO = tl.load(do_ptr + tok[:, None] * DV + cv[None, :], mask=valid[:, None], other=0.)
        P = tl.load(P_ptr + tok[:, None] * C + rows[None, :], mask=valid[:, None], other=0.)
        kk = tl.load(k_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
        kds = _dot(kk, dS, PREC)
        if GATE == GATE_SCALAR:
            kds = kds * tl.exp(tl.where(valid[:, None], Gn_row - Gm, float('-inf')))  # (K exp(G_n - G)) dS'
        dd = scale * _dot(tl.trans(P), dO, PREC) + kds
        tl.store(dvn_ptr + tok[:, None] * DV + cv[None, :], dd.to(dvn_ptr.dtype.element_ty), mask=valid[:, None])
        qq = tl.load(q_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
        if W_FREE:
            beta = beta_ahead.to(tl.float32)
            beta_ahead = tl.load(beta_ptr + tok - C * H, mask=t >= C, other=0.)  # chunk c - 1's (none before 0)
            Aa = tl.load(A_ptr + tok[:, None] * C + rows[None, :], mask=valid[:, None], other=0.)
            x = _dot(tl.trans(Aa), dd, PREC) * beta[:, None]  # diag(beta) A^T dDelta
        else:
            ww = tl.load(w_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
        if GATE == GATE_SCALAR:
            dO = dO.to(tl.float32) * tl.exp(tl.where(valid[:, None], Gm, float('-inf')))  # (Q exp G)^T dO = Q^T (exp(G) dO)
        if DECAYED:
            dS = dS * decay_n
        elif GATE != GATE_NONE:
            dS = dS * tl.exp(Gn_col)
        if W_FREE:
            dS += scale * _dot(tl.trans(qq), dO, PREC) - _dot(tl.trans(kk), x, PREC)  # W^T dDelta = K^T x
        else:
            dS += scale * _dot(tl.trans(qq), dO, PREC) - _dot(tl.trans(ww), dd, PREC)
    if STORE_DH0:
        tl.store(dh0_ptr + bh * DK * DV + s_offs, dS)

@triton.jit
def _gate_grads(Y, dqg, dkd, sds, qq, kk, beta, Gm, Gn_row, valid):
    # The per-channel terms of the gradients that do not involve the Grams (see above): W = A (beta exp(G) K),
    # Qg = Q exp(G), Kd = K exp(G_n - G). -> dq, dk, dbeta, dG (without the Gram parts) and dG_n [1, BK].
    # KDA's _grads_bwd (per key tile) and DeltaNet's _wy_grads_bwd (G = 0).
    eg = tl.exp(tl.where(valid[:, None], Gm, float('-inf')))            # exp(G), 0 on padded rows
    egn = tl.exp(tl.where(valid[:, None], Gn_row - Gm, float('-inf')))  # exp(G_n - G)
    kb = kk * eg * beta[:, None]
    dk = Y * eg * beta[:, None]
    dbeta = tl.sum(Y * eg * kk, 1)
    dG = Y * kb
    kd = kk * egn
    dq = dqg * eg
    dG += dqg * qq * eg
    dk += dkd * egn
    dG -= dkd * kd
    dGn = tl.exp(Gn_row) * sds[None, :] + tl.sum(dkd * kd, 0)[None, :]  # G_n: state decay exp(G_n) S and Kd
    return dq, dk, dbeta, dG, dGn

@triton.jit(do_not_specialize=["T", "NT", "H"])
def _wy_grads_bwd_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, G_ptr, A_ptr, h_ptr, vn_ptr, do_ptr, dvn_ptr, dh_ptr,
                         dq_ptr, dk_ptr, dv_ptr, dbeta_ptr, dg_ptr, scale, T, NT,
                         H, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                         LOG2C: tl.constexpr, GATE: tl.constexpr, PREC: tl.constexpr):
    # DeltaNet (GATE_NONE, every Dk) and GDN (GATE_SCALAR, at Dk > 64; below, _wy_grads_bwd_phased): one program per
    # (chunk, b h), whole Dk rows -> dq, dk, dv, dbeta, GDN's dg [B, T, H].
    # GDN's dg needs only the row sums of dG, so dG is a [C] vector, each [C, Dk] term summed over channels where it
    # is formed: with eg = exp(G_r) a row factor, rowsum(Y beta eg K) + beta rowsum(K M') = beta dbeta_K (dbeta_K:
    # dbeta less rowsum(X V)), one product, and the two q-side terms (eg dQg, M) together as rowsum(Q dq) from the
    # final dq. Its lines are ordered so that few [C, Dk] tiles are live at once: dk's gate terms first (Y and dKd
    # die), then dq whole and stored, then dk's Gram products (q dies after the first). Against a [C, Dk] dG tile
    # summed at the end and per-term row sums in the natural order, this order measured fastest at Dk = 128, and
    # against the two-pass kernel too (which reads the [C, 128] tiles twice).
    c = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = tl.arange(0, C)
    r2 = rows[:, None]
    i2 = rows[None, :]
    t = c * C + rows
    valid = t < T
    n = tl.minimum(T - c * C, C)
    tok = (b * T + t) * H + h
    tok0 = (b * T + c * C) * H + h
    ck = tl.arange(0, DK)
    beta = tl.load(beta_ptr + tok, mask=valid, other=0.).to(tl.float32)
    A = _f32_if(tl.load(A_ptr + tok[:, None] * C + rows[None, :], mask=valid[:, None], other=0.), GATE == GATE_SCALAR)

    # every contraction over the value dimension, one V-tile at a time. DeltaNet keeps the tiles in the dtype they
    # are stored in (dot operands: _dot takes them as they are); GDN takes them in fp32, which its many row sums of
    # products made faster at Dk = 128 (the products need fp32 operands anyway, converted once here)
    dP = tl.zeros([C, C], dtype=tl.float32)
    dL = tl.zeros([C, C], dtype=tl.float32)
    dbeta = tl.zeros([C], dtype=tl.float32)                              # rowsum(X V)
    dqg = tl.zeros([C, DK], dtype=tl.float32)
    dkd = tl.zeros([C, DK], dtype=tl.float32)
    Y = tl.zeros([C, DK], dtype=tl.float32)                              # A^T dW = -X S^T
    sds = tl.zeros([DK], dtype=tl.float32)                               # rowsum(S * dS')
    s_base = ((b * NT + c) * H + h) * DK * DV
    for iv in range(DV // BV):
        cv = iv * BV + tl.arange(0, BV)
        x_offs = tok[:, None] * DV + cv[None, :]
        d = _f32_if(tl.load(vn_ptr + x_offs, mask=valid[:, None], other=0.), GATE == GATE_SCALAR)
        dO = _f32_if(tl.load(do_ptr + x_offs, mask=valid[:, None], other=0.), GATE == GATE_SCALAR)
        dd = _f32_if(tl.load(dvn_ptr + x_offs, mask=valid[:, None], other=0.), GATE == GATE_SCALAR)
        vv = tl.load(v_ptr + x_offs, mask=valid[:, None], other=0.).to(tl.float32)
        S = _f32_if(tl.load(h_ptr + s_base + ck[:, None] * DV + cv[None, :]), GATE == GATE_SCALAR)
        dS = _f32_if(tl.load(dh_ptr + s_base + ck[:, None] * DV + cv[None, :]), GATE == GATE_SCALAR)
        X = _dot(tl.trans(A), dd, PREC)                                 # A^T dDelta [C, BV]
        dP += _dot(dO, tl.trans(d), PREC)
        dL -= _dot(X, tl.trans(d), PREC)
        tl.store(dv_ptr + x_offs, (X * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=valid[:, None])
        dbeta += tl.sum(X * vv, 1)
        dqg += _dot(dO, tl.trans(S), PREC)
        dkd += _dot(d, tl.trans(dS), PREC)
        Y -= _dot(X, tl.trans(S), PREC)
        if GATE != GATE_NONE:
            sds += tl.sum(S * dS, 1)
    dP = tl.where((i2 <= r2) & (r2 < n), dP * scale, 0.)                 # grad of the scaled scores
    dL = tl.where((i2 < r2) & (r2 < n), dL, 0.)
    dqg = dqg * scale

    Gm, Gn_row, Gn_col = _load_gate(G_ptr, tok, valid, tok0 + (n - 1) * H, GATE, C, 1, 1)
    if GATE == GATE_SCALAR:
        # GDN: each Gram product is used twice (in dk or dq and in a row sum), except M, which goes only to dq (a
        # fold into dq's accumulator: no dot follows it), so Triton does not fold `dk += dot` into a chain of dots (a
        # dot whose result feeds another dot gets all 8 warps along its 64 rows: a doubled accumulator and [C, Dk]
        # layout conversions)
        kk = _f32_if(tl.load(k_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.), GATE == GATE_SCALAR)
        eg = tl.exp(tl.where(valid[:, None], Gm, float('-inf')))            # [C, 1], as in _gate_grads
        egn = tl.exp(tl.where(valid[:, None], Gn_row - Gm, float('-inf')))
        db = tl.sum(eg, 1) * tl.sum(Y * kk, 1)                              # dbeta_K, W's part
        sdk = tl.sum(egn, 1) * tl.sum(dkd * kk, 1)                          # rowsum(dKd Kd)
        dGn = tl.exp(tl.sum(Gn_row)) * tl.sum(sds) + tl.sum(sdk)
        dk = Y * (eg * beta[:, None]) + dkd * egn
        decay = tl.exp(tl.where((i2 <= r2) & (r2 < n), Gm - tl.trans(Gm), float('-inf')))
        dP = dP * decay
        dL = dL * decay
        qq = _f32_if(tl.load(q_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.), GATE == GATE_SCALAR)
        dq = dqg * eg + _dot(dP, kk, PREC)
        dG = tl.sum(qq * dq, 1) - sdk
        tl.store(dq_ptr + tok[:, None] * DK + ck[None, :], dq.to(dq_ptr.dtype.element_ty), mask=valid[:, None])
        m = _dot(tl.trans(dP), qq, PREC)
        dk += m
        dG -= tl.sum(kk * m, 1)
        m = _dot(tl.trans(dL * beta[:, None]), kk, PREC)
        dk += m
        dG -= tl.sum(kk * m, 1)
        m = _dot(dL, kk, PREC)
        dk += beta[:, None] * m
        db += tl.sum(m * kk, 1)
        dG += beta * db
        dbeta += db
        tl.store(dk_ptr + tok[:, None] * DK + ck[None, :], dk.to(dk_ptr.dtype.element_ty), mask=valid[:, None])
    else:
        qq = _f32_if(tl.load(q_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.), GATE == GATE_SCALAR)
        kk = _f32_if(tl.load(k_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.), GATE == GATE_SCALAR)
        dq, dk, db, dG, dGn = _gate_grads(Y, dqg, dkd, sds, qq, kk, beta, Gm, Gn_row, valid)
        dbeta += db
        dq, dk, dG, dbeta = _grams_bwd(dP, dL, beta, qq, kk, dq, dk, dG, dbeta, PREC)
        tl.store(dq_ptr + tok[:, None] * DK + ck[None, :], dq.to(dq_ptr.dtype.element_ty), mask=valid[:, None])
        tl.store(dk_ptr + tok[:, None] * DK + ck[None, :], dk.to(dk_ptr.dtype.element_ty), mask=valid[:, None])
    tl.store(dbeta_ptr + tok, dbeta, mask=valid)
    if GATE == GATE_SCALAR:
        dg = tl.cumsum(dG + tl.where(rows == n - 1, dGn, 0.), axis=0, reverse=True)  # G = cumsum(g) => reverse
        tl.store(dg_ptr + tok, dg, mask=valid)

@triton.jit(do_not_specialize=["T", "NT", "H"])
def _wy_grads_bwd_phased_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, G_ptr, A_ptr, h_ptr, vn_ptr, do_ptr, dvn_ptr, dh_ptr,
                                dq_ptr, dk_ptr, dv_ptr, dbeta_ptr, dg_ptr, scale, T, NT,
                                H, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                                PREC: tl.constexpr):
    # GDN at Dk <= 64: _wy_grads_bwd's gradients in two passes over the V-tiles, so that at most four [C, Dk]-or-[C, C]
    # fp32 accumulators are live at once (five in one pass): GDN's one-pass form spills at Dk = 64 where DeltaNet's
    # does not, and its two [C, C] decays and row sums made it the slowest kernel of GDN's backward there.
    #   1. the output side: dP, dQg -> dq (stored), then dk = N (P_qk's column side) and dP dies;
    #   2. the W/U side: X, dL, dv, rowsum(X V), Y, dKd -> the rest of dk and dbeta.
    # At Dv <= 64 (one V-tile) Delta and S are read once for both passes. At Dk = 128 the second reads of [C, 128]
    # tiles cost more than the spills saved, so there GDN takes _wy_grads_bwd. dG needs no per-term row sums:
    # every term with G_r on row r enters through q_r (+), k_r (-) or, for W and L's rows, k_r (+), so
    # dG = rowsum(Q dq) - rowsum(K dk) + 2 beta dbeta_K, dbeta_K = rowsum(K Z), Z = exp(G) Y + M' (dbeta less
    # rowsum(X V)); dG_n = exp(G_n) <S, dS'> + colsum(dKd Kd), both from the second pass's tiles, which this
    # kernel holds anyway (a row sum in _state_bwd's sequential loop costs that loop more). The colsum comes from the
    # same dKd tile as dk's term (-dKd Kd in dG through k dk): after a strong gate the two nearly cancel, in fp32
    # only if both are formed from the same tile.
    # The [C, C] decay exp(G_r - G_i) is formed once, in the first pass (i <= r, for dP), and kept for the second,
    # where dL takes it with its diagonal removed by a select: half the exps of forming it per pass, and fewer spills.
    c = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = tl.arange(0, C)
    r2 = rows[:, None]
    i2 = rows[None, :]
    t = c * C + rows
    valid = t < T
    n = tl.minimum(T - c * C, C)
    tok = (b * T + t) * H + h
    tok0 = (b * T + c * C) * H + h
    ck = tl.arange(0, DK)
    s_base = ((b * NT + c) * H + h) * DK * DV
    Gm, Gn_row, Gn_col = _load_gate(G_ptr, tok, valid, tok0 + (n - 1) * H, GATE_SCALAR, C, 1, 1)
    eg = tl.exp(tl.where(valid[:, None], Gm, float('-inf')))              # exp(G) [C, 1], 0 on padded rows
    egn = tl.exp(tl.where(valid[:, None], Gn_row - Gm, float('-inf')))    # exp(G_n - G)

    if DV == BV:  # one V-tile (Dv <= 64): Delta and S are read once for both passes
        d1 = tl.load(vn_ptr + tok[:, None] * DV + tl.arange(0, BV)[None, :], mask=valid[:, None], other=0.)
        S1 = tl.load(h_ptr + s_base + ck[:, None] * DV + tl.arange(0, BV)[None, :])

    # 1. the output side: dP = Tril(dO Delta^T), dq = scale exp(G) dO S^T + M
    dP = tl.zeros([C, C], dtype=tl.float32)
    dq = tl.zeros([C, DK], dtype=tl.float32)
    for iv in range(DV // BV):
        cv = iv * BV + tl.arange(0, BV)
        x_offs = tok[:, None] * DV + cv[None, :]
        if DV == BV:
            d, S = d1, S1
        else:
            d = tl.load(vn_ptr + x_offs, mask=valid[:, None], other=0.)
            S = tl.load(h_ptr + s_base + ck[:, None] * DV + cv[None, :])
        dO = tl.load(do_ptr + x_offs, mask=valid[:, None], other=0.)
        dP += _dot(dO, tl.trans(d), PREC)
        dq += _dot(dO, tl.trans(S), PREC)
    decay = tl.exp(tl.where((i2 <= r2) & (r2 < n), Gm - tl.trans(Gm), float('-inf')))  # 0 above the diagonal
    dP = dP * (scale * decay)
    qq = tl.load(q_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
    kk = tl.load(k_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
    dq = dq * (eg * scale) + _dot(dP, kk, PREC)
    tl.store(dq_ptr + tok[:, None] * DK + ck[None, :], dq.to(dq_ptr.dtype.element_ty), mask=valid[:, None])
    dG = tl.sum(qq.to(tl.float32) * dq, 1)
    dk = _dot(tl.trans(dP), qq, PREC)                                      # N

    # 2. the W/U side
    beta = tl.load(beta_ptr + tok, mask=valid, other=0.).to(tl.float32)
    A = tl.load(A_ptr + tok[:, None] * C + rows[None, :], mask=valid[:, None], other=0.)
    dL = tl.zeros([C, C], dtype=tl.float32)
    dbeta = tl.zeros([C], dtype=tl.float32)                                # rowsum(X V)
    Y = tl.zeros([C, DK], dtype=tl.float32)
    dkd = tl.zeros([C, DK], dtype=tl.float32)
    sds = tl.zeros([DK], dtype=tl.float32)
    for iv in range(DV // BV):
        cv = iv * BV + tl.arange(0, BV)
        x_offs = tok[:, None] * DV + cv[None, :]
        if DV == BV:
            d, S = d1, S1
        else:
            d = tl.load(vn_ptr + x_offs, mask=valid[:, None], other=0.)
            S = tl.load(h_ptr + s_base + ck[:, None] * DV + cv[None, :])
        dd = tl.load(dvn_ptr + x_offs, mask=valid[:, None], other=0.)
        vv = tl.load(v_ptr + x_offs, mask=valid[:, None], other=0.).to(tl.float32)
        dS = tl.load(dh_ptr + s_base + ck[:, None] * DV + cv[None, :])
        X = _dot(tl.trans(A), dd, PREC)                                   # A^T dDelta [C, BV]
        dL -= _dot(X, tl.trans(d), PREC)
        tl.store(dv_ptr + x_offs, (X * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=valid[:, None])
        dbeta += tl.sum(X * vv, 1)
        Y -= _dot(X, tl.trans(S), PREC)
        dkd += _dot(d, tl.trans(dS), PREC)
        sds += tl.sum(S.to(tl.float32) * dS.to(tl.float32), 1)
    dL = tl.where(i2 < r2, dL * decay, 0.)                      # decay: 0 above the diagonal and on padded rows
    kf = kk.to(tl.float32)
    Z = Y * eg + _dot(dL, kk, PREC)                                       # exp(G) Y + M'
    db = tl.sum(Z * kf, 1)                                                 # dbeta_K
    tl.store(dbeta_ptr + tok, dbeta + db, mask=valid)
    dk += beta[:, None] * Z + dkd * egn + _dot(tl.trans(dL * beta[:, None]), kk, PREC)  # + N'
    tl.store(dk_ptr + tok[:, None] * DK + ck[None, :], dk.to(dk_ptr.dtype.element_ty), mask=valid[:, None])
    dG += 2 * beta * db - tl.sum(kf * dk, 1)
    dGn = tl.exp(tl.sum(Gn_row)) * tl.sum(sds) + tl.sum(tl.sum(egn, 1) * tl.sum(dkd * kf, 1))
    dg = tl.cumsum(dG + tl.where(rows == n - 1, dGn, 0.), axis=0, reverse=True)
    tl.store(dg_ptr + tok, dg, mask=valid)

@triton.jit(do_not_specialize=["T", "H"])
def _wy_bwd_kernel(v_ptr, beta_ptr, A_ptr, vn_ptr, do_ptr, dvn_ptr, dv_ptr, dbeta_ptr, dP_ptr, dL_ptr, scale, T,
                   H, DV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr, PREC: tl.constexpr):
    # KDA, one program per chunk: the C x C gradients and the value side, all contractions over V-tiles. Each program
    # reads and writes only its own chunk's rows, so dvn_ptr holds dDelta on entry and X = A^T dDelta on exit.
    # dP_ptr: the scaled, masked dP [B, T, H, C]; dbeta_ptr: rowsum(X V) [B, T, H].
    c = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    rows = tl.arange(0, C)
    r2 = rows[:, None]
    i2 = rows[None, :]
    t = c * C + rows
    valid = t < T
    n = tl.minimum(T - c * C, C)
    tok = (b * T + t) * H + h
    beta = tl.load(beta_ptr + tok, mask=valid, other=0.).to(tl.float32)
    A = tl.load(A_ptr + tok[:, None] * C + rows[None, :], mask=valid[:, None], other=0.).to(tl.float32)
    dP = tl.zeros([C, C], dtype=tl.float32)
    dL = tl.zeros([C, C], dtype=tl.float32)
    dbeta = tl.zeros([C], dtype=tl.float32)
    for iv in range(DV // BV):
        cv = iv * BV + tl.arange(0, BV)
        x_offs = tok[:, None] * DV + cv[None, :]
        vv = tl.load(v_ptr + x_offs, mask=valid[:, None], other=0.).to(tl.float32)
        d = tl.load(vn_ptr + x_offs, mask=valid[:, None], other=0.).to(tl.float32)
        dO = tl.load(do_ptr + x_offs, mask=valid[:, None], other=0.).to(tl.float32)
        dd = tl.load(dvn_ptr + x_offs, mask=valid[:, None], other=0.).to(tl.float32)
        X = _dot(tl.trans(A), dd, PREC)                # A^T dDelta [C, BV]
        dP += _dot(dO, tl.trans(d), PREC)
        dL -= _dot(X, tl.trans(d), PREC)
        tl.store(dv_ptr + x_offs, (X * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=valid[:, None])
        dbeta += tl.sum(X * vv, 1)
        tl.store(dvn_ptr + x_offs, X.to(dvn_ptr.dtype.element_ty), mask=valid[:, None])  # over dDelta, read above
    dP = tl.where((i2 <= r2) & (r2 < n), dP * scale, 0.)                 # grad of the scaled scores
    dL = tl.where((i2 < r2) & (r2 < n), dL, 0.)
    tl.store(dP_ptr + tok[:, None] * C + rows[None, :], dP.to(dP_ptr.dtype.element_ty), mask=valid[:, None])
    tl.store(dL_ptr + tok[:, None] * C + rows[None, :], dL.to(dL_ptr.dtype.element_ty), mask=valid[:, None])
    tl.store(dbeta_ptr + tok, dbeta, mask=valid)

@triton.jit(do_not_specialize=["T", "NT", "H"])
def _grads_bwd_kernel(q_ptr, k_ptr, beta_ptr, G_ptr, dP_ptr, dL_ptr, h_ptr, vn_ptr, do_ptr, x_ptr, dh_ptr,
                      dq_ptr, dk_ptr, dbeta_ptr, dg_ptr, scale, T, NT,
                      H, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      DG: tl.constexpr, C: tl.constexpr, LOG2C: tl.constexpr, PREC: tl.constexpr,
                      BOUNDED: tl.constexpr, u_ptr, A_ptr, bias_ptr, part_ptr, lb,
                      AG: tl.constexpr, GATE_BWD: tl.constexpr):
    # KDA, one program per (key tile, chunk, b h): dq, dk, dg for BK key channels; a partial dbeta sum per key tile.
    # BOUNDED: the gate is the bounded one (lower_bound), so _grams_bwd_channel needs no dyadic groups of one row.
    # GATE_BWD (the gate formed in the kernels from u, A_log, dt_bias; 2: the bounded form): the gate's backward
    # here, from dg in registers, not a pass over dg (fp32) and u after this kernel: du (u's dtype, at dg_ptr) and
    # dA_log's, ddt_bias's partial sums per (chunk, b), as _decay_gate_bwd_kernel forms them from dg for GDN.
    # dP, dL from _wy_bwd; x_ptr: X = A^T dDelta [B, T, H, DV] (written by _wy_bwd over dDelta).
    ik = tl.program_id(0)
    c = tl.program_id(1).to(tl.int64)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // H, bh % H
    rows = tl.arange(0, C)
    r2 = rows[:, None]
    t = c * C + rows
    valid = t < T
    n = tl.minimum(T - c * C, C)
    tok = (b * T + t) * H + h
    tok0 = (b * T + c * C) * H + h
    ck = ik * BK + tl.arange(0, BK)                 # this program's key channels

    # contractions over the value dimension, one V-tile at a time: [C, BK] each
    dqg = tl.zeros([C, BK], dtype=tl.float32)
    dkd = tl.zeros([C, BK], dtype=tl.float32)
    Y = tl.zeros([C, BK], dtype=tl.float32)                              # A^T dW = -X S^T
    sds = tl.zeros([BK], dtype=tl.float32)                               # rowsum(S * dS')
    s_base = ((b * NT + c) * H + h) * DK * DV
    for iv in range(DV // BV):
        cv = iv * BV + tl.arange(0, BV)
        x_offs = tok[:, None] * DV + cv[None, :]
        S = tl.load(h_ptr + s_base + ck[:, None] * DV + cv[None, :]).to(tl.float32)
        dS = tl.load(dh_ptr + s_base + ck[:, None] * DV + cv[None, :]).to(tl.float32)
        d = tl.load(vn_ptr + x_offs, mask=valid[:, None], other=0.).to(tl.float32)
        dO = tl.load(do_ptr + x_offs, mask=valid[:, None], other=0.).to(tl.float32)
        X = tl.load(x_ptr + x_offs, mask=valid[:, None], other=0.).to(tl.float32)
        dqg += _dot(dO, tl.trans(S), PREC)
        dkd += _dot(d, tl.trans(dS), PREC)
        Y -= _dot(X, tl.trans(S), PREC)
        sds += tl.sum(S * dS, 1)
    dqg = dqg * scale

    # loaded after the loop, so that they are not live during it
    g_tile = G_ptr + ik * BK                        # this tile's gate channels
    Gm, Gn_row, Gn_col = _load_gate(g_tile, tok, valid, tok0 + (n - 1) * H, GATE_CHANNEL, C, BK, DG)
    qq = tl.load(q_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.).to(tl.float32)
    kk = tl.load(k_ptr + tok[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.).to(tl.float32)
    beta = tl.load(beta_ptr + tok, mask=valid, other=0.).to(tl.float32)
    dq, dk, dbeta, dG, dGn = _gate_grads(Y, dqg, dkd, sds, qq, kk, beta, Gm, Gn_row, valid)
    # P_qk (scale folded into dP) and L = beta_r (K K^T decayed), strictly lower: dP, dL [B, T, H, C] read as pair tiles
    dq, dk, dG, dbeta = _grams_bwd_channel(dP_ptr + tok0 * C, dL_ptr + tok0 * C, H * C, beta, qq, kk, Gm,
                                           g_tile + tok0 * DG, H * DG, n, dq, dk, dG, dbeta, C, BK, LOG2C, PREC,
                                           BOUNDED)

    tl.store(dq_ptr + tok[:, None] * DK + ck[None, :], dq.to(dq_ptr.dtype.element_ty), mask=valid[:, None])
    tl.store(dk_ptr + tok[:, None] * DK + ck[None, :], dk.to(dk_ptr.dtype.element_ty), mask=valid[:, None])
    part = ik.to(tl.int64) * T * H * (tl.num_programs(2) // H)           # partial sums per key tile: ik * B*T*H
    tl.store(dbeta_ptr + part + tok, dbeta, mask=valid)
    dG += tl.where(r2 == n - 1, dGn, 0.)                                 # G_n is row n-1 of the cumsum
    dg = tl.cumsum(dG, axis=0, reverse=True)
    offs = tok[:, None] * DK + ck[None, :]
    if GATE_BWD:
        _gate_fn_bwd(u_ptr, A_ptr, bias_ptr, dg_ptr, part_ptr, lb, tl.where(valid[:, None], dg, 0.), offs,
                     valid[:, None], h * DK + ck, ck < DK, (c * (tl.num_programs(2) // H) + b) * 2 * H * DK, H * DK,
                     AG, GATE_BWD == 2)
    else:
        tl.store(dg_ptr + offs, dg, mask=valid[:, None])

# ---- the custom ops (kernels::delta_rule_fwd, delta_rule_bwd, decay_gate_bwd) and delta_rule_triton -----------------

# Forward (kernels::delta_rule_fwd): G = chunk-local cumsum(g) -> P_qk, L (KDA: _grams_chunk, then _grams_block for
# the chunks it left) -> A (_inverse) -> W, U (_wy_fwd) -> O, final state (_state_fwd). Saved: q, k, v, beta, G,
# P_qk, A, the initial state, and with TUNING['keep'] W, h, Delta (KDA: Kd, Qg); the backward
# (kernels::delta_rule_bwd) recomputes those that were not kept (_wy_fwd, _state_fwd), then runs _state_bwd (reverse
# over chunks) and the per-chunk gradients: _wy_grads_bwd (DeltaNet; GDN at Dk > 64), _wy_grads_bwd_phased (GDN at
# Dk <= 64), or _wy_bwd and _grads_bwd (KDA); with A_log, dt_bias the gate's backward inside _grads_bwd (KDA) or by
# kernels::decay_gate_bwd (GDN). They are torch.library custom ops with fake (shape) functions and the backward
# registered as the forward's autograd formula, so torch.compile traces them as opaque nodes, forward and backward,
# with no graph break. Optional tensors cannot be None in a custom op's outputs: "absent" outputs are empty tensors.

def _gate_kind(g, k):
    """-> (GATE, DG): GATE_NONE (DeltaNet), GATE_SCALAR (GDN: g [B,T,H]) or GATE_CHANNEL (KDA: g [B,T,H,Dk]) as a
    plain int, and DG, the gate values per token."""
    if g is None:
        return int(GATE_NONE), 1
    return (int(GATE_SCALAR), 1) if g.dim() == k.dim() - 1 else (int(GATE_CHANNEL), k.shape[-1])

def _meta(q, k, v):
    B, T, H, DK = k.shape
    DV = v.shape[-1]
    # the dots' operands (_dot): bf16 inputs -> bf16 (full tensor-core rate, errors within the tests' bounds); fp16
    # -> tf32 (rounding fp16 to bf16 would drop 3 mantissa bits); fp32 -> IEEE fp32
    prec = {torch.float32: 'ieee', torch.bfloat16: 'bf16'}.get(q.dtype, 'tf32')
    return B, T, H, DK, DV, triton.cdiv(T, TRITON_CHUNK), min(DV, 64), prec

def _warps(DK, DV):
    # [64, 128] fp32 tiles are 64 registers per thread at 4 warps; 8 warps halve that (fewer spills)
    return 8 if max(DK, DV) >= 128 else 4

def _by_gate(setting, GATE):
    """A TUNING value given per gate kind ({GATE_NONE: .., GATE_SCALAR: .., ...}) or one for all."""
    return setting[GATE] if isinstance(setting, dict) else setting

def _state_tile(DK, DV, GATE, backward, BH, T, device):
    """-> (V-tile, warps) of the sequential state passes (TUNING['state']): 8 warps for KDA's backward at Dk = 128,
    and V-tiles halved down to min_v while (Dv / V-tile) * B*H programs leave SMs idle, then (one_wave_v, at
    T >= one_wave_min_t) further while twice the programs still fit in one wave."""
    t = TUNING['state']
    if backward and GATE == GATE_CHANNEL and max(DK, DV) >= 128:
        warps = t['kda_bwd_warps']
    else:
        warps = (t['bwd_warps'] or t['warps']) if backward else t['warps']
    BV = min(DV, _by_gate(t['v'], GATE))
    sms = _sm_count(device)
    while BV > t['min_v'] and (DV // BV) * BH < sms:
        BV //= 2
    long_walk = t['one_wave_v'] and T >= t['one_wave_min_t']
    while long_walk and BV > t['one_wave_v'] and 2 * (DV // BV) * BH <= sms:  # twice the programs, one wave
        BV //= 2
    return BV, warps

def _state_stages(BV, key, x):
    """num_stages of a state pass (TUNING['state'][key], or 'small_v_stages' at V-tiles of 32 or less with 16-bit
    inputs: fp32 tiles need twice the shared memory, 256 KB at 3 stages on Triton 3.6, over Hopper's 227)."""
    t = TUNING['state']
    small = t['small_v_stages'] and BV <= 32 and x.element_size() == 2
    if key == 'bwd_stages' and x.shape[-1] < t['small_v_bwd_min_k']:
        small = False
    return t['small_v_stages'] if small else t[key]

def _wu_in_pass(GATE, DK, DV, BV, BH, device):
    """Whether DeltaNet's forward state pass forms Delta itself, with no _wy_fwd and no W stored
    (TUNING['state']['wu_in_pass'], the least Dk; _state_fwd_kernel's WU_IN_PASS): only where its (Dv / V-tile) B*H
    programs cover the SMs, where the pass is bound by bandwidth, which _wy_fwd's round trip costs (with fewer
    programs each program's latency bounds it, and its two more dots a chunk would lengthen it: 2 x 16384 x 16 heads
    keeps _wy_fwd)."""
    min_k = TUNING['state']['wu_in_pass']
    return bool(min_k is not None and DK >= min_k and GATE == GATE_NONE and (DV // BV) * BH >= _sm_count(device))

def _w_free(GATE, k, v):
    """Whether the forward stores no W (where _wu_in_pass: DeltaNet), the backward pass forming W^T dDelta from A,
    beta and K. From the shapes alone, so that the fake function agrees."""
    B, T, H, DK = k.shape
    DV = v.shape[-1]
    BV = _state_tile(DK, DV, GATE, False, B * H, T, k.device)[0]
    return _wu_in_pass(GATE, DK, DV, BV, B * H, k.device)

def _grams_inverse(q, k, beta, G, GATE, DG, bounded=False):
    """P_qk and A = (I + L)^-1 per chunk, [B, T, H, C] in the intermediates' dtype. bounded: G is the cumsum of the
    bounded gate (lower_bound), which lets KDA's diagonal blocks skip their span test and dyadic split."""
    B, T, H, DK, DV, NT, BV, prec = _meta(q, k, k)
    C = TRITON_CHUNK
    Gp = G if G is not None else k  # any pointer; unused when GATE == GATE_NONE
    idt = _storage(prec)
    P = torch.empty(B, T, H, C, device=k.device, dtype=idt)
    iprec = TUNING['inverse']['prec'][prec]
    L = torch.empty(B, T, H, C, device=k.device, dtype=torch.float32)  # the inverse's input stays fp32
    A = L if idt == torch.float32 else torch.empty(B, T, H, C, device=k.device, dtype=idt)
    grams = TUNING['grams']
    BK = min(DK, grams['kda_k'] if GATE == GATE_CHANNEL else grams['k'])
    chunked = GATE == GATE_CHANNEL  # KDA: whole chunks where the gate allows, then the others by blocks
    done = torch.empty(B * H * NT, device=k.device, dtype=torch.int8) if chunked else P  # (any pointer when not)
    if chunked:
        cap = {'maxnreg': grams['chunk_maxnreg']} if grams['chunk_maxnreg'] else {}
        ck, cw = grams['chunk_k'], grams['chunk_warps']
        if DK <= 64:
            ck, cw = grams['chunk_k_d64'] or ck, grams['chunk_warps_d64'] or cw
        _grams_chunk_kernel[(NT, B * H)](q, k, beta, Gp, P, L, done, T, H, DK, min(DK, ck), prec, num_warps=cw, **cap)
    _grams_block_kernel[(NT, 10, B * H)](q, k, beta, Gp, P, L, T, H, DK, BK, GATE, prec, bounded, done, bool(chunked),
                                         num_warps=grams['warps'])
    _inverse_kernel[(NT, B * H)](L, A, T, H, iprec, num_warps=TUNING['inverse']['warps'])
    return P, A

def _states(q, k, v, beta, G, A, h0, output_final_state, GATE, DG, P=None, scale=1.0, keep=False):
    """W, U from A, then the sequential pass (DeltaNet where _wu_in_pass: the pass alone, and no W). The
    forward (P = P_qk given): -> the output O (v's dtype), formed in the pass, the final state (fp32; None unless asked
    for) and, with keep, what the backward reads (below; else None). The backward's recompute (P None): -> W, the state
    snapshots h[c] (k's dtype), Delta, and for KDA Kd = K exp(G_n - G), Qg = Q exp(G) (k's dtype; else None)."""
    B, T, H, DK, DV, NT, BV, prec = _meta(k, k, v)
    C = TRITON_CHUNK
    Gp = G if G is not None else k  # any pointer; unused when GATE == GATE_NONE
    BS, nw = _state_tile(DK, DV, GATE, False, B * H, T, k.device)
    wu = _wu_in_pass(GATE, DK, DV, BS, B * H, k.device)  # as _w_free, which the fake function calls
    w = torch.empty(0, device=k.device, dtype=k.dtype) if wu else torch.empty_like(k)  # no W where wu
    u = v if wu else torch.empty_like(v)  # the pass reads V in U's place
    decayed = bool(GATE == GATE_CHANNEL)  # KDA: Kd, Qg written for the state passes
    kd, qg = (torch.empty_like(k), torch.empty_like(k)) if decayed else (None, None)
    wt = TUNING['wy_fwd']
    split, wwarps = _by_gate(wt['split_d64'], GATE) if DK <= 64 else wt['split'], wt['warps']
    while split > 1 and min(DK, DV) // split < 16:  # a dot's tile needs 16 columns: small heads take fewer programs
        split //= 2
    if not wu:
        _wy_fwd_kernel[(NT, B * H, split)](k, v, beta, Gp, A, w, u, q, kd if decayed else w, qg if decayed else w, T,
                                           H, DK, DV, DG, DK // split, DV // split, C, GATE, prec, decayed,
                                           num_warps=wwarps or _warps(DK // split, DV // split))
    output = P is not None
    snapshots = not output or keep
    o = torch.empty_like(v) if output else None
    vn = torch.empty_like(v) if snapshots else None  # Delta
    h = torch.empty(B, NT, H, DK, DV, device=k.device, dtype=k.dtype) if snapshots else None
    ht = torch.empty(B, H, DK, DV, device=k.device, dtype=torch.float32) if output_final_state else None
    any_ = o if output else vn  # any pointer, in place of an absent tensor
    if output:
        nw = TUNING['state']['out_warps']
    _state_fwd_kernel[(DV // BS, B * H)](kd if decayed else k, k if wu else w, u, Gp, h if snapshots else any_,
                                         vn if snapshots else any_, h0 if h0 is not None else any_,
                                         ht if ht is not None else any_, qg if decayed else q,
                                         P if output else any_, o if output else any_, scale, T, NT, H, A, beta, DK,
                                         DV, BS, DG, C, GATE, prec, h0 is not None, ht is not None, decayed, output,
                                         snapshots, wu, num_warps=nw,
                                         num_stages=_state_stages(BS, 'stages', k))
    if not output:
        return w, h, vn, kd, qg
    return o, ht, ((w, h, vn, kd, qg) if keep else None)

def _bounded(GATE, A_log, lower_bound):
    """Whether KDA's Gram kernels take their bounded form (BOUNDED): only for the bounded gate formed in the kernels
    (a g passed in is not checked against any bound)."""
    return bool(GATE == GATE_CHANNEL) and A_log is not None and lower_bound is not None

def _gate_launch(g, H, DG):
    """The cumsum kernel's tiling of g: (heads per launch, columns per program, A_log's columns per value). GDN's
    [B, T, H] runs as one 'head' of H columns (A_log per column), KDA's [B, T, H, Dk] as H heads of Dk (per head)."""
    return (1, H, 1) if DG == 1 else (H, DG, DG)

def _chunk_cumsum(g, H, DG, A_log=None, dt_bias=None, lower_bound=None):
    """G fp32 [B, T, H, DG]: the chunk-local cumsum of g [B, T, H(, Dk)], or with A_log of the gate formed from its
    input u = g (-exp(A_log) softplus(u + dt_bias); lower_bound: the bounded gate)."""
    B, T = g.shape[:2]
    G = torch.empty(B, T, H, DG, device=g.device, dtype=torch.float32)
    HL, DL, AG = _gate_launch(g, H, DG)
    fn = A_log is not None
    gate_fn = 0 if not fn else 1 if lower_bound is None else 2  # none, softplus, bounded (the kernel's GATE_FN)
    BD = min(triton.next_power_of_2(DL), TUNING['cumsum']['d'])
    _chunk_cumsum_kernel[(triton.cdiv(T, TRITON_CHUNK), B * HL, triton.cdiv(DL, BD))](
        g.contiguous(), G, A_log if fn else G, dt_bias.contiguous() if fn else G, float(lower_bound or 0.), T, HL, DL,
        TRITON_CHUNK, BD, gate_fn, AG, num_warps=TUNING['cumsum']['warps'])
    return G

@torch.library.custom_op("kernels::delta_rule_fwd", mutates_args=())
def _delta_rule_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: Optional[torch.Tensor],
                    scale: float, initial_state: Optional[torch.Tensor], output_final_state: bool,
                    A_log: Optional[torch.Tensor] = None, dt_bias: Optional[torch.Tensor] = None,
                    lower_bound: Optional[float] = None, keep: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                               torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> o [B,T,H,Dv] (v's dtype), final state fp32 [B,H,Dk,Dv] (empty unless asked for),
    G fp32 [B,T,H,DG] (chunk-local cumsum of g, saved for the backward; empty for DeltaNet), and P_qk, A
    [B,T,H,C] (saved for the backward; bf16 for bf16 inputs, else fp32). A_log given: g is the gate's input u and the
    log-decay -exp(A_log) softplus(u + dt_bias) is formed inside the cumsum kernel; with lower_bound lb also given,
    the bounded lb sigmoid(exp(A_log) (u + dt_bias)), and KDA's Grams take their bounded form (BOUNDED).
    keep: also W, the snapshots h [B,NT,H,Dk,Dv], Delta and KDA's Kd, Qg (k's and v's dtypes), which the backward
    then reads instead of recomputing them; empty tensors otherwise (and Kd, Qg always but for KDA)."""
    q, k, v, beta = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous()
    B, T, H, DK, DV, NT, BV, prec = _meta(q, k, v)
    GATE, DG = _gate_kind(g, k)
    G = torch.empty(0, device=k.device, dtype=torch.float32)
    if GATE != GATE_NONE:
        G = _chunk_cumsum(g, H, DG, A_log, dt_bias, lower_bound)
    Gp = G if GATE != GATE_NONE else None
    h0 = initial_state.contiguous().float() if initial_state is not None else None
    P, A = _grams_inverse(q, k, beta, Gp, GATE, DG, _bounded(GATE, A_log, lower_bound))
    o, ht, kept = _states(q, k, v, beta, Gp, A, h0, output_final_state, GATE, DG, P, scale, keep=keep)
    kept = [x if x is not None else torch.empty(0, device=k.device, dtype=k.dtype) for x in (kept or [None] * 5)]
    return (o, (ht if ht is not None else torch.empty(0, device=k.device, dtype=torch.float32)), G, P, A, *kept)

@_delta_rule_fwd.register_fake
def _(q, k, v, beta, g, scale, initial_state, output_final_state, A_log=None, dt_bias=None, lower_bound=None,
      keep=False):
    B, T, H, DK = k.shape
    DV = v.shape[-1]
    GATE, DG = _gate_kind(g, k)
    ht = q.new_empty((B, H, DK, DV) if output_final_state else (0,), dtype=torch.float32)
    G = q.new_empty((B, T, H, DG) if GATE != GATE_NONE else (0,), dtype=torch.float32)
    idt = _storage(_meta(q, k, v)[-1])
    PA = (B, T, H, TRITON_CHUNK)
    def kept(shape, like, channel=False):  # as _delta_rule_fwd's: absent ones empty, in k's dtype
        there = keep and (GATE == GATE_CHANNEL or not channel)
        return like.new_empty(shape if there else (0,), dtype=like.dtype if there else k.dtype)
    wshape = (0,) if _w_free(GATE, k, v) else k.shape  # no W stored
    return (v.new_empty(v.shape), ht, G, q.new_empty(PA, dtype=idt), q.new_empty(PA, dtype=idt), kept(wshape, k),
            kept((B, triton.cdiv(T, TRITON_CHUNK), H, DK, DV), k), kept(v.shape, v), kept(k.shape, k, True),
            kept(k.shape, k, True))

@torch.library.custom_op("kernels::decay_gate_bwd", mutates_args=())
def _decay_gate_bwd(u: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, dg: torch.Tensor,
                    lower_bound: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of the log-decay g = -exp(A_log) softplus(u + dt_bias), or with lower_bound lb of the bounded
    g = lb sigmoid(exp(A_log) (u + dt_bias)) (u [B,T,H] or [B,T,H,Dk], dg fp32 of u's shape) -> du (u's dtype),
    dA_log, ddt_bias (fp32, their shapes)."""
    B, T, H = u.shape[:3]
    DG = u.shape[3] if u.dim() == 4 else 1
    HL, DL, AG = _gate_launch(u, H, DG)
    NT = triton.cdiv(T, TRITON_CHUNK)
    du = torch.empty_like(u)
    part = torch.empty(NT * B, 2, H * DG, device=u.device, dtype=torch.float32)
    _decay_gate_bwd_kernel[(NT, B * HL)](u.contiguous(), A_log, dt_bias.contiguous(), dg.contiguous(), du, part,
                                         float(lower_bound or 0.), T, HL, DL, TRITON_CHUNK,
                                         triton.next_power_of_2(DL), AG, lower_bound is not None)
    sums = torch.empty(H * DG, 2, device=u.device, dtype=torch.float32)
    _column_sums(part, H * DG, 2, sums)
    return du, sums[:, 0].view(H, DG).sum(1), sums[:, 1].reshape(dt_bias.shape).contiguous()  # as the fake's

@_decay_gate_bwd.register_fake
def _(u, A_log, dt_bias, dg, lower_bound=None):
    f32 = torch.float32
    return u.new_empty(u.shape), A_log.new_empty(A_log.shape, dtype=f32), dt_bias.new_empty(dt_bias.shape, dtype=f32)

@torch.library.custom_op("kernels::delta_rule_bwd", mutates_args=())
def _delta_rule_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, G: Optional[torch.Tensor],
                    P: torch.Tensor, A: torch.Tensor,
                    initial_state: Optional[torch.Tensor], do: torch.Tensor, dht: Optional[torch.Tensor], scale: float,
                    bounded: bool = False, w: Optional[torch.Tensor] = None, h: Optional[torch.Tensor] = None,
                    vn: Optional[torch.Tensor] = None, kd: Optional[torch.Tensor] = None,
                    qg: Optional[torch.Tensor] = None, u: Optional[torch.Tensor] = None,
                    A_log: Optional[torch.Tensor] = None, dt_bias: Optional[torch.Tensor] = None,
                    lower_bound: Optional[float] = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                               torch.Tensor, torch.Tensor]:
    """-> dq, dk, dv (the inputs' dtypes), dbeta fp32 [B,T,H], dg fp32 (g's shape; empty for DeltaNet),
    d initial_state fp32 (empty without one), and two empty tensors. G is the forward's chunk-local cumsum (None for
    DeltaNet); P, A the forward's P_qk and (I + L)^-1. bounded: G is that of the bounded gate (KDA's _grads_bwd then
    takes BOUNDED). w, h, vn (Delta), kd, qg: the forward's, when it kept them (TUNING['keep']); else (None) they are
    recomputed. u, A_log, dt_bias (lower_bound): KDA's gate formed in the kernels, whose backward _grads_bwd then
    runs itself: du (u's dtype) in dg's place, and dA_log, ddt_bias (fp32) last."""
    q, k, v, beta, do = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous(), do.contiguous()
    B, T, H, DK, DV, NT, BV, prec = _meta(q, k, v)
    GATE, DG = ((int(GATE_NONE), 1) if G is None else (int(GATE_SCALAR), 1) if G.shape[-1] == 1
                else (int(GATE_CHANNEL), G.shape[-1]))
    C, LOG2C = TRITON_CHUNK, int(math.log2(TRITON_CHUNK))
    Gp = G if G is not None else k
    idt = _storage(prec)
    h0 = initial_state.contiguous().float() if initial_state is not None else None
    BS, nw = _state_tile(DK, DV, GATE, True, B * H, T, k.device)
    if h is None:  # the forward did not keep them
        w, h, vn, kd, qg = _states(q, k, v, beta, G, A, h0, False, GATE, DG)
    dvn = torch.empty(B, T, H, DV, device=k.device, dtype=idt)
    dh = torch.empty(B, NT, H, DK, DV, device=k.device, dtype=idt)
    dh0 = torch.empty(B, H, DK, DV, device=k.device, dtype=torch.float32) if h0 is not None else None
    if dht is not None:
        dht = dht.contiguous().float()
    decayed = bool(GATE == GATE_CHANNEL)  # KDA: the state pass reads Kd, Qg
    # the forward stored no W (_w_free; at T = 0 every tensor is empty)
    wfree = bool(GATE == GATE_NONE and T > 0 and w.numel() == 0)
    _state_bwd_kernel[(DV // BS, B * H)](qg if decayed else q, kd if decayed else k, k if wfree else w, Gp, P, do,
                                         dvn, dh, dht if dht is not None else dh, dh0 if dh0 is not None else dh,
                                         scale, T, NT, H, A, beta, DK, DV, BS, DG, C, GATE, prec, dht is not None,
                                         dh0 is not None, decayed, wfree, num_warps=nw,
                                         num_stages=_state_stages(BS, 'bwd_stages', k))
    del w, kd, qg
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if GATE != GATE_CHANNEL:  # DeltaNet, GDN
        wy = TUNING['wy_grads']
        warps, BVg = (wy['warps'] if DK > 64 else wy['warps_d64'][GATE]), min(DV, wy['v'])
        dbeta = torch.empty(B, T, H, device=k.device, dtype=torch.float32)
        dg = torch.empty(B, T, H, device=k.device, dtype=torch.float32) if GATE == GATE_SCALAR else dbeta
        if GATE == GATE_SCALAR and DK <= 64:  # GDN at Dk <= 64: the two-pass form
            _wy_grads_bwd_phased_kernel[(NT, B * H)](q, k, v, beta, Gp, A, h, vn, do, dvn, dh, dq, dk, dv, dbeta, dg,
                                                     scale, T, NT, H, DK, DV, BVg, C, prec,
                                                     num_warps=warps, num_stages=1)
        else:
            _wy_grads_bwd_kernel[(NT, B * H)](q, k, v, beta, Gp, A, h, vn, do, dvn, dh, dq, dk, dv, dbeta, dg, scale,
                                              T, NT, H, DK, DV, BVg, C, LOG2C, GATE, prec,
                                              num_warps=warps, num_stages=_by_gate(wy['stages'], GATE))
        return dq, dk, dv, dbeta, (dg if GATE == GATE_SCALAR else torch.empty(0, device=k.device)), \
            (dh0 if dh0 is not None else torch.empty(0, device=k.device)), torch.empty(0, device=k.device), \
            torch.empty(0, device=k.device)
    kda = TUNING['kda_grads']  # KDA's backward: _wy_bwd, then _grads_bwd per key tile
    BK, NK = min(DK, kda['k']), DK // min(DK, kda['k'])
    fn = u is not None  # the gate's backward inside _grads_bwd
    # dbeta comes back as one partial sum per key tile (its last slot: the value side from _wy_bwd), added up below
    dbeta = torch.empty(NK + 1, B, T, H, device=k.device, dtype=torch.float32)
    dg = torch.empty(B, T, H, DK, device=k.device, dtype=u.dtype if fn else torch.float32)  # du or dg
    part = torch.empty(NT * B, 2, H * DK, device=k.device, dtype=torch.float32) if fn else dg
    dP = torch.empty(B, T, H, C, device=k.device, dtype=idt)
    dL = torch.empty_like(dP)
    # X = A^T dDelta is written over dDelta (no other kernel reads it afterwards)
    cap = {'maxnreg': kda['wy_maxnreg']} if kda['wy_maxnreg'] else {}
    _wy_bwd_kernel[(NT, B * H)](v, beta, A, vn, do, dvn, dv, dbeta[NK], dP, dL, scale, T, H, DV, min(DV, kda['wy_v']),
                                C, prec, num_warps=kda['wy_warps'], num_stages=1, **cap)
    _grads_bwd_kernel[(NK, NT, B * H)](q, k, beta, Gp, dP, dL, h, vn, do, dvn, dh, dq, dk, dbeta, dg, scale, T, NT,
                                       H, DK, DV, BK, BV, DG, C, LOG2C, prec, bool(bounded),
                                       u if fn else dg, A_log if fn else dg, dt_bias.contiguous() if fn else dg,
                                       part, float(lower_bound or 0.), DK, 0 if not fn else 1 if lower_bound is None
                                       else 2, num_warps=kda['warps'], num_stages=1)
    empty = lambda: torch.empty(0, device=k.device)
    dA = ddt = None
    if fn:  # the partial sums over (chunk, b), added up in one kernel, as _decay_gate_bwd does
        sums = torch.empty(H * DK, 2, device=k.device, dtype=torch.float32)
        _column_sums(part, H * DK, 2, sums)
        dA, ddt = sums[:, 0].view(H, DK).sum(1), sums[:, 1].reshape(dt_bias.shape).contiguous()
    return (dq, dk, dv, dbeta.sum(0), dg, (dh0 if dh0 is not None else empty()), dA if fn else empty(),
            ddt if fn else empty())

@_delta_rule_bwd.register_fake
def _(q, k, v, beta, G, P, A, initial_state, do, dht, scale, bounded=False, w=None, h=None, vn=None, kd=None, qg=None,
      u=None, A_log=None, dt_bias=None, lower_bound=None):
    f32 = torch.float32
    dg = q.new_empty((0,) if G is None else (G.shape[:3] if G.shape[-1] == 1 else G.shape),
                     dtype=u.dtype if u is not None else f32)
    dh0 = q.new_empty((0,) if initial_state is None else initial_state.shape, dtype=f32)
    dA = q.new_empty(A_log.shape if u is not None else (0,), dtype=f32)
    ddt = q.new_empty(dt_bias.shape if u is not None else (0,), dtype=f32)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), beta.new_empty(beta.shape, dtype=f32),
            dg, dh0, dA, ddt)

def _delta_rule_setup(ctx, inputs, output):
    q, k, v, beta, g, scale, initial_state, output_final_state, A_log, dt_bias, lower_bound, keep = inputs
    # autograd would otherwise fill zero gradients for G, P, A (a pass over KDA's fp32 G and the two [B, T, H, C])
    ctx.set_materialize_grads(False)
    gate = (g, A_log, dt_bias) if A_log is not None else (None, None, None)  # the gate's inputs, for its backward
    kda = g is not None and _gate_kind(g, k)[0] == GATE_CHANNEL
    # W, h, Delta (and KDA's Kd, Qg) when the forward kept them: the backward reads them instead of recomputing
    kept = [*output[5:8], *(output[8:10] if kda else (None, None))] if keep else [None] * 5
    ctx.save_for_backward(q, k, v, beta, output[2] if g is not None else None, output[3], output[4], initial_state,
                          *gate, *kept)
    ctx.scale, ctx.output_final_state = scale, output_final_state
    ctx.g_dtype = None if g is None else g.dtype
    ctx.lower_bound = lower_bound if A_log is not None else None
    ctx.bounded = g is not None and _bounded(_gate_kind(g, k)[0], A_log, lower_bound)

def _delta_rule_backward(ctx, do, dht, *_):
    q, k, v, beta, G, P, A, h0, u, A_log, dt_bias, *kept = ctx.saved_tensors
    dht = dht if ctx.output_final_state else None  # grads of "absent" (empty) outputs are ignored
    if do is None:  # only the final state was used
        do = torch.zeros_like(v)
    # the gate formed in the kernels: KDA's backward of it inside _grads_bwd, GDN's by kernels::decay_gate_bwd
    fused = A_log is not None and G.shape[-1] > 1
    gate = (u, A_log, dt_bias, ctx.lower_bound) if fused else ()
    dq, dk, dv, dbeta, dg, dh0, dA, ddt = _delta_rule_bwd(q, k, v, beta, G, P, A, h0, do, dht, ctx.scale, ctx.bounded,
                                                          *kept, *gate)
    if A_log is not None:  # g was the gate's input u
        if not fused:
            dg, dA, ddt = _decay_gate_bwd(u, A_log, dt_bias, dg, ctx.lower_bound)
        dA, ddt = dA.to(A_log.dtype), ddt.to(dt_bias.dtype)
    else:
        dA = ddt = None
    return (dq, dk, dv, dbeta.to(beta.dtype), None if G is None else dg.to(ctx.g_dtype), None,
            None if h0 is None else dh0.to(h0.dtype), None, dA, ddt, None, None)

_delta_rule_fwd.register_autograd(_delta_rule_backward, setup_context=_delta_rule_setup)

def delta_rule_triton(q, k, v, beta, g=None, scale=None, initial_state=None, output_final_state=False, A_log=None,
                      dt_bias=None, lower_bound=None, keep=None):
    """The delta rule through the Triton kernels (custom ops, differentiable); same arguments and result as
    delta_rule. CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before triton is imported."""
    _check_delta_rule("delta_rule", q, k, v, beta, g, initial_state)
    _check_gate_fn("delta_rule", g, A_log, dt_bias, lower_bound)
    why = _triton_unsupported(q, v)
    if why:
        _fail("delta_rule", why)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    lb = None if lower_bound is None else float(lower_bound)
    # keep the backward's inputs from the forward only where there will be a backward
    keep = bool(TUNING['keep'] if keep is None else keep) and torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, beta, g, initial_state, A_log, dt_bias))
    o, ht = _delta_rule_fwd(q, k, v, beta, g, scale, initial_state, output_final_state, A_log, dt_bias, lb, keep)[:2]
    return o, (ht if output_final_state else None)

# ---------------------------------------------------------------------------------------------------------------------
# 3.2 Scalar-decay linear attention: RetNet, Mamba2, GLA (and plain linear attention); docs/mixers.md §4.1 (chunked
# forward), §5.5 (backward). Gate kinds: GATE_NONE (plain linear attention), GATE_SCALAR (Mamba2: Δ·A, g [B, T, H]),
# GATE_CONST (RetNet: log γ, g [H]), GATE_CHANNEL (GLA: a log-decay per key channel, g [B, T, H, Dk]; its own
# kernels, _gla_*).
# ---------------------------------------------------------------------------------------------------------------------

# ---- forward --------------------------------------------------------------------------------------------------------

# Kernels for plain linear attention (GATE_NONE), Mamba2 (GATE_SCALAR) and RetNet (GATE_CONST), docs/mixers.md §4.1;
# GLA's (GATE_CHANNEL) follow them (_gla_fwd).
# Same chunk (C = TRITON_CHUNK = 64) and numerical rules (section 3's) as the delta rule's kernels. Per chunk (n <= C
# rows, chunk-start state S = h[c], G = chunk-local cumsum of g, Γ = exp(G), D_ri = exp(G_r - G_i) [i <= r]):
#   S_new = Γ_n S + (K * exp(G_n - G))^T V                _la_state_fwd: sequential over chunks, snapshots h[c]
#   O     = scale (Diag(Γ) Q S + ((Q K^T) ⊙ D) V)          _la_output_fwd: parallel over chunks
# or both in _la_state_fwd (OUTPUT) where its programs hold whole Dk rows and cover the SMs (TUNING['scalar']): no
# h[c].
# Mamba2's SSD (SSD): V is Δ·x, formed from x and Δ in every kernel that reads V, and O gains D·x.
# These are the delta-rule state pass and output with Delta = V: no W, no (I + L)^-1. They are small kernels of
# their own rather than flags on _state_fwd because q, k are indexed per group (below) and P = Q K^T ⊙ D
# is formed in the output kernel instead of being loaded; they share the rules: exp only of a number <= 0 (masked
# with a select before the exp), fp32 state and accumulation, int64 token offsets, any T (a partial last chunk is
# masked). Unlike the delta-rule kernels they read the raw gates and form every decay exponent between two positions
# as a sum of the gates in between (D_ri: Σ_{i<j<=r} g_j; G_n - G_r: Σ_{r<j<n} g_j), never as a difference of
# cumsums, which loses ~3 digits in fp32 after a -1000 gate (_la_gates, _la_decay; as _causal_decay in torch).
# GATE: GATE_NONE (plain linear attention); GATE_SCALAR, a gate per token (Mamba2's Δ·A, g [B, T, H] fp32; G, G_n
# and the segment sums are formed in-kernel per chunk); GATE_CONST, a constant per head (RetNet's log γ, g [H]; G_r =
# (r + 1) g_h and G_n - G_r = (n - 1 - r) g_h are generated in-kernel, no [B, T, H] tensor).
# Grouped q/k (Mamba2's B, C shared by the heads of a group): q, k are [B, T, HK, Dk] and head h reads q/k head
# h // (H // HK); no per-head copy is made. The backward's _la_dqkg_bwd runs one program per group (q/k head) and
# sums its heads' dq, dk in registers, so dq, dk are written once, [B, T, HK, Dk], with no reduction after it.
# Dots follow the delta rule's rule (_dot: bf16 operands for bf16 inputs, fp32 accumulation), and the backward's
# recomputed h[c] and dh[c] are stored in _storage's dtype (bf16 for bf16 inputs), as fla's kernels round them.
# Tiles: the chunk-parallel kernels work on [64, 64] tiles of Dk x Dv and loop over the other side's tiles; the
# sequential passes take whole Dk rows or key tiles of 64 and V-tiles of 64 or less by SM coverage (TUNING['scalar']);
# the backward's gradients are two kernels (dv; dq, dk, dg), so no program holds a [C, 128] fp32 tile. Offline ptxas
# (Triton 3.6, sm_90a, bf16): no spills but the fused forward at Dk = 128 with a per-token gate (a few hundred bytes;
# that form is not used there) and the 32-head group backward (_la_dqkg_bwd with GROUP = 32).

@triton.jit
def _la_gates(g_ptr, tok, valid, rows, n, h, H, C: tl.constexpr, GATE: tl.constexpr):
    # -> gm [C] the raw gates of this chunk (GATE_SCALAR; 0 on padded rows), G [C] their cumsum (padded rows: junk,
    # callers mask), G_n, the tail exponents G_n - G_r [C] (0 on padded rows) and g_h (GATE_CONST, else 0).
    # The tail is the reverse exclusive cumsum of g (Σ_{r<j<n} g_j: the gates loaded one token later), not G_n - G_r:
    # after a -1000 gate both are ~ -1000, where one fp32 ulp is 6e-5, and their difference would carry that error
    # into every decay of the rest of the chunk. A sum of same-sign terms is accurate to a few ulp of itself.
    if GATE == GATE_SCALAR:
        gm = tl.load(g_ptr + tok, mask=valid, other=0.)
        Gm = tl.cumsum(gm, axis=0)
        Gn = tl.sum(gm, axis=0)
        tail = tl.cumsum(tl.load(g_ptr + tok + H, mask=rows + 1 < n, other=0.), axis=0, reverse=True)
        gh = 0.
    elif GATE == GATE_CONST:
        gh = tl.load(g_ptr + h).to(tl.float32)
        gm = tl.zeros([C], dtype=tl.float32)
        Gm = (rows + 1).to(tl.float32) * gh
        Gn = n.to(tl.float32) * gh
        tail = tl.where(valid, (n - 1 - rows).to(tl.float32) * gh, 0.)   # exact, like (r - i) g_h in _la_decay
    else:
        gm = tl.zeros([C], dtype=tl.float32)
        Gm = tl.zeros([C], dtype=tl.float32)
        Gn = 0.
        tail = tl.zeros([C], dtype=tl.float32)
        gh = 0.
    return gm, Gm, Gn, tail, gh

@triton.jit
def _la_decay(gm, gh, n, C: tl.constexpr, GATE: tl.constexpr):
    # D [C, C] = exp(G_r - G_i) for i <= r < n, 0 elsewhere (select before the exp: never exp of a positive number;
    # the clamp at 0 because a parallel cumsum need not be monotone in its last bit, docs/mixers.md §7 item 1).
    # The exponent is the segment sum Σ_{i<j<=r} g_j (as in _causal_decay), not G_r - G_i (see _la_gates): a cumsum
    # down the rows (axis 0, over j) of the tile [j, i] = g_j where j > i, else 0.
    # A constant gate uses (r - i) g_h, exact, rather than the difference of two rounded products.
    r = tl.arange(0, C)[:, None]
    i = tl.arange(0, C)[None, :]
    if GATE == GATE_CONST:
        diff = (r - i).to(tl.float32) * gh
    else:
        diff = tl.minimum(tl.cumsum(tl.where(r > i, gm[:, None], 0.), axis=0), 0.)
    return tl.exp(tl.where((i <= r) & (r < n), diff, float('-inf')))

@triton.jit(do_not_specialize=["T", "NT", "H", "HK"])
def _la_state_fwd_kernel(k_ptr, v_ptr, g_ptr, dt_ptr, h_ptr, h0_ptr, ht_ptr, q_ptr, D_ptr, o_ptr, scale, T, NT, H, HK,
                         DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                         GATE: tl.constexpr, PREC: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr,
                         SSD: tl.constexpr = 0, OUTPUT: tl.constexpr = 0, SNAPSHOTS: tl.constexpr = 1):
    # One program per (V-tile, K-tile, b, h) walks the chunks in order with its [BK, BV] state tile in fp32 registers.
    # A scalar decay scales whole rows and columns alike, so the key tiles of the state never mix (the delta rule's
    # W S would couple them): where whole rows leave SMs idle, key tiles of 64 multiply the programs of this
    # sequential pass (_la_state_tiles).
    # OUTPUT (whole Dk rows, BK = DK): the forward's output too, chunk by chunk from the state in registers
    # (_la_output_fwd's equations), one kernel, and the snapshots h[c] written only with SNAPSHOTS (TUNING['keep']:
    # for the backward, which otherwise recomputes them).
    iv, ik = tl.program_id(0), tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // H, bh % H
    hk = h // (H // HK)                             # the q/k head (group) this head reads
    rows = tl.arange(0, C)
    ck = ik * BK + tl.arange(0, BK)
    cv = iv * BV + tl.arange(0, BV)
    s_offs = ck[:, None] * DV + cv[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + bh * DK * DV + s_offs).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    for c in range(NT):
        t = c * C + rows
        valid = t < T
        n = tl.minimum(T - c * C, C)
        tok = (b * T + t) * H + h                   # [C] int64 token-head index of v, G
        tokk = (b * T + t) * HK + hk                # ... and of q, k
        if SNAPSHOTS:
            tl.store(h_ptr + ((b * NT + c) * H + h) * DK * DV + s_offs, S.to(h_ptr.dtype.element_ty))
        kk = tl.load(k_ptr + tokk[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
        vv = tl.load(v_ptr + tok[:, None] * DV + cv[None, :], mask=valid[:, None], other=0.)
        vs = vv
        if SSD:  # the value is Δ·x
            vs = vv * tl.load(dt_ptr + tok, mask=valid, other=0.)[:, None]
        gm, Gm, Gn, tail, gh = _la_gates(g_ptr, tok, valid, rows, n, h, H, C, GATE)
        if OUTPUT:  # O = scale (Diag(Γ) Q S + ((Q K^T) ⊙ D) V), S the chunk-start state
            qq = tl.load(q_ptr + tokk[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
            eg = tl.exp(tl.where(valid, Gm, float('-inf')))[:, None]
            P = _dot(qq, tl.trans(kk), PREC) * _la_decay(gm, gh, n, C, GATE)
            o = scale * (_dot(qq, S, PREC) * eg + _dot(P, vs, PREC))
            if SSD:
                o += tl.load(D_ptr + h) * vv.to(tl.float32)
            tl.store(o_ptr + tok[:, None] * DV + cv[None, :], o.to(o_ptr.dtype.element_ty), mask=valid[:, None])
        kd = kk.to(tl.float32) * tl.exp(tl.where(valid, tl.minimum(tail, 0.), float('-inf')))[:, None]
        if GATE != GATE_NONE:
            S = S * tl.exp(Gn)
        S += _dot(tl.trans(kd), vs, PREC)
    if STORE_HT:
        tl.store(ht_ptr + bh * DK * DV + s_offs, S)

@triton.jit(do_not_specialize=["T", "NT", "H", "HK"])
def _la_output_fwd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, dt_ptr, D_ptr, h_ptr, o_ptr, scale, T, NT, H, HK,
                          DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                          GATE: tl.constexpr, PREC: tl.constexpr, SSD: tl.constexpr = 0):
    # One program per (V-tile, chunk, b, h). Q K^T and Q S are sums over key channels: accumulated over key tiles of
    # BK so that no [C, Dk] tile is live, and the row scale Γ of Diag(Γ) Q S is applied after the dot (it commutes),
    # which leaves Q, K and the snapshot S (_storage's dtype) as the dots' operands, unscaled.
    iv = tl.program_id(0)
    c = tl.program_id(1).to(tl.int64)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // H, bh % H
    hk = h // (H // HK)
    rows = tl.arange(0, C)
    t = c * C + rows
    valid = t < T
    n = tl.minimum(T - c * C, C)
    tok = (b * T + t) * H + h
    tokk = (b * T + t) * HK + hk
    cv = iv * BV + tl.arange(0, BV)
    s_base = ((b * NT + c) * H + h) * DK * DV
    qk = tl.zeros([C, C], dtype=tl.float32)                                  # Q K^T
    qs = tl.zeros([C, BV], dtype=tl.float32)                                 # Q S
    for ik in range(DK // BK):
        ck = ik * BK + tl.arange(0, BK)
        qq = tl.load(q_ptr + tokk[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
        kk = tl.load(k_ptr + tokk[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.)
        S = tl.load(h_ptr + s_base + ck[:, None] * DV + cv[None, :])
        qk += _dot(qq, tl.trans(kk), PREC)
        qs += _dot(qq, S, PREC)
    vv = tl.load(v_ptr + tok[:, None] * DV + cv[None, :], mask=valid[:, None], other=0.)
    gm, Gm, _, _, gh = _la_gates(g_ptr, tok, valid, rows, n, h, H, C, GATE)
    eg = tl.exp(tl.where(valid, Gm, float('-inf')))[:, None]                # exp(G), 0 on padded rows
    P = qk * _la_decay(gm, gh, n, C, GATE)
    if SSD:  # value Δ·x, and the skip connection D·x
        o = scale * (qs * eg + _dot(P, vv * tl.load(dt_ptr + tok, mask=valid, other=0.)[:, None], PREC))
        o += tl.load(D_ptr + h) * vv.to(tl.float32)
    else:
        o = scale * (qs * eg + _dot(P, vv, PREC))
    tl.store(o_ptr + tok[:, None] * DV + cv[None, :], o.to(o_ptr.dtype.element_ty), mask=valid[:, None])

# ---- GLA: the per-key-channel gate (GATE_CHANNEL, g [B, T, H, Dk]) --------------------------------------------------
#
# With a gate per key channel the decay sits inside the sum over channels, M_ij = Σ_c q_ic k_jc exp(G_ic - G_jc), so
# (Q K^T) ⊙ D does not apply, and splitting exp(G_i - G_j) about a reference row overflows for strong gates
# (docs/mixers.md §4.2, §7 item 3). These kernels form each pair's decay element-wise instead, over chunks of
# GLA_CHUNK = 16 tokens (the exps cost 16 Dk per token and V-tile), one program per (V-tile, key tile, b, h) walking
# the chunks in order with its [BK, BV] state tile in fp32 registers: Diag(exp g) scales rows, so the key tiles of
# the state never mix. Per chunk (n <= 16 rows, chunk-start state S, G = chunk-local cumsum of g, per channel):
#   M_ij  = Σ_c q_ic k_jc exp(Σ_{j<m<=i} g_mc)   (j <= i, this key tile's channels)            _gla_intra
#   O     = scale ((Q ⊙ exp G) S + M V)           (this key tile's share; the shares are summed outside)
#   S_new = Diag(exp G_n) S + (K ⊙ exp(G_n - G))^T V
# Every exponent is a sum of gates (<= 0), never a difference of cumsums (which loses digits after a -1000 gate, see
# _la_gates): exp(G) the cumsum, exp(G_n - G) the reverse exclusive cumsum (_gla_gates), the pairs' segment sums
# built a column at a time (_gla_intra). Without OUTPUT the same pass writes the chunk-start snapshots h[c] for the
# backward. Dots follow _dot's rule; the state, M and every exp are fp32.

GLA_CHUNK = 16  # tokens per chunk of the GLA kernels: the element-wise pair decays cost C*Dk exps per token

@triton.jit
def _gla_gates(g_ptr, tok, valid, rows, n, H, ck, DK: tl.constexpr):
    # -> exp(G) [C, BK], exp(G_n) [BK] and exp(G_n - G) [C, BK] of this chunk's gates (fp32, [B, T, H, Dk]); the
    # row tiles are 0 on padded rows. G_n - G_r is the reverse cumsum of the gates one row later, Σ_{r<m<n} g_m.
    offs = tok[:, None] * DK + ck[None, :]
    gg = tl.load(g_ptr + offs, mask=valid[:, None], other=0.)
    eg = tl.exp(tl.where(valid[:, None], tl.cumsum(gg, axis=0), float('-inf')))
    egn = tl.exp(tl.sum(gg, axis=0))
    tail = tl.cumsum(tl.load(g_ptr + offs + H * DK, mask=(rows + 1 < n)[:, None], other=0.), axis=0, reverse=True)
    etail = tl.exp(tl.where(valid[:, None], tail, float('-inf')))
    return eg, egn, etail

@triton.jit
def _gla_intra(qq, dM, k_ptr, g_ptr, x0, xk0, n, H, HK, rows, ck, DK: tl.constexpr, BK: tl.constexpr,
               C: tl.constexpr, BWD: tl.constexpr):
    # The pairs j < i < n of one chunk over this key tile's channels (the diagonal, exp(0) = 1, is the caller's):
    # -> M [C, C], M_ij = Σ_c q_ic k_jc exp(E_ijc), E_ijc = Σ_{j<m<=i} g_mc (qq fp32 [C, BK], 0 on padded rows);
    # with BWD, given dM [C, C], also Σ_j dM_ij k_j ⊙ exp(E_ij) (dq's in-chunk part) and Σ_i dM_ij q_i ⊙ exp(E_ij)
    # (dk's, row j), else zeros. One column j at a time, from n - 2 down to 0 (the rows k_j, g_{j+1} it loads are
    # then real tokens: no masks): A[i] = E_ij for i > j is the previous column's plus g_{j+1}, a sum of gates
    # accurate to a few ulp of itself (rows past n hold finite junk that meets q = 0 and dO = 0); the pairs i <= j
    # are selected away. Rows k_j and g_{j+1} are reloaded (L1) rather than extracted from the tiles.
    cols = tl.arange(0, C)
    M = tl.zeros([C, C], dtype=tl.float32)
    A = tl.zeros([C, BK], dtype=tl.float32)
    dq = tl.zeros([C, BK], dtype=tl.float32)
    dk = tl.zeros([C, BK], dtype=tl.float32)
    kp = k_ptr + xk0 * DK + ck                      # row 0 of the chunk's k and g, this key tile
    gp = g_ptr + x0 * DK + ck
    for jj in range(n - 1):
        j = n - 2 - jj
        below = rows[:, None] > j
        A = tl.where(below, A + tl.load(gp + (j + 1) * (H * DK))[None, :], 0.)
        kj = tl.load(kp + j * (HK * DK)).to(tl.float32)
        e = tl.where(below, tl.exp(A), 0.)                                    # exp(E_ij) (A <= 0), 0 for i <= j
        qe = qq * e
        M = tl.where(cols[None, :] == j, tl.sum(qe * kj[None, :], 1)[:, None], M)
        if BWD:
            dmj = tl.sum(tl.where(cols[None, :] == j, dM, 0.), 1)            # column j of dM
            dq += (dmj[:, None] * e) * kj[None, :]
            dk = tl.where(rows[:, None] == j, tl.sum(dmj[:, None] * qe, 0)[None, :], dk)
    return M, dq, dk

@triton.jit(do_not_specialize=["T", "NT", "H", "HK"])
def _gla_fwd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, h0_ptr, ht_ptr, h_ptr, o_ptr, scale, T, NT, H, HK,
                    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                    PREC: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr, OUTPUT: tl.constexpr,
                    SNAPSHOTS: tl.constexpr):
    # One program per (V-tile, key tile, b, h). OUTPUT: o_ptr [NK, B, T, H, Dv] gets this key tile's share of O
    # (o itself when NK = 1). SNAPSHOTS: h_ptr [B, NT, H, Dk, Dv] the chunk-start states (the backward's recompute,
    # or the forward with TUNING['keep']).
    iv, ik = tl.program_id(0), tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // H, bh % H
    hk = h // (H // HK)                             # the q/k head (group) this head reads
    rows = tl.arange(0, C)
    ck = ik * BK + tl.arange(0, BK)
    cv = iv * BV + tl.arange(0, BV)
    s_offs = ck[:, None] * DV + cv[None, :]
    o0 = ik * (tl.num_programs(2).to(tl.int64) * T)  # token-head offset of this key tile's share (B T H per share)
    if HAS_H0:
        S = tl.load(h0_ptr + bh * DK * DV + s_offs).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    for c in range(NT):
        n = tl.minimum(T - c * C, C)
        valid = rows < n
        x0 = (b * T + c * C) * H + h                # int64 token-head index of row 0 (v, g, o)
        xk0 = (b * T + c * C) * HK + hk             # ... and of q, k
        tok = x0 + rows * H
        tokk = xk0 + rows * HK
        if SNAPSHOTS:
            tl.store(h_ptr + ((b * NT + c) * H + h) * DK * DV + s_offs, S.to(h_ptr.dtype.element_ty))
        kk = tl.load(k_ptr + tokk[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.).to(tl.float32)
        vv = tl.load(v_ptr + tok[:, None] * DV + cv[None, :], mask=valid[:, None], other=0.)
        eg, egn, etail = _gla_gates(g_ptr, tok, valid, rows, n, H, ck, DK)
        if OUTPUT:
            qq = tl.load(q_ptr + tokk[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.).to(tl.float32)
            M, _, _ = _gla_intra(qq, 0., k_ptr, g_ptr, x0, xk0, n, H, HK, rows, ck, DK, BK, C, 0)
            M += tl.where(rows[:, None] == rows[None, :], tl.sum(qq * kk, 1)[:, None], 0.)   # the diagonal
            o = scale * (_dot(qq * eg, S, PREC) + _dot(M, vv, PREC))
            tl.store(o_ptr + (o0 + tok)[:, None] * DV + cv[None, :], o.to(o_ptr.dtype.element_ty),
                     mask=valid[:, None])
        S = S * egn[:, None] + _dot(tl.trans(kk * etail), vv, PREC)
    if STORE_HT:
        tl.store(ht_ptr + bh * DK * DV + s_offs, S)

# ---- backward -------------------------------------------------------------------------------------------------------

# Backward (h[c] recomputed by _la_state_fwd; dh[c] = gradient of the state at the END of chunk c):
#   _la_state_bwd, reverse over chunks:  dh[c-1] = Γ_n dh[c] + scale (Q * Γ)^T dO_c    (after chunk 0: d initial_state)
#   _la_dv_bwd and _la_dqkg_bwd, parallel over chunks, with dA = scale (dO V^T) ⊙ D (the gradient of the decayed scores):
#     dq = scale (dO h^T) * Γ + dA K
#     dk = (V dh^T) * exp(G_n - G) + dA^T Q                 (the first term: dk_inter)
#     dv = (K * exp(G_n - G)) dh + scale (Q K^T ⊙ D)^T dO
#     dG_r = q_r·dq_r - k_r·dk_r,  and on the last row + Γ_n Σ(h ⊙ dh) + Σ_r k_r·dk_inter_r;  dg = reverse cumsum
#   (every G_r enters through exp(G_r - G_i), exp(G_r) or exp(G_n - G_r); the q·dq and k·dk sums collect exactly
#   the + and - sides of those exponents). Only GATE_SCALAR has a gate gradient (RetNet's constant is not trained).
#   The forward forms those exponents as segment sums of g, equal to the differences in exact arithmetic, so dG
#   (which consumes only the decay values D, Γ, exp(G_n - G)) and dg_j = Σ_{r>=j} dG_r still hold.

@triton.jit(do_not_specialize=["T", "NT", "H", "HK"])
def _la_state_bwd_kernel(q_ptr, g_ptr, do_ptr, dh_ptr, dht_ptr, dh0_ptr, scale, T, NT, H, HK,
                         DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                         GATE: tl.constexpr, PREC: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr):
    # One program per (V-tile, K-tile, b, h), reverse over chunks; key tiles independent as in _la_state_fwd.
    iv, ik = tl.program_id(0), tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // H, bh % H
    hk = h // (H // HK)
    rows = tl.arange(0, C)
    ck = ik * BK + tl.arange(0, BK)
    cv = iv * BV + tl.arange(0, BV)
    s_offs = ck[:, None] * DV + cv[None, :]
    if HAS_DHT:
        dS = tl.load(dht_ptr + bh * DK * DV + s_offs).to(tl.float32)
    else:
        dS = tl.zeros([BK, BV], dtype=tl.float32)
    for cc in range(NT):
        c = NT - 1 - cc
        t = c * C + rows
        valid = t < T
        n = tl.minimum(T - c * C, C)
        tok = (b * T + t) * H + h
        tokk = (b * T + t) * HK + hk
        tl.store(dh_ptr + ((b * NT + c) * H + h) * DK * DV + s_offs, dS.to(dh_ptr.dtype.element_ty))
        qq = tl.load(q_ptr + tokk[:, None] * DK + ck[None, :], mask=valid[:, None], other=0.).to(tl.float32)
        dO = tl.load(do_ptr + tok[:, None] * DV + cv[None, :], mask=valid[:, None], other=0.)
        _, Gm, Gn, _, _ = _la_gates(g_ptr, tok, valid, rows, n, h, H, C, GATE)
        qg = qq * tl.exp(tl.where(valid, Gm, float('-inf')))[:, None]
        if GATE != GATE_NONE:
            dS = dS * tl.exp(Gn)
        dS += scale * _dot(tl.trans(qg), dO, PREC)
    if STORE_DH0:
        tl.store(dh0_ptr + bh * DK * DV + s_offs, dS)

# The chunk-parallel gradients are two kernels, so that no program holds a whole [C, Dk] row block (at Dk = 128 one
# kernel would keep q, k, dq_inter, dk_inter [64, 128] fp32 plus P, dA [64, 64]: 255 registers and spills). The price is recomputation: Q K^T once per V-tile in _la_dv_bwd and dO V^T once per key tile in
# _la_dqkg_bwd (each 2x at Dk = Dv = 128), and dh[c] read by both. Their tile offsets are an int64 base at the chunk's
# first row plus int32 offsets within the chunk (< 64 H Dv): a [64, 64] tile of int64 offsets costs 2 registers per
# element (offline ptxas, sm_90a, _la_dqkg_bwd at 8 warps, 3 stages: 1088 B spilled with int64 offsets, 668 B
# without). Both run 1 stage, which removes the rest (237 registers, no spill): their loops are Dv/64 or Dk/64 long,
# too short for software pipelining to pay for its buffers.

@triton.jit(do_not_specialize=["T", "NT", "H", "HK"])
def _la_dv_bwd_kernel(q_ptr, k_ptr, g_ptr, do_ptr, dh_ptr, dv_ptr, v_ptr, dt_ptr, D_ptr, ddt_ptr, dD_ptr,
                      scale, T, NT, H, HK, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      C: tl.constexpr, GATE: tl.constexpr, PREC: tl.constexpr, SSD: tl.constexpr = 0):
    # One program per (V-tile, chunk, b, h):  dv = Diag(exp(G_n - G)) K dh + scale (Q K^T ⊙ D)^T dO,
    # with K dh and Q K^T accumulated over key tiles (the row decay factors out of the first dot).
    # SSD (value Δ·x, output + D·x): dv above is the value's gradient u; then dx = Δ u + D dO, and this V-tile's
    # shares of dΔ_t = Σ_p u x and of dD (per token: Σ_p dO x) go to ddt_ptr, dD_ptr [B, T, H, Dv / BV].
    iv = tl.program_id(0)
    c = tl.program_id(1).to(tl.int64)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // H, bh % H
    hk = h // (H // HK)
    rows = tl.arange(0, C)
    t = c * C + rows
    valid = t < T
    n = tl.minimum(T - c * C, C)
    tok = (b * T + t) * H + h
    cv = iv * BV + tl.arange(0, BV)
    s_base = ((b * NT + c) * H + h) * DK * DV
    x0 = (b * T + c * C) * H + h                                         # int64 token-head index of row 0
    xk0 = (b * T + c * C) * HK + hk
    qk = tl.zeros([C, C], dtype=tl.float32)                                  # Q K^T
    kds = tl.zeros([C, BV], dtype=tl.float32)                                # K dh
    for ik in range(DK // BK):
        ck = ik * BK + tl.arange(0, BK)
        k_offs = rows[:, None] * (HK * DK) + ck[None, :]
        qq = tl.load(q_ptr + xk0 * DK + k_offs, mask=valid[:, None], other=0.)
        kk = tl.load(k_ptr + xk0 * DK + k_offs, mask=valid[:, None], other=0.)
        dS = tl.load(dh_ptr + s_base + (ck[:, None] * DV + cv[None, :]))
        qk += _dot(qq, tl.trans(kk), PREC)
        kds += _dot(kk, dS, PREC)
    x_offs = rows[:, None] * (H * DV) + cv[None, :]
    dO = tl.load(do_ptr + x0 * DV + x_offs, mask=valid[:, None], other=0.)
    gm, _, _, tail, gh = _la_gates(g_ptr, tok, valid, rows, n, h, H, C, GATE)
    egn = tl.exp(tl.where(valid, tl.minimum(tail, 0.), float('-inf')))[:, None]  # exp(G_n - G), 0 on padded rows
    P = scale * qk * _la_decay(gm, gh, n, C, GATE)                          # the scaled decayed scores
    dv = kds * egn + _dot(tl.trans(P), dO, PREC)
    if SSD:
        xx = tl.load(v_ptr + x0 * DV + x_offs, mask=valid[:, None], other=0.).to(tl.float32)
        dtv = tl.load(dt_ptr + tok, mask=valid, other=0.)
        part = tok * (DV // BV) + iv
        tl.store(ddt_ptr + part, tl.sum(dv * xx, 1), mask=valid)
        tl.store(dD_ptr + part, tl.sum(dO.to(tl.float32) * xx, 1), mask=valid)
        dv = dv * dtv[:, None] + tl.load(D_ptr + h) * dO.to(tl.float32)
    tl.store(dv_ptr + x0 * DV + x_offs, dv.to(dv_ptr.dtype.element_ty), mask=valid[:, None])

@triton.jit(do_not_specialize=["T", "NT", "H", "HK"])
def _la_dqkg_bwd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, dt_ptr, h_ptr, do_ptr, dh_ptr, dq_ptr, dk_ptr, dg_ptr,
                        scale, T, NT, H, HK, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
                        BV: tl.constexpr, C: tl.constexpr, GATE: tl.constexpr, PREC: tl.constexpr,
                        GROUP: tl.constexpr, SSD: tl.constexpr = 0):
    # One program per (K-tile, chunk, b, q/k head hk): a loop over the GROUP = H / HK heads that read hk (RetNet:
    # GROUP = 1, one iteration), each a loop over V-tiles. dq, dk [B, T, HK, Dk] are the sums over the group's heads,
    # accumulated in fp32 registers in head order and written once in the inputs' dtypes: no per-head copies, no
    # atomics, deterministic. dG_r sums over key channels, so each key tile writes each head's reverse-cumsummed share
    # (the cumsum is linear) to dg_ptr [B, T, H, NK], NK = Dk / BK, and the caller adds the shares up.
    ik = tl.program_id(0)
    c = tl.program_id(1).to(tl.int64)
    bg = tl.program_id(2).to(tl.int64)
    b, hk = bg // HK, bg % HK
    rows = tl.arange(0, C)
    t = c * C + rows
    valid = t < T
    n = tl.minimum(T - c * C, C)
    ck = ik * BK + tl.arange(0, BK)
    xk0 = (b * T + c * C) * HK + hk                                      # int64 token-head index of row 0 (q, k)
    k_offs = rows[:, None] * (HK * DK) + ck[None, :]
    if GROUP > 1:  # the group's q, k (input dtype), read once for all its heads
        q_in = tl.load(q_ptr + xk0 * DK + k_offs, mask=valid[:, None], other=0.)
        k_in = tl.load(k_ptr + xk0 * DK + k_offs, mask=valid[:, None], other=0.)
    x0 = (b * T + c * C) * H * DV                                        # int64 offsets of row 0, head 0: v, dO
    s0 = (b * NT + c) * H * DK * DV                                      # ... and of h[c], dh[c]
    dq = tl.zeros([C, BK], dtype=tl.float32)                             # Σ over the group's heads
    dk = tl.zeros([C, BK], dtype=tl.float32)
    for j in range(GROUP):
        # The head enters the int32 in-chunk offsets (and the load masks compare those offsets) so that no offset
        # or mask tile is loop-invariant: the compiler hoists those out of the loop, where each holds registers
        # through all of it (offline ptxas, 32 heads, key tiles of 64: 1360 B spilled with them, 476 without).
        h = (hk * GROUP + j).to(tl.int32)
        tok = (b * T + t) * H + h
        dA = tl.zeros([C, C], dtype=tl.float32)                          # dO V^T
        dqi = tl.zeros([C, BK], dtype=tl.float32)                        # dO h^T
        dki = tl.zeros([C, BK], dtype=tl.float32)                        # V dh^T
        sds = tl.zeros([BK], dtype=tl.float32)                           # rowsum(h ⊙ dh)
        if SSD:
            dtv = tl.load(dt_ptr + tok, mask=valid, other=0.)
        for iv in range(DV // BV):
            cv = iv * BV + tl.arange(0, BV)
            x_offs = rows[:, None] * (H * DV) + (h * DV + cv)[None, :]
            x_mask = x_offs < n * (H * DV)                               # rows < n: h Dv + cv < H Dv
            s_offs = (h * (DK * DV) + ck * DV)[:, None] + cv[None, :]
            vv = tl.load(v_ptr + x0 + x_offs, mask=x_mask, other=0.)
            if SSD:  # the value Δ·x
                vv = vv * dtv[:, None]
            dO = tl.load(do_ptr + x0 + x_offs, mask=x_mask, other=0.)
            S = tl.load(h_ptr + s0 + s_offs)
            dS = tl.load(dh_ptr + s0 + s_offs)
            dA += _dot(dO, tl.trans(vv), PREC)
            dqi += _dot(dO, tl.trans(S), PREC)
            dki += _dot(vv, tl.trans(dS), PREC)
            sds += tl.sum(S.to(tl.float32) * dS.to(tl.float32), 1)
        if GROUP == 1:  # one head: q, k read after the V-tile loop, so that they are not live during it
            q_in = tl.load(q_ptr + xk0 * DK + k_offs, mask=valid[:, None], other=0.)
            k_in = tl.load(k_ptr + xk0 * DK + k_offs, mask=valid[:, None], other=0.)
        qq, kk = q_in.to(tl.float32), k_in.to(tl.float32)
        gm, Gm, Gn, tail, gh = _la_gates(g_ptr, tok, valid, rows, n, h, H, C, GATE)
        eg = tl.exp(tl.where(valid, Gm, float('-inf')))[:, None]         # exp(G), 0 on padded rows
        egn = tl.exp(tl.where(valid, tl.minimum(tail, 0.), float('-inf')))[:, None]  # exp(G_n - G), clamped as above
        dA = scale * dA * _la_decay(gm, gh, n, C, GATE)
        dqh = scale * dqi * eg + _dot(dA, k_in, PREC)   # this head's dq, dk
        dk_inter = dki * egn
        dkh = dk_inter + _dot(tl.trans(dA), q_in, PREC)
        if GATE == GATE_SCALAR:
            dG = tl.sum(qq * dqh, 1) - tl.sum(kk * dkh, 1)
            dGn = tl.exp(Gn) * tl.sum(sds, 0) + tl.sum(tl.sum(kk * dk_inter, 1), 0)
            dG += tl.where(rows == n - 1, dGn, 0.)
            tl.store(dg_ptr + tok * (DK // BK) + ik, tl.cumsum(dG, axis=0, reverse=True), mask=valid)
        dq += dqh
        dk += dkh
    tl.store(dq_ptr + xk0 * DK + k_offs, dq.to(dq_ptr.dtype.element_ty), mask=valid[:, None])
    tl.store(dk_ptr + xk0 * DK + k_offs, dk.to(dk_ptr.dtype.element_ty), mask=valid[:, None])

# GLA's backward (g [B, T, H, Dk]): one program per (V-tile, key tile, b, h), reverse over chunks with dS' (the
# gradient of the state after the chunk; d final_state first) in fp32 registers and the chunk-start state S = h[c]
# recomputed by _gla_fwd. Per chunk, with M as in _gla_fwd, E_ij = the pair's decay exponent, Kt = K ⊙ exp(G_n - G):
#   dM    = scale dO V^T   (j <= i)
#   dv    = scale M^T dO + Kt dS'                                    (this key tile's share)
#   dq    = scale (dO S^T) ⊙ exp(G) + Σ_j dM_ij k_j ⊙ exp(E_ij)      (this V-tile's share, as dk and dg)
#   dk    = Σ_i dM_ij q_i ⊙ exp(E_ij) + dk_s,   dk_s = (V dS'^T) ⊙ exp(G_n - G)
#   dG    = q ⊙ dq - k ⊙ dk (without the pairs j = i, whose terms cancel),  and on the last row
#           + Σ_j k_j ⊙ dk_s_j + exp(G_n) ⊙ rowsum(S ⊙ dS')
#   dg    = reverse cumsum of dG within the chunk
#   dS    = Diag(exp G_n) dS' + scale (Q ⊙ exp G)^T dO                (after chunk 0: d initial_state)
# (every G_ic enters through exp(E_ij) = exp(G_i - G_j), exp(G_i) and exp(G_n - G_i), so q ⊙ dq and k ⊙ dk collect
# the + and - sides of those exponents; the forward's segment sums equal the differences in exact arithmetic.)
# dq, dk, dg are sums over V-tiles and dv over key tiles: each program writes its share ([NV or NK, B, T, H, D]
# fp32, or the gradient itself when there is one tile), and the caller adds them up.

@triton.jit(do_not_specialize=["T", "NT", "H", "HK"])
def _gla_bwd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, h_ptr, do_ptr, dht_ptr, dh0_ptr, dq_ptr, dk_ptr, dv_ptr, dg_ptr,
                    scale, T, NT, H, HK, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                    C: tl.constexpr, PREC: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr):
    iv, ik = tl.program_id(0), tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b, h = bh // H, bh % H
    hk = h // (H // HK)
    rows = tl.arange(0, C)
    ck = ik * BK + tl.arange(0, BK)
    cv = iv * BV + tl.arange(0, BV)
    s_offs = ck[:, None] * DV + cv[None, :]
    nbt = tl.num_programs(2).to(tl.int64) * T        # token-heads (B T H) per share
    if HAS_DHT:
        dS = tl.load(dht_ptr + bh * DK * DV + s_offs).to(tl.float32)
    else:
        dS = tl.zeros([BK, BV], dtype=tl.float32)
    for cc in range(NT):
        c = NT - 1 - cc
        n = tl.minimum(T - c * C, C)
        valid = rows < n
        x0 = (b * T + c * C) * H + h
        xk0 = (b * T + c * C) * HK + hk
        tok = x0 + rows * H
        tokk = xk0 + rows * HK
        S = tl.load(h_ptr + ((b * NT + c) * H + h) * DK * DV + s_offs).to(tl.float32)
        k_offs = tokk[:, None] * DK + ck[None, :]
        v_offs = tok[:, None] * DV + cv[None, :]
        qq = tl.load(q_ptr + k_offs, mask=valid[:, None], other=0.).to(tl.float32)
        kk = tl.load(k_ptr + k_offs, mask=valid[:, None], other=0.).to(tl.float32)
        vv = tl.load(v_ptr + v_offs, mask=valid[:, None], other=0.)
        dO = tl.load(do_ptr + v_offs, mask=valid[:, None], other=0.)
        eg, egn, etail = _gla_gates(g_ptr, tok, valid, rows, n, H, ck, DK)
        dM = scale * _dot(dO, tl.trans(vv), PREC)         # the pairs above the diagonal have exp(E) = 0 below
        M, dq, dk = _gla_intra(qq, dM, k_ptr, g_ptr, x0, xk0, n, H, HK, rows, ck, DK, BK, C, 1)
        diag = rows[:, None] == rows[None, :]
        M += tl.where(diag, tl.sum(qq * kk, 1)[:, None], 0.)
        kt = kk * etail
        dks = _dot(vv, tl.trans(dS), PREC) * etail        # through the state update
        dq += scale * _dot(dO, tl.trans(S), PREC) * eg
        dk += dks
        dv = scale * _dot(tl.trans(M), dO, PREC) + _dot(kt, dS, PREC)
        # dG before the diagonal pairs join dq, dk: their decay exp(0) has no gate, and their two equal terms
        # q_i dM_ii k_i would cancel in q dq - k dk, leaving only rounding (6e-5 relative dg at gates of -5..-10)
        dG = qq * dq - kk * dk
        dGn = tl.sum(kk * dks, 0) + egn * tl.sum(S * dS, 1)
        dG += tl.where((rows == n - 1)[:, None], dGn[None, :], 0.)
        dMd = tl.sum(tl.where(diag, dM, 0.), 1)[:, None]  # dM_ii
        dq += dMd * kk
        dk += dMd * qq
        dq_offs = (iv * nbt + tok)[:, None] * DK + ck[None, :]
        tl.store(dq_ptr + dq_offs, dq.to(dq_ptr.dtype.element_ty), mask=valid[:, None])
        tl.store(dk_ptr + dq_offs, dk.to(dk_ptr.dtype.element_ty), mask=valid[:, None])
        tl.store(dg_ptr + dq_offs, tl.cumsum(dG, axis=0, reverse=True), mask=valid[:, None])
        tl.store(dv_ptr + (ik * nbt + tok)[:, None] * DV + cv[None, :], dv.to(dv_ptr.dtype.element_ty),
                 mask=valid[:, None])
        dS = dS * egn[:, None] + scale * _dot(tl.trans(qq * eg), dO, PREC)
    if STORE_DH0:
        tl.store(dh0_ptr + bh * DK * DV + s_offs, dS)

# ---- the custom ops (kernels::linear_attn_fwd, linear_attn_bwd, gla_fwd, gla_bwd) and linear_attn_triton ------------

# The scalar-decay family as custom ops, the same way. Forward (kernels::linear_attn_fwd): the raw gates (fp32; each
# kernel sums them per chunk) -> h[c], final state (_la_state_fwd) -> O (_la_output_fwd), or O and the final state
# from _la_state_fwd alone (OUTPUT, see TUNING['scalar']). Saved: q, k, v, g (per token or the constant [H] gate), dt, D and
# the initial state; the backward (kernels::linear_attn_bwd) recomputes h[c] (bf16 for bf16 inputs), then runs
# _la_state_bwd (reverse over chunks), _la_dv_bwd (with SSD also dx, dΔ, dD) and _la_dqkg_bwd. With TUNING['keep']
# (the default) the forward's h[c] is saved instead of recomputed: one state pass less, for h[c] held (2x q's size
# at Dk = Dv = 128).

def _decay_kind(g):
    """GATE_NONE (no gate), GATE_SCALAR (a gate per token, [B,T,H] or a step's [B,H]: Mamba2) or GATE_CONST (a constant
    per head, [H]: RetNet), as a plain int."""
    return int(GATE_NONE) if g is None else int(GATE_CONST) if g.dim() == 1 else int(GATE_SCALAR)

def _la_meta(q, k, v):
    """-> B, T, H, HK, Dk, Dv, NT, BK, BV, prec. Tiles of 64 on both sides: every kernel loops over, or is launched
    per, key tile and V-tile, so no program holds a [C, 128] tile (at 128 they spilled). The dots' operands follow the
    delta rule's rule (_dot): bf16 when q, k, v are all bf16, IEEE fp32 when any is fp32, tf32 otherwise (fp16)."""
    B, T, H, DV = v.shape
    HK, DK = q.shape[2], q.shape[3]
    dtypes = {q.dtype, k.dtype, v.dtype}
    prec = 'bf16' if dtypes == {torch.bfloat16} else ('ieee' if torch.float32 in dtypes else 'tf32')
    return B, T, H, HK, DK, DV, triton.cdiv(T, TRITON_CHUNK), min(DK, 64), min(DV, 64), prec

def _la_cfg(name, DK):
    """TUNING['scalar'][name], or its '_d64' override at Dk <= 64."""
    t = TUNING['scalar']
    return t.get(name + '_d64', t[name]) if DK <= 64 else t[name]

def _la_state_tiles(B, H, DK, DV, device):
    """-> (BK, BV) of the sequential passes (TUNING['scalar'])."""
    BK, BV = DK, min(DV, 64)
    while (DV // BV) * (DK // BK) * B * H < _la_cfg('state_cover', DK) * _sm_count(device):
        if BK > 64:
            BK = 64
        elif BV > TUNING['scalar']['state_min_v']:
            BV //= 2
        else:
            break
    return BK, BV

def _la_states(k, v, gp, dtp, h0, GATE, SSD, h_dtype, output_final_state, prec, out=None):
    """The sequential pass: chunk-start snapshots h[c] [B, NT, H, Dk, Dv] in h_dtype, final state fp32 (or None).
    out (q, D, o, scale): the fused forward (whole Dk rows), which writes o, and h only if h_dtype is given (else h
    is None)."""
    B, T, H, HK, DK, DV, NT, _, _, _ = _la_meta(k, k, v)
    BK, BV = _la_state_tiles(B, H, DK, DV, k.device)
    h = torch.empty(B, NT, H, DK, DV, device=k.device, dtype=h_dtype) if h_dtype is not None else None
    ht = torch.empty(B, H, DK, DV, device=k.device, dtype=torch.float32) if output_final_state else None
    q, D, o, scale = out if out is not None else (k, k, k, 1.0)
    hp = h if h is not None else o
    _la_state_fwd_kernel[(DV // BV, DK // BK, B * H)](k, v, gp, dtp, hp, h0 if h0 is not None else hp,
                                                      ht if ht is not None else hp, q, D, o, scale, T, NT, H, HK,
                                                      DK, DV, BK, BV, TRITON_CHUNK, GATE, prec, h0 is not None,
                                                      ht is not None, SSD, int(out is not None), int(h is not None),
                                                      num_warps=_la_cfg('fused_warps' if out is not None
                                                                        else 'state_warps', DK),
                                                      num_stages=_la_cfg('fused_stages' if out is not None
                                                                         else 'state_stages', DK))
    return h, ht

def _la_gate_ptrs(g, dt, D, k):
    """(g, Δ, D) as the kernels read them: fp32, contiguous; k (any pointer) in place of an absent one."""
    f = lambda x: x.float().contiguous() if x is not None else k
    return f(g), f(dt), f(D)

@torch.library.custom_op("kernels::linear_attn_fwd", mutates_args=())
def _linear_attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], scale: float,
                     initial_state: Optional[torch.Tensor], output_final_state: bool, dt: Optional[torch.Tensor],
                     D: Optional[torch.Tensor], keep: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> o [B,T,H,Dv] (v's dtype), final state fp32 [B,H,Dk,Dv] (empty unless asked for), and with keep the
    snapshots h[c] [B,NT,H,Dk,Dv] (_storage's dtype) for the backward, which otherwise recomputes them (else empty).
    dt [B,T,H] and D [H] (Mamba2's SSD, both or neither): the value is dt·v and the output gains D·v."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, T, H, HK, DK, DV, NT, BK, BV, prec = _la_meta(q, k, v)
    GATE, SSD = _decay_kind(g), int(dt is not None)
    gp, dtp, Dp = _la_gate_ptrs(g, dt, D, k)  # the raw gates (the kernels sum them)
    h0 = initial_state.contiguous().float() if initial_state is not None else None
    o = torch.empty_like(v)
    empty = lambda dtype: torch.empty(0, device=k.device, dtype=dtype)
    if GATE in TUNING['scalar']['fused_fwd'] and _la_state_tiles(B, H, DK, DV, k.device)[0] == DK:  # whole rows cover SMs
        h, ht = _la_states(k, v, gp, dtp, h0, GATE, SSD, _storage(prec) if keep else None, output_final_state, prec,
                           out=(q, Dp, o, scale))
        return o, (ht if ht is not None else empty(torch.float32)), (h if keep else empty(_storage(prec)))
    h, ht = _la_states(k, v, gp, dtp, h0, GATE, SSD, _storage(prec), output_final_state, prec)
    _la_output_fwd_kernel[(DV // BV, NT, B * H)](q, k, v, gp, dtp, Dp, h, o, scale, T, NT, H, HK, DK, DV, BK, BV,
                                                  TRITON_CHUNK, GATE, prec, SSD, num_warps=_la_cfg('out_warps', DK),
                                                  num_stages=_la_cfg('out_stages', DK))
    return o, (ht if ht is not None else empty(torch.float32)), (h if keep else empty(h.dtype))

@_linear_attn_fwd.register_fake
def _(q, k, v, g, scale, initial_state, output_final_state, dt, D, keep=False):
    B, T, H, DV = v.shape
    ht = q.new_empty((B, H, q.shape[-1], DV) if output_final_state else (0,), dtype=torch.float32)
    h = q.new_empty((B, triton.cdiv(T, TRITON_CHUNK), H, q.shape[-1], DV) if keep else (0,),
                    dtype=_storage(_la_meta(q, k, v)[-1]))
    return v.new_empty(v.shape), ht, h

@torch.library.custom_op("kernels::linear_attn_bwd", mutates_args=())
def _linear_attn_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                     initial_state: Optional[torch.Tensor], do: torch.Tensor, dht: Optional[torch.Tensor], scale: float,
                     dt: Optional[torch.Tensor], D: Optional[torch.Tensor], h: Optional[torch.Tensor] = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                torch.Tensor]:
    """-> dq, dk, dv (the inputs' dtypes and shapes), dg fp32 [B,T,H] (empty unless g is per token), d initial_state
    fp32 (empty without one), d dt fp32 [B,T,H] and dD fp32 [H] (empty without them). g: the forward's gate, per
    token [B,T,H] or the constant [H], or None. h: the forward's snapshots (TUNING['keep']), else recomputed."""
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()
    B, T, H, HK, DK, DV, NT, BK, BV, prec = _la_meta(q, k, v)
    GATE, SSD = _decay_kind(g), int(dt is not None)
    gp, dtp, Dp = _la_gate_ptrs(g, dt, D, k)
    h0 = initial_state.contiguous().float() if initial_state is not None else None
    # h[c] recomputed, and dh[c], in the dots' storage dtype (bf16 for bf16 inputs: both are only ever dot operands,
    # which _dot rounds to bf16 anyway, and rowsum(h * dh) for dg)
    if h is None:
        h, _ = _la_states(k, v, gp, dtp, h0, GATE, SSD, _storage(prec), False, prec)
    dh = torch.empty_like(h)
    dh0 = torch.empty(B, H, DK, DV, device=k.device, dtype=torch.float32) if h0 is not None else None
    if dht is not None:
        dht = dht.contiguous().float()
    BKs, BVs = _la_state_tiles(B, H, DK, DV, k.device)
    _la_state_bwd_kernel[(DV // BVs, DK // BKs, B * H)](q, gp, do, dh, dht if dht is not None else dh,
                                                        dh0 if dh0 is not None else dh, scale, T, NT, H, HK, DK, DV,
                                                        BKs, BVs, TRITON_CHUNK, GATE, prec, dht is not None,
                                                        dh0 is not None, num_warps=_la_cfg('state_warps', DK),
                                                        num_stages=_la_cfg('state_stages', DK))
    # grouped q/k: _la_dqkg_bwd sums the heads of each group in registers and writes [B, T, HK, Dk] once
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)  # k's dtype, not q's
    dv = torch.empty_like(v)
    # _la_dqkg_bwd's key tile and stages: as the other kernels' without groups; with groups TUNING['scalar']'s
    # group_k and group_stages (the latter where Dv is one V-tile, else 1)
    t = TUNING['scalar']
    BKg, stages = (BK, 1) if HK == H else (min(DK, t['group_k']), t['group_stages'] if DV == BV else 1)
    # dg: one reverse-cumsummed share per key tile, [B, T, H, Dk // BKg], added up below (one share at Dk <= BKg)
    dgk = torch.empty(B, T, H, DK // BKg, device=k.device, dtype=torch.float32) if GATE == GATE_SCALAR else dv
    # SSD: per-V-tile shares of dΔ and of D's gradient per token, [2, B, T, H, Dv // BV], added up below
    dssd = torch.empty(2, B, T, H, DV // BV, device=k.device, dtype=torch.float32) if SSD else dv
    _la_dv_bwd_kernel[(DV // BV, NT, B * H)](q, k, gp, do, dh, dv, v, dtp, Dp, dssd, dssd[1] if SSD else dv, scale,
                                             T, NT, H, HK, DK, DV, BK, BV, TRITON_CHUNK, GATE, prec, SSD,
                                             num_warps=_la_cfg('dv_warps', DK), num_stages=1)
    _la_dqkg_bwd_kernel[(DK // BKg, NT, B * HK)](q, k, v, gp, dtp, h, do, dh, dq, dk, dgk, scale, T, NT, H, HK, DK,
                                                 DV, BKg, BV, TRITON_CHUNK, GATE, prec, H // HK, SSD,
                                                 num_warps=_la_cfg('dqkg_warps', DK), num_stages=stages)
    empty = lambda: torch.empty(0, device=k.device)  # one per absent output: returns may not alias
    dg = (dgk.sum(-1) if DK > BKg else dgk.view(B, T, H)) if GATE == GATE_SCALAR else empty()
    ddt, dD = (dssd[0].sum(-1), dssd[1].sum((0, 1, 3))) if SSD else (empty(), empty())
    return dq, dk, dv, dg, (dh0 if dh0 is not None else empty()), ddt, dD

@_linear_attn_bwd.register_fake
def _(q, k, v, g, initial_state, do, dht, scale, dt, D, h=None):
    f32 = torch.float32
    dg = q.new_empty(v.shape[:3] if _decay_kind(g) == GATE_SCALAR else (0,), dtype=f32)
    dh0 = q.new_empty((0,) if initial_state is None else initial_state.shape, dtype=f32)
    ddt = q.new_empty((0,) if dt is None else v.shape[:3], dtype=f32)
    dD = q.new_empty((0,) if D is None else (v.shape[2],), dtype=f32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dg, dh0, ddt, dD

def _linear_attn_setup(ctx, inputs, output):
    q, k, v, g, scale, initial_state, output_final_state, dt, D, keep = inputs
    ctx.set_materialize_grads(False)  # no zero gradient formed for h
    ctx.save_for_backward(q, k, v, g, initial_state, dt, D, output[2] if keep else None)
    ctx.scale, ctx.output_final_state = scale, output_final_state
    ctx.dtypes = [None if x is None else x.dtype for x in (g, dt, D)]

def _linear_attn_backward(ctx, do, dht, _):
    q, k, v, g, h0, dt, D, h = ctx.saved_tensors
    dht = dht if ctx.output_final_state else None  # grads of "absent" (empty) outputs are ignored
    if do is None:  # only the final state was used
        do = torch.zeros_like(v)
    dq, dk, dv, dg, dh0, ddt, dD = _linear_attn_bwd(q, k, v, g, h0, do, dht, ctx.scale, dt, D, h)
    g_dt, dt_dt, D_dt = ctx.dtypes
    # a constant [H] gate is not differentiated (as in linear_attn_recurrent)
    return (dq, dk, dv, dg.to(g_dt) if _decay_kind(g) == GATE_SCALAR else None, None,
            None if h0 is None else dh0.to(h0.dtype), None,
            None if dt is None else ddt.to(dt_dt), None if D is None else dD.to(D_dt), None)

_linear_attn_fwd.register_autograd(_linear_attn_backward, setup_context=_linear_attn_setup)

# GLA (g [B, T, H, Dk]) as its own pair of custom ops. Forward (kernels::gla_fwd): _gla_fwd with OUTPUT, O's shares
# over key tiles summed here when Dk has more than one. Saved: q, k, v, g and the initial state (TUNING['keep']: and
# h[c]); the backward (kernels::gla_bwd) recomputes the chunk-start states h[c] (_gla_fwd without OUTPUT;
# _storage's dtype) unless kept, then runs
# _gla_bwd, reverse over chunks, and sums its per-tile shares: dv over key tiles, dq, dk, dg over V-tiles (and dq, dk
# over the heads of a q/k group). h[c] is Dk*Dv/16 values per token and head (8x q's at Dk = Dv = 128).

def _gla_tiles(DK, DV):
    """-> (BK, BV) of the GLA kernels (TUNING['gla'])."""
    return min(DK, TUNING['gla']['k']), min(DV, TUNING['gla']['v'])

@torch.library.custom_op("kernels::gla_fwd", mutates_args=())
def _gla_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float,
             initial_state: Optional[torch.Tensor], output_final_state: bool, keep: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> o [B,T,H,Dv] (v's dtype), final state fp32 [B,H,Dk,Dv] (empty unless asked for), and with keep the
    chunk-start states h[c] [B,NT,H,Dk,Dv] (_storage's dtype) for the backward (else empty); g [B,T,H,Dk]."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, T, H, HK, DK, DV, _, _, _, prec = _la_meta(q, k, v)
    BK, BV = _gla_tiles(DK, DV)
    NK, NV = DK // BK, DV // BV
    gp = g.float().contiguous()
    h0 = initial_state.contiguous().float() if initial_state is not None else None
    ht = torch.empty(B, H, DK, DV, device=k.device, dtype=torch.float32) if output_final_state else None
    # one share of O per key tile (fp32, summed below), or O itself
    o = torch.empty_like(v) if NK == 1 else torch.empty(NK, B, T, H, DV, device=k.device, dtype=torch.float32)
    NT = triton.cdiv(T, GLA_CHUNK)
    h = torch.empty(B, NT, H, DK, DV, device=k.device, dtype=_storage(prec)) if keep else None
    _gla_fwd_kernel[(NV, NK, B * H)](q, k, v, gp, h0 if h0 is not None else o, ht if ht is not None else o,
                                     h if keep else o, o, scale, T, NT, H, HK, DK, DV, BK, BV, GLA_CHUNK, prec,
                                     h0 is not None, ht is not None, 1, keep, num_warps=TUNING['gla']['fwd_warps'],
                                     num_stages=TUNING['gla']['fwd_stages'])
    if NK > 1:
        o = o.sum(0).to(v.dtype)
    empty = lambda dtype: torch.empty(0, device=k.device, dtype=dtype)
    return o, (ht if ht is not None else empty(torch.float32)), (h if keep else empty(_storage(prec)))

@_gla_fwd.register_fake
def _(q, k, v, g, scale, initial_state, output_final_state, keep=False):
    B, T, H, DV = v.shape
    ht = q.new_empty((B, H, q.shape[-1], DV) if output_final_state else (0,), dtype=torch.float32)
    h = q.new_empty((B, triton.cdiv(T, GLA_CHUNK), H, q.shape[-1], DV) if keep else (0,),
                    dtype=_storage(_la_meta(q, k, v)[-1]))
    return v.new_empty(v.shape), ht, h

@torch.library.custom_op("kernels::gla_bwd", mutates_args=())
def _gla_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             initial_state: Optional[torch.Tensor], do: torch.Tensor, dht: Optional[torch.Tensor], scale: float,
             h: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                        torch.Tensor]:
    """-> dq, dk, dv (the inputs' dtypes and shapes), dg fp32 [B,T,H,Dk], d initial_state fp32 (empty without one).
    h: the forward's chunk-start states (TUNING['keep']), else recomputed here."""
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()
    B, T, H, HK, DK, DV, _, _, _, prec = _la_meta(q, k, v)
    BK, BV = _gla_tiles(DK, DV)
    NK, NV, NT = DK // BK, DV // BV, triton.cdiv(T, GLA_CHUNK)
    gp = g.float().contiguous()
    h0 = initial_state.contiguous().float() if initial_state is not None else None
    if h is None:
        h = torch.empty(B, NT, H, DK, DV, device=k.device, dtype=_storage(prec))
        _gla_fwd_kernel[(NV, NK, B * H)](q, k, v, gp, h0 if h0 is not None else h, h, h, h, scale, T, NT, H, HK, DK,
                                         DV, BK, BV, GLA_CHUNK, prec, h0 is not None, False, 0, 1,
                                         num_warps=TUNING['gla']['fwd_warps'], num_stages=TUNING['gla']['fwd_stages'])
    f32, t = dict(device=k.device, dtype=torch.float32), TUNING['gla']
    # per-tile shares (fp32), or the gradients themselves where there is one share per token and head
    whole = NV == 1 and HK == H
    dq = torch.empty_like(q) if whole else torch.empty(NV, B, T, H, DK, **f32)
    dk = torch.empty_like(k) if whole else torch.empty(NV, B, T, H, DK, **f32)
    dv = torch.empty_like(v) if NK == 1 else torch.empty(NK, B, T, H, DV, **f32)
    dg = torch.empty(NV, B, T, H, DK, **f32)
    dh0 = torch.empty(B, H, DK, DV, **f32) if h0 is not None else None
    if dht is not None:
        dht = dht.contiguous().float()
    _gla_bwd_kernel[(NV, NK, B * H)](q, k, v, gp, h, do, dht if dht is not None else h,
                                     dh0 if dh0 is not None else h, dq, dk, dv, dg, scale, T, NT, H, HK, DK, DV, BK,
                                     BV, GLA_CHUNK, prec, dht is not None, dh0 is not None,
                                     num_warps=t['bwd_warps'] if BK * BV >= 64 * 64 else t['bwd_warps_small'],
                                     num_stages=t['bwd_stages'])
    if not whole:  # head h reads q/k head h // (H // HK): its group's heads are adjacent
        dq = dq.view(NV, B, T, HK, H // HK, DK).sum((0, 4)).to(q.dtype)
        dk = dk.view(NV, B, T, HK, H // HK, DK).sum((0, 4)).to(k.dtype)
    if NK > 1:
        dv = dv.sum(0).to(v.dtype)
    dg = dg[0] if NV == 1 else dg.sum(0)
    return dq, dk, dv, dg, (dh0 if dh0 is not None else torch.empty(0, **f32))

@_gla_bwd.register_fake
def _(q, k, v, g, initial_state, do, dht, scale, h=None):
    f32 = torch.float32
    dh0 = q.new_empty((0,) if initial_state is None else initial_state.shape, dtype=f32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), g.new_empty(g.shape, dtype=f32), dh0

def _gla_setup(ctx, inputs, output):
    q, k, v, g, scale, initial_state, output_final_state, keep = inputs
    ctx.set_materialize_grads(False)  # no zero gradient formed for h
    ctx.save_for_backward(q, k, v, g, initial_state, output[2] if keep else None)
    ctx.scale, ctx.output_final_state = scale, output_final_state

def _gla_backward(ctx, do, dht, _):
    q, k, v, g, h0, h = ctx.saved_tensors
    dht = dht if ctx.output_final_state else None  # grads of "absent" (empty) outputs are ignored
    if do is None:  # only the final state was used
        do = torch.zeros_like(v)
    dq, dk, dv, dg, dh0 = _gla_bwd(q, k, v, g, h0, do, dht, ctx.scale, h)
    return dq, dk, dv, dg.to(g.dtype), None, None if h0 is None else dh0.to(h0.dtype), None, None

_gla_fwd.register_autograd(_gla_backward, setup_context=_gla_setup)

def linear_attn_triton(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False, dt=None, D=None):
    """Scalar-decay linear attention through the Triton kernels (custom ops, differentiable); same arguments and
    result as linear_attn. CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before triton is imported."""
    _check_linear_attn("linear_attn", q, k, v, g, initial_state, dt=dt, D=D)
    why = _triton_unsupported(q, v)
    if why:
        _fail("linear_attn", why)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    # keep the backward's snapshots from the forward only where there will be a backward
    keep = bool(TUNING['keep']) and torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, g, initial_state, dt, D))
    if g is not None and g.dim() == 4:  # GLA's per-key-channel gate (dt, D refused by the check above)
        o, ht = _gla_fwd(q, k, v, g, scale, initial_state, output_final_state, keep)[:2]
    else:
        o, ht = _linear_attn_fwd(q, k, v, g, scale, initial_state, output_final_state, dt, D, keep)[:2]
    return o, (ht if output_final_state else None)

# ---------------------------------------------------------------------------------------------------------------------
# 3.3 The short convolution (the equations are in section 2)
# The torch version runs F.conv1d over a [B, D, T] transpose; the Triton kernels read [B, T, D] as it is (channels
# contiguous), fuse the SiLU (and the norm), and recompute p in the backward instead of saving it: the convs are
# memory-bound, so the floor is one read of x and one write of y forward, two reads (x, dy) and one write backward.
# ---------------------------------------------------------------------------------------------------------------------

# ---- forward --------------------------------------------------------------------------------------------------------

@triton.jit
def _conv_ld(base, t, stride, lo, hi, d, dm):
    """Row t (scalar) of a sequence with the given row stride, [BD] in its dtype; zeros unless lo <= t < hi."""
    tt = t + d * 0
    return tl.load(base + t * stride + d, mask=dm & (tt >= lo) & (tt < hi), other=0.)

@triton.jit
def _conv_window(xb, t0, sxt, T, d, dm):
    """x_{t0-3}, x_{t0-2}, x_{t0-1} in fp32 (zeros before the start): the window a program starts with."""
    return (_conv_ld(xb, t0 - 3, sxt, 0, T, d, dm).to(tl.float32), _conv_ld(xb, t0 - 2, sxt, 0, T, d, dm).to(tl.float32),
            _conv_ld(xb, t0 - 1, sxt, 0, T, d, dm).to(tl.float32))

@triton.jit
def _conv_ahead(base, t0, stride, hi, d, dm):
    """Rows t0 .. t0+3 (zeros from hi on), loaded ahead of their use."""
    return (_conv_ld(base, t0, stride, 0, hi, d, dm), _conv_ld(base, t0 + 1, stride, 0, hi, d, dm),
            _conv_ld(base, t0 + 2, stride, 0, hi, d, dm), _conv_ld(base, t0 + 3, stride, 0, hi, d, dm))

@triton.jit
def _conv_weights(w_ptr, b_ptr, d, dm, BIAS: tl.constexpr):
    w0 = tl.load(w_ptr + d * 4 + 0, mask=dm, other=0.)
    w1 = tl.load(w_ptr + d * 4 + 1, mask=dm, other=0.)
    w2 = tl.load(w_ptr + d * 4 + 2, mask=dm, other=0.)
    w3 = tl.load(w_ptr + d * 4 + 3, mask=dm, other=0.)
    bias = tl.load(b_ptr + d, mask=dm, other=0.) if BIAS else tl.zeros_like(w0)
    return w0, w1, w2, w3, bias

@triton.jit
def _conv_pos(pos_ptr, b, t, hi, T, POS: tl.constexpr):
    """doc_pos of row t (0 from hi on) with documents (POS), else 3: every tap of the window is used."""
    if POS:
        return tl.load(pos_ptr + b * T + t, mask=t < hi, other=0).to(tl.int32)
    else:
        return 3

@triton.jit
def _conv_cols(idd, D, BD: tl.constexpr, G: tl.constexpr):
    """The program's BD channels as [BD // G, G], one row per norm group (G = BD without the norm), and their mask."""
    d = idd * BD + tl.arange(0, BD // G)[:, None] * G + tl.arange(0, G)[None, :]
    return d, d < D

# Look-ahead and unrolling (AHEAD, UNROLL of the row kernels): rows t+1 .. t+AHEAD are in flight while row t is
# computed, in AHEAD registers shifted by one each row. Without unrolling the shift is a register copy, and a copy
# of a register whose load is pending waits for it (SASS of the UNROLL = 1 loop: `LDG R16 ... MOV R12, R16` in one
# iteration), so only about one row is in flight; unrolled by a multiple of AHEAD the copies vanish.

@triton.jit
def _short_conv_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, pos_ptr, T, D, sxb, sxt, eps, L: tl.constexpr,
                           BD: tl.constexpr, BIAS: tl.constexpr, NORM: tl.constexpr, G: tl.constexpr,
                           AHEAD: tl.constexpr, UNROLL: tl.constexpr, POS: tl.constexpr):
    # One program: BD channels of L consecutive rows, walked one row at a time with the window (x_{t-3}, x_{t-2},
    # x_{t-1}) in registers, so that every x is read once; the next AHEAD (4 or 8) rows are loaded ahead.
    # POS (documents): the row's doc_pos [B, T] masks the taps that reach into an earlier document.
    idd, b, seg = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    d, dm = _conv_cols(idd, D, BD, G)
    xb, yb = x_ptr + b * sxb, y_ptr + b * T * D
    w0, w1, w2, w3, bias = _conv_weights(w_ptr, b_ptr, d, dm, BIAS)
    t0 = seg * L
    hi = tl.minimum(T, t0 + L)
    xa, xm, xc = _conv_window(xb, t0, sxt, T, d, dm)
    n1, n2, n3, n4 = _conv_ahead(xb, t0, sxt, hi, d, dm)
    if AHEAD == 8:
        n5, n6, n7, n8 = _conv_ahead(xb, t0 + 4, sxt, hi, d, dm)
    for i in tl.range(0, L, loop_unroll_factor=UNROLL):
        t = t0 + i
        x0 = n1.to(tl.float32)
        if AHEAD == 8:
            n1, n2, n3, n4, n5, n6, n7 = n2, n3, n4, n5, n6, n7, n8
            n8 = _conv_ld(xb, t + 8, sxt, 0, hi, d, dm)
        else:
            n1, n2, n3 = n2, n3, n4
            n4 = _conv_ld(xb, t + 4, sxt, 0, hi, d, dm)
        if POS:
            ps = _conv_pos(pos_ptr, b, t, hi, T, POS)
            y = bias + w0 * tl.where(ps >= 3, xa, 0.) + w1 * tl.where(ps >= 2, xm, 0.) + w2 * tl.where(ps >= 1, xc, 0.) \
                + w3 * x0
        else:
            y = bias + w0 * xa + w1 * xm + w2 * xc + w3 * x0
        y = y * tl.sigmoid(y)
        if NORM:  # each row of the [BD // G, G] tile is one group
            y = y * tl.rsqrt(tl.sum(y * y, 1)[:, None] + eps)
        tl.store(yb + t * D + d, y.to(y_ptr.dtype.element_ty), mask=dm & ((t + d * 0) < hi))
        xa, xm, xc = xm, xc, x0

# ---- backward -------------------------------------------------------------------------------------------------------

@triton.jit
def _conv_bwd_row(x0, dy, xa, xm, xc, q1, q2, q3, w0, w1, w2, w3, bias, eps, dxb, sdt, t, t0, T, d, dm, ps,
                  NORM: tl.constexpr, POS: tl.constexpr):
    """Row t of the backward: dp_t from x_t, dy_t and the window; stores dx_{t-3} = q3 + w0 dp_t (complete now)
    when t0 <= t-3 < T. -> dp, dp masked to the taps of lag 1, 2, 3 (d1, d2, d3: dp itself without POS; with it 0
    where the lag exceeds the row's doc_pos ps), and the partial sums of dx shifted by one row (q1, q2, q3)."""
    if POS:
        xa, xm, xc = tl.where(ps >= 3, xa, 0.), tl.where(ps >= 2, xm, 0.), tl.where(ps >= 1, xc, 0.)
    p = bias + w0 * xa + w1 * xm + w2 * xc + w3 * x0
    sg = tl.sigmoid(p)
    if NORM:  # dy <- r dy - r^3 (y . dy) y, r = (|y|^2 + eps)^-1/2, per row of the [BD // G, G] tile
        y = p * sg
        r = tl.rsqrt(tl.sum(y * y, 1)[:, None] + eps)
        dy = r * dy - (r * r * r) * tl.sum(y * dy, 1)[:, None] * y
    dp = dy * sg * (1 + p * (1 - sg))   # silu'(p) = sigmoid(p) (1 + p (1 - sigmoid(p))); dy = 0 past the end
    if POS:
        d1, d2, d3 = tl.where(ps >= 1, dp, 0.), tl.where(ps >= 2, dp, 0.), tl.where(ps >= 3, dp, 0.)
    else:
        d1, d2, d3 = dp, dp, dp
    tl.store(dxb + (t - 3) * sdt + d, (q3 + w0 * d3).to(dxb.dtype.element_ty),
             mask=dm & ((t - 3 + d * 0) >= t0) & ((t - 3 + d * 0) < T))
    return dp, d1, d2, d3, w3 * dp, q1 + w2 * d1, q2 + w1 * d2

@triton.jit
def _conv_bwd_item(x_ptr, dy_ptr, dx_ptr, pos_ptr, j, NS, T, D, sxb, sxt, sdb, sdt, eps, d, dm, w0, w1, w2, w3, bias,
                   a0, a1, a2, a3, ab, L: tl.constexpr, NORM: tl.constexpr, AHEAD: tl.constexpr, UNROLL: tl.constexpr,
                   POS: tl.constexpr):
    """Work item j = (b, segment) of the backward (see _short_conv_bwd_kernel) -> the partial sums a0..a3, ab of
    dw, db with its rows added."""
    zero = tl.zeros_like(w0)
    b = (j // NS).to(tl.int64)
    t0 = (j % NS) * L
    xb, dyb, dxb = x_ptr + b * sxb, dy_ptr + b * T * D, dx_ptr + b * sdb
    hi = tl.minimum(T, t0 + L + 3)     # the rows it reads
    xa, xm, xc = _conv_window(xb, t0, sxt, T, d, dm)
    n1, n2, n3, n4 = _conv_ahead(xb, t0, sxt, hi, d, dm)
    g1, g2, g3, g4 = _conv_ahead(dyb, t0, D, hi, d, dm)
    if AHEAD == 8:
        n5, n6, n7, n8 = _conv_ahead(xb, t0 + 4, sxt, hi, d, dm)
        g5, g6, g7, g8 = _conv_ahead(dyb, t0 + 4, D, hi, d, dm)
    q1, q2, q3 = zero, zero, zero
    for i in tl.range(0, L, loop_unroll_factor=UNROLL):
        t = t0 + i
        x0, dy = n1.to(tl.float32), g1.to(tl.float32)
        if AHEAD == 8:
            n1, n2, n3, n4, n5, n6, n7 = n2, n3, n4, n5, n6, n7, n8
            g1, g2, g3, g4, g5, g6, g7 = g2, g3, g4, g5, g6, g7, g8
            n8 = _conv_ld(xb, t + 8, sxt, 0, hi, d, dm)
            g8 = _conv_ld(dyb, t + 8, D, 0, hi, d, dm)
        else:
            n1, n2, n3, g1, g2, g3 = n2, n3, n4, g2, g3, g4
            n4 = _conv_ld(xb, t + 4, sxt, 0, hi, d, dm)
            g4 = _conv_ld(dyb, t + 4, D, 0, hi, d, dm)
        ps = _conv_pos(pos_ptr, b, t, hi, T, POS)
        dp, d1, d2, d3, q1, q2, q3 = _conv_bwd_row(x0, dy, xa, xm, xc, q1, q2, q3, w0, w1, w2, w3, bias, eps, dxb, sdt,
                                                   t, t0, T, d, dm, ps, NORM, POS)
        a0 += d3 * xa
        a1 += d2 * xm
        a2 += d1 * xc
        a3 += dp * x0
        ab += dp
        xa, xm, xc = xm, xc, x0
    # rows t0+L .. t0+L+2 (already loaded, zeros from T on): complete dx of the item's last three rows
    x0 = n1.to(tl.float32)
    ps = _conv_pos(pos_ptr, b, t0 + L, hi, T, POS)
    dp, d1, d2, d3, q1, q2, q3 = _conv_bwd_row(x0, g1.to(tl.float32), xa, xm, xc, q1, q2, q3, w0, w1, w2, w3, bias,
                                               eps, dxb, sdt, t0 + L, t0, T, d, dm, ps, NORM, POS)
    xa, xm, xc = xm, xc, x0
    x0 = n2.to(tl.float32)
    ps = _conv_pos(pos_ptr, b, t0 + L + 1, hi, T, POS)
    dp, d1, d2, d3, q1, q2, q3 = _conv_bwd_row(x0, g2.to(tl.float32), xa, xm, xc, q1, q2, q3, w0, w1, w2, w3, bias,
                                               eps, dxb, sdt, t0 + L + 1, t0, T, d, dm, ps, NORM, POS)
    ps = _conv_pos(pos_ptr, b, t0 + L + 2, hi, T, POS)
    dp, d1, d2, d3, q1, q2, q3 = _conv_bwd_row(n3.to(tl.float32), g3.to(tl.float32), xm, xc, x0, q1, q2, q3, w0, w1,
                                               w2, w3, bias, eps, dxb, sdt, t0 + L + 2, t0, T, d, dm, ps, NORM, POS)
    return a0, a1, a2, a3, ab

@triton.jit
def _short_conv_bwd_kernel(x_ptr, w_ptr, b_ptr, dy_ptr, dx_ptr, dw_ptr, db_ptr, pos_ptr, T, D, sxb, sxt, sdb, sdt, eps,
                           NS, NW, L: tl.constexpr, BD: tl.constexpr, BIAS: tl.constexpr, NORM: tl.constexpr,
                           G: tl.constexpr, AHEAD: tl.constexpr, UNROLL: tl.constexpr, PERSIST: tl.constexpr,
                           POS: tl.constexpr):
    # Work items: the NW = B * NS segments (b, L rows from t0) of every sequence. Without PERSIST program j of the
    # grid's second axis takes item j; with it, items j, j + NP, j + 2 NP, ... (NP = that axis' size < NW: fewer dw
    # partial sums, longer programs; the loop over items costs registers, hence the switch). An item walks rows
    # tau = t0 .. t0+L+2 in order (three past its L rows: dx_t needs dp_t .. dp_{t+3}), x and dy read once per row
    # with the next AHEAD loaded ahead. After dp_tau: dx_{tau-3} = q3 + w0 dp_tau is complete (stored when it is one
    # of the item's rows), and the partial sums shift: q3 <- q2 + w1 dp, q2 <- q1 + w2 dp, q1 <- w3 dp.
    # dw_j += dp_tau x_{tau-3+j} and db += dp_tau over the item's own rows (dp = 0 past T, so the L-row loop needs no
    # mask); one partial sum per program, summed by the caller (deterministic, no atomics). POS (documents): each
    # row's doc_pos masks its taps (_conv_bwd_row), in dp's products with the window and with the weights alike.
    # x and dx may be column slices of wider [B, T, *] tensors (strides sxb, sxt and sdb, sdt: the parts of one
    # matmul's output, whose gradient is then written whole, with no cat); dy is contiguous [B, T, D].
    idd, pid = tl.program_id(0), tl.program_id(1)
    d, dm = _conv_cols(idd, D, BD, G)
    w0, w1, w2, w3, bias = _conv_weights(w_ptr, b_ptr, d, dm, BIAS)
    a0 = tl.zeros_like(w0)
    a1, a2, a3, ab = a0, a0, a0, a0
    if PERSIST:
        for j in range(pid, NW, tl.num_programs(1)):
            a0, a1, a2, a3, ab = _conv_bwd_item(x_ptr, dy_ptr, dx_ptr, pos_ptr, j, NS, T, D, sxb, sxt, sdb, sdt, eps, d,
                                                dm, w0, w1, w2, w3, bias, a0, a1, a2, a3, ab, L, NORM, AHEAD, UNROLL,
                                                POS)
    else:
        a0, a1, a2, a3, ab = _conv_bwd_item(x_ptr, dy_ptr, dx_ptr, pos_ptr, pid, NS, T, D, sxb, sxt, sdb, sdt, eps, d,
                                            dm, w0, w1, w2, w3, bias, a0, a1, a2, a3, ab, L, NORM, AHEAD, UNROLL, POS)
    tl.store(dw_ptr + pid * 4 * D + d, a0, mask=dm)
    tl.store(dw_ptr + pid * 4 * D + D + d, a1, mask=dm)
    tl.store(dw_ptr + pid * 4 * D + 2 * D + d, a2, mask=dm)
    tl.store(dw_ptr + pid * 4 * D + 3 * D + d, a3, mask=dm)
    if BIAS:
        tl.store(db_ptr + pid * D + d, ab, mask=dm)

# ---- the custom ops (kernels::short_conv_fwd, short_conv_bwd) -------------------------------------------------------

def _conv_rows(x):
    """(x, batch stride, row stride): x may be a column slice of a wider [B, T, *] (Mamba2's xBC) but its channels
    must be contiguous; anything else is copied once."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x, x.stride(0), x.stride(1)

def _conv_cfg(cfg, T, D, norm):
    """-> rows L (at most T rounded up to a power of two), channels BD, group G (the norm's, else BD), the
    constexprs (AHEAD, UNROLL) and the launch options."""
    BD = norm * min(cfg['heads'], triton.next_power_of_2(D // norm)) if norm else cfg['BD']
    if cfg['ahead'] not in (4, 8):
        raise ValueError(f"short_conv: the row kernels load 4 or 8 rows ahead, got ahead={cfg['ahead']}")
    return min(cfg['L'], triton.next_power_of_2(T)), BD, (norm or BD), (cfg['ahead'], cfg['unroll']), dict(
        num_warps=cfg['warps'])

def _conv_parts(sizes, norms):
    """-> (first column, last column + 1, norm group) of each part of a split conv"""
    ends = list(itertools.accumulate(sizes))
    return [(c1 - n, c1, g) for n, c1, g in zip(sizes, ends, norms)]

@torch.library.custom_op("kernels::short_conv_fwd", mutates_args=())
def _short_conv_fwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], sizes: list[int],
                    norms: list[int], doc_pos: Optional[torch.Tensor] = None) -> list[torch.Tensor]:
    """x [B, T, sum(sizes)] -> one contiguous y [B, T, D] per part (D = sizes[i], from its columns of x, weight and
    bias, norm groups norms[i]; 0: none), each read straight from its column slice of x."""
    B, T, _ = x.shape
    ys = []
    for c0, c1, norm in _conv_parts(sizes, norms):
        xs, sxb, sxt = _conv_rows(x[..., c0:c1])
        D = c1 - c0
        y = torch.empty(B, T, D, device=x.device, dtype=x.dtype)
        L, BD, G, ahead_unroll, opts = _conv_cfg(TUNING['conv_fwd'], T, D, norm)
        _short_conv_fwd_kernel[(triton.cdiv(D, BD), B, triton.cdiv(T, L))](
            xs, weight[c0:c1].contiguous(), bias[c0:c1] if bias is not None else weight, y,
            doc_pos.contiguous() if doc_pos is not None else weight, T, D, sxb, sxt, NORM_EPS, L, BD,
            bias is not None, norm > 0, G, *ahead_unroll, doc_pos is not None, **opts)
        ys.append(y)
    return ys

@_short_conv_fwd.register_fake
def _(x, weight, bias, sizes, norms, doc_pos=None):
    return [x.new_empty(x.shape[0], x.shape[1], n) for n in sizes]

@torch.library.custom_op("kernels::short_conv_bwd", mutates_args=())
def _short_conv_bwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], sizes: list[int],
                    norms: list[int], dys: list[torch.Tensor], doc_pos: Optional[torch.Tensor] = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> dx [B, T, sum(sizes)] (x's dtype; each part's kernel writes its columns: no cat of the parts' gradients),
    dw fp32 [sum(sizes), 4], db fp32 [sum(sizes)] (empty without a bias)."""
    B, T, DX = x.shape
    dx = torch.empty(B, T, DX, device=x.device, dtype=x.dtype)
    dw = torch.empty(DX, 4, device=x.device, dtype=torch.float32)
    db = torch.empty(DX if bias is not None else 0, device=x.device, dtype=torch.float32)
    for (c0, c1, norm), dy in zip(_conv_parts(sizes, norms), dys):
        xs, sxb, sxt = _conv_rows(x[..., c0:c1])
        dy = dy.contiguous()
        D = c1 - c0
        L, BD, G, ahead_unroll, opts = _conv_cfg(TUNING['conv_bwd'], T, D, norm)
        NS = triton.cdiv(T, L)
        NW = B * NS                                      # work items (b, segment)
        NP = min(NW, TUNING['conv_bwd']['parts'] or NW, 65535)    # programs along the rows = partial sums per channel
        pw = torch.empty(NP, 4, D, device=x.device, dtype=torch.float32)
        pb = torch.empty(NP, D, device=x.device, dtype=torch.float32) if bias is not None else pw
        _short_conv_bwd_kernel[(triton.cdiv(D, BD), NP)](
            xs, weight[c0:c1].contiguous(), bias[c0:c1] if bias is not None else weight, dy, dx[..., c0:c1], pw, pb,
            doc_pos.contiguous() if doc_pos is not None else weight, T, D, sxb, sxt, dx.stride(0), dx.stride(1),
            NORM_EPS, NS, NW, L, BD, bias is not None, norm > 0, G, *ahead_unroll, NP < NW, doc_pos is not None,
            **opts)
        _column_sums(pw, D, 4, dw[c0:c1])
        if bias is not None:
            _column_sums(pb, D, 1, db[c0:c1])
    return dx, dw, db

@_short_conv_bwd.register_fake
def _(x, weight, bias, sizes, norms, dys, doc_pos=None):
    f32 = torch.float32
    return x.new_empty(x.shape), weight.new_empty(weight.shape, dtype=f32), x.new_empty(
        (0,) if bias is None else bias.shape, dtype=f32)

class _ShortConv(torch.autograd.Function):
    """The autograd node of the two ops: a Function rather than register_autograd, whose backward does not take a
    list of tensors as an op's output (torch 2.13 checks its structure against the inputs' and fails)."""

    @staticmethod
    def forward(ctx, x, weight, bias, sizes, norms, doc_pos):
        ctx.save_for_backward(x, weight, bias, doc_pos)
        ctx.sizes, ctx.norms = sizes, norms
        return tuple(_short_conv_fwd(x, weight, bias, sizes, norms, doc_pos))

    @staticmethod
    def backward(ctx, *dys):
        x, weight, bias, doc_pos = ctx.saved_tensors
        dx, dw, db = _short_conv_bwd(x, weight, bias, ctx.sizes, ctx.norms, list(dys), doc_pos)
        return dx, dw.to(weight.dtype), None if bias is None else db.to(bias.dtype), None, None, None

# =====================================================================================================================
# 4. The decode steps: one token, the state updated in place; the torch version (any device and dtype), then the
# Triton step: one program per (V-tile, b, h) keeps its state tile in registers, one read and one write of it
# =====================================================================================================================

# ---- the delta rule: S <- Diag(exp g) S;  e = beta (v - S^T k);  S <- S + k e^T;  o = s S^T q -----------------------

def delta_rule_step_torch(q, k, v, beta, g, state, scale=None):
    _check_delta_rule("delta_rule_step", q, k, v, beta, g, state, step=True)
    dt = state.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = q.to(dt), k.to(dt)
    if g is not None:  # [B, H] -> [B, H, 1, 1];  [B, H, Dk] -> [B, H, Dk, 1] (rows of S are key channels)
        state.mul_(g.to(dt).exp()[..., None, None] if g.ndim == 2 else g.to(dt).exp()[..., None])
    err = beta.to(dt)[..., None] * (v.to(dt) - torch.einsum("bhk,bhkv->bhv", k, state))  # against the decayed state
    state.add_(k[:, :, :, None] * err[:, :, None, :])
    return (scale * torch.einsum("bhk,bhkv->bhv", q, state)).to(v.dtype)

@triton.jit
def _step_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, s_ptr, o_ptr, scale,
                 DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr):
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    ck = tl.arange(0, DK)
    cv = iv * BV + tl.arange(0, BV)
    q = tl.load(q_ptr + bh * DK + ck).to(tl.float32)
    k = tl.load(k_ptr + bh * DK + ck).to(tl.float32)
    v = tl.load(v_ptr + bh * DV + cv).to(tl.float32)
    beta = tl.load(beta_ptr + bh).to(tl.float32)
    s_offs = bh * DK * DV + ck[:, None] * DV + cv[None, :]
    S = tl.load(s_ptr + s_offs)
    if GATE == GATE_SCALAR:  # GDN: one decay for the whole state
        S = S * tl.exp(tl.load(g_ptr + bh).to(tl.float32))
    if GATE == GATE_CHANNEL:  # KDA: one decay per key channel, a row of S
        S = S * tl.exp(tl.load(g_ptr + bh * DK + ck).to(tl.float32))[:, None]
    e = beta * (v - tl.sum(S * k[:, None], 0))   # error against the decayed state (decay first)
    S += k[:, None] * e[None, :]
    o = scale * tl.sum(S * q[:, None], 0)
    tl.store(s_ptr + s_offs, S)
    tl.store(o_ptr + bh * DV + cv, o.to(o_ptr.dtype.element_ty))

@torch.library.custom_op("kernels::delta_rule_step", mutates_args=("state",))
def _delta_rule_step_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                        g: Optional[torch.Tensor], state: torch.Tensor, scale: float) -> torch.Tensor:
    B, H, DK = k.shape
    DV = v.shape[-1]
    GATE = _gate_kind(g, k)[0]
    q, k, v, beta = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous()
    o = torch.empty_like(v)
    BV = min(DV, TUNING['step']['v'])
    _step_kernel[(DV // BV, B * H)](q, k, v, beta, g.contiguous() if g is not None else beta, state, o, scale,
                                    DK, DV, BV, GATE)
    return o

@_delta_rule_step_op.register_fake
def _(q, k, v, beta, g, state, scale):
    return v.new_empty(v.shape)

def delta_rule_step_triton(q, k, v, beta, g, state, scale=None):
    """One delta-rule decode step through the Triton kernel (custom op; state fp32, contiguous, updated in place)."""
    _check_delta_rule("delta_rule_step", q, k, v, beta, g, state, step=True)
    why = _triton_unsupported(q, v, state)
    if why:
        _fail("delta_rule_step", why)
    return _delta_rule_step_op(q, k, v, beta, g, state, q.shape[-1] ** -0.5 if scale is None else float(scale))

# ---- the delta rule's whole step, from the projections: q, k = L2(silu(conv(q))), L2(silu(conv(k))) per head,
# v = silu(conv(v)), beta = sigmoid(beta logit), g (or decay_gate(u)), then the step above: one kernel on CUDA ---------

OUT_GATES = (None, "sigmoid", "silu")  # delta_rule_decode's gate_fn (the kernel's OUT_GATE: its index)

def delta_rule_decode_torch(q, k, v, conv_states, conv_weights, beta, g, state, scale=None, A_log=None, dt_bias=None,
                            lower_bound=None, norm=None, gate=None, gate_fn=None):
    """The steps one by one: short_conv_step_torch for q, k, v, delta_rule_step_torch, then the RMSNorm per head and
    the output gate in fp32."""
    B, H, Dk, Dv = state.shape
    (sq, sk, sv), (wq, wk, wv) = conv_states, conv_weights
    q = short_conv_step_torch(q, sq, wq, norm=Dk).view(B, H, Dk)
    k = short_conv_step_torch(k, sk, wk, norm=Dk).view(B, H, Dk)
    v = short_conv_step_torch(v, sv, wv).view(B, H, Dv)
    if g is not None:
        g = g.view(B, H, -1) if g.shape[1] != H else g
        if A_log is not None:
            g = decay_gate(g[:, None], A_log, dt_bias, lower_bound)[:, 0]
    o = delta_rule_step_torch(q, k, v, torch.sigmoid(beta.float()), g, state, scale)
    if norm is None and gate is None:
        return o
    o = o.float() if norm is None else F.rms_norm(o.float(), (Dv,), norm[0].float(), norm[1])
    if gate is not None:
        z = gate.float().view(B, H, Dv)
        o = o * (torch.sigmoid(z) if gate_fn == "sigmoid" else F.silu(z))
    return o.to(v.dtype)

@triton.jit
def _conv_silu(x_ptr, s_ptr, w_ptr, c, D, SHIFT: tl.constexpr):
    # silu of the width-4 causal conv of channels c over the window (s0, s1, s2, x) in fp32; SHIFT: the state ->
    # (s1, s2, x) here. -> (silu, s1, s2, x): what a later _conv_shift writes
    s0 = tl.load(s_ptr + c)
    s1 = tl.load(s_ptr + D + c)
    s2 = tl.load(s_ptr + 2 * D + c)
    x = tl.load(x_ptr + c)
    p = (tl.load(w_ptr + c * 4 + 0).to(tl.float32) * s0.to(tl.float32)
         + tl.load(w_ptr + c * 4 + 1).to(tl.float32) * s1.to(tl.float32)
         + tl.load(w_ptr + c * 4 + 2).to(tl.float32) * s2.to(tl.float32)
         + tl.load(w_ptr + c * 4 + 3).to(tl.float32) * x.to(tl.float32))
    if SHIFT:
        _conv_shift(s_ptr, c, D, s1, s2, x)
    return p * tl.sigmoid(p), s1, s2, x

@triton.jit
def _conv_shift(s_ptr, c, D, s1, s2, x):
    tl.debug_barrier()  # every thread's loads before any store (a value may be held by several threads)
    tl.store(s_ptr + c, s1)
    tl.store(s_ptr + D + c, s2)
    tl.store(s_ptr + 2 * D + c, x.to(s_ptr.dtype.element_ty))

@triton.jit
def _decode_gate(g_ptr, A_ptr, bias_ptr, lb, h, c, GATE_FN: tl.constexpr):
    # the log-decay at columns c of head h: g as given (GATE_FN 0), or formed from its input u = g:
    # -exp(A_h) softplus(u + b_c) (1), lb sigmoid(exp(A_h) (u + b_c)) (2)
    g = tl.load(g_ptr + c).to(tl.float32)
    if GATE_FN:
        x = g + tl.load(bias_ptr + c).to(tl.float32)
        a = tl.exp(tl.load(A_ptr + h).to(tl.float32))
        if GATE_FN == 1:
            g = -a * _softplus(x)
        else:
            g = lb * tl.sigmoid(a * x)
    return g

@triton.jit
def _out_gate(o, z_ptr, c, OUT_GATE: tl.constexpr):
    # o * sigmoid(z) (1) or o * silu(z) (2)
    z = tl.load(z_ptr + c).to(tl.float32)
    if OUT_GATE == 1:
        return o * tl.sigmoid(z)
    return o * z * tl.sigmoid(z)

@triton.jit(do_not_specialize=["H", "sq", "sk", "sv", "sb", "sg", "sz"])
def _decode_kernel(q_ptr, k_ptr, v_ptr, sq, sk, sv, cq_ptr, ck_ptr, cv_ptr, wq_ptr, wk_ptr, wv_ptr, b_ptr, sb,
                   g_ptr, sg, A_ptr, bias_ptr, lb, s_ptr, o_ptr, o32_ptr, t_ptr, scale, eps, nw_ptr, n_eps, z_ptr,
                   sz, H, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr,
                   GATE_FN: tl.constexpr, NORM: tl.constexpr, OUT_GATE: tl.constexpr):
    # One program per (V-tile, b, h): more programs than heads at batch 1, where one per head leaves the GPU idle.
    # Every V-tile of a head forms the whole q and k (their convs, norms) and the whole gate; it owns its columns of
    # v's conv window and of the state. q's and k's windows are shared by the head's tiles, so the last tile to
    # finish (a ticket per head, taken after every tile's reads) shifts them, and forms the head's RMSNorm from the
    # tiles' outputs (o32) when there is one; it then puts the ticket back to 0 for the next step.
    # q, k, v, beta, g, z: row b at b * (its row stride): column slices of one [B, .] projection output, or not
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    NV: tl.constexpr = DV // BV
    ck = h * DK + tl.arange(0, DK)
    cv = h * DV + iv * BV + tl.arange(0, BV)
    q, q1, q2, qx = _conv_silu(q_ptr + b * sq, cq_ptr + b * 3 * H * DK, wq_ptr, ck, H * DK, NV == 1)
    k, k1, k2, kx = _conv_silu(k_ptr + b * sk, ck_ptr + b * 3 * H * DK, wk_ptr, ck, H * DK, NV == 1)
    v, _, _, _ = _conv_silu(v_ptr + b * sv, cv_ptr + b * 3 * H * DV, wv_ptr, cv, H * DV, True)
    q = q * tl.rsqrt(tl.sum(q * q, 0) + eps)
    k = k * tl.rsqrt(tl.sum(k * k, 0) + eps)
    beta = tl.sigmoid(tl.load(b_ptr + b * sb + h).to(tl.float32))
    s_offs = bh * DK * DV + tl.arange(0, DK)[:, None] * DV + iv * BV + tl.arange(0, BV)[None, :]
    S = tl.load(s_ptr + s_offs)
    if GATE == GATE_SCALAR:  # GDN: one log-decay for the head
        S = S * tl.exp(_decode_gate(g_ptr + b * sg, A_ptr, bias_ptr, lb, h, h, GATE_FN))
    if GATE == GATE_CHANNEL:  # KDA: one per key channel, a row of S
        S = S * tl.exp(_decode_gate(g_ptr + b * sg, A_ptr, bias_ptr, lb, h, ck, GATE_FN))[:, None]
    e = beta * (v - tl.sum(S * k[:, None], 0))   # error against the decayed state (decay first)
    S += k[:, None] * e[None, :]
    o = scale * tl.sum(S * q[:, None], 0)
    tl.store(s_ptr + s_offs, S)
    cvh = tl.arange(0, DV)
    if NORM and NV == 1:  # RMSNorm of the head's output: this program holds all of it
        o = o * tl.rsqrt(tl.sum(o * o, 0) / DV + n_eps) * tl.load(nw_ptr + cvh).to(tl.float32)
    if NORM and NV > 1:  # the last tile normalizes (below)
        tl.store(o32_ptr + bh * DV + iv * BV + tl.arange(0, BV), o)
    else:
        if OUT_GATE:
            o = _out_gate(o, z_ptr + b * sz, cv, OUT_GATE)
        tl.store(o_ptr + bh * DV + iv * BV + tl.arange(0, BV), o.to(o_ptr.dtype.element_ty))
    if NV > 1:
        tl.debug_barrier()  # this program's reads of the windows and writes of o32 before its ticket (release)
        if tl.atomic_add(t_ptr + bh, 1) == NV - 1:  # the last tile of head (b, h): every other one has read
            tl.debug_barrier()
            _conv_shift(cq_ptr + b * 3 * H * DK, ck, H * DK, q1, q2, qx)
            _conv_shift(ck_ptr + b * 3 * H * DK, ck, H * DK, k1, k2, kx)
            if NORM:
                oh = tl.load(o32_ptr + bh * DV + cvh, cache_modifier=".cg")  # the tiles' outputs (not from L1)
                oh = oh * tl.rsqrt(tl.sum(oh * oh, 0) / DV + n_eps) * tl.load(nw_ptr + cvh).to(tl.float32)
                if OUT_GATE:
                    oh = _out_gate(oh, z_ptr + b * sz, h * DV + cvh, OUT_GATE)
                tl.store(o_ptr + bh * DV + cvh, oh.to(o_ptr.dtype.element_ty))
            tl.store(t_ptr + bh, 0)

# device -> int32 zeros, one ticket per (b, h): _decode_kernel puts each back to 0 when done. One stream at a time
# uses them (a Decoder's steps, or the layers of a forward, run in order); a grown buffer keeps the old one alive,
# as a captured CUDA graph may still use it
_TICKETS, _OLD_TICKETS = {}, []

def _tickets(n, device):
    t = _TICKETS.get(device)
    if t is None or t.numel() < n:
        if device.type == 'cuda' and torch.cuda.is_current_stream_capturing():  # (its zeros would not be written yet)
            raise RuntimeError(f"delta_rule_decode: run one step of batch x heads = {n} before capturing a CUDA graph")
        if t is not None:
            _OLD_TICKETS.append(t)
        t = _TICKETS[device] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return t

def _decode_v_tile(B, H, DV, device):
    """The V-tile of _decode_kernel: TUNING['step']['decode_v'], or (None) the widest that still gives about two
    programs per SM, not below 16 columns."""
    bv = TUNING['step']['decode_v']
    if bv is not None and not (isinstance(bv, int) and bv > 0 and bv & (bv - 1) == 0):
        raise ValueError(f"TUNING['step']['decode_v'] must be a power of two (or None: picked), not {bv!r}")
    if bv is None:
        bv = DV
        while bv > 16 and (DV // bv) * B * H < 2 * _sm_count(device):
            bv //= 2
    return min(DV, bv)

@torch.library.custom_op("kernels::delta_rule_decode",
                         mutates_args=("conv_q", "conv_k", "conv_v", "state"))
def _delta_rule_decode_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, conv_q: torch.Tensor,
                          conv_k: torch.Tensor, conv_v: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
                          w_v: torch.Tensor, beta: torch.Tensor, g: Optional[torch.Tensor],
                          A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor], state: torch.Tensor,
                          scale: float, lower_bound: float, norm_weight: Optional[torch.Tensor], norm_eps: float,
                          gate: Optional[torch.Tensor], gate_fn: int) -> torch.Tensor:
    B, H, DK, DV = state.shape
    GATE = int(GATE_NONE) if g is None else int(GATE_SCALAR) if g.shape[1] == H else int(GATE_CHANNEL)
    GATE_FN = 0 if A_log is None else 1 if lower_bound == 0. else 2
    BV = _decode_v_tile(B, H, DV, state.device)
    o = v.new_empty(B, H, DV)
    o32 = torch.empty(B, H, DV, dtype=torch.float32, device=v.device) if norm_weight is not None and BV < DV else o
    warps = 8 if DK * BV >= 128 * 128 else 4
    some = lambda t: beta if t is None else t.contiguous()  # (an absent tensor: any pointer, never read)
    _decode_kernel[(DV // BV, B * H)](q, k, v, q.stride(0), k.stride(0), v.stride(0), conv_q, conv_k, conv_v,
                                      w_q.contiguous(), w_k.contiguous(), w_v.contiguous(), beta, beta.stride(0),
                                      g if g is not None else beta, g.stride(0) if g is not None else 0, some(A_log),
                                      some(dt_bias), lower_bound, state, o, o32, _tickets(B * H, state.device),
                                      scale, NORM_EPS, some(norm_weight), norm_eps,
                                      gate if gate is not None else beta, gate.stride(0) if gate is not None else 0,
                                      H, DK, DV, BV, GATE, GATE_FN, norm_weight is not None, gate_fn,
                                      num_warps=warps)
    return o

@_delta_rule_decode_op.register_fake
def _(q, k, v, conv_q, conv_k, conv_v, w_q, w_k, w_v, beta, g, A_log, dt_bias, state, scale, lower_bound,
      norm_weight, norm_eps, gate, gate_fn):
    return v.new_empty(state.shape[0], state.shape[1], state.shape[3])

# ---- scalar decay: S <- exp(g) S + k v^T;  o = s S^T q  (GLA: S <- Diag(exp g) S + k v^T) ---------------------------

def linear_attn_step_torch(q, k, v, g, state, scale=None):
    _check_linear_attn("linear_attn_step", q, k, v, g, state, step=True)
    H, dt = v.shape[1], state.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = _expand_heads(q[:, None], H)[:, 0].to(dt), _expand_heads(k[:, None], H)[:, 0].to(dt)  # [B, H, Dk]
    if g is not None and g.dim() == 3:  # GLA: [B, H, Dk], the rows of S
        state.mul_(g.to(dt).exp()[..., None])
    elif g is not None:
        state.mul_(g.to(dt).exp().expand(v.shape[:2])[:, :, None, None])  # [H] or [B, H] -> [B, H, 1, 1]
    state.add_(k[:, :, :, None] * v.to(dt)[:, :, None, :])
    return (scale * torch.einsum("bhk,bhkv->bhv", q, state)).to(v.dtype)

@triton.jit(do_not_specialize=["H", "HK"])
def _la_step_kernel(q_ptr, k_ptr, v_ptr, g_ptr, s_ptr, o_ptr, scale, H, HK,
                    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr):
    # S <- exp(g) S + k v^T;  o = scale S^T q.  q, k [B, HK, Dk] (head h reads h // (H // HK)), v [B, H, Dv];
    # g: GATE_SCALAR [B, H] (Mamba2's Δ·A of this token), GATE_CONST [H] (RetNet's log γ), GATE_CHANNEL [B, H, Dk]
    # (GLA: S <- Diag(exp g) S, one decay per row of the state), GATE_NONE none
    iv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    bhk = b * HK + h // (H // HK)
    ck = tl.arange(0, DK)
    cv = iv * BV + tl.arange(0, BV)
    q = tl.load(q_ptr + bhk * DK + ck).to(tl.float32)
    k = tl.load(k_ptr + bhk * DK + ck).to(tl.float32)
    v = tl.load(v_ptr + bh * DV + cv).to(tl.float32)
    s_offs = bh * DK * DV + ck[:, None] * DV + cv[None, :]
    S = tl.load(s_ptr + s_offs)
    if GATE == GATE_SCALAR:
        S = S * tl.exp(tl.load(g_ptr + bh).to(tl.float32))
    if GATE == GATE_CONST:
        S = S * tl.exp(tl.load(g_ptr + h).to(tl.float32))
    if GATE == GATE_CHANNEL:
        S = S * tl.exp(tl.load(g_ptr + bh * DK + ck).to(tl.float32))[:, None]
    S += k[:, None] * v[None, :]
    o = scale * tl.sum(S * q[:, None], 0)
    tl.store(s_ptr + s_offs, S)
    tl.store(o_ptr + bh * DV + cv, o.to(o_ptr.dtype.element_ty))

@torch.library.custom_op("kernels::linear_attn_step", mutates_args=("state",))
def _linear_attn_step_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
                         state: torch.Tensor, scale: float) -> torch.Tensor:
    B, HK, DK = k.shape
    H, DV = v.shape[1:]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(v)
    BV = min(DV, TUNING['step']['v'])
    GATE = int(GATE_CHANNEL) if g is not None and g.dim() == 3 else _decay_kind(g)  # [B, H, Dk]: GLA
    _la_step_kernel[(DV // BV, B * H)](q, k, v, g.contiguous() if g is not None else v, state, o, scale, H, HK,
                                       DK, DV, BV, GATE)
    return o

@_linear_attn_step_op.register_fake
def _(q, k, v, g, state, scale):
    return v.new_empty(v.shape)

def linear_attn_step_triton(q, k, v, g, state, scale=None):
    """One scalar-decay decode step through the Triton kernel (custom op; state fp32, contiguous, updated in place)."""
    _check_linear_attn("linear_attn_step", q, k, v, g, state, step=True)
    why = _triton_unsupported(q, v, state)
    if why:
        _fail("linear_attn_step", why)
    return _linear_attn_step_op(q, k, v, g, state, q.shape[-1] ** -0.5 if scale is None else float(scale))

# ---- the short conv: the last 3 raw inputs are the state; one token shifts it by one --------------------------------

def short_conv_step_torch(x, state, weight, bias=None, norm=0):
    """One token: x [B, D], state [B, W-1, D] (the last W-1 raw inputs, updated in place) -> y [B, D]."""
    window = torch.cat([state, x[:, None].to(state.dtype)], dim=1)            # [B, W, D]
    p = torch.einsum("bwd,dw->bd", window.float(), weight.float())
    if bias is not None:
        p = p + bias.float()
    state.copy_(window[:, 1:])
    y = F.silu(p)
    if norm:
        y = y.unflatten(-1, (-1, norm))
        y = (y * torch.rsqrt(y.pow(2).sum(-1, keepdim=True) + NORM_EPS)).flatten(-2)
    return y.to(x.dtype)

@triton.jit
def _short_conv_step_kernel(x_ptr, s_ptr, w_ptr, b_ptr, y_ptr, D, eps, BD: tl.constexpr, BIAS: tl.constexpr,
                            NORM: tl.constexpr):
    # one token per batch row: y = silu(p) over the window (s0, s1, s2, x); the state becomes (s1, s2, x)
    idd, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    d = idd * BD + tl.arange(0, BD)
    dm = d < D
    sb = s_ptr + b * 3 * D
    s0 = tl.load(sb + d, mask=dm, other=0.)
    s1 = tl.load(sb + D + d, mask=dm, other=0.)
    s2 = tl.load(sb + 2 * D + d, mask=dm, other=0.)
    x = tl.load(x_ptr + b * D + d, mask=dm, other=0.)
    p = (tl.load(w_ptr + d * 4 + 0, mask=dm, other=0.) * s0.to(tl.float32)
         + tl.load(w_ptr + d * 4 + 1, mask=dm, other=0.) * s1.to(tl.float32)
         + tl.load(w_ptr + d * 4 + 2, mask=dm, other=0.) * s2.to(tl.float32)
         + tl.load(w_ptr + d * 4 + 3, mask=dm, other=0.) * x.to(tl.float32))
    if BIAS:
        p += tl.load(b_ptr + d, mask=dm, other=0.)
    tl.debug_barrier()  # every thread's loads before any store (with BD below the threads, several hold one value)
    tl.store(sb + d, s1, mask=dm)
    tl.store(sb + D + d, s2, mask=dm)
    tl.store(sb + 2 * D + d, x.to(s_ptr.dtype.element_ty), mask=dm)
    y = p * tl.sigmoid(p)
    if NORM:
        y = y * tl.rsqrt(tl.sum(y * y, 0) + eps)
    tl.store(y_ptr + b * D + d, y.to(y_ptr.dtype.element_ty), mask=dm)

@torch.library.custom_op("kernels::short_conv_step", mutates_args=("state",))
def _short_conv_step_op(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                        norm: int) -> torch.Tensor:
    B, D = x.shape
    y = torch.empty_like(x)
    x = x.contiguous()
    BD = norm or 128
    _short_conv_step_kernel[(triton.cdiv(D, BD), B)](x, state, weight.contiguous(),
                                                     bias if bias is not None else weight, y, D, NORM_EPS, BD,
                                                     bias is not None, norm > 0)
    return y

@_short_conv_step_op.register_fake
def _(x, state, weight, bias, norm):
    return x.new_empty(x.shape)

# ---- the one-token matmuls: y = x W^T + b for a few rows of x (a decode step's projections and head) ----------------
# At batch 1 a step's matmuls are GEMVs: each reads its weights once, and with ~50 of them a token a kernel's fixed
# cost is what counts. One Triton GEMV, autotuned per shape on the GPU over TUNING['gemv'] (in a Decoder's warm-up,
# before its CUDA graph is captured); with programmatic dependent launch (Hopper and later, TUNING['step']['pdl'])
# it reads its first weight tile, which no earlier kernel writes, before it waits for the kernel before it.

@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, swn, sym, HAS_B: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
    # one program: BN outputs for all M (<= BM) rows, over K in tiles of BK, fp32 sums
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    w = tl.load(w_ptr + rn[:, None] * swn + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.)
    if PDL:  # x is the previous kernel's output: wait for it here, before anything is written; then (not before)
        # let the next kernel start its prologue: a kernel that waits before it triggers keeps the chain ordered
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(x_ptr + rm[:, None] * sxm + (k0 + rk)[None, :], mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K),
                    other=0.)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
        kn = k0 + BK + rk  # the next tile, loaded while this one is summed
        w = tl.load(w_ptr + rn[:, None] * swn + kn[None, :], mask=(rn[:, None] < N) & (kn[None, :] < K), other=0.)
    if HAS_B:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))

@functools.lru_cache(maxsize=None)
def _gemv_tuned(configs):
    return triton.autotune([triton.Config(dict(BN=n, BK=k), num_warps=w) for n, k, w in configs],
                           key=['BM', 'N', 'K', 'HAS_B', 'PDL'])(_gemv_kernel)  # (BM: 1, 2, 4 or 8 rows)

def pdl(device):
    """Whether a decode step's kernels launch with programmatic dependent launch on device (TUNING['step']['pdl'] on
    Hopper or later): the GEMV here, and Inductor's kernels of a Decoder's compiled step."""
    return bool(TUNING['step']['pdl']) and torch.version.hip is None and _cuda_capability(device) >= (9, 0)

@functools.lru_cache(maxsize=None)
def _cuda_capability(device):
    return torch.cuda.get_device_capability(device) if device.type == 'cuda' else (0, 0)

@torch.library.custom_op("kernels::gemv", mutates_args=())
def _gemv_op(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    x, w, b = x.contiguous(), w.contiguous(), None if b is None else b.contiguous()  # (rows of unit stride)
    M, K = x.shape
    N = w.shape[0]
    y = x.new_empty(M, N)
    use_pdl = pdl(x.device)
    args = (x, w, w if b is None else b, y, M, N, K, x.stride(0), w.stride(0), y.stride(0))
    meta = dict(HAS_B=b is not None, BM=max(1, triton.next_power_of_2(M)), PDL=use_pdl)
    if _INTERPRETING:  # (the interpreter cannot time configs: the first)
        n, k, warps = TUNING['gemv'][0]
        _gemv_kernel[(triton.cdiv(N, n),)](*args, **meta, BN=n, BK=k, num_warps=warps)
    else:
        _gemv_tuned(tuple(TUNING['gemv']))[lambda c: (triton.cdiv(N, c['BN']),)](
            *args, **meta, **(dict(launch_pdl=True) if use_pdl else {}))
    return y

@_gemv_op.register_fake
def _(x, w, b):
    return x.new_empty(x.shape[0], w.shape[0])

def linear_step(x, weight, bias=None, path="auto"):
    """F.linear(x, weight, bias) for a decode step: x [..., K] of at most TUNING['step']['gemv'] rows through the GEMV
    above (path 'auto': on CUDA; 'triton': also on CPU under the interpreter; 'torch', 'recurrent': never); anything
    else through F.linear itself: more rows, inputs that need a gradient (the GEMV has no backward), weights not
    contiguous or not already in the input's (autocast's) dtype (the GEMV reads its first weight tile before it waits
    for the kernel before it, so the weights must not be the output of a cast made just before)."""
    check_path(path)
    if path == "triton" and not (HAVE_TRITON and (x.is_cuda or _INTERPRETING)):
        raise UserError("linear_step: kernels='triton' runs on a CUDA GPU, or on CPU with TRITON_INTERPRET=1 set "
                        "before triton is imported: use kernels='auto' or 'torch' here")
    K, rows = x.shape[-1], math.prod(x.shape[:-1])
    dt = torch.get_autocast_dtype('cuda') if x.is_cuda and torch.is_autocast_enabled('cuda') else x.dtype
    if (path not in ("auto", "triton") or (path == "auto" and not x.is_cuda) or not HAVE_TRITON
            or not 0 < rows <= TUNING['step']['gemv'] or K == 0 or weight.numel() >= 2 ** 31
            or dt not in (torch.float16, torch.bfloat16, torch.float32) or not weight.is_contiguous()
            or weight.dtype != dt or (bias is not None and bias.dtype != dt)
            or (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)))):
        return F.linear(x, weight, bias)
    y = _gemv_op(x.reshape(rows, K).to(dt), weight, bias)
    return y.view(*x.shape[:-1], weight.shape[0])

# =====================================================================================================================
# 5. TUNING
# =====================================================================================================================

# Every launch setting of the Triton kernels, read at each launch (nothing reads it at import): a changed value takes
# effect at the next call, as tools/tune.py --tiles and the tests set them. Measured at B8 T4096 H16 D128 bf16 on an
# H100 (the short conv at [8, 4096, 768]); why each value is what it is: notes/perf.md. tools/tune.py checks every
# candidate against the fp64 reference before timing it (Triton 3.6 miscompiles some settings on Hopper). No entry
# changes a result beyond rounding, except the inverse's precision, which the tests' tolerances cover.
TUNING = {
    # the forward hands the backward what it would recompute (W, h[c], Delta; KDA's Kd, Qg; scalar decay: h[c])
    'keep': True,
    # the delta rule's sequential passes: _state_tile (V-tiles, warps), _state_stages, _wu_in_pass (DeltaNet)
    'state': dict(v={0: 32, 1: 64, 2: 64}, warps=4, kda_bwd_warps=8, bwd_warps=None, min_v=32, one_wave_v=16,
                  one_wave_min_t=8192, out_warps=4, stages=2, bwd_stages=2, small_v_stages=3, small_v_bwd_min_k=128,
                  wu_in_pass=64),
    # _grams_block's key tile (KDA: kda_k) and warps; KDA's _grams_chunk (chunk_*; *_d64 at Dk <= 64, None: as above)
    'grams': dict(k=64, kda_k=16, warps=1, chunk_k=32, chunk_warps=4, chunk_maxnreg=128, chunk_k_d64=64,
                  chunk_warps_d64=None),
    # _chunk_cumsum: columns per program and warps
    'cumsum': dict(d=32, warps=2),
    # _wy_fwd: programs a chunk (split_d64 by gate kind at Dk <= 64) and warps (None: by tile size, _warps)
    'wy_fwd': dict(split=2, split_d64={0: 2, 1: 2, 2: 1}, warps=8),
    # _inverse: one-warp programs hide its chain of small dots; its dots' precision by the inputs' (_meta's prec)
    'inverse': dict(warps=1, prec={'bf16': 'tf32', 'tf32': 'tf32x3', 'ieee': 'ieee'}),
    # DeltaNet's and GDN's gradient kernels: V-tile, warps (warps_d64 by gate kind at Dk <= 64), stages by gate kind
    'wy_grads': dict(v=64, warps=8, warps_d64={0: 4, 1: 4}, stages={0: 2, 1: 1}),
    # KDA's backward: _grads_bwd's key tile and warps, _wy_bwd's V-tile, warps and register cap (None: uncapped)
    'kda_grads': dict(k=64, warps=8, wy_v=32, wy_warps=8, wy_maxnreg=None),
    # the decode steps' V-tile (more programs at batch 1); delta_rule_decode's (None: _decode_v_tile picks); the most
    # rows linear_step sends to the GEMV (0: none, cuBLAS for all); programmatic dependent launch (Hopper and later:
    # the GEMV's, and Inductor's kernels in a Decoder's compiled step)
    'step': dict(v=32, decode_v=None, gemv=8, pdl=True),
    # the GEMV's candidates (outputs a program, K-tile, warps), timed per shape on the GPU; the interpreter runs the first
    'gemv': [(4, 256, 2), (2, 512, 2), (4, 512, 4), (8, 256, 4), (8, 512, 4), (16, 128, 4), (16, 256, 8), (32, 128, 8)],
    # scalar decay: passes (_la_state_tiles), output, gradients; fused_fwd: one-pass forwards; *_d64 at Dk <= 64
    'scalar': dict(state_warps=4, state_stages=3, state_cover=1, state_cover_d64=0, state_min_v=32,
                   out_warps=4, out_stages=3, dv_warps=4, dqkg_warps=4,
                   fused_fwd=(int(GATE_NONE), int(GATE_CONST)), fused_warps=4, fused_stages=2, fused_stages_d64=3,
                   group_k=64, group_stages=2),
    # GLA: key and V tiles, warps and stages of _gla_fwd and _gla_bwd (bwd_warps_small below [64, 64] tiles)
    'gla': dict(k=64, v=64, fwd_warps=4, bwd_warps=8, bwd_warps_small=4, fwd_stages=1, bwd_stages=1),
    # the short conv's row kernels: rows, channels (norm: heads), warps, rows ahead (4|8), unroll; parts (0: per item)
    'conv_fwd': dict(L=32, BD=128, heads=1, warps=1, ahead=4, unroll=4),
    'conv_bwd': dict(L=128, BD=128, heads=1, warps=1, ahead=8, unroll=8, parts=0),
}
