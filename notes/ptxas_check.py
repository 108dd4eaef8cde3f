"""
Registers, spilled bytes and shared memory of a Triton kernel of kernels.py for Hopper (sm_90a), compiled on a
machine WITHOUT a GPU: Triton lowers to PTX and its bundled ptxas assembles it; nothing is launched. Use it to
compare tile / warp settings before spending GPU time. Indicative only: the compiler here (the local Triton) may
differ from the GPU machine's (Triton 3.6 there), so confirm on the GPU with `python bench.py --profile`.

$ python notes/ptxas_check.py            # _grads_bwd_kernel at Dk = Dv = 128, DeltaNet and KDA, a few tilings
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


if __name__ == "__main__":
    types = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "beta_ptr", "h_ptr", "vn_ptr", "do_ptr",
                                  "dq_ptr", "dk_ptr", "dv_ptr")}
    types |= {n: "*fp32" for n in ("G_ptr", "A_ptr", "dvn_ptr", "dh_ptr", "dbeta_ptr", "dg_ptr")} | {"scale": "fp32"}
    print(f"triton {triton.__version__}; _grads_bwd_kernel, Dk = Dv = 128, sm_90a")
    for gate, BK, BV, warps in itertools.product((0, 2), (64, 32), (64, 32), (8,)):
        c = dict(DK=128, DV=128, BK=BK, BV=BV, DG=128 if gate == 2 else 1, C=64, LOG2C=6, GATE=gate, PREC="tf32")
        regs, spill, shared = ptxas_report(kernels._grads_bwd_kernel, types, c, warps)
        print(f"  {['deltanet', 'gdn', 'kda'][gate]:8s} BK={BK:3d} BV={BV:3d} warps={warps}: "
              f"regs {regs:3d}, spill stores {spill:6d} B, shared {shared} KB", flush=True)
