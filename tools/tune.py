"""
The tile tuner and the ptxas report of kernels.py's Triton kernels. --tiles checks kernels.TUNING's candidates of one
family (TILE_CANDIDATES: the delta rule, the scalar decay, the short conv) against the fp64 reference, each in its
own process, then times those that pass next to 'default' (CUDA; on CPU the checks only, through Triton's
interpreter). --ptxas compiles every launch of the public calls offline for sm_90a (no GPU needed) and reports
registers, spills and shared memory: it prepares GPU work.

    python tools/tune.py --tiles delta --jobs 8      # the delta rule's candidates, checked, then timed at SHAPES
    python tools/tune.py --tiles conv --only "bwd"   # the short conv's backward candidates (and 'default')
    python tools/tune.py --tiles scalar --variants retnet   # the scalar-decay candidates, timed on RetNet only
    python tools/tune.py --tiles delta --tiny --jobs 2      # CPU: the checks only, through Triton's interpreter
    python tools/tune.py --ptxas --only _wy,_grads   # registers / spills / shared memory of every launch of those
                                                     # kernels (tools/launches.py records them), for sm_90a

The timings are tools/benchlib.py's (measure: fwd and fwd+bwd ms, peak MiB; --timing eager for do_bench).
"""

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules
import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback
import tempfile
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
import triton

import benchlib
import kernels
from benchlib import (DEVICE, MAMBA2_SHAPES, RETNET_SHAPES, SCALAR_VARIANTS, SHAPES, VARIANTS, first_line, inputs,
                      mamba2_core, mamba2_inputs, measure, retnet_gate, retnet_inputs, row, run_chunk, tuned)

# -----------------------------------------------------------------------------
# --tiles: kernels.TUNING's candidates, each checked against the fp64 reference in its own process, then timed

# family -> {candidate: {TUNING entry: {key: value}}}, each a change of kernels.TUNING (the rest stays as it is);
# 'default' is kernels.TUNING itself, timed beside the others (the column "÷ default")
TILE_CANDIDATES = {
    "delta": {
        "default": {},
        "wy_grads warps 16": {"wy_grads": dict(warps=16)},
        "wy_grads warps 4": {"wy_grads": dict(warps=4)},
        "wy_grads v 32": {"wy_grads": dict(v=32)},
        "wy_grads d64 deltanet 8": {"wy_grads": dict(warps_d64={0: 8, 1: 4})},
        "wy_grads d64 gdn 8": {"wy_grads": dict(warps_d64={0: 4, 1: 8})},
        "wy_grads stages 1": {"wy_grads": dict(stages=1)},
        "wy_grads stages 2": {"wy_grads": dict(stages=2)},
        "state warps 8": {"state": dict(warps=8, out_warps=8)},
        "state warps 2": {"state": dict(warps=2, out_warps=2)},
        "state v 32": {"state": dict(v=32)},
        "state kda_bwd_warps 4": {"state": dict(kda_bwd_warps=4)},
        "state min_v 16": {"state": dict(min_v=16)},
        "state out_warps 8": {"state": dict(out_warps=8)},
        "state stages 3": {"state": dict(stages=3, bwd_stages=3)},
        "state small-v stages 2": {"state": dict(small_v_stages=None)},
        "state small-v bwd at Dk 64": {"state": dict(small_v_bwd_min_k=64)},
        "state v 64": {"state": dict(v=64)},
        "state kda v 32": {"state": dict(v={0: 32, 1: 64, 2: 32})},
        "state one-wave off": {"state": dict(one_wave_v=None)},
        "state wu in pass off": {"state": dict(wu_in_pass=None)},
        "state wu in pass at Dk 128": {"state": dict(wu_in_pass=128)},
        "state bwd warps 8": {"state": dict(bwd_warps=8)},
        "kda_grads k 32": {"kda_grads": dict(k=32)},
        "kda_grads warps 4": {"kda_grads": dict(warps=4)},
        "kda_grads wy 64/8": {"kda_grads": dict(wy_v=64)},
        "kda_grads wy maxnreg 128": {"kda_grads": dict(wy_maxnreg=128)},
        "grams kda_k 32": {"grams": dict(kda_k=32)},
        "wy_fwd warps 4": {"wy_fwd": dict(warps=None)},
        "wy_fwd split 1 warps 4": {"wy_fwd": dict(split=1, warps=None)},
        "wy_fwd split 1 at Dk 128": {"wy_fwd": dict(split=1)},
        "wy_fwd split 4 warps 2": {"wy_fwd": dict(split=4, split_d64=4, warps=2)},
        "wy_fwd d64 split 2": {"wy_fwd": dict(split_d64=2)},
        "wy_fwd d64 split 1": {"wy_fwd": dict(split_d64=1)},
        "cumsum d 64": {"cumsum": dict(d=64, warps=2)},
        "cumsum d 64 warps 4": {"cumsum": dict(d=64, warps=4)},
        "grams chunk maxnreg 128": {"grams": dict(chunk_maxnreg=128)},
        "grams k 32 warps 2": {"grams": dict(k=32, warps=2)},
        "grams k 128": {"grams": dict(k=128)},
        "grams chunk d64 k 32": {"grams": dict(chunk_k_d64=32)},
        "grams chunk d64 k 32 warps 8": {"grams": dict(chunk_k_d64=32, chunk_warps_d64=8)},
        "grams chunk d64 k 16": {"grams": dict(chunk_k_d64=16)},
        "grams chunk d64 warps 8": {"grams": dict(chunk_warps_d64=8)},
        "inverse warps 2": {"inverse": dict(warps=2)},
        "inverse warps 4": {"inverse": dict(warps=4)},
        "inverse prec tf32x3": {"inverse": dict(prec={"bf16": "tf32x3", "tf32": "tf32x3", "ieee": "ieee"})},
    },
    "scalar": {
        "default": {},
        "state stages 2": {"scalar": dict(state_stages=2)},
        "state cover 2": {"scalar": dict(state_cover=2)},
        "fused every gate": {"scalar": dict(fused_fwd=(int(kernels.GATE_NONE), int(kernels.GATE_SCALAR),
                                                       int(kernels.GATE_CONST)))},
        "fused none": {"scalar": dict(fused_fwd=())},
        "fused warps 8": {"scalar": dict(fused_warps=8)},
        "state cover d64 1": {"scalar": dict(state_cover_d64=1)},
        "group k 32": {"scalar": dict(group_k=32)},
        "group stages 1": {"scalar": dict(group_stages=1)},
    },
    "conv": {
        "default": {},
        "fwd ahead 8": {"conv_fwd": dict(ahead=8, unroll=8)},
        "fwd L 64": {"conv_fwd": dict(L=64)},
        "bwd L 64": {"conv_bwd": dict(L=64)},
        "bwd ahead 4": {"conv_bwd": dict(ahead=4, unroll=4)},
        "bwd 2 channels": {"conv_bwd": dict(warps=2, heads=2)},
        "bwd persist 256": {"conv_bwd": dict(parts=256)},
    },
}
# relative RMS error bounds against the fp64 reference (test_kernels.py's): bf16 inputs, fp32 inputs (IEEE dots)
TILE_TOL = {"o": (5e-3, 1e-4), "y": (1e-2, 2e-5), "ht": (5e-3, 1e-4), "beta": (2e-2, 1e-3), "g": (2e-2, 1e-3)}
TILE_TOL_GRAD = (8e-3, 1e-4)  # every other input's gradient


def rel_rms(a, ref):
    a, ref = a.double(), ref.double()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def reference_errors(fn, ref_fn, x, diff, seed=0, names=("o", "ht"), no_grad=False):
    """fn(**x) -> (o, final state | None) against ref_fn on fp64 copies: {name: relative RMS error} of the output, the
    final state and the gradients of x[diff] (random cotangents for both outputs); no_grad: also the outputs of fn
    called without autograd ('<name> no grad': the path the timed forward takes, which may differ)."""
    leaves = {n: (t.detach().clone().requires_grad_(n in diff) if torch.is_tensor(t) else t) for n, t in x.items()}
    ref = {n: (t.detach().double().requires_grad_(n in diff) if torch.is_tensor(t) else t) for n, t in x.items()}
    out, rout = fn(**leaves), ref_fn(**ref)
    gen = torch.Generator().manual_seed(seed)
    loss = rloss = 0
    errs = {}
    for name, a, b in zip(names, out, rout):
        if b is None:
            continue
        w = torch.randn(b.shape, generator=gen, dtype=torch.float64).to(b.device)
        loss, rloss = loss + (a.double() * w).sum(), rloss + (b * w).sum()
        errs[name] = rel_rms(a, b)
    grads = torch.autograd.grad(loss, [leaves[n] for n in diff])
    rgrads = torch.autograd.grad(rloss, [ref[n] for n in diff])
    errs |= {n: rel_rms(a, b) for n, a, b in zip(diff, grads, rgrads)}
    if no_grad:
        with torch.no_grad():
            out = fn(**{n: (t.detach() if torch.is_tensor(t) else t) for n, t in x.items()})
        errs |= {f"{name} no grad": rel_rms(a, b) for name, a, b in zip(names, out, rout) if b is not None}
    return errs


def tile_cases(family, device, tiny):
    """The inputs a candidate is checked on: [(label, fn, ref_fn, x, diff, dtype)]; tiny: CPU-sized (the interpreter)."""
    gen = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=gen)
    cases = []
    if family == "delta":
        shapes = [(1, 65, 2, 16, torch.float32)] if tiny else \
            [(2, 1000, 2, 128, torch.bfloat16), (2, 65, 2, 64, torch.bfloat16), (2, 65, 2, 128, torch.float32)]
        for (B, T, H, D, dtype), gate in itertools.product(shapes, ("deltanet", "gdn", "kda")):
            x = dict(q=F.normalize(rnd(B, T, H, D), dim=-1), k=F.normalize(rnd(B, T, H, D), dim=-1), v=rnd(B, T, H, D),
                     beta=torch.sigmoid(rnd(B, T, H)))
            if gate == "gdn":
                x["g"] = F.logsigmoid(rnd(B, T, H)) / 16
            if gate == "kda":  # strong: a tenth of the gates at -1000
                g = -5 - 5 * torch.rand(B, T, H, D, generator=gen)
                x["g"] = torch.where(torch.rand(B, T, H, D, generator=gen) < 0.1, -1000.0, g)
            x = {n: t.to(device, dtype) for n, t in x.items()} | dict(initial_state=rnd(B, H, D, D).to(device),
                                                                      output_final_state=True)
            cases.append((f"{gate} B{B} T{T} H{H} D{D} {str(dtype)[6:]}", kernels.delta_rule_triton,
                          kernels.delta_rule_recurrent, x, [n for n in x if n not in ("output_final_state",)], dtype))
    elif family == "scalar":
        shapes = [(1, 65, 2, 1, 16, 32, torch.float32)] if tiny else \
            [(2, 1000, 4, 4, 128, 128, torch.bfloat16), (2, 1000, 8, 1, 128, 64, torch.bfloat16)]
        for B, T, H, HK, DK, DV, dtype in shapes:
            for gate in ("retnet", "mamba2"):
                if gate == "retnet":  # RetNet's constant gate (not differentiated), one q/k head per head
                    hk, g = H, torch.log(1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float32)))
                else:  # Mamba2's per-token gate, strong: -A_h softplus(3x + 2), A_h in [1, 16]
                    hk, g = HK, -(1 + 15 * torch.rand(H, generator=gen)) * F.softplus(3 * rnd(B, T, H) + 2)
                x = dict(q=rnd(B, T, hk, DK).to(device, dtype), k=rnd(B, T, hk, DK).to(device, dtype),
                         v=rnd(B, T, H, DV).to(device, dtype), g=g.to(device), initial_state=rnd(B, H, DK, DV).to(device),
                         output_final_state=True, scale=1.0)
                diff = ["q", "k", "v", "initial_state"] + (["g"] if gate == "mamba2" else [])
                cases.append((f"{gate} B{B} T{T} H{H}/{hk} Dk{DK} Dv{DV} {str(dtype)[6:]}", kernels.linear_attn_triton,
                              kernels.linear_attn_recurrent, x, diff, dtype))
    else:  # conv: (B, T, D, norm, bias, x a column slice of a wider tensor)
        shapes = [(2, 40, 32, 16, False, False), (2, 40, 24, 0, True, True)] if tiny else \
            [(3, 1000, 384, 0, True, True), (3, 1000, 384, 128, False, False), (8, 4096, 768, 128, False, False)]
        dtype = torch.float32 if tiny else torch.bfloat16
        for B, T, D, norm, bias, wide in shapes:
            x = dict(xw=rnd(B, T, D + (8 if wide else 0)).to(device, dtype), weight=(rnd(D, 4) / 2).to(device),
                     bias=rnd(D).to(device) if bias else None)  # x: the first D columns of xw (a slice when wide)
            run = lambda xw, weight, bias, D=D, norm=norm: (
                kernels.short_conv(xw[..., :D], weight, bias, norm=norm, path="triton"), None)
            ref = lambda xw, weight, bias, D=D, norm=norm: (kernels.short_conv_torch(xw[..., :D], weight, bias, norm), None)
            cases.append((f"conv B{B} T{T} D{D} norm {norm}{' bias slice' if wide else ''}", run, ref, x,
                          ["xw", "weight"] + (["bias"] if bias else []), dtype))
    return cases


def tiles_check(family, name, device="cuda", tiny=False):
    """Check candidate `name` of TILE_CANDIDATES[family] on tile_cases -> {case: errors}; AssertionError naming the
    errors over the bounds (TILE_TOL; 2.5x for bf16 on CPU, where the interpreter truncates instead of rounding)."""
    failed, out = [], {}
    with tuned(TILE_CANDIDATES[family][name]):
        for label, fn, ref, x, diff, dtype in tile_cases(family, device, tiny):
            errs = out[label] = reference_errors(fn, ref, x, diff, names=("y" if family == "conv" else "o", "ht"),
                                                 no_grad=True)
            j = 0 if dtype == torch.bfloat16 else 1
            slack = 2.5 if (j == 0 and device == "cpu") else 1.0
            bad = {n: e for n, e in errs.items()
                   if not e < slack * TILE_TOL.get(n.removesuffix(" no grad"), TILE_TOL_GRAD)[j]}
            print(f"  {name}: {label}: " + " ".join(f"{n}={e:.1e}" for n, e in errs.items()), flush=True)
            if bad:
                failed.append(f"{label}: {bad}")
    assert not failed, f"{name}: errors over the bounds: " + "; ".join(failed)
    return out


def tile_timings(family, name, variants, shapes=None):
    """fwd / fwd+bwd ms and peak MiB of candidate `name` -> {(variant, shape): (fwd, fwd+bwd, peak)}: the delta rule
    at `shapes` (B, T, H, D; default SHAPES), the scalar decay at RETNET_SHAPES and MAMBA2_SHAPES, the short conv at
    KDA's [8, 4096, 768] bf16 with and without the norm."""
    out = {}
    with tuned(TILE_CANDIDATES[family][name]):
        if family == "delta":
            for variant in [v for v in VARIANTS if v in variants]:
                for B, T, H, D in shapes or SHAPES:
                    x = inputs(B, T, H, D, variant)
                    out[variant, (B, T, H, D)] = measure(lambda x, v=variant: run_chunk("ours", v, x), x,
                                                         ["q", "k", "v", "beta", "g"])
        elif family == "scalar":
            if "retnet" in variants:
                for sh in RETNET_SHAPES:
                    x, g = retnet_inputs(*sh), retnet_gate(sh[2])
                    out["retnet", sh] = measure(lambda x: kernels.linear_attn_triton(x["q"], x["k"], x["v"], g)[0],
                                                x, "qkv")
            if "mamba2" in variants:
                for sh in MAMBA2_SHAPES:
                    out["mamba2", sh] = measure(mamba2_core, mamba2_inputs(*sh),
                                                ["x", "Bm", "Cm", "dt", "A_log", "dt_bias", "D"])
        else:
            for norm in (0, 128):  # KDA's convs: v without the norm, q and k with it (heads of 128)
                x = dict(x=torch.randn(8, 4096, 768, device=DEVICE, dtype=torch.bfloat16),
                         w=torch.randn(768, 4, device=DEVICE) / 2)
                out[f"norm {norm}", (8, 4096, 768)] = measure(
                    lambda x, norm=norm: kernels.short_conv(x["x"], x["w"], norm=norm, path="triton"), x, ["x", "w"])
        torch.cuda.empty_cache()
    return out


def tiles(family, only, variants, jobs, tiny, shapes=None):
    """--tiles: check every chosen candidate in its own process (jobs at a time; an illegal address or a miscompile
    cannot touch the others, and the processes fill Triton's disk cache), then time those that passed, one by one,
    next to 'default'."""
    names = [n for n in TILE_CANDIDATES[family] if not only or n == "default" or
             any(n.startswith(p) for p in only.split(","))]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cmd = [sys.executable, os.path.abspath(__file__), "--tiles", family, "--tiles_check"]
    env = dict(os.environ, TRITON_INTERPRET="1") if device == "cpu" else None  # CPU: the kernels through the interpreter
    ok = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = {n: pool.submit(subprocess.run, cmd + [n] + (["--tiny"] if tiny else []), capture_output=True,
                               text=True, env=env) for n in names}
        for n, r in runs.items():
            p = r.result()
            ok[n] = p.returncode == 0
            why = "" if ok[n] else " ".join((p.stderr.strip().splitlines() or ["?"])[-1:])[:150]
            print(f"check {family} {n:26s} {'ok' if ok[n] else 'FAILED ' + why}", flush=True)
    if device != "cuda":
        print("timing needs CUDA: checks only")
        return ok
    print(f"\n{family} candidates that passed, fwd / fwd+bwd ms ({benchlib.TIMING} timing), peak MiB, fwd+bwd ÷ default's",
          flush=True)
    widths = (26, 10, 22, 7, 10, 8, 9)
    row(["candidate", "variant", "shape", "fwd ms", "fwd+bwd ms", "peak MiB", "÷ default"], widths)
    base = tile_timings(family, "default", variants, shapes) if ok.get("default") else {}
    for n in names:
        if not ok[n]:
            continue
        got = base if n == "default" else tile_timings(family, n, variants, shapes)
        for (variant, shape), (f, fb, peak) in got.items():
            ratio = f"{fb / base[variant, shape][1]:.3f}" if (variant, shape) in base else "-"
            row([n, variant, ",".join(map(str, shape)), f"{f:.3f}", f"{fb:.3f}", f"{peak:.0f}", ratio], widths)
    return ok


# -----------------------------------------------------------------------------
# --ptxas: registers, spills and shared memory of every Triton launch of kernels.py, compiled offline for sm_90a

SHARED_LIMIT_KB = 227  # Hopper's shared memory per block


def ptxas_report(name, sig, constexprs, warps, stages):
    """-> (registers, spill-store bytes, shared KB) of one recorded launch compiled for sm_90a: Triton lowers it to PTX
    and its bundled ptxas assembles it; nothing is launched. Pointer arguments are taken 16-byte aligned, as Triton
    specialises them on torch tensors (without it every access is scalar and the counts are far from the GPU's)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    fn = getattr(kernels, name)
    names = fn.arg_names
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig.get(n, "").startswith("*")}
    src = ASTSource(fn=fn, signature={n: sig.get(n, "constexpr") for n in names},
                    constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as f:
            f.write(k.asm["ptx"])
        err = ""
        for ptxas in ("ptxas", "ptxas-blackwell"):  # the first that accepts this PTX version
            p = subprocess.run([os.path.join(bin_dir, ptxas), "-v", "-arch=sm_90a", "k.ptx", "-o", "k.cubin"], cwd=d,
                               capture_output=True, text=True)
            err = p.stderr
            if p.returncode == 0:
                break
    regs, spill = re.search(r"Used (\d+) registers", err), re.search(r"(\d+) bytes spill stores", err)
    if not regs:
        raise RuntimeError(f"ptxas failed: {err[-300:]}")
    return int(regs.group(1)), int(spill.group(1)) if spill else 0, k.metadata.shared // 1024


PTXAS_KEYS = ("GATE", "DK", "DV", "BK", "BV", "GROUP", "DECAYED", "OUTPUT", "SNAPSHOTS", "BOUNDED", "GATE_BWD",
              "SKIP_DONE", "SSD", "NORM", "POS", "L", "BD", "AHEAD")


def ptxas(D, dtypes, only):
    """--ptxas: every launch of the public calls at Dk = Dv = D in each dtype (tools/launches.py's record_launches, in a
    process with TRITON_INTERPRET=1), compiled here without the interpreter for sm_90a, with the current kernels.TUNING. Indicative:
    the local Triton may differ from the GPU machine's; spills are not time (time candidates with --tiles)."""
    if os.environ.get("TRITON_INTERPRET"):  # the compiler needs triton without the interpreter: run again without it
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        argv = ["--ptxas", "--shape", f"1,65,4,{D}", "--dtypes", ",".join(dtypes)] + (["--only", only] if only else [])
        return subprocess.run([sys.executable, os.path.abspath(__file__)] + argv, env=env).returncode
    recorder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launches.py")
    p = subprocess.run([sys.executable, recorder, str(D), ",".join(dtypes)],
                       env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"recording the launches failed:\n{p.stderr[-2000:]}")
    launches = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"triton {triton.__version__}, sm_90a; every launch of the public calls at Dk = Dv = {D}, "
          f"{'/'.join(dtypes)} inputs", flush=True)
    for name, sig, const, warps, stages in sorted(launches, key=lambda x: (x[0], json.dumps(x[2], sort_keys=True))):
        if only and not any(name.startswith(o) for o in only.split(",")):
            continue
        dtype = next((t[1:] for n, t in sorted(sig.items()) if n in ("q_ptr", "k_ptr", "x_ptr", "v_ptr")), "-")
        what = " ".join(f"{k}={const[k]}" for k in PTXAS_KEYS if k in const)
        try:
            regs, spill, shared = ptxas_report(name, sig, const, warps, stages)
            flag = f"  OVER {SHARED_LIMIT_KB} KB" if shared > SHARED_LIMIT_KB else ""
            res = f"regs {regs:3d}, spill stores {spill:5d} B, shared {shared:3d} KB{flag}"
        except Exception as e:  # noqa: BLE001 (one that does not compile is reported in its row)
            res = "FAILED " + first_line(e, 120)
        print(f"  {name:28s} {dtype:4s} {what:52s} warps={warps} stages={stages}: {res}", flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiles", choices=tuple(TILE_CANDIDATES), default=None,
                    help="check kernels.TUNING's candidates (TILE_CANDIDATES) of one family against the fp64 "
                         "reference, then time those that pass (CUDA; checks only on CPU)")
    ap.add_argument("--only", default="", help="--tiles: candidates whose names start with one of these "
                    "(comma-separated; 'default' always runs); --ptxas: kernels whose names start with one of these")
    ap.add_argument("--variants", default="", help="--tiles: the variants timed, a subset of "
                    f"{','.join(VARIANTS + SCALAR_VARIANTS)} (default: the family's)")
    ap.add_argument("--shape", default="", help="--tiles delta: time at this B,T,H,D (default SHAPES); --ptxas: "
                    "Dk = Dv = its last number (default 128)")
    ap.add_argument("--jobs", type=int, default=2, help="--tiles: candidates checked at once")
    ap.add_argument("--tiny", action="store_true", help="--tiles: CPU-sized check inputs (the interpreter)")
    ap.add_argument("--timing", choices=("graph", "eager"), default="graph",
                    help="--tiles: CUDA-graph replay (GPU time; default) or do_bench from Python (with launches)")
    ap.add_argument("--ptxas", action="store_true", help="registers / spills / shared memory of every Triton launch, "
                    "compiled offline for sm_90a (no GPU needed)")
    ap.add_argument("--dtypes", default="bf16,fp32", help="--ptxas: input dtypes (bf16, fp16, fp32)")
    ap.add_argument("--tiles_check", default="", help=argparse.SUPPRESS)  # internal: one candidate of --tiles
    args = ap.parse_args()
    benchlib.TIMING = args.timing
    if args.ptxas:  # needs no GPU
        D = int(args.shape.split(",")[-1]) if args.shape else 128
        sys.exit(ptxas(D, [d for d in args.dtypes.split(",") if d], args.only))
    if args.tiles is None:
        ap.error("give --tiles FAMILY or --ptxas")
    if args.tiles_check:  # one candidate of --tiles, in its own process
        tiles_check(args.tiles, args.tiles_check, "cuda" if torch.cuda.is_available() else "cpu", args.tiny)
        return
    variants = [v for v in args.variants.split(",") if v] or \
        list(SCALAR_VARIANTS if args.tiles == "scalar" else VARIANTS)
    if set(variants) - set(VARIANTS + SCALAR_VARIANTS):
        sys.exit(f"--variants must be a subset of {VARIANTS + SCALAR_VARIANTS}, got {args.variants!r}")
    shapes = [tuple(map(int, args.shape.split(",")))] if args.shape else None
    ok = tiles(args.tiles, args.only, variants, args.jobs, args.tiny, shapes)  # the checks run on CPU too (--tiny)
    sys.exit(0 if all(ok.values()) else 1)


if __name__ == "__main__":
    main()
