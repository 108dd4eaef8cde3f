"""
The launch recorder: every Triton launch the public calls of kernels.py make, recorded instead of run (kernel name,
argument types, constexpr values, warps, stages). tools/tune.py --ptxas compiles each recorded launch offline for
sm_90a; tests may use LaunchRecorder to see which launches a call makes. Runs on CPU: kernels.py's Triton path takes
CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, which this file sets when run as a script).

    python tools/launches.py 128 bf16,fp32   # one JSON list of the unique launches at Dk = Dv = 128, bf16 and fp32
"""

import inspect
import itertools
import json
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules
import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback
if __name__ == "__main__":  # before kernels.py is imported: its kernels are jitted for the interpreter then
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import triton

import kernels
from benchlib import TUNING_PRESETS, tuned

TORCH_TO_TRITON = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
                   torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
                   torch.bool: "i1"}


class LaunchRecorder:
    """Stands in for a Triton kernel of kernels.py: kernel[grid](*args) records (name, {runtime argument: type},
    {constexpr: value}, warps, stages) and runs nothing."""

    def __init__(self, name, kernel, out):
        params = inspect.signature(kernel.fn).parameters
        self.name, self.out, self.arg_names = name, out, list(params)
        self.constexpr = {n for n, p in params.items() if "constexpr" in str(p.annotation)}
        self.defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}

    def __getitem__(self, grid):
        def launch(*args, num_warps=4, num_stages=3, **kw):
            values = dict(self.defaults) | dict(zip(self.arg_names, args)) | kw
            sig, const = {}, {}
            for n in self.arg_names:
                v = values[n]
                if n in self.constexpr or v is None:
                    const[n] = v
                elif torch.is_tensor(v):
                    sig[n] = "*" + TORCH_TO_TRITON[v.dtype]
                elif isinstance(v, bool):
                    sig[n] = "i1"
                elif isinstance(v, int):
                    sig[n] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
                else:
                    sig[n] = "fp32"
            self.out.append((self.name, sig, const, num_warps, num_stages))
        return launch


def record_launches(D, dtypes, H=4):
    """Every Triton launch of the public calls at Dk = Dv = D, T = 65 (a partial last chunk), B = 1, H heads, in each
    dtype: the delta rule (DeltaNet, GDN, KDA; with and without the gate formed in the kernels) and the scalar decay
    (plain, RetNet, Mamba2 with H heads on one q/k head and dt, D, GLA), forward, backward and decode step; the short conv
    (with and without the norm, bias, documents), forward, backward and step. kernels.py's Triton kernels are replaced
    by LaunchRecorders while they run, so nothing is computed (the calls only allocate by shape) -> the unique
    launches. CPU tensors on the Triton path: needs TRITON_INTERPRET=1. One SM on CPU: the state passes take the tiles
    of a large B*H. Under TUNING_PRESETS 'default' and 'recompute' (kernels they compile differently)."""
    out = []
    found = {n: k for n, k in vars(kernels).items()
             if n.endswith("_kernel") and isinstance(k, triton.runtime.jit.KernelInterface)}
    for n, k in found.items():
        setattr(kernels, n, LaunchRecorder(n, k, out))
    try:
        T = 65
        rnd = lambda *s, dtype=torch.float32: torch.randn(*s, dtype=dtype, requires_grad=True)
        for dtype, preset in itertools.product(dtypes, ("default", "recompute")):
            with tuned(TUNING_PRESETS[preset]):
                for gate, fn in itertools.product((None, "gdn", "kda"), (False, True)):
                    if fn and gate is None:
                        continue
                    g = None if gate is None else rnd(*((1, T, H) if gate == "gdn" else (1, T, H, D)))
                    gate_fn = dict(A_log=rnd(H), dt_bias=rnd(*g.shape[2:])) if fn else {}
                    o, ht = kernels.delta_rule_triton(rnd(1, T, H, D, dtype=dtype), rnd(1, T, H, D, dtype=dtype),
                                                      rnd(1, T, H, D, dtype=dtype), rnd(1, T, H, dtype=dtype), g,
                                                      initial_state=rnd(1, H, D, D), output_final_state=True, **gate_fn)
                    (o.float().sum() + ht.sum()).backward()
                    gs = None if g is None else g.detach()[:, 0]
                    kernels.delta_rule_step_triton(*(torch.zeros(1, H, D, dtype=dtype) for _ in "qkv"),
                                                   torch.zeros(1, H, dtype=dtype), gs, torch.zeros(1, H, D, D))
                for gate in (None, "retnet", "mamba2", "gla"):
                    hk = 1 if gate in ("mamba2", "gla") else H
                    g = {None: None, "retnet": torch.full((H,), -0.1), "mamba2": -rnd(1, T, H).detach().abs(),
                         "gla": -rnd(1, T, H, D).detach().abs()}[gate]
                    ssd = dict(dt=rnd(1, T, H), D=rnd(H)) if gate == "mamba2" else {}
                    o, ht = kernels.linear_attn_triton(rnd(1, T, hk, D, dtype=dtype), rnd(1, T, hk, D, dtype=dtype),
                                                       rnd(1, T, H, D, dtype=dtype), g, initial_state=rnd(1, H, D, D),
                                                       output_final_state=True, **ssd)
                    (o.float().sum() + ht.sum()).backward()
                    gs = None if g is None else (g if g.dim() == 1 else g[:, 0])
                    z = lambda *shape: torch.zeros(*shape, dtype=dtype)
                    kernels.linear_attn_step_triton(z(1, hk, D), z(1, hk, D), z(1, H, D), gs, torch.zeros(1, H, D, D))
                for norm, bias, pos in ((0, False, False), (16, True, False), (0, True, True)):
                    x = rnd(2, T, 64, dtype=dtype)
                    doc_pos = torch.zeros(2, T, dtype=torch.uint8) if pos else None
                    kernels.short_conv(x, rnd(64, 4), rnd(64) if bias else None, norm=norm, path="triton",
                                       doc_pos=doc_pos).float().sum().backward()
                    kernels.short_conv_step(x.detach()[:, 0], torch.zeros(2, 3, 64, dtype=dtype), rnd(64, 4).detach(),
                                            None, norm=norm, path="triton")
    finally:
        for n, k in found.items():
            setattr(kernels, n, k)
    unique = {json.dumps(launch, sort_keys=True): launch for launch in out}
    return list(unique.values())


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(json.dumps(record_launches(int(sys.argv[1]), [DTYPES[d] for d in sys.argv[2].split(",")])))
