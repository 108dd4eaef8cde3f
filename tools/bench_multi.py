"""
Multi-GPU harness: config/kda_hybrid.py trained by train.py itself under torchrun on the pystdlib shards (median
tokens/s of the steps after the first third, with their quartiles; peak = the largest max_memory_allocated over
ranks, from train.py's iter lines), NCCL multicast off. Prints the tables of README's 'Several GPUs'.

    python tools/bench_multi.py dp,cp --gpus 2        # both tables: 1 GPU against 2
    python tools/bench_multi.py dp --gpus 2,4 --json dp.json   # DDP and FSDP on 1, 2 and 4 GPUs
    python tools/bench_multi.py cp --gpus 2 --cp_context 98304 --cp_multiples 1,n   # context parallelism
    python tools/bench_multi.py opt --gpus 2          # AdamW against Muon under FSDP and DDP, T = 4,096

'dp': T = 1,024, --dp_batch sequences × 2 micro-steps per GPU, 60 steps (32: the GPU is the limit; at owt.py's 12
the H100 idles over half of each step, waiting for the host's launches, and the table measures the host's Python more
than the layouts: notes/perf.md (49)), DDP and FSDP on 1 GPU (a torchrun of one rank), then both on each of --gpus;
the two side by side (GPUs 0..n-1 and n..2n-1) where the host has 2n GPUs, else one after the other. 'cp': batch 1,
30 steps, data 'pystdlib_long' (long_rows_dataset: rows longer than pystdlib's val split), one GPU at --cp_context
and at --cp_context + 16,384 (side by side on two GPUs: the longer one is expected not to fit, which makes
--cp_context the longest that does; where neither fits, the two contexts 16,384 and 32,768 shorter, and so on down),
then --context_parallel=n for each n of --gpus at each --cp_multiples of the longest that fit one GPU (default 1 and
n; a multiple of n or more runs with --activation_checkpointing=True: each rank would hold as many tokens as the one
GPU did, plus CP's own tensors, which ran out of memory at 2 × 98,304 over 2 H100s); the losses of the 1-GPU and the
CP runs at the same context (same data, same init) are compared step by step. 'opt': T = 4,096, 8 sequences per GPU
(config/pkgtext.py's step on each GPU), AdamW and Muon under FSDP, then under DDP, on each of --gpus, the two
optimizers side by side where the host has 2n GPUs: tokens/s and Muon's over AdamW's (under FSDP each rank holds
rows of each matrix and Muon gathers the whole matrices for its orthogonalisation: optim.Muon, parallel.py).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)  # its modules
import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import triton

MULTI_GPU_ENV = dict(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")


def train_run(nproc, overrides, steps, tag, gpus=None):
    """train.py config/kda_hybrid.py under torchrun with nproc ranks (on GPUs `gpus`, e.g. "1"): its iter lines
    parsed -> dict(tokens_s (median of the steps after the first third), peak_gib, losses {iter: loss}, error)."""
    out = os.path.join(tempfile.gettempdir(), f"bench-multi-{tag}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py",
           "config/kda_hybrid.py", "--dataset=pystdlib", f"--max_iters={steps}", "--eval_interval=1000000",
           "--eval_iters=1", "--log_interval=1", f"--out_dir={out}", "--overwrite=True",  # (its own temp folder)
           "--wandb_log=False"] + overrides  # later wins
    env = dict(os.environ, **MULTI_GPU_ENV)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = re.findall(r"^iter (\d+)/\d+: loss ([\d.]+).*?tok/s ([\d,]+).*?peak ([\d.]+) GiB", p.stdout, re.M)
    rec = dict(tag=tag, nproc=nproc, overrides=overrides, wall_s=round(time.perf_counter() - t0, 1),
               T=int(next(o for o in overrides if o.startswith("--block_size=")).split("=")[1]),
               losses={int(i): float(l) for i, l, _, _ in lines})
    timed = [float(t.replace(",", "")) for i, _, t, _ in lines if int(i) >= steps // 3]
    rec["tokens_s_by_step"] = {int(i): float(t.replace(",", "")) for i, _, t, _ in lines}
    if p.returncode != 0 or not timed:  # the rank's own exception line, not torchrun's report around it
        text = (p.stdout + p.stderr).splitlines()
        err = ([l for l in text if "out of memory" in l.lower()] or
               [l for l in text if re.match(r"^\S+\.py: error: ", l)] or  # train.py's one-line errors
               [l for l in text if re.match(r"^\s*([\w]+\.)*\w*(Error|Exception): ", l) and "ChildFailedError" not in l])
        rec["error"] = (err[-1] if err else (p.stdout + p.stderr)[-300:]).strip()[:300]
        rec["stderr_tail"] = p.stderr[-4000:]
    if timed:
        q = statistics.quantiles(timed, n=4) if len(timed) > 1 else [timed[0]] * 3
        rec.update(tokens_s=statistics.median(timed), quartiles=(q[0], q[2]),
                   peak_gib=max(float(pk) for *_, pk in lines))
    print(f"{tag}: " + (f"{rec['tokens_s']:,.0f} tokens/s (quartiles {rec['quartiles'][0]:,.0f}–"
                        f"{rec['quartiles'][1]:,.0f}), peak {rec['peak_gib']:.1f} GiB" if timed else "")
          + (f" ERROR {rec['error']}" if "error" in rec else "") + f" ({rec['wall_s']:.0f} s)", flush=True)
    return rec


def long_rows_dataset():
    """'pystdlib_long': the pystdlib train shard as both splits (symlinks in data/pystdlib_long/), for the context-
    parallel runs, whose rows (up to 2 × 98,304 tokens) are longer than the whole pystdlib val split (156,690 tokens).
    Only the speed runs use it: their end-of-run eval then reads training tokens."""
    src = os.path.join(ROOT, "data", "pystdlib", "pystdlib_train_000000.bin")
    if not os.path.exists(src):
        sys.exit("bench_multi.py cp needs the pystdlib shards: python data/pystdlib/prepare.py")
    out = os.path.join(ROOT, "data", "pystdlib_long")
    os.makedirs(out, exist_ok=True)
    for split in ("train", "val"):
        dst = os.path.join(out, f"pystdlib_long_{split}_000000.bin")
        if not os.path.exists(dst):
            os.symlink(src, dst)
    return "pystdlib_long"


def multi_gpu_bench(parts, gpus, cp_context, steps=30, cp_multiples=("1", "n"), dp_batch=32):
    """The tables of README's 'Several GPUs' (see the module docstring) of `parts` ('dp', 'cp', 'opt')."""
    print(f"device {torch.cuda.get_device_name()} x {torch.cuda.device_count()}, torch {torch.__version__}, "
          f"triton {triton.__version__}")
    print("command: python " + " ".join(sys.argv), flush=True)
    results = {}
    if "dp" in parts:
        rows = []
        for n in [1] + gpus:  # DDP and FSDP at each GPU count in the same minutes (this host's speed drifts): side by
            # side on GPUs 0..n-1 and n..2n-1 where the host has 2n, else one after the other
            layouts = (("DDP", []), ("FSDP", ["--fsdp=True"]))
            side = 2 * n <= torch.cuda.device_count()
            def run(i, n=n):  # layout i (on GPUs i*n .. i*n+n-1 when side by side)
                layout, flag = layouts[i]
                gpus_i = ",".join(str(i * n + g) for g in range(n)) if side else None
                return train_run(n, flag + ["--block_size=1024", f"--batch_size={dp_batch}",
                                            f"--gradient_accumulation_steps={2 * n}"], 2 * steps, f"{layout}-{n}", gpus_i)
            with ThreadPoolExecutor(2 if side else 1) as pool:
                rows += [(layouts[i][0], n, r) for i, r in enumerate(pool.map(run, range(len(layouts))))]
        rows.sort(key=lambda x: x[0] != "DDP")
        print(f"T = 1,024, {dp_batch} sequences x 2 micro-steps per GPU")
        print("| layout | GPUs | tokens/s (quartiles of the steps) | per GPU | per GPU ÷ 1 GPU | ÷ DDP | peak GiB per GPU |")
        print("|---|---|---|---|---|---|---|")
        base = {(l, n): r.get("tokens_s") for l, n, r in rows}
        for layout, n, r in rows:
            if "tokens_s" not in r:
                print(f"| {layout} | {n} | {r.get('error')} | | | | |")
                continue
            t = r["tokens_s"]
            one, ddp = base[(layout, 1)], base[("DDP", n)]
            print(f"| {layout} | {n} | {t:,.0f} ({r['quartiles'][0]:,.0f}–{r['quartiles'][1]:,.0f}) | {t / n:,.0f} | {t / n / one:.2f} | "
                  f"{t / ddp:.2f} | {r['peak_gib']:.1f} |" if one and ddp else f"| {layout} | {n} | {t:,.0f} | | | | |")
        results["dp"] = rows
    if "opt" in parts:
        rows = []
        for n in gpus:
            for layout, flag in (("FSDP", ["--fsdp=True"]), ("DDP", [])):
                side = 2 * n <= torch.cuda.device_count()
                def run(opt, n=n, layout=layout, flag=flag):
                    gpus_i = ",".join(str((opt == "muon") * n + g) for g in range(n)) if side else None
                    return train_run(n, flag + [f"--optimizer={opt}", "--block_size=4096", "--batch_size=8",
                                                f"--gradient_accumulation_steps={n}"], 2 * steps, f"{layout}-{opt}-{n}", gpus_i)
                with ThreadPoolExecutor(2 if side else 1) as pool:
                    rows += [(layout, n, opt, r) for opt, r in zip(("adamw", "muon"), pool.map(run, ("adamw", "muon")))]
        print("T = 4,096, 8 sequences per GPU, one micro-step; side by side (where the host has 2n GPUs), AdamW on GPUs "
              "0..n-1 and Muon on n..2n-1: a difference between the two halves of the host counts in ÷ AdamW")
        print("| layout | GPUs | optimizer | tokens/s (quartiles of the steps) | ÷ AdamW | peak GiB per GPU |")
        print("|---|---|---|---|---|---|")
        adamw = {(l, n): r.get("tokens_s") for l, n, o, r in rows if o == "adamw"}
        for layout, n, opt, r in rows:
            if "tokens_s" not in r:
                print(f"| {layout} | {n} | {opt} | {r.get('error')} | | |")
                continue
            t, base = r["tokens_s"], adamw[(layout, n)]
            print(f"| {layout} | {n} | {opt} | {t:,.0f} ({r['quartiles'][0]:,.0f}–{r['quartiles'][1]:,.0f}) | "
                  + (f"{t / base:.3f}" if base else "") + f" | {r['peak_gib']:.1f} |")
        results["opt"] = rows
    if "cp" in parts:
        step = 16384
        common = ["--batch_size=1", "--gradient_accumulation_steps=1", f"--dataset={long_rows_dataset()}"]
        single, pair = [], (cp_context, cp_context + step)  # the context and one step longer, side by side
        while True:  # on two GPUs; where neither fits (a smaller card), the two contexts below, and so on down
            with ThreadPoolExecutor(2) as pool:
                tried = list(pool.map(lambda c: train_run(1, common + [f"--block_size={c[1]}"], steps,
                                                          f"1GPU-T{c[1]}", gpus=str(c[0])), enumerate(pair)))
            single = tried + single
            fit = [r for r in tried if "tokens_s" in r]
            pair = tuple(c for c in (pair[0] - 2 * step, pair[0] - step) if c > 0)
            if fit or not pair:
                break
        if not fit:
            print(f"no context fit one GPU: {single[0].get('error')}")
            return results
        one = fit[-1]
        T1 = one["T"]
        # over n GPUs: at the one-GPU context (the speed-up) and at n times it (what n GPUs add)
        cps = []
        for n in gpus:
            for m in [n if m == "n" else int(m) for m in cp_multiples]:
                ac = ["--activation_checkpointing=True"] if m >= n else []
                cps.append(train_run(n, common + [f"--block_size={m * T1}", f"--context_parallel={n}"] + ac, steps,
                                     f"CP{n}-T{m * T1}" + ("-AC" if ac else "")))
        print("| layout | GPUs | context | tokens/s | × 1 GPU | peak GiB per GPU | ÷ 1 GPU's peak |")
        print("|---|---|---|---|---|---|---|")
        for r in single + cps:
            n, T = r["nproc"], r["T"]
            name = "1 GPU" if n == 1 else f"CP over {n}" + (", recompute" if r["tag"].endswith("-AC") else "")
            if "tokens_s" not in r:
                print(f"| {name} | {n} | {T:,} | {r.get('error')} | | | |")
                continue
            print(f"| {name} | {n} | {T:,} | {r['tokens_s']:,.0f} | "
                  f"{r['tokens_s'] / one['tokens_s']:.2f} | {r['peak_gib']:.1f} | {r['peak_gib'] / one['peak_gib']:.2f} |")
        for r in cps:  # same data, same init: the losses of CP and one GPU at the one-GPU context, step by step
            same = [abs(r["losses"][i] - one["losses"][i]) for i in one["losses"] if i in r["losses"]]
            if r["T"] == T1 and same:
                last = max(one["losses"])
                print(f"losses at T={T1:,}, 1 GPU vs CP over {r['nproc']}, steps 0-{last}: largest difference "
                      f"{max(same):.4f} (first {one['losses'][0]:.4f} / {r['losses'].get(0, float('nan')):.4f}, "
                      f"last {one['losses'][last]:.4f} / {r['losses'].get(last, float('nan')):.4f})")
        results["cp"] = dict(single=single, cp=cps)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parts", nargs="?", default="dp,cp", help="'dp' (DDP and FSDP at T=1024), 'cp' (context "
                    "parallelism at --cp_context), 'opt' (AdamW and Muon under FSDP and DDP at T=4096); comma-separated "
                    "(default dp,cp)")
    ap.add_argument("--gpus", default="2", help="GPU counts of the multi-GPU runs, e.g. 2 or 2,4,8")
    ap.add_argument("--dp_batch", type=int, default=32, help="dp: sequences per micro-step per GPU (owt.py's is 12, "
                    "where the step is host-bound)")
    ap.add_argument("--cp_context", type=int, default=98304, help="cp: the context expected to be the longest one GPU "
                    "trains at batch 1 (also tried: it + 16,384)")
    ap.add_argument("--cp_multiples", default="1,n", help="cp: contexts of the CP runs as multiples of the longest "
                    "that fit one GPU ('n': the GPU count); above n with activation checkpointing")
    ap.add_argument("--json", default="", help="also write the results to this JSON file")
    args = ap.parse_args()
    unknown = set(args.parts.split(",")) - {"dp", "cp", "opt"}
    if unknown:
        ap.error(f"unknown part(s) {', '.join(sorted(map(repr, unknown)))}: give dp, cp and/or opt, comma-separated")
    if not torch.cuda.is_available():
        sys.exit("bench_multi.py needs CUDA GPUs")
    res = multi_gpu_bench(args.parts.split(","), [int(n) for n in args.gpus.split(",")], args.cp_context,
                          cp_multiples=args.cp_multiples.split(","), dp_batch=args.dp_batch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
