"""
Registers, spilled bytes and shared memory of a Triton kernel of kernels.py for Hopper (sm_90a), compiled on a
machine WITHOUT a GPU: Triton lowers to PTX and its bundled ptxas assembles it; nothing is launched. Use it to
compare tile / warp settings before spending GPU time. Indicative only: the compiler here (the local Triton) may
differ from the GPU machine's (Triton 3.6 there), so confirm on the GPU with `python bench.py --profile`.

$ python notes/ptxas_check.py            # the two delta-rule gradient kernels at Dk = Dv = 128, DeltaNet and KDA,
                                         # a few tilings, bf16 (tf32 dots) and fp32 (IEEE dots) inputs
$ python notes/ptxas_check.py --quick    # bf16 only, the tilings kernels.py uses (and GDN)
Before the split (2026-11-23, one kernel _grads_bwd): 255 registers, spill stores 1612 B DeltaNet / 6076 B KDA.
"""
import itertools
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile for real (the tests' interpreter would skip the compiler)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import kernels  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SHARED_LIMIT_KB = 227  # Hopper's shared memory per block


def ptxas_report(fn, types, constexprs, num_warps, num_stages=1):
    """-> (registers, spill-store bytes, shared KB) of fn compiled for sm_90a. types: {arg: '*bf16' | 'fp32' | ...}
    for the runtime arguments (the rest default to i32); constexprs: {arg: value}."""
    names = fn.arg_names
    sig = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in constexprs.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as f:
            f.write(k.asm["ptx"])
        out = ""
        for ptxas in ("ptxas", "ptxas-blackwell"):  # the first that accepts this PTX version
            p = subprocess.run([os.path.join(BIN, ptxas), "-v", "-arch=sm_90a", "k.ptx", "-o", "k.cubin"], cwd=d,
                               capture_output=True, text=True)
            out = p.stderr
            if p.returncode == 0:
                break
    regs, spill = re.search(r"Used (\d+) registers", out), re.search(r"(\d+) bytes spill stores", out)
    if not regs:
        raise RuntimeError(f"ptxas failed:\n{out[-500:]}")
    return int(regs.group(1)), int(spill.group(1)) if spill else 0, k.metadata.shared // 1024


def types_for(dtype):
    """argument types of the backward kernels: inputs, h and the gradients of the inputs in dtype, the rest fp32"""
    t = {n: f"*{dtype}" for n in ("q_ptr", "k_ptr", "v_ptr", "beta_ptr", "h_ptr", "vn_ptr", "do_ptr",
                                  "dq_ptr", "dk_ptr", "dv_ptr")}
    f32 = ("G_ptr", "A_ptr", "dvn_ptr", "dh_ptr", "dbeta_ptr", "dg_ptr", "dP_ptr", "dL_ptr", "x_ptr")
    return t | {n: "*fp32" for n in f32} | {"scale": "fp32"}


def line(name, gate, tiles, warps, dtype, res):
    regs, spill, shared = res
    flag = "  OVER 227 KB" if shared > SHARED_LIMIT_KB else ""
    print(f"  {name:10s} {['deltanet', 'gdn', 'kda', 'any'][gate]:8s} {dtype:4s} {tiles:14s} warps={warps:2d}: "
          f"regs {regs:3d}, spill stores {spill:6d} B, shared {shared:3d} KB{flag}", flush=True)


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    print(f"triton {triton.__version__}; delta-rule backward kernels, Dk = Dv = 128, sm_90a")
    dtypes = ("bf16",) if quick else ("bf16", "fp32")
    for dtype in dtypes:
        prec = "ieee" if dtype == "fp32" else "tf32"
        # _wy_bwd does not depend on the gate or on Dk
        for BV, warps in [(32, 8)] if quick else [(64, 4), (64, 8), (32, 4), (32, 8), (16, 8)]:
            res = ptxas_report(kernels._wy_bwd_kernel, types_for(dtype), dict(DV=128, BV=BV, C=64, PREC=prec), warps)
            line("_wy_bwd", 3, f"BV={BV}", warps, dtype, res)
        for gate in (0, 1, 2) if quick else (0, 2):
            base = dict(DK=128, DV=128, DG=128 if gate == 2 else 1, C=64, GATE=gate, PREC=prec, LOG2C=6)
            if quick:
                settings = [(*kernels._bwd_key_tile(128, gate), 64)]
            else:
                settings = list(itertools.product((64, 32, 16), (4, 8), (64, 32)))
            for BK, warps, BV in settings:
                res = ptxas_report(kernels._grads_bwd_kernel, types_for(dtype), base | dict(BK=BK, BV=BV), warps)
                line("_grads_bwd", gate, f"BK={BK} BV={BV}", warps, dtype, res)
