"""
How fast is one training step of the recall grid's small models (config/mqar.py: 4 layers x 128, 128 tokens), in
eager mode, under torch.compile, and under torch.compile with CUDA graphs (TORCHINDUCTOR_CUDAGRAPHS=1), alone and
with several runs sharing the GPU? The grid's cost is steps x (time per step under sharing), so this decides how it
runs. Every number is read from train.py's own "iter N: ... time X ms" lines (the median over the steps after the
first `skip`, so compilation and the first evals are left out).

$ python notes/mqar_speed.py --mixers softmax kda mamba2 --batches 64 256 --modes eager compile cudagraphs
$ python notes/mqar_speed.py --shared kda:64:eager kda:64:cudagraphs --copies 8     # K runs at once: aggregate steps/s
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(mixer, batch, mode, steps, out_dir, extra):
    return ([sys.executable, 'train.py', 'config/mqar.py', f'--mixer={mixer}', f'--batch_size={batch}',
             f'--max_iters={steps}', f'--lr_decay_iters={steps}', f'--eval_interval={steps}', '--eval_iters=2',
             '--log_interval=1', f'--compile={mode != "eager"}', f'--out_dir={out_dir}'] + extra)


def environment(mode):
    env = dict(os.environ, OMP_NUM_THREADS='1', TORCHINDUCTOR_COMPILE_THREADS='1')
    if mode == 'cudagraphs':
        env['TORCHINDUCTOR_CUDAGRAPHS'] = '1'
    return env


def run(mixer, batch, mode, steps, tag, extra, log_dir):
    out_dir = f'/tmp/mqar-speed/{tag}-{mixer.replace("*", "x").replace(",", "+")}-{batch}-{mode}'
    t0 = time.time()
    p = subprocess.run(command(mixer, batch, mode, steps, out_dir, extra), cwd=ROOT, env=environment(mode),
                       capture_output=True, text=True)
    wall = time.time() - t0
    with open(os.path.join(log_dir, os.path.basename(out_dir) + '.txt'), 'w') as f:
        f.write(p.stdout + p.stderr)
    times = [float(m.group(2)) for m in re.finditer(r'^iter (\d+): .* time ([\d.]+)ms', p.stdout, re.M)]
    return p.returncode, times, wall, (p.stdout + p.stderr)[-600:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--mixers', nargs='+', default=['softmax', 'kda', 'mamba2'])
    ap.add_argument('--batches', nargs='+', type=int, default=[64])
    ap.add_argument('--modes', nargs='+', default=['eager', 'compile', 'cudagraphs'])
    ap.add_argument('--cells', nargs='*', default=None, help="mixer:batch:mode cells instead of the full product")
    ap.add_argument('--steps', type=int, default=120)
    ap.add_argument('--skip', type=int, default=40, help="steps left out of the median (compilation, first evals)")
    ap.add_argument('--warm_jobs', type=int, default=12, help="compile every cell at once first (shared disk caches)")
    ap.add_argument('--shared', nargs='*', default=[], help="mixer:batch:mode cells to run --copies at once")
    ap.add_argument('--copies', type=int, default=8)
    ap.add_argument('--log_dir', default='/tmp/mqar-speed-logs')
    args, extra = ap.parse_known_args()
    os.makedirs(args.log_dir, exist_ok=True)
    cells = ([tuple(c.split(':')) for c in args.cells] if args.cells is not None else
             [(m, str(b), mode) for m in args.mixers for b in args.batches for mode in args.modes])
    cells = [(m, int(b), mode) for m, b, mode in cells]
    shared = [(m, int(b), mode) for m, b, mode in (c.split(':') for c in args.shared)]

    if args.warm_jobs and (cells or shared):
        t0 = time.time()
        with ThreadPoolExecutor(args.warm_jobs) as ex:
            res = list(ex.map(lambda c: run(*c, 12, 'warm', extra, args.log_dir), sorted(set(cells + shared))))
        bad = [(c, r[3]) for c, r in zip(sorted(set(cells + shared)), res) if r[0] != 0]
        print(f"warm: {len(res)} runs at once, {time.time() - t0:.0f}s; failed: {len(bad)}", flush=True)
        for c, tail in bad:
            print(f"  {c}: {tail}", flush=True)

    print(f"| mixer | batch | mode | ms/step alone (median of steps {args.skip}-{args.steps}) | min | wall s |", flush=True)
    print("|---|---|---|---|---|---|", flush=True)
    for m, b, mode in cells:
        rc, times, wall, tail = run(m, b, mode, args.steps, 'alone', extra, args.log_dir)
        if rc != 0 or len(times) <= args.skip:
            print(f"| {m} | {b} | {mode} | FAILED rc={rc}: {tail!r} | | |", flush=True)
            continue
        t = times[args.skip:]
        print(f"| {m} | {b} | {mode} | {statistics.median(t):.2f} | {min(t):.2f} | {wall:.0f} |", flush=True)

    for m, b, mode in shared:
        t0 = time.time()
        with ThreadPoolExecutor(args.copies) as ex:
            res = list(ex.map(lambda k: run(m, b, mode, args.steps, f'shared{k}', extra, args.log_dir), range(args.copies)))
        meds = [statistics.median(r[1][args.skip:]) for r in res if r[0] == 0 and len(r[1]) > args.skip]
        if len(meds) < args.copies:
            print(f"shared {m}:{b}:{mode}: {args.copies - len(meds)} of {args.copies} failed", flush=True)
        if meds:
            ms = statistics.median(meds)
            print(f"shared {m}:{b}:{mode} x{args.copies}: median ms/step each {ms:.2f}, aggregate "
                  f"{len(meds) * 1000 / ms:.0f} steps/s ({time.time() - t0:.0f}s wall)", flush=True)


if __name__ == '__main__':
    main()
