"""
Registers, spilled bytes and shared memory of a Triton kernel of kernels.py for Hopper (sm_90a), compiled on a
machine WITHOUT a GPU: Triton lowers to PTX and its bundled ptxas assembles it; nothing is launched. Use it to
compare tile / warp settings before spending GPU time. Indicative only: the compiler here (the local Triton) may
differ from the GPU machine's (Triton 3.6 there), so confirm on the GPU with `python bench.py --profile`.

$ python notes/ptxas_check.py            # the delta-rule state passes and gradient kernels at Dk = Dv = 128, every
                                         # gate kind, a few tilings, bf16 (bf16 dots) and fp32 (IEEE dots) inputs
$ python notes/ptxas_check.py --quick    # bf16 only, fewer tilings
$ python notes/ptxas_check.py --la       # the scalar-decay _la_ kernels as kernels.py launches them (la_launches),
                                         # Dk = Dv = 128 and Dk = 128 / Dv = 64 (Mamba2), Mamba2's gate, bf16 and fp32
Spill bytes are not time: they ranked KDA's backward key tile 16 above 32, and the GPU measured the opposite
(notes/perf.md, 2026-11-23 (c); check and time candidates with notes/delta_tiles.py before choosing).
Before the split (2026-11-23, one kernel _grads_bwd): 255 registers, spill stores 1612 B DeltaNet / 6076 B KDA.
Counts before ptxas_report's `aligned` (pointer arguments 16-byte aligned, as at a launch) came from scalar 2-byte
global accesses and are not comparable: _wy_grads_bwd at Dk = 128, bf16, 8 warps, Triton 3.6, spill stores DeltaNet
1948 -> 428 B, GDN 3614 -> 792 B with it.
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


def ptxas_report(fn, types, constexprs, num_warps, num_stages=1, aligned=True):
    """-> (registers, spill-store bytes, shared KB) of fn compiled for sm_90a. types: {arg: '*bf16' | 'fp32' | ...}
    for the runtime arguments (the rest default to i32); constexprs: {arg: value}. aligned: pointer arguments 16-byte
    aligned, as Triton specialises them at a launch on torch tensors (without it, every global load and store is a
    scalar 2- or 4-byte access with its own address registers, and the counts are far from the GPU's)."""
    names = fn.arg_names
    # constexpr parameters left out take their defaults (e.g. _wy_grads_bwd_kernel's GDN)
    constexprs = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default} | constexprs
    sig = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if aligned and sig[n].startswith("*")}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
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


def la_launches(DK, DV, dt, DECAY):
    """-> [(name, kernel, types, constexprs, warps, stages)]: the scalar-decay kernels with the tiles, warps and stages
    that kernels.py (_la_states, _linear_attn_fwd, _linear_attn_bwd, kernels.LA_TILE) launches them with, and the
    alternative state tiles (key tiles of 64) that small B*H takes."""
    inter = "*bf16" if dt == "*bf16" else "*fp32"  # kernels._storage: h[c], dh[c]
    ptr = lambda names: {n: dt for n in names if n in ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "o_ptr", "dq_ptr",
                                                       "dk_ptr", "dv_ptr")} | {"h_ptr": inter, "dh_ptr": inter}
    f32 = {n: "*fp32" for n in ("g_ptr", "h0_ptr", "ht_ptr", "dht_ptr", "dh0_ptr", "dg_ptr", "dt_ptr", "D_ptr",
                                "ddt_ptr", "dD_ptr")} | {"scale": "fp32"}
    prec = "ieee" if dt == "*fp32" else "bf16"
    T = kernels.LA_TILE
    sbk = DK  # whole Dk rows where the programs cover the SMs (kernels._la_state_tiles)
    tiles = dict(BK=min(DK, 64), BV=min(DV, 64))
    common = dict(DK=DK, DV=DV, C=64, DECAY=DECAY, PREC=prec) | tiles
    out = []
    sw, ss = T['state_warps'], T['state_stages']
    for name, fn, c, warps, stages in (
            ("state_fwd", kernels._la_state_fwd_kernel, dict(HAS_H0=True, STORE_HT=True, BK=sbk), sw, ss),
            ("state_fwd(bk=64)", kernels._la_state_fwd_kernel, dict(HAS_H0=True, STORE_HT=True, BK=min(DK, 64)), sw, ss),
            ("fused_fwd", kernels._la_state_fwd_kernel, dict(HAS_H0=True, STORE_HT=True, BK=DK, OUTPUT=1),
             T['fused_warps'], T['fused_stages']),
            ("output_fwd", kernels._la_output_fwd_kernel, {}, T['out_warps'], T['out_stages']),
            ("state_bwd", kernels._la_state_bwd_kernel, dict(HAS_DHT=True, STORE_DH0=True, BK=sbk), sw, ss),
            ("state_bwd(bk=64)", kernels._la_state_bwd_kernel, dict(HAS_DHT=True, STORE_DH0=True, BK=min(DK, 64)), sw, ss),
            ("dv_bwd", kernels._la_dv_bwd_kernel, {}, T['dv_warps'], 1),
            ("dqkg_bwd", kernels._la_dqkg_bwd_kernel, dict(GROUP=1), T['dqkg_warps'], 1),
            # grouped q/k (Mamba2, 32 heads on one B/C head): key tiles of 64, 2 stages at one V-tile
            ("dqkg_bwd(G32)", kernels._la_dqkg_bwd_kernel, dict(GROUP=32, BK=min(DK, 64)), T['dqkg_warps'],
             2 if DV <= 64 else 1)):
        out.append((name, fn, ptr(fn.arg_names) | f32, common | c, warps, stages))
    return out


def la_report(shapes=((128, 128), (64, 128), (128, 64))):
    """Every kernel of the scalar-decay family as kernels.py launches it (la_launches), at (Dk, Dv) = RetNet's 128 / 128,
    64 / 128 and Mamba2's d_state 128 / head 64."""
    print(f"triton {triton.__version__}; scalar-decay _la_ kernels, DECAY = 1 (Mamba2 gate), sm_90a")
    for (DK, DV), dt in itertools.product(shapes, ("bf16", "fp32")):
        for name, fn, types, c, warps, stages in la_launches(DK, DV, "*" + dt, DECAY=1):
            regs, spill, shared = ptxas_report(fn, types, c, warps, stages)
            print(f"  Dk={DK:3d} Dv={DV:3d} {dt}  {name:15s} warps={warps} stages={stages}: "
                  f"regs {regs:3d}, spill stores {spill:5d} B, shared {shared:3d} KB", flush=True)


def types_for(dtype):
    """argument types of the delta-rule kernels: inputs, h, W, U and the gradients of the inputs in dtype; the
    intermediates (P_qk, A, dP, dL, dh, dDelta, X) in kernels._storage's dtype (bf16 for bf16 inputs); the rest fp32"""
    inter = "*bf16" if dtype == "bf16" else "*fp32"
    t = {n: f"*{dtype}" for n in ("q_ptr", "k_ptr", "v_ptr", "beta_ptr", "h_ptr", "vn_ptr", "do_ptr", "w_ptr", "u_ptr",
                                  "dq_ptr", "dk_ptr", "dv_ptr", "o_ptr")}
    t |= {n: inter for n in ("P_ptr", "A_ptr", "dvn_ptr", "dh_ptr", "dP_ptr", "dL_ptr", "x_ptr")}
    f32 = ("G_ptr", "dbeta_ptr", "dg_ptr", "h0_ptr", "ht_ptr", "dht_ptr", "dh0_ptr")
    return t | {n: "*fp32" for n in f32} | {"scale": "fp32"}


def line(name, gate, tiles, warps, dtype, res):
    regs, spill, shared = res
    flag = "  OVER 227 KB" if shared > SHARED_LIMIT_KB else ""
    print(f"  {name:10s} {['deltanet', 'gdn', 'kda', 'any'][gate]:8s} {dtype:4s} {tiles:14s} warps={warps:2d}: "
          f"regs {regs:3d}, spill stores {spill:6d} B, shared {shared:3d} KB{flag}", flush=True)


if __name__ == "__main__":
    if "--la" in sys.argv:
        la_report()
        sys.exit()
    quick = "--quick" in sys.argv
    print(f"triton {triton.__version__}; delta-rule kernels, Dk = Dv = 128, sm_90a")
    dtypes = ("bf16",) if quick else ("bf16", "fp32")
    for dtype in dtypes:
        prec = "ieee" if dtype == "fp32" else "bf16"
        for gate in (0, 1, 2):
            base = dict(DK=128, DV=128, DG=128 if gate == 2 else 1, C=64, GATE=gate, PREC=prec)
            for BV, warps in [(32, 4), (64, 8)] if quick else [(32, 4), (32, 8), (64, 4), (64, 8)]:
                for name, fn, c in (
                        ("state_fwd+o", kernels._state_fwd_kernel, dict(HAS_H0=True, STORE_HT=True, OUTPUT=True)),
                        ("state_fwd", kernels._state_fwd_kernel, dict(HAS_H0=True, STORE_HT=False, OUTPUT=False)),
                        ("state_bwd", kernels._state_bwd_kernel, dict(HAS_DHT=True, STORE_DH0=True))):
                    res = ptxas_report(fn, types_for(dtype), base | c | dict(BV=BV, DECAYED=gate == 2), warps, 2)
                    line(name, gate, f"BV={BV}", warps, dtype, res)
            if gate < 2:
                for BV, warps in [(32, 8), (32, 16)] if quick else [(32, 4), (32, 8), (32, 16), (64, 8), (16, 8)]:
                    c = {k: v for k, v in base.items() if k != "DG"} | dict(BV=BV, LOG2C=6)
                    res = ptxas_report(kernels._wy_grads_bwd_kernel, types_for(dtype), c, warps)
                    line("wy_grads", gate, f"BV={BV}", warps, dtype, res)
            else:
                res = ptxas_report(kernels._wy_bwd_kernel, types_for(dtype), dict(DV=128, BV=32, C=64, PREC=prec), 8)
                line("wy_bwd", 3, "BV=32", 8, dtype, res)
                for BK, warps in [(32, 8)] if quick else [(32, 8), (32, 4), (64, 8)]:
                    c = {k: v for k, v in base.items() if k != "GATE"} | dict(BK=BK, BV=64, LOG2C=6)
                    res = ptxas_report(kernels._grads_bwd_kernel, types_for(dtype), c, warps)
                    line("grads_bwd", gate, f"BK={BK} BV=64", warps, dtype, res)
