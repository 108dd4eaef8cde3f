"""
The recall grid: train every mixer (and the 3:1 KDA:softmax hybrid) on MQAR and on state tracking, at several
task sizes and model widths, one run after another (or --jobs at a time), and write one markdown results table:
the final val answer accuracy of each mixer × (pairs or assignments) × width.

$ python grid.py --jobs=8           # the real run, on one GPU: config/mqar.py and config/statetrack.py as sized there
$ python grid.py --quick            # a tiny version (vocab 32, 32 tokens, 200 steps per run) that runs on 2 CPU cores
$ python grid.py --tasks mqar --mixers softmax kda 'kda*3,softmax' --sizes 8 24 --widths 128 --device=cuda:1
$ python grid.py --resume           # keep the runs that finished (an interrupted grid, or parts run on other GPUs
                                    #   into the same --out_root), run the rest, rewrite the table from all the logs
$ python grid.py --jobs=16 --start_within=4    # on a time-limited lease: start no run after 4 min, --resume later
$ python grid.py --learning_rates 3e-4 1e-3 3e-3    # each cell keeps its best LR (Zoology's protocol)

Every run is `python train.py config/<task>.py --mixer=M --<size key>=N --n_embd=W --n_head=W/32 --learning_rate=LR
--out_dir=<out_root>/<task>/<run>` plus any train.py override given here after the grid's own flags (`--device=cpu`,
`--max_iters=1000`, ...). The table is read back from the runs' log.txt files (plot.py's read_log), so it only
ever shows what the runs printed. Plot one cell's curves with plot.py, e.g.
$ python plot.py out-grid/mqar/*_n16_w128_* --metric=val_acc --out=mqar_n16_w128.png
"""
import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import time

import torch

from plot import read_log

ROOT = os.path.dirname(os.path.abspath(__file__))
MIXERS = ['softmax', 'retnet', 'mamba2', 'deltanet', 'gdn', 'kda', 'kda*3,softmax']
HEAD_WIDTH = 32  # the configs' softmax head width (n_head = width / 32) and linear head_dim, kept at every width

# per task: its config, the train.py key the grid varies, and the tiny --quick version
TASKS = {
    'mqar': dict(
        config='config/mqar.py', size_key='mqar_num_pairs', size_name='pairs',
        sizes=[8, 16, 24], widths=[64, 128, 256],
        quick=dict(sizes=[2, 4], widths=[64],
                   overrides=['--task_vocab_size=32', '--block_size=32'])),
    'statetrack': dict(
        config='config/statetrack.py', size_key='statetrack_num_assignments', size_name='assignments',
        sizes=[32, 64, 96], widths=[64, 128, 256],
        quick=dict(sizes=[4, 8], widths=[64],
                   overrides=['--task_vocab_size=32', '--block_size=32', '--statetrack_num_vars=4',
                              '--statetrack_num_queries=4'])),
}
# --quick for every task: 200 steps of 32 sequences, evals at 100 and 200 on 4 × 32 val sequences, on whatever
# device train.py picks; eager mode (compile=False) comes from the configs
QUICK = ['--batch_size=32', '--max_iters=200', '--lr_decay_iters=200', '--warmup_iters=20', '--eval_interval=100',
         '--eval_iters=4', '--log_interval=50']


def run_name(mixer, size, width, lr):
    # shell- and file-friendly: 'kda*3,softmax' -> 'kdax3+softmax'
    return f"{mixer.replace('*', 'x').replace(',', '+')}_n{size}_w{width}_lr{lr:g}"


def finished(out_dir):
    """The run's log has an eval at its config's max_iters (train.py evals there when eval_interval divides it), or
    says it stopped early at stop_at_val_acc."""
    path = os.path.join(out_dir, 'log.txt')
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        if re.search(r'^stopping at step \d+: val acc', f.read(), re.M):
            return True
    log = read_log(out_dir)
    return log['config'] is not None and any(e['step'] == log['config']['max_iters'] for e in log['evals'])


def train_args(task, mixer, size, width, lr, out_dir, extra):
    """train.py's arguments for one cell of the grid (extra: further overrides, which win)."""
    if width % HEAD_WIDTH != 0:
        raise ValueError(f"width {width} is not a multiple of the {HEAD_WIDTH}-wide heads")
    spec = TASKS[task]
    return [spec['config'], f'--mixer={mixer}', f"--{spec['size_key']}={size}", f'--n_embd={width}',
            f'--n_head={width // HEAD_WIDTH}', f'--learning_rate={lr}', f'--min_lr={lr / 10}', f'--out_dir={out_dir}'] + extra


def start(task, mixer, size, width, lr, out_dir, extra, env):
    """Start one train.py run in the background; its stdout and stderr go to out_dir/run.txt. Returns the Popen."""
    cmd = [sys.executable, 'train.py'] + train_args(task, mixer, size, width, lr, out_dir, extra)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, 'run.txt'), 'w') as f:
        f.write(' '.join(cmd) + '\n')
        f.flush()
        return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)


def table(task, mixers, sizes, widths, lrs, out_root):
    """Markdown: one row per mixer, one column per width × size; a cell is the final val answer accuracy of
    its best LR (with that LR when several were tried), 'failed' when the run stopped early, '—' when absent."""
    spec = TASKS[task]
    cols = [(w, n) for w in widths for n in sizes]
    lines = ["| mixer | " + ' | '.join(f"w={w}, {n} {spec['size_name']}" for w, n in cols) + ' |',
             '|---|' + '---|' * len(cols)]
    for mixer in mixers:
        cells = []
        for w, n in cols:
            best, state = None, '—'
            for lr in lrs:
                out_dir = os.path.join(out_root, task, run_name(mixer, n, w, lr))
                if not os.path.isfile(os.path.join(out_dir, 'log.txt')):
                    continue
                if not finished(out_dir):
                    state = 'failed'
                    continue
                acc = read_log(out_dir)['evals'][-1]['val_acc']
                if best is None or acc > best[0]:
                    best = (acc, lr)
            if best is None:
                cells.append(state)
            else:
                cells.append(f"{best[0]:.3f}" + (f" ({best[1]:g})" if len(lrs) > 1 else ''))
        lines.append(f"| `{mixer}` | " + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def settings(task, out_root):
    """The shared settings of a task's runs, as their logs state them (from the first run that has a log)."""
    task_dir = os.path.join(out_root, task)
    for name in sorted(os.listdir(task_dir)) if os.path.isdir(task_dir) else []:
        if os.path.isfile(os.path.join(task_dir, name, 'log.txt')):
            c = read_log(os.path.join(task_dir, name))['config']
            if c is not None:
                extra = {'mqar': 'N queries of random stored keys',
                         'statetrack': f"{c['statetrack_num_vars']} variables, {c['statetrack_num_queries']} queries"}[task]
                return (f"Sequences of {c['block_size']} tokens, vocabulary {c['task_vocab_size']}, {extra}; "
                        f"{c['n_layer']} layers; {c['max_iters']:,} steps × {c['batch_size'] * c['gradient_accumulation_steps']} "
                        f"sequences" + (f", stopped early at val accuracy ≥ {c['stop_at_val_acc']}"
                                        if c.get('stop_at_val_acc') else "")
                        + f"; accuracy on {c['eval_iters'] * c['batch_size']} fixed val sequences.")
    return "No run of this task has a log yet."


def describe_device(extra):
    device = next((a.split('=', 1)[1] for a in extra if a.startswith('--device=')), '')
    if (device or 'cuda').startswith('cuda') and torch.cuda.is_available():
        return torch.cuda.get_device_name(device or None)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], allow_abbrev=False,
                                 epilog="Arguments not listed here (--key=value) are passed to every train.py run.")
    ap.add_argument('--tasks', nargs='+', default=list(TASKS), choices=list(TASKS))
    ap.add_argument('--mixers', nargs='+', default=MIXERS, help="mixer patterns (default: the six mixers and 'kda*3,softmax')")
    ap.add_argument('--sizes', nargs='+', type=int, help="pairs (mqar) / assignments (statetrack); default per task")
    ap.add_argument('--widths', nargs='+', type=int, help="n_embd values, multiples of 32; default per task")
    ap.add_argument('--learning_rates', nargs='+', type=float, default=[1e-3], help="each cell keeps its best")
    ap.add_argument('--quick', action='store_true', help="tiny tasks and 200 steps per run: a CPU-sized smoke run")
    ap.add_argument('--resume', action='store_true', help="skip runs whose log already ends at max_iters")
    ap.add_argument('--jobs', type=int, default=1, help="runs at once on the same device; small models leave a GPU "
                    "mostly idle (on an H100, 4 at once each ran as fast as alone, 12 at once each 2-2.6x slower)")
    ap.add_argument('--start_within', type=float, default=None, metavar='MIN',
                    help="start no run after this many minutes (a time-limited GPU lease): the runs under way finish, "
                         "the rest show '—' in the table; run the same command with --resume later to fill them in")
    ap.add_argument('--out_root', default=None, help="runs go to <out_root>/<task>/<run> (default out-grid, out-grid-quick)")
    ap.add_argument('--table', default=None, help="the markdown file to write (default <out_root>/results.md)")
    args, extra = ap.parse_known_args()
    # the keys the grid sets for each run come from its own flags; an override would silently break the table
    owned = {'out_dir': '--out_root', 'mixer': '--mixers', 'n_embd': '--widths', 'n_head': '--widths',
             'learning_rate': '--learning_rates', 'min_lr': '--learning_rates (min_lr = LR / 10)',
             'mqar_num_pairs': '--sizes', 'statetrack_num_assignments': '--sizes'}
    for a in extra:
        if not (a.startswith('--') and '=' in a):
            ap.error(f"unrecognised argument {a!r}: train.py overrides must look like --key=value")
        key = a[2:].split('=', 1)[0]
        if key in owned:
            ap.error(f"{a}: the grid sets {key} for each run; use {owned[key]}")
    out_root = args.out_root or ('out-grid-quick' if args.quick else 'out-grid')
    table_path = args.table or os.path.join(out_root, 'results.md')

    plan = []  # (task, mixers, sizes, widths, train.py overrides)
    for task in args.tasks:
        spec = TASKS[task]
        sizes = args.sizes or (spec['quick']['sizes'] if args.quick else spec['sizes'])
        widths = args.widths or (spec['quick']['widths'] if args.quick else spec['widths'])
        overrides = (spec['quick']['overrides'] + QUICK if args.quick else []) + extra  # the user's come last and win
        plan.append((task, args.mixers, sizes, widths, overrides))

    runs = [(task, mixer, size, width, lr, os.path.join(out_root, task, run_name(mixer, size, width, lr)), overrides)
            for task, mixers, sizes, widths, overrides in plan
            for width in widths for size in sizes for mixer in mixers for lr in args.learning_rates]
    print(f"grid: {len(runs)} runs into {out_root}/, {args.jobs} at a time, table -> {table_path}")
    env = dict(os.environ)
    if args.jobs > 1:
        env.setdefault('OMP_NUM_THREADS', '1')  # the runs share the CPU too: one thread each, unless the caller chose
    failures, running, t_start, skipped = [], [], time.time(), 0  # running: (k, out_dir, Popen, start time)

    def wait_for_one():
        while True:
            for item in running:
                k, out_dir, proc, t0 = item
                if proc.poll() is not None:
                    running.remove(item)
                    evals = read_log(out_dir)['evals'] if os.path.isfile(os.path.join(out_dir, 'log.txt')) else []
                    ok = proc.returncode == 0 and len(evals) > 0
                    result = f"val acc {evals[-1]['val_acc']:.3f}" if ok else f"FAILED, see {out_dir}/run.txt"
                    print(f"[{k}/{len(runs)}] {out_dir}: {result} ({time.time() - t0:.0f}s)", flush=True)
                    if not ok:
                        failures.append(out_dir)
                    return
            time.sleep(0.5)

    for k, (task, mixer, size, width, lr, out_dir, overrides) in enumerate(runs, 1):
        if args.resume and finished(out_dir):
            print(f"[{k}/{len(runs)}] {out_dir}: finished earlier, kept")
            continue
        if len(running) == args.jobs:
            wait_for_one()
        if args.start_within is not None and time.time() - t_start > 60 * args.start_within:
            if not args.resume:  # this grid reruns every cell: an older log there must not stand in the table
                shutil.rmtree(out_dir, ignore_errors=True)
            skipped += 1
            continue
        shutil.rmtree(out_dir, ignore_errors=True)  # a fresh log: train.py appends to log.txt
        running.append((k, out_dir, start(task, mixer, size, width, lr, out_dir, overrides, env), time.time()))
    while running:
        wait_for_one()

    cmd = ' '.join(['python', 'grid.py'] + sys.argv[1:])
    parts = ["# Recall grid: final val answer accuracy\n",
             f"Made by `{cmd}` on {describe_device(extra)}, {time.strftime('%Y-%m-%d')}; "
             f"this invocation ran for {(time.time() - t_start) / 60:.1f} min. Every run: its task config "
             f"(`config/<task>.py`){' with the --quick overrides in grid.py' if args.quick else ''}, "
             f"n_embd = w, 32-wide heads; logs in `{out_root}/<task>/`.\n"]
    for task, mixers, sizes, widths, overrides in plan:
        parts.append(f"## {task}\n\n{settings(task, out_root)}\n\n{table(task, mixers, sizes, widths, args.learning_rates, out_root)}\n")
    os.makedirs(os.path.dirname(os.path.abspath(table_path)), exist_ok=True)
    with open(table_path, 'w') as f:
        f.write('\n'.join(parts))
    print('\n'.join(parts))
    print(f"wrote {table_path}")
    if skipped:
        print(f"{skipped} runs not started (--start_within {args.start_within:g} min): add --resume to run them")
    if failures:
        print(f"{len(failures)} runs failed: " + ', '.join(failures))
        sys.exit(1)


if __name__ == '__main__':
    main()
