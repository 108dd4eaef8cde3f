"""
GPU sweep of the scalar-decay kernels' launch settings (kernels.LA_TILE), each checked against the fp64 recurrence
before it is timed, beside fla's chunk_retention and mamba_ssm's mamba_chunk_scan_combined in the same process.

$ python notes/la_tiles.py [--variants base,bk0,...] [--profile]     # from the repo root, on a CUDA machine

1. For each variant: kernels.linear_attn_triton against kernels.linear_attn_recurrent on fp64 copies (bf16 inputs,
   an initial state and a final-state cotangent; test_kernels.py's bf16 tolerances): RetNet's constant gate at
   Dk = Dv = 128 and 64, Mamba2's grouped q/k (8 heads on 1, Dk 128, Dv 64, strong gates); then, if it passes,
   bench.py's RetNet rows (its three shapes) and the Mamba2 core rows (its two shapes), fwd and fwd+bwd ms by CUDA-graph
   replay (bench.measure).
2. The peers once, at the same shapes, and the ratio ours / peer per variant.
3. --profile: torch.profiler kernel times (ms per call) of ours (the last variant) and of the peer, fwd+bwd.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
import kernels  # noqa: E402

TOL = {"o": 5e-3, "ht": 5e-3, "q": 8e-3, "k": 8e-3, "v": 8e-3, "initial_state": 8e-3, "g": 2e-2}  # bf16 TRITON_TOL
BASE = dict(kernels.LA_TILE)
VARIANTS = {
    "base": {},
    "st2": {"state_stages": 2},
    "cover0_d64": {"state_cover_d64": 0},
    "fusedw8_d64": {"fused_warps_d64": 8},
    "fusedall": {"fused_fwd": (0, 1, 2)},
}


def check(label, B, T, H, HK, DK, DV, gate, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen)
    if gate == "retnet":
        g, kw = torch.log(1 - 2.0 ** (-5.0 - torch.arange(H, device="cuda", dtype=torch.float32))), {}
    else:
        A = 1 + 15 * torch.rand(H, device="cuda", generator=gen)
        g, kw = -A * torch.nn.functional.softplus(3 * rnd(B, T, H) + 2), {"scale": 1.0}
    x = dict(q=rnd(B, T, HK, DK).bfloat16(), k=rnd(B, T, HK, DK).bfloat16(), v=rnd(B, T, H, DV).bfloat16(), g=g,
             initial_state=rnd(B, H, DK, DV))
    diff = [n for n in x if n != "g" or gate != "retnet"]
    leaves = {n: t.detach().clone().requires_grad_(n in diff) for n, t in x.items()}
    ref = {n: t.detach().double().requires_grad_(n in diff) for n, t in x.items()}
    o, S = kernels.linear_attn_triton(**leaves, output_final_state=True, **kw)
    ro, rS = kernels.linear_attn_recurrent(**ref, output_final_state=True, **kw)
    do = torch.randn(ro.shape, device="cuda", dtype=torch.float64, generator=gen)
    dS = torch.randn(rS.shape, device="cuda", dtype=torch.float64, generator=gen)
    got = torch.autograd.grad((o.double() * do).sum() + (S.double() * dS).sum(), [leaves[n] for n in diff])
    want = torch.autograd.grad((ro * do).sum() + (rS * dS).sum(), [ref[n] for n in diff])
    errs = {"o": (o, ro), "ht": (S, rS)} | {n: (a, b) for n, a, b in zip(diff, got, want)}
    errs = {n: ((a.double() - b).norm() / b.norm()).item() for n, (a, b) in errs.items()}
    ok = all(e < TOL[n] for n, e in errs.items())
    print(f"  {label}: " + " ".join(f"{n}={e:.1e}" for n, e in errs.items()) + ("" if ok else "  OVER"), flush=True)
    return ok


def correct():
    return all([check("retnet D128", 2, 1000, 4, 4, 128, 128, "retnet"),
                check("retnet D64", 2, 1000, 4, 4, 64, 64, "retnet"),
                check("mamba2 8 on 1, 128/64", 2, 1000, 8, 1, 128, 64, "mamba2")])


def time_ours():
    out = {}
    g = {}
    for sh in bench.RETNET_SHAPES:
        x = bench.retnet_inputs(*sh)
        gh = bench.retnet_gate(sh[2])
        out[("retnet",) + sh] = bench.measure(lambda x: kernels.linear_attn_triton(x["q"], x["k"], x["v"], gh)[0],
                                              x, "qkv")[:2]
        del x
    for sh in bench.MAMBA2_SHAPES:
        x = bench.mamba2_inputs(*sh)
        out[("mamba2",) + sh] = bench.measure(bench.mamba2_core, x, ["x", "Bm", "Cm", "dt", "A_log", "dt_bias", "D"])[:2]
        del x
    torch.cuda.empty_cache()
    return out


def time_peers(fla, ssd):
    out = {}
    for sh in bench.RETNET_SHAPES:
        x = bench.retnet_inputs(*sh)
        try:
            out[("retnet",) + sh] = bench.measure(lambda x: fla(x["q"], x["k"], x["v"])[0], x, "qkv")[:2]
        except Exception as e:  # noqa: BLE001
            print(f"  fla {sh}: {bench.first_line(e)}")
    for sh in bench.MAMBA2_SHAPES:
        x = bench.mamba2_inputs(*sh)
        peer = lambda x: ssd(x["x"], x["dt"], -torch.exp(x["A_log"]), x["Bm"], x["Cm"], chunk_size=256, D=x["D"],
                             dt_bias=x["dt_bias"], dt_softplus=True)
        try:
            out[("mamba2",) + sh] = bench.measure(peer, x, ["x", "Bm", "Cm", "dt", "A_log", "dt_bias", "D"])[:2]
        except Exception as e:  # noqa: BLE001
            print(f"  mamba_ssm {sh}: {bench.first_line(e)}")
    torch.cuda.empty_cache()
    return out


def profile(name, fn, x, leaves):
    xg = {n: (t.detach().requires_grad_() if n in leaves else t) for n, t in x.items()}
    params = [xg[n] for n in leaves]
    do = torch.randn_like(fn(x))
    for _ in range(3):
        torch.autograd.grad(fn(xg), params, do)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.autograd.grad(fn(xg), params, do)
        torch.cuda.synchronize()
    rows = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA or getattr(e, "self_device_time_total", 0) > 0:
            t = getattr(e, "self_device_time_total", 0) / 1000 / 5
            if t > 0.005:
                rows[e.key] = t
    print(f"\n{name}: {sum(rows.values()):.3f} ms per fwd+bwd, by kernel (ms):")
    for k, t in sorted(rows.items(), key=lambda r: -r[1]):
        print(f"  {t:7.3f}  {k[:110]}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-peers", action="store_true", help="time ours only (fla's autotuning takes minutes)")
    ap.add_argument("--warm", action="store_true", help="compile only (the checks, and every timed configuration at a "
                    "small T), to fill Triton's disk cache from parallel processes")
    ap.add_argument("--set", default="", help="settings for every variant, e.g. state_cover=2,out_warps=8")
    args = ap.parse_args()
    import triton
    fixed = {k: int(v) for k, v in (kv.split("=") for kv in args.set.split(",") if kv)}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    if args.warm:
        for name in args.variants.split(","):
            kernels.LA_TILE.clear()
            kernels.LA_TILE.update(BASE, **fixed, **VARIANTS[name])
            correct()
            bench.RETNET_SHAPES = [(1, 256) + sh[2:] for sh in bench.RETNET_SHAPES]
            bench.MAMBA2_SHAPES = [(1, 256) + sh[2:] for sh in bench.MAMBA2_SHAPES]
            time_ours()
            print(f"warm {name}", flush=True)
        sys.exit()
    fla, ssd = bench.load_scalar_peers() if not args.no_peers else ("skipped", "skipped")
    import importlib.metadata as md
    for p in ("fla-core", "mamba_ssm"):
        try:
            print(f"{p} {md.version(p)}")
        except Exception:  # noqa: BLE001
            print(f"{p}: no metadata (source tree)")
    peers = time_peers(fla, ssd) if not (isinstance(fla, str) and isinstance(ssd, str)) else {}
    print("peers: " + "  ".join(f"{k[0]}{k[1:]} {f:.3f}/{fb:.3f}" for k, (f, fb) in peers.items()), flush=True)
    for name in args.variants.split(","):
        kernels.LA_TILE.clear()
        kernels.LA_TILE.update(BASE, **fixed, **VARIANTS[name])
        print(f"\n[{name}] {kernels.LA_TILE}", flush=True)
        try:
            if not correct():
                print("  FAIL: not timed", flush=True)
                continue
            res = time_ours()
        except Exception as e:  # noqa: BLE001
            print(f"  error: {bench.first_line(e, 200)}", flush=True)
            continue
        for k, (f, fb) in res.items():
            p = peers.get(k)
            ratio = f"  ours/peer {f / p[0]:.2f} / {fb / p[1]:.2f}" if p else ""
            print(f"  {k[0]:7s}{str(k[1:]):26s} fwd {f:.3f}  fwd+bwd {fb:.3f}{ratio}", flush=True)
    if args.profile:
        sh = bench.RETNET_SHAPES[0]
        x = bench.retnet_inputs(*sh)
        gh = bench.retnet_gate(sh[2])
        profile(f"ours retnet {sh}", lambda x: kernels.linear_attn_triton(x["q"], x["k"], x["v"], gh)[0], x, "qkv")
        if not isinstance(fla, str):
            profile(f"fla retnet {sh}", lambda x: fla(x["q"], x["k"], x["v"])[0], x, "qkv")
        sh = bench.MAMBA2_SHAPES[0]
        x = bench.mamba2_inputs(*sh)
        lv = ["x", "Bm", "Cm", "dt", "A_log", "dt_bias", "D"]
        profile(f"ours mamba2 core {sh}", bench.mamba2_core, x, lv)
        if not isinstance(ssd, str):
            profile(f"mamba_ssm {sh}", lambda x: ssd(x["x"], x["dt"], -torch.exp(x["A_log"]), x["Bm"], x["Cm"],
                                                    chunk_size=256, D=x["D"], dt_bias=x["dt_bias"],
                                                    dt_softplus=True), x, lv)
