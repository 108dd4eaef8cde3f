"""
Time to loss: mixers trained on the same tokens in the same order, compared by val loss against tokens and against
seconds, and by the time each takes to reach a baseline's final val loss.

$ python tools/ttl.py run out-ttl --mixers softmax 'kda*3,softmax' gdn kda --lrs 6e-4 1.2e-3 --seeds 1337 1338 \\
      -- config/pkgtext.py                      # the settings after -- go to every run, unchanged
$ python tools/ttl.py run out-final --mixers softmax 'kda*3,softmax' --lrs_from out-ttl --seeds 1337 1338 \\
      -- config/pkgtext.py                      # each arm at its best rate in out-ttl (a shorter sweep)
$ python tools/ttl.py report out-ttl            # the tables, and out-ttl/ttl.png
$ python tools/ttl.py report out-ttl --baseline softmax --plot ttl.png

run: train.py once per (mixer, optimizer, learning rate, seed), one run at a time (each alone on the GPU: the clock is
what is measured; --gpus N: N at a time, each alone on one of N GPUs of one host; --per_gpu K: K runs share each GPU,
for a learning-rate sweep, whose losses do not depend on it, while their clocks are not one run's), into
<out>/<mixer>_<optimizer>_lr<lr>_s<seed>; each gets --mixer, --optimizer, --learning_rate, --min_lr =
learning_rate / 10 and --seed, and the same settings after `--` (config and overrides). The data loader reads the
train shards in order, so every run sees the same batches in the same order, and every eval scores the same first
eval_iters val batches. A finished run is kept (run again to fill in the rest) when it ran with the same settings,
else refused; an unfinished one starts again from scratch, since a resumed run's clock would not be one run's.

report: each run's log.txt (plot.py's read_log). The clock at an eval is train.py's train clock (the sum of the step
times: evals and saves not counted) less the compile time: what the first ten steps took beyond the median step
(compiling, autotuning), reported apart; give train.py --log_interval=1 so that all ten are logged (with a longer
interval only step 0 is seen). An arm is a (mixer, optimizer); its best rate is the one with the lowest mean final val
loss, chosen the same way for every arm. Per arm at its best rate: the final val loss as mean ± half-range over seeds,
the median tokens/s, the compile time, and the time and tokens to reach the baseline's final val loss (the baseline
mixer with AdamW, mean over its seeds): where the mean curve over seeds first reaches it, interpolated linearly
between evals, or "not reached"; with several optimizers also the tokens each takes to its mixer's AdamW final loss,
over AdamW's own; the largest spike: how far one step's training loss rose above the median of the logged losses of
the 50 steps before it (from step 100 on; the largest over seeds) and at which step (one step in every run: a batch of harder text, not
the optimizer), and how many steps were non-finite. Under it each seed's own final val loss and time to the target
(a mean hides a spread); then every rate. The picture: val loss against tokens (the seeds' range shaded) and against
seconds, one line per arm at its best rate (the mean over seeds), and the per-step training loss.
"""
import argparse
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules
import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback
from configurator import UserError
from plot import read_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLOCK = re.compile(r'^step (\d+): .*\(eval [\d.]+s, train clock ([\d.]+)s\)$', re.M)
GPU = re.compile(r'^\|\s+\d+\s+(NVIDIA .+?)\s{2,}(?:On|Off)\s', re.M)  # the nvidia-smi table train.py logs
ITER = re.compile(r'^iter (\d+)/\d+: loss (nan|inf|[\d.]+),.* time ([\d.]+)ms', re.M)


def run_name(mixer, optimizer, lr, seed):
    return f"{mixer.replace(' ', '').replace('*', 'x').replace(',', '+')}_{optimizer}_lr{lr:g}_s{seed}"


def finished(out_dir):
    """True when out_dir's log holds one straight run (not resumed) that reached its max_iters: its final eval
    line written whole, as report reads it."""
    if not os.path.isfile(os.path.join(out_dir, 'log.txt')):
        return False
    try:
        r = read_run(out_dir)
    except (OSError, ValueError, UserError):
        return False
    return r['steps'][-1] == r['max_iters']


def ran_with(out_dir):
    """The train.py arguments of out_dir's last run (its log's `=== date time train.py args` line), --out_dir left
    out."""
    with open(os.path.join(out_dir, 'log.txt')) as f:
        heads = re.findall(r'^=== \S+ \S+ \S+(.*)$', f.read(), re.M)
    return [a for a in heads[-1].split() if not a.startswith('--out_dir=')] if heads else []


def run(args, settings):
    rates = {(m, o): args.lrs for m in args.mixers for o in args.optimizers}
    if args.lrs_from:  # each arm at its best rate in that sweep, picked as report picks it
        best = best_rates(groups(run_dirs([args.lrs_from])))
        for arm in rates:
            if arm not in best:
                raise UserError(f"{args.lrs_from} holds no finished run of {arm[0]} with {arm[1]}: sweep it first")
            rates[arm] = [best[arm]]
            print(f"{arm[0]} with {arm[1]}: lr {best[arm]:g}, its best in {args.lrs_from}", flush=True)
    jobs = [(m, o, lr, s) for (m, o), lrs in rates.items() for lr in lrs for s in args.seeds]
    todo = []
    for i, (mixer, optimizer, lr, seed) in enumerate(jobs):  # a mixer's runs together: its compile cache is warm
        out_dir = os.path.join(args.out, run_name(mixer, optimizer, lr, seed))
        cmd = [sys.executable, os.path.join(ROOT, 'train.py')] + settings + [
            f'--mixer={mixer}', f'--optimizer={optimizer}', f'--learning_rate={lr}', f'--min_lr={lr / 10:g}', f'--seed={seed}', f'--out_dir={out_dir}',
            '--overwrite=True', '--init_from=scratch']
        if finished(out_dir):
            before, now = ran_with(out_dir), [a for a in cmd[2:] if not a.startswith('--out_dir=')]
            if before != now:  # (checked before any run starts)
                raise UserError(f"{out_dir} finished with other settings ({' '.join(before)}), not these "
                                f"({' '.join(now)}): give another out folder, or remove that run to train it again")
            print(f"[{i + 1}/{len(jobs)}] {out_dir}: finished before, kept", flush=True)
            continue
        todo.append((f"[{i + 1}/{len(jobs)}] {out_dir}", out_dir, cmd))
    if todo:
        os.makedirs(args.out, exist_ok=True)
    # --gpus N: N runs at once, each alone on one of the GPUs this process may use (CUDA_VISIBLE_DEVICES, else 0..N-1)
    visible = [d for d in os.environ.get('CUDA_VISIBLE_DEVICES', '').split(',') if d.strip()] or [str(g) for g in range(args.gpus)]
    if args.gpus > len(visible):
        raise UserError(f"--gpus {args.gpus}: CUDA_VISIBLE_DEVICES names only {len(visible)} ({','.join(visible)})")
    slots = args.gpus * args.per_gpu  # slot s runs on GPU s % gpus (runs spread over the GPUs first)
    running, failed = {}, []  # slot -> (out_dir, process, its console file)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (else a SIGTERM ends ttl.py and leaves its runs going)
    try:
        while todo or running:
            while todo and len(running) < slots:
                slot = min(set(range(slots)) - set(running))
                gpu = visible[slot % args.gpus]
                name, out_dir, cmd = todo.pop(0)
                print(f"{name}: {' '.join(cmd[1:])}" + (f" (GPU {gpu})" if slots > 1 else ""), flush=True)
                shared = out_dir.rstrip('/') + '.shared'  # report leaves such a run's clock out
                if args.per_gpu > 1:
                    with open(shared, 'w') as f:
                        f.write(f"{args.per_gpu} runs shared its GPU: its clock is not one run's\n")
                elif os.path.exists(shared):
                    os.remove(shared)
                if slots == 1:
                    running[slot] = (out_dir, subprocess.Popen(cmd, cwd=ROOT), None)
                else:
                    console = open(out_dir.rstrip('/') + '.console', 'w')
                    running[slot] = (out_dir, subprocess.Popen(cmd, cwd=ROOT, stdout=console, stderr=subprocess.STDOUT,
                                                               env=dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)), console)
            for slot, (out_dir, proc, console) in list(running.items()):
                code = proc.wait() if slots == 1 else proc.poll()
                if code is not None:
                    del running[slot]
                    if console:
                        console.close()
                    if code != 0:
                        failed.append(out_dir)
                        print(f"ttl.py: {out_dir} stopped with status {code}: see its log.txt", flush=True)
            if running and slots > 1:
                time.sleep(2)
    finally:  # Ctrl-C, a SIGTERM or an error here: no run is left behind (each stops at a step, as train.py does)
        for out_dir, proc, console in running.values():
            proc.terminate()
            proc.wait()
            if console:
                console.close()
    if failed:
        sys.exit(f"ttl.py: {len(failed)} run(s) stopped ({', '.join(failed)}): `ttl.py run` again starts them anew")


def read_run(out_dir):
    """One run's curve: {'mixer', 'lr', 'seed', 'steps', 'tokens', 'seconds', 'val', 'iters', 'losses', 'tok_s',
    'compile', 'max_iters'} with seconds at each eval, compile time not counted."""
    log = read_log(out_dir)
    c = log['config']
    if not c or not log['evals'] or log['tokens_per_iter'] is None:
        raise UserError(f"{out_dir}: no evals in its log.txt (not a train.py run, or it never evaluated)")
    with open(os.path.join(out_dir, 'log.txt')) as f:
        starts = [s for s in re.split(r'^(?==== )', f.read(), flags=re.M) if re.search(r'^config: ', s, re.M)]
    scratch = [i for i, s in enumerate(starts) if "'init_from': 'scratch'" in s and "'eval_only': False" in s]
    if not scratch or scratch[-1] != len(starts) - 1:
        raise UserError(f"{out_dir}: a resumed run, whose clock restarted: run it again straight (ttl.py run)")
    text = starts[-1]  # the run itself
    clock = {int(s): float(t) for s, t in CLOCK.findall(text)}
    iters = [(int(n), float(loss), float(ms) / 1000) for n, loss, ms in ITER.findall(text)]
    if not clock or not iters or iters[0][0] != 0:
        raise UserError(f"{out_dir}: its log has no train clock or no iter 0 line (a log of an older train.py?)")
    median = statistics.median([t for _, _, t in iters[1:]] or [iters[0][2]])
    losses = [loss for _, loss, _ in iters]
    rise = None  # the largest spike: (how far a step's loss rose over the median of the 50 steps before it, the step)
    finite = [(n, x) for n, x, _ in iters if math.isfinite(x)]
    for k, (n, x) in enumerate(finite):
        before = [y for m, y in finite[max(0, k - 50):k] if m >= n - 50]
        if n >= 100 and before and (rise is None or x - statistics.median(before) > rise[0]):
            rise = (x - statistics.median(before), n)
    compile_s = sum(max(t - median, 0.0) for n, _, t in iters if n < 10)  # compiling, autotuning: the first steps
    evals = [e for e in log['evals'] if e['step'] in clock]
    gpu = GPU.search(text)
    return {'shared': os.path.exists(out_dir.rstrip('/') + '.shared'),  # (run --per_gpu: the clock is not one run's)
            'device': gpu.group(1) if gpu else c.get('device') or 'cpu', 'mixer': c['mixer'],
            'optimizer': c.get('optimizer', 'adamw'), 'lr': c['learning_rate'], 'seed': c['seed'], 'max_iters': c['max_iters'],
            'steps': [e['step'] for e in evals], 'tokens': [e['step'] * log['tokens_per_iter'] for e in evals],
            'seconds': [max(clock[e['step']] - compile_s, 0.0) if e['step'] else 0.0 for e in evals],
            'val': [e['val_loss'] for e in evals], 'iters': [n * log['tokens_per_iter'] for n, _, _ in iters],
            'losses': losses, 'tok_s': log['tokens_per_iter'] / median, 'compile': compile_s, 'rise': rise,
            'nonfinite': sum(not math.isfinite(x) for x in losses)}


def mean_curve(runs):
    """The seeds' mean (steps, tokens, seconds, val) at the eval steps they all have."""
    steps = sorted(set.intersection(*(set(r['steps']) for r in runs)))
    at = lambda r, key: [r[key][r['steps'].index(s)] for s in steps]
    mean = lambda key: [statistics.fmean(v) for v in zip(*(at(r, key) for r in runs))]
    return steps, mean('tokens'), mean('seconds'), mean('val')


def reach(xs, losses, target):
    """The x where the curve (xs, losses) first reaches target, linear between evals; None when it never does."""
    for i, loss in enumerate(losses):
        if loss <= target:
            if i == 0:
                return xs[0]
            x0, l0 = xs[i - 1], losses[i - 1]
            return x0 + (l0 - target) / (l0 - loss) * (xs[i] - x0)
    return None


def groups(out_dirs):
    """{(mixer, optimizer, lr): [runs over seeds]} of the finished runs among out_dirs, and of those that diverged
    (stopped on a non-finite loss: their 'final' is nan, which rules their rate out); a warning for each other
    unfinished one."""
    found = {}
    for d in out_dirs:
        try:
            r, why = read_run(d), "not finished"
        except (OSError, ValueError, UserError) as e:
            r, why = None, str(e).removeprefix(f"{d}: ")
        done = r is not None and r['steps'][-1] == r['max_iters']
        diverged = r is not None and (r['nonfinite'] > 0 or not all(math.isfinite(v) for v in r['val']))
        if not done and not diverged:
            print(f"ttl.py: {d}: {why}; left out", file=sys.stderr)
            continue
        r['final'] = r['val'][-1] if done and math.isfinite(r['val'][-1]) else math.nan
        if not math.isfinite(r['final']):
            print(f"ttl.py: {d}: diverged (a non-finite loss): its rate is ruled out", file=sys.stderr)
        found.setdefault((r['mixer'], r['optimizer'], r['lr']), []).append(r)
    if not found:
        raise UserError(f"no finished train.py runs among {', '.join(out_dirs)}: `ttl.py run` first")
    seeds = {}
    for (mixer, optimizer, lr), runs in found.items():
        seeds.setdefault((mixer, optimizer), set()).update(r['seed'] for r in runs)
    for (mixer, optimizer, lr), runs in found.items():
        if len(runs) < len(seeds[(mixer, optimizer)]):  # its mean is over fewer seeds than its arm's other rates'
            print(f"ttl.py: warning: {mixer} with {optimizer} at lr {lr:g} has {len(runs)} of the arm's "
                  f"{len(seeds[(mixer, optimizer)])} seeds", file=sys.stderr)
        if len({(r['max_iters'], r['tokens'][-1]) for r in runs if math.isfinite(r['final'])}) > 1:
            raise UserError(f"{mixer} with {optimizer} at lr {lr:g}: its seeds trained different token counts: compare "
                            f"like with like")
    return found


def spike(runs):
    """The largest spike over runs, and its step: a spike at the same step in every run is a hard batch."""
    rises = [r['rise'] for r in runs if r['rise'] is not None]
    return "{:.2f} (step {})".format(*max(rises)) if rises else "— (under 100 steps)"


def run_dirs(paths):
    """The run folders among paths: each a run folder (a log.txt in it) or a folder holding them."""
    out_dirs = []
    for path in paths:
        if not os.path.exists(path):
            raise UserError(f"{path}: no such folder")
        subs = sorted(os.path.join(path, d) for d in os.listdir(path)) if os.path.isdir(path) else []
        out_dirs += [d for d in subs if os.path.isfile(os.path.join(d, 'log.txt'))] or [path]
    return out_dirs


def final_loss(runs):
    """The mean final val loss over seeds; nan if one of them diverged."""
    return statistics.fmean(r['final'] for r in runs)


def best_rates(found):
    """{(mixer, optimizer): the learning rate with the lowest mean final val loss over its seeds, none of them
    diverged}: the same rule for every arm (an arm whose every rate diverged has none)."""
    best = {}
    for (mixer, optimizer, lr), runs in sorted(found.items()):
        arm, loss = (mixer, optimizer), final_loss(runs)
        if math.isfinite(loss) and (arm not in best or loss < final_loss(found[arm + (best[arm],)])):
            best[arm] = lr
    return best


def report(args):
    found = groups(run_dirs(args.runs))
    final = {k: final_loss(runs) for k, runs in found.items()}
    best = best_rates(found)  # (mixer, optimizer) -> its best learning rate
    base_arm = (args.baseline, 'adamw') if (args.baseline, 'adamw') in best else next(
        (a for a in best if a[0] == args.baseline), None)
    if base_arm is None:
        raise UserError(f"no finished run of the baseline {args.baseline!r} (mixers found: "
                        f"{', '.join(sorted({m for m, _ in best}))}): give --baseline one of them")
    best = dict(sorted(best.items(), key=lambda kv: (kv[0] != base_arm, kv[0][0] != args.baseline)))  # baseline first
    base = found[base_arm + (best[base_arm],)]
    target = final[base_arm + (best[base_arm],)]
    # a clock compares only on one kind of GPU: the times and speeds are those of the runs on the baseline's (its
    # seeds' most common); a run on another counts for its losses only
    devices = [r['device'] for r in base]
    clock = max(devices, key=devices.count)
    on_clock = lambda runs: [r for r in runs if r['device'] == clock]
    base_time = reach(*mean_curve(on_clock(base))[2:], target)
    optimizers = len({o for _, o in best}) > 1

    def row(mixer, optimizer, lr):
        runs = found[(mixer, optimizer, lr)]
        vals = [r['final'] for r in runs]
        _, tokens, _, val = mean_curve(runs)
        timed = on_clock(runs)
        t = reach(*mean_curve(timed)[2:], target) if timed else None
        n = reach(tokens, val, target)
        mine, either = any(r['shared'] for r in runs), any(r['shared'] for r in runs + base)  # (run --per_gpu)
        speed = ["— (GPU shared)"] * 2 if mine else [f"— (not run on {clock})"] * 2 if not timed else [
            f"{statistics.fmean(r['tok_s'] for r in timed):,.0f}", f"{statistics.fmean(r['compile'] for r in timed):.1f}"]
        if n is None:
            time_to = "not reached"
        elif either:  # a shared GPU's clock is not one run's: the tokens only
            time_to = f"{n / 1e6:,.1f}M tokens (GPU shared: no time)"
        elif not timed or t is None:  # its loss curve reaches the target; no run on the clock's GPU does
            time_to = f"{n / 1e6:,.1f}M tokens (no time: " + ("not run on " + clock if not timed else
                                                               f"its seeds on {clock} do not reach it") + ")"
        else:
            time_to = f"{t:,.1f} s ({t / base_time:.2f}×), {n / 1e6:,.1f}M tokens" if base_time else \
                f"{t:,.1f} s, {n / 1e6:,.1f}M tokens"
            if len(timed) < len(runs):
                time_to += f" (time: its {len(timed)} of {len(runs)} seeds on {clock})"
        cells = [f"`{mixer}`"] + ([optimizer] if optimizers else []) + [
            f"{lr:g}", str(len(runs)), f"{statistics.fmean(vals):.4f} ± {(max(vals) - min(vals)) / 2:.4f}"
            if all(map(math.isfinite, vals)) else f"diverged ({sum(not math.isfinite(v) for v in vals)} of {len(vals)})"
            ] + speed + [
            time_to,
            spike(runs) + (f", {sum(r['nonfinite'] for r in runs)} non-finite" if any(r['nonfinite'] for r in runs)
                           else "")]
        if optimizers:  # the tokens this arm takes to its mixer's AdamW final loss, over AdamW's own
            adamw = (mixer, 'adamw')
            if adamw in best and optimizer != 'adamw':
                runs_a = found[adamw + (best[adamw],)]
                goal = final[adamw + (best[adamw],)]
                mine, theirs = reach(tokens, val, goal), reach(mean_curve(runs_a)[1], mean_curve(runs_a)[3], goal)
                cells.append("not reached" if mine is None else f"{mine / theirs:.2f}×" if theirs else "—")
            else:
                cells.append("—")
        return '| ' + ' | '.join(cells) + ' |'

    r0 = base[0]
    counts = {arm: found[arm + (lr,)][0]['tokens'][-1] for arm, lr in best.items()}
    if len(set(counts.values())) > 1:  # a time to a loss compares runs of one budget
        print(f"ttl.py: warning: the arms trained different token counts ("
              f"{', '.join(f'{m} {o}: {n / 1e6:,.1f}M' for (m, o), n in counts.items())}): compare like with like",
              file=sys.stderr)
    devices = sorted({r['device'] for runs in found.values() for r in runs})
    if len(devices) > 1:
        print(f"ttl.py: warning: the runs ran on different devices ({', '.join(devices)}): times and tokens/s are "
              f"those of the runs on {clock}, the baseline's; the others count for their losses only", file=sys.stderr)
    names = (['mixer'] + (['optimizer'] if optimizers else []) + ['lr', 'seeds', 'final val loss', 'tokens/s',
             'compile s', f"time to {args.baseline}'s {target:.4f}", 'largest spike'] +
             (["tokens to its AdamW's final loss"] if optimizers else []))
    head = '| ' + ' | '.join(names) + ' |\n|' + '---|' * len(names)
    print(f"Time to loss on {clock}: {r0['tokens'][-1] / 1e6:,.1f}M tokens per run; target: "
          f"{' with '.join(base_arm)}'s final val loss at its best lr, mean over its seeds (× = the time over its own)\n")
    print(head)
    for arm, lr in best.items():
        print(row(*arm, lr))
    several = [(arm, lr) for arm, lr in best.items() if len(found[arm + (lr,)]) > 1]
    if several:  # a mean hides how far apart the seeds are: each one's own numbers
        print("\nEach seed at its arm's best rate: final val loss, and time (tokens) to the target:\n")
    for arm, lr in several:
        cells = []
        for r in sorted(found[arm + (lr,)], key=lambda r: r['seed']):
            t, n = reach(r['seconds'], r['val'], target), reach(r['tokens'], r['val'], target)
            cells.append(f"seed {r['seed']} {r['final']:.4f}, " + ("not reached" if n is None else
                         f"{n / 1e6:,.1f}M tokens" if r['shared'] else f"{n / 1e6:,.1f}M tokens (on {r['device']})"
                         if r['device'] != clock else f"{t:,.1f} s ({n / 1e6:,.1f}M tokens)"))
        print(f"- `{arm[0]}`{' with ' + arm[1] if optimizers else ''}: " + '; '.join(cells))
    if len(found) > len(best):
        print("\nEvery learning rate (the best of each above: the lowest mean final val loss):\n")
        print(head)
        for key in sorted(found, key=lambda k: (list(best).index(k[:2]), k[2])):
            print(row(*key))
    if args.plot != '':
        path = args.plot or os.path.join(args.runs[0] if os.path.isdir(args.runs[0]) else '.', 'ttl.png')
        picture({arm: found[arm + (lr,)] for arm, lr in best.items()}, target, ' with '.join(base_arm), path,
                args.title, clock)
        print(f"\npicture: {path}")


def picture(curves, target, baseline, path, title=None, clock=None):
    """Val loss against tokens (each arm's mean, the seeds' range shaded) and against seconds (the mean of its runs on
    the clock's GPU, clock None: all), the training loss per step; target a dotted line."""
    import matplotlib
    matplotlib.use('Agg')  # files only, no display needed
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    top = max(statistics.fmean(r['val'][min(1, len(r['val']) - 1)] for r in runs) for runs in curves.values())
    low, high = math.inf, -math.inf  # the training-loss panel's range: its own curves after the first tenth
    for i, ((mixer, optimizer), runs) in enumerate(curves.items()):
        steps, tokens, _, val = mean_curve(runs)
        label = f"{mixer} ({optimizer}, lr {runs[0]['lr']:g}, {len(runs)} seed{'s: mean, range shaded' if len(runs) > 1 else ''})"
        axes[0].plot([t / 1e6 for t in tokens], val, marker='o', markersize=2, color=f'C{i}', label=label)
        if len(runs) > 1:  # the seeds' range around their mean: a spread is part of the result
            at = [[r['val'][r['steps'].index(s)] for r in runs] for s in steps]
            axes[0].fill_between([t / 1e6 for t in tokens], [min(v) for v in at], [max(v) for v in at],
                                 color=f'C{i}', alpha=0.2, linewidth=0)
        timed = [r for r in runs if clock is None or r['device'] == clock]
        if timed and not any(r['shared'] for r in runs):  # (run --per_gpu: no clock)
            _, _, seconds_t, val_t = mean_curve(timed)
            axes[1].plot(seconds_t, val_t, marker='o', markersize=2, color=f'C{i}',
                         label=label if len(timed) == len(runs) else f"{label}; time: {len(timed)} on {clock}")
        for j, r in enumerate(runs):  # each seed's per-step loss, a moving mean over 4% of the run (a batch of code
            k = max(1, len(r['losses']) // 25)  # and one of prose differ by more than a nat)
            smooth = [statistics.fmean(r['losses'][max(0, n - k):n + 1]) for n in range(len(r['losses']))]
            axes[2].plot([t / 1e6 for t in r['iters']], smooth, color=f'C{i}', linewidth=0.8, alpha=0.8,
                         label=label if j == 0 else None)
            low, high = min(low, min(smooth[k:] or smooth)), max(high, smooth[len(smooth) // 10])
    for ax, xlabel, ylabel in ((axes[0], 'training tokens (M)', 'val loss'), (axes[1], 'training seconds (compile not '
                               'counted)', 'val loss'), (axes[2], 'training tokens (M)', 'training loss (per step, smoothed)')):
        ax.axhline(target, color='grey', linestyle=':', linewidth=0.8, label=f"{baseline}'s final {target:.3f}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(*((target - 0.3, top) if ax is not axes[2] else (low - 0.1, high)))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title or "time to loss", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main_args(argv):
    settings = argv[argv.index('--') + 1:] if '--' in argv else []
    argv = argv[:argv.index('--')] if '--' in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], allow_abbrev=False)
    sub = ap.add_subparsers(dest='command', required=True)
    r = sub.add_parser('run', help="train every (mixer, lr, seed), one at a time; train.py settings after --")
    r.add_argument('out', help="folder for the runs: <out>/<mixer>_<optimizer>_lr<lr>_s<seed>")
    r.add_argument('--mixers', nargs='+', required=True)
    lr = r.add_mutually_exclusive_group(required=True)
    lr.add_argument('--lrs', nargs='+', type=float, help="every arm at each of these learning rates")
    lr.add_argument('--lrs_from', metavar='SWEEP', help="each arm at its best rate among the finished runs in SWEEP "
                    "(a ttl.py run folder; the lowest mean final val loss, as report picks it)")
    r.add_argument('--seeds', nargs='+', type=int, default=[1337])
    r.add_argument('--optimizers', nargs='+', default=['adamw'], choices=['adamw', 'muon'])
    r.add_argument('--gpus', type=int, default=1, help="runs at once, each alone on one GPU (its console output in "
                   "<run folder>.console)")
    r.add_argument('--per_gpu', type=int, default=1, help="runs sharing each GPU (a learning-rate sweep: the same "
                   "losses in less time; report then gives their tokens, not their clocks)")
    p = sub.add_parser('report', help="tables and picture from finished runs")
    p.add_argument('runs', nargs='+', help="run folders, or folders holding them (ttl.py run's <out>)")
    p.add_argument('--baseline', default='softmax', help="the mixer whose final val loss is the target")
    p.add_argument('--plot', default=None, help="PNG path ('' for none); default <first folder>/ttl.png")
    p.add_argument('--title', default=None)
    args = ap.parse_args(argv)
    if args.command == 'run':
        if not settings:
            raise UserError("give train.py's settings after --, e.g. `-- config/pkgtext.py` (every run gets the same)")
        for flag in ('mixer', 'optimizer', 'learning_rate', 'min_lr', 'seed', 'out_dir', 'init_from', 'overwrite'):
            if any(s.startswith(f'--{flag}=') for s in settings):
                raise UserError(f"--{flag} is set by ttl.py for each run: leave it out of the settings after --")
        if args.gpus < 1 or args.per_gpu < 1:
            raise UserError(f"--gpus and --per_gpu must be >= 1, got {args.gpus} and {args.per_gpu}")
        if min(args.lrs or [1]) <= 0 or len(set(args.lrs or [])) < len(args.lrs or []) or len(set(args.seeds)) < len(args.seeds):
            raise UserError(f"--lrs must be > 0 and distinct and --seeds distinct, got {args.lrs} and {args.seeds}")
        run(args, settings)
    else:
        report(args)


if __name__ == '__main__':
    main_args(sys.argv[1:])
