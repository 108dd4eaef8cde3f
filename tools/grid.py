"""
The recall grid: train every mixer (and the 3:1 KDA:softmax hybrid) on MQAR and on state tracking, at several
task sizes and model widths, one run after another (or --jobs at a time), and write one markdown results table:
the final val answer accuracy of each mixer × (pairs or assignments) × width.

$ python tools/grid.py --jobs=8           # the real run, on one GPU: config/mqar.py and config/statetrack.py as sized there
$ python tools/grid.py --quick            # a tiny version (vocab 32, 32 tokens, 200 steps per run) that runs on 2 CPU cores
$ python tools/grid.py --tasks mqar --mixers softmax kda 'kda*3,softmax' --sizes 8 24 --widths 128 --device=cuda:1
$ python tools/grid.py --resume           # keep the runs that finished (an interrupted grid, or parts run on other GPUs
                                    #   into the same --out_root), continue the unfinished ones from their ckpt.pt,
                                    #   run the rest, rewrite the table from all the logs
$ python tools/grid.py --jobs=16 --start_within=4    # on a time-limited lease: start no run after 4 min, --resume later
$ python tools/grid.py --learning_rates 3e-4 1e-3 3e-3    # each cell keeps its best LR (Zoology's protocol)
$ python tools/grid.py --tasks mqar --learning_rates 3e-4 1e-3 --seeds 1337 1338 --jobs 16 --max_iters=16000 \
    --lr_decay_iters=16000 --eval_interval=500 --stop_at_val_acc=0.99 --plot recall.png
                                    # 2 seeds per cell; 1e-3 runs only where 3e-4 did not reach 0.99; a figure too
$ python tools/grid.py ... --learning_rates 3e-4 1e-3 --batch_sizes 64 256 --stop_at_val_acc=0.99
                                    # then, where neither LR reached 0.99, both again at 256 sequences a step
$ python tools/grid.py --tasks needle --seeds 1337 1338 --learning_rates 1e-3 3e-4 --stop_at_val_acc=0.99
                                    # the long-context study's runs (not in the default grid); then
                                    #   python tools/longctx.py needle out-grid/needle/* scores them at longer contexts
$ python tools/grid.py ... --ahead        # a cell's later settings start without waiting for its earlier ones, and are
                                    #   stopped if one of those reaches the threshold: the same table, sooner

Every run is `python train.py config/<task>.py --mixer=M --<size key>=N --n_embd=W --n_head=W/32 --learning_rate=LR
--seed=S --out_dir=<out_root>/<task>/<run>` plus any train.py override given here after the grid's own flags
(`--device=cpu`, `--max_iters=1000`, ...); <run> is e.g. kda_n16_w128_lr0.001_s1337, with _bs256 appended at a
--batch_sizes batch other than the config's. The seed sets the model's init and the order of the training sequences
(tasks.py's TaskLoader); the val set is the same fixed one for every seed.

Seeds and learning rates: a cell shows, over --seeds, the mean of each seed's best final val accuracy over
--learning_rates, ± half the range over seeds, and the LRs that gave the bests. With --stop_at_val_acc (passed on
to train.py, which then stops a run at the first eval that reaches it) the LRs of a cell and seed run in the given
order, and a later LR runs only if no earlier one reached the threshold: put the LR most likely to succeed first.
The runs of every cell's first LR start first; a later LR starts as soon as its cell's earlier ones are done.
--batch_sizes extends the same ladder: all the LRs at the first batch size, then all at the next, and so on (for
softmax attention on MQAR more sequences a step made the recall circuit form where more steps did not: notes/perf.md
2026-11-25 (s)); a cell then names its best as e.g. '1e-3 bs256'.

The table is read back from the runs' log.txt files (plot.py's read_log), so it only ever shows what the runs
printed; --plot draws the same numbers (one row of panels per task, one panel per width, accuracy against size,
one line per mixer; needs matplotlib). Plot one cell's curves with plot.py, e.g.
$ python tools/plot.py out-grid/mqar/*_n16_w128_* --metric=val_acc --out=mqar_n16_w128.png
"""
import argparse
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules
import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback
import time
from collections import namedtuple

import torch

import model
from checkpoint import INHERITED_LOCK, lock_out_dir
from configurator import UserError
from plot import read_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIXERS = list(model.MIXERS) + ['kda*3,softmax']  # every registered mixer and the 3:1 hybrid
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
    # not in the default grid: the long-context study trains these, then longctx.py scores them at longer contexts
    'needle': dict(
        config='config/needle.py', size_key='needle_num_needles', size_name='needles',
        sizes=[4], widths=[128],
        quick=dict(sizes=[2], widths=[64], overrides=['--task_vocab_size=32', '--block_size=32'])),
}
RECALL = ['mqar', 'statetrack']  # the recall grid: what grid.py runs without --tasks
# --quick for every task: 200 steps of 32 sequences, evals at 100 and 200 on 4 × 32 val sequences, on whatever
# device train.py picks; eager mode (compile=False) comes from the configs
QUICK = ['--batch_size=32', '--max_iters=200', '--lr_decay_iters=200', '--warmup_iters=20', '--eval_interval=100',
         '--eval_iters=4', '--log_interval=50']


SEED = 1337  # train.py's default seed: the one seed of a grid without --seeds

# one train.py run of the grid; the runs of one (task, mixer, size, width, seed) differ only in lr and batch, the
# settings tried in turn (batch None: the config's; overrides then hold the run's --batch_size and --eval_iters);
# lock: out_dir's lock, held by run_all from before it clears out_dir until the launched train.py holds it too
Run = namedtuple('Run', 'task mixer size width seed lr out_dir overrides batch lock', defaults=(None, None))


def run_name(mixer, size, width, lr, seed, batch=None):
    # shell- and file-friendly: 'kda*3,softmax' -> 'kdax3+softmax'; '_bs256' only where the batch is not the config's
    return (f"{mixer.replace('*', 'x').replace(',', '+')}_n{size}_w{width}_lr{lr:g}_s{seed}"
            + (f"_bs{batch}" if batch is not None else ''))


def setting_label(lr, batch=None):
    """How a table cell names the setting that gave a seed's best: '3e-4', or '3e-4 bs256' off the config's batch."""
    return short_lr(lr) + (f" bs{batch}" if batch is not None else '')


def batch_overrides(config, overrides, batch):
    """train.py's --batch_size and --eval_iters for a run of `batch` sequences a step, with eval_iters scaled so that
    its evals see the same val sequences as the config's batch (eval_iters × batch_size of them); and whether that
    batch is the config's own (then the run keeps the name it would have without --batch_sizes)."""
    values = {}
    with open(os.path.join(ROOT, config)) as f:  # a config is plain assignments (configurator.py execs it too)
        exec(f.read(), {}, values)
    for a in overrides:  # --quick's (or the user's) overrides change the base, as in train.py: the last one wins
        key, _, value = a[2:].partition('=')
        if key in ('batch_size', 'eval_iters'):
            values[key] = int(value)
    base, val_sequences = values['batch_size'], values['eval_iters'] * values['batch_size']
    if val_sequences % batch != 0:
        raise ValueError(f"batch {batch} does not divide the {val_sequences} val sequences of {config}'s evals "
                         f"(eval_iters × batch_size): use a divisor so every batch size is scored on the same ones")
    return [f'--batch_size={batch}', f'--eval_iters={val_sequences // batch}'], batch == base


def short_lr(lr):
    """3e-4, not 0.0003: the way LRs are written in commands and papers, and short enough for a table cell."""
    mantissa, exponent = f"{lr:e}".split('e')
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def stop_line(out_dir):
    """(step, val acc) of the line train.py logs when --stop_at_val_acc ended the run early, or None."""
    path = os.path.join(out_dir, 'log.txt')
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        m = re.search(r'^stopping at step (\d+): val acc ([\d.]+)', f.read(), re.M)
    return (int(m.group(1)), float(m.group(2))) if m else None


def finished(out_dir):
    """The run's log has an eval at its config's max_iters (train.py's last step, always evaluated), or says it
    stopped early at stop_at_val_acc."""
    if not os.path.isfile(os.path.join(out_dir, 'log.txt')):
        return False
    if stop_line(out_dir) is not None:
        return True
    log = read_log(out_dir)
    return log['config'] is not None and any(e['step'] == log['config']['max_iters'] for e in log['evals'])


def reached(out_dir, stop_at_val_acc):
    """The run stopped early at this threshold, so a later LR of its cell and seed is not needed. The accuracy is
    compared again because a --resume'd grid may keep a run that an older grid stopped at a lower threshold."""
    line = stop_line(out_dir)
    return line is not None and line[1] >= stop_at_val_acc


def train_args(task, mixer, size, width, lr, seed, out_dir, extra):
    """train.py's arguments for one cell of the grid (extra: further overrides, which win)."""
    if width % HEAD_WIDTH != 0:
        raise ValueError(f"width {width} is not a multiple of the {HEAD_WIDTH}-wide heads")
    spec = TASKS[task]
    return [spec['config'], f'--mixer={mixer}', f"--{spec['size_key']}={size}", f'--n_embd={width}',
            f'--n_head={width // HEAD_WIDTH}', f'--learning_rate={lr}', f'--min_lr={lr / 10}', f'--seed={seed}',
            f'--out_dir={out_dir}'] + extra


def start(run, env):
    """Start one train.py run in the background; its stdout and stderr go to out_dir/run.txt. Returns the Popen.
    The run inherits out_dir's lock (run.lock) and adopts it (checkpoint.lock_out_dir), so that no other process can
    take out_dir between run_all clearing it and train.py starting. Its own session: a Ctrl-C in the terminal reaches
    grid.py only, which passes it on once (two would stop the run without saving)."""
    cmd = [sys.executable, 'train.py'] + train_args(run.task, run.mixer, run.size, run.width, run.lr, run.seed,
                                                    run.out_dir, run.overrides)
    fds = (run.lock.fileno(),) if run.lock is not None else ()
    env = dict(env, **({INHERITED_LOCK: str(fds[0])} if fds else {}))
    with open(os.path.join(run.out_dir, 'run.txt'), 'w') as f:
        f.write(' '.join(cmd) + '\n')
        f.flush()
        return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, pass_fds=fds,
                                start_new_session=True)


def claim(out_dir):
    """out_dir's lock (an open file), or None with a line printed when a live run holds it: such an out_dir is
    never cleared nor run in (another grid.py into the same out_root, or a train.py started by hand)."""
    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)  # the lock lives beside out_dir
    try:
        return lock_out_dir(out_dir)
    except UserError as e:
        print(f"{out_dir}: left alone: {str(e).split(': wait for it')[0]}", flush=True)
        return None


def clear(out_dir):
    """Remove out_dir (an older grid's run that this grid does not run), unless a live run holds it."""
    lock = claim(out_dir)
    if lock is not None:
        shutil.rmtree(out_dir, ignore_errors=True)
        lock.close()


def run_all(runs, launch, jobs=1, stop_at_val_acc=0.0, resume=False, start_within=None, ahead=False):
    """Run the grid's runs, at most `jobs` at once; launch(run) starts one (run.out_dir exists and is empty) and
    returns its Popen. runs: in the table's order, the LRs of a (task, mixer, size, width, seed) in the order tried.

    Without stop_at_val_acc every run is independent and they start in the given order. With it, a run starts only
    once the earlier LRs of its cell and seed are done, and not at all (printed 'not needed') when one of them reached
    the threshold; to keep the slots full, the first LR of every cell goes first, then each later LR as soon as its
    cell is ready. With resume a finished run is kept and an unfinished one that left a ckpt.pt is continued from it
    (launched with --init_from=resume); without, every run starts afresh and the out_dir of a run not started
    (start_within, or not needed) is removed, so that no older grid's log stands in the table.
    With ahead (and stop_at_val_acc) a later LR does not wait for the earlier ones of its cell and seed: it starts
    when a slot is free (still after every first LR), and is stopped, as not needed, as soon as an earlier one reaches
    the threshold. Once every run has ended the table is the same (collect() counts no setting after one that reached
    it; while an earlier one is unfinished, a later one that finished counts); the grid takes less wall time where
    many cells need every setting, and more GPU time where an earlier one would have reached.
    An out_dir that a live run holds (its lock) is never cleared nor run in: that run counts as failed.
    SIGTERM or SIGINT (Ctrl-C) to grid.py goes on to every running train.py, each of which saves its ckpt.pt and
    stops; grid.py waits for them and exits with 128 + the signal (a second signal is passed on too: the runs exit at
    once). Run the same command with resume=True (--resume) to continue them.
    Returns (the out_dirs of failed runs, the number not started for start_within, the number not needed)."""
    earlier = {}  # out_dir -> the out_dirs of the earlier LRs of its (task, mixer, size, width, seed)
    so_far = {}   # (task, mixer, size, width, seed) -> its out_dirs met so far, in LR order
    for r in runs:
        chain = so_far.setdefault(r[:5], [])
        earlier[r.out_dir] = list(chain)
        chain.append(r.out_dir)
    number = {r.out_dir: k for k, r in enumerate(runs, 1)}  # for the progress lines, in the table's order
    if stop_at_val_acc > 0:  # the wave of first LRs, then second LRs, ...; sorted() is stable: the table's order within
        runs = sorted(runs, key=lambda r: len(earlier[r.out_dir]))
    done = {}  # out_dir -> whether it reached stop_at_val_acc
    setting_of = {r.out_dir: ('lr ' if r.batch is None else '') + setting_label(r.lr, r.batch) for r in runs}
    pending, running = list(runs), []  # running: (run, Popen, start time)
    failures, not_started, not_needed, t_start = [], 0, 0, time.time()
    signals = []  # the SIGTERM / SIGINT grid.py received, in order

    def on_signal(signum, frame):
        signals.append(signum)  # acted on in the loops below, not here: a handler must not wait for children
    handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}

    def stop_all():
        """Pass the signals on to the running runs, wait for every one to end, and exit."""
        sent = 0
        while running:
            for s in signals[sent:]:
                for _, proc, _ in running:
                    if proc.poll() is None:
                        proc.send_signal(s)
            sent = len(signals)
            running[:] = [item for item in running if item[1].poll() is None]
            time.sleep(0.1)
        for s, h in handlers.items():
            signal.signal(s, h)
        name = signal.Signals(signals[0]).name
        print(f"grid: stopped by {name}; the runs under way saved their ckpt.pt: run the same command with --resume "
              f"to continue them and run the rest", flush=True)
        sys.exit(128 + signals[0])

    def stop_later_ones(winner):
        """ahead: stop the running later LRs of winner's cell and seed, which it made not needed."""
        nonlocal not_needed
        for item in [item for item in running if winner in earlier[item[0].out_dir]]:
            run, proc, _ = item
            proc.kill()  # not SIGTERM: its state is not wanted, no checkpoint to write
            proc.wait()
            running.remove(item)
            done[run.out_dir] = False
            not_needed += 1
            if not resume:  # as for a run not needed: its partial log must not stand in a later table
                clear(run.out_dir)
            print(f"[{number[run.out_dir]}/{len(runs)}] {run.out_dir}: stopped, not needed: {setting_of[winner]} "
                  f"reached stop_at_val_acc {stop_at_val_acc:g}", flush=True)

    def wait_for_one():
        while True:
            if signals:
                stop_all()
            for item in running:
                run, proc, t0 = item
                if proc.poll() is not None:
                    running.remove(item)
                    evals = read_log(run.out_dir)['evals'] if os.path.isfile(os.path.join(run.out_dir, 'log.txt')) else []
                    ok = proc.returncode == 0 and len(evals) > 0
                    done[run.out_dir] = ok and stop_at_val_acc > 0 and reached(run.out_dir, stop_at_val_acc)
                    result = f"val acc {evals[-1]['val_acc']:.3f}" if ok else f"FAILED, see {run.out_dir}/run.txt"
                    if done[run.out_dir]:
                        result += f", reached stop_at_val_acc at step {stop_line(run.out_dir)[0]}"
                    print(f"[{number[run.out_dir]}/{len(runs)}] {run.out_dir}: {result} ({time.time() - t0:.0f}s)", flush=True)
                    if not ok:
                        failures.append(run.out_dir)
                    if done[run.out_dir]:
                        stop_later_ones(run.out_dir)
                    return
            time.sleep(0.1)

    while pending or running:
        if signals:
            stop_all()
        # the first pending run whose earlier LRs are all done (without stop_at_val_acc: the first pending run)
        run = next((r for r in pending if stop_at_val_acc <= 0 or ahead or all(d in done for d in earlier[r.out_dir])),
                   None)
        if run is None:  # every pending run waits for a running one (one always runs then: a chain's first is ready)
            wait_for_one()
            continue
        tag = f"[{number[run.out_dir]}/{len(runs)}] {run.out_dir}"
        if resume and finished(run.out_dir):
            pending.remove(run)
            done[run.out_dir] = stop_at_val_acc > 0 and reached(run.out_dir, stop_at_val_acc)
            print(f"{tag}: finished earlier, kept")
            continue
        winner = next((d for d in earlier[run.out_dir] if done.get(d)), None) if stop_at_val_acc > 0 else None
        if winner is not None:
            pending.remove(run)
            done[run.out_dir] = False
            not_needed += 1
            if not resume:  # this grid reruns every cell: an older log there must not stand in the table
                clear(run.out_dir)
            print(f"{tag}: not needed: {setting_of[winner]} reached stop_at_val_acc {stop_at_val_acc:g}")
            continue
        if len(running) == jobs:  # wait for a slot, then choose again: the run that ended may have readied another
            wait_for_one()
            continue
        pending.remove(run)
        if start_within is not None and time.time() - t_start > 60 * start_within:
            done[run.out_dir] = False
            not_started += 1
            if not resume:  # as for a run not needed: no older log may stand in the table
                clear(run.out_dir)
            continue
        lock = claim(run.out_dir)  # held from before any deletion until the launched run holds it as well
        if lock is None:
            done[run.out_dir] = False
            failures.append(run.out_dir)
            continue
        if resume and os.path.isfile(os.path.join(run.out_dir, 'ckpt.pt')):
            # unfinished, with a checkpoint (a lease ended under it): go on from its last eval; the log goes on too
            print(f"{tag}: unfinished, continued from its ckpt.pt")
            run = run._replace(overrides=run.overrides + ['--init_from=resume'])
        else:
            shutil.rmtree(run.out_dir, ignore_errors=True)  # a fresh log: train.py appends to log.txt
            os.makedirs(run.out_dir)
        run = run._replace(lock=lock)
        try:
            running.append((run, launch(run), time.time()))
        finally:
            lock.close()  # the launched train.py holds it now (or, not started, nobody needs it)
    for s, h in handlers.items():
        signal.signal(s, h)
    return failures, not_started, not_needed


def collect(task, mixers, sizes, widths, lrs, seeds, out_root, batches=(None,)):
    """Per cell (mixer, width, size), what the table and the plot show, read from the runs' logs: {'mean': over the
    seeds that have a finished run, of each seed's best final val accuracy over the settings (each batch in batches,
    None for the config's, with each of lrs) (None if no seed has one), 'spread': half the range (max - min) of those
    bests over seeds, 'settings': the (lr, batch) that gave them (in the order tried, each once), 'lrs': their LRs
    (in lrs order, each once), 'seeds': the seeds that have a finished run, 'short': those of them whose ladder
    was cut short (a setting they needed, after no earlier one reached stop_at_val_acc, has no finished run),
    'state': 'failed' when runs left logs but none finished, '—' when there is no log at all}. A seed's settings
    after one that stopped early (reached stop_at_val_acc) are not counted, as a grid would not have run them: a log
    left there by an interrupted or older grid does not change the cell."""
    tried = [(lr, batch) for batch in batches for lr in lrs]
    cells = {}
    for mixer in mixers:
        for w in widths:
            for n in sizes:
                bests, state = {}, '—'  # bests: seed -> (val acc, (lr, batch)) of its best finished run
                short = []  # seeds whose ladder was cut short: a setting it needed has no finished run
                for seed in seeds:
                    missing = False
                    for lr, batch in tried:
                        out_dir = os.path.join(out_root, task, run_name(mixer, n, w, lr, seed, batch))
                        if not os.path.isfile(os.path.join(out_dir, 'log.txt')):
                            missing = True
                            continue
                        if not finished(out_dir):
                            state, missing = 'failed', True
                            continue
                        acc = read_log(out_dir)['evals'][-1]['val_acc']
                        if seed not in bests or acc > bests[seed][0]:  # a tie keeps the earlier setting
                            bests[seed] = (acc, (lr, batch))
                        if stop_line(out_dir) is not None:  # it reached the threshold: the ladder ends here
                            missing = False  # the settings after it were not needed
                            break
                    if missing and seed in bests:
                        short.append(seed)
                accs = [acc for acc, _ in bests.values()]
                best_lrs = {lr for _, lr in bests.values()}
                cells[mixer, w, n] = {'mean': sum(accs) / len(accs) if accs else None,
                                      'spread': (max(accs) - min(accs)) / 2 if accs else None,
                                      'settings': [t for t in tried if t in best_lrs],
                                      'lrs': [lr for lr in lrs if any(t[0] == lr for t in best_lrs)],
                                      'seeds': [s for s in seeds if s in bests], 'short': short, 'state': state}
    return cells


def table(task, mixers, sizes, widths, lrs, seeds, out_root, batches=(None,)):
    """Markdown: one row per mixer, one column per width × size. A cell is collect()'s mean over seeds, '±' half
    the range over seeds (2+ seeds), the LRs that gave each seed's best (when several were given), and
    ', n=1 of 2 seeds' when some seeds have no finished run, and ' †' (with a footnote) when a seed's ladder was cut
    short; 'failed' or '—' when no seed has one."""
    spec = TASKS[task]
    cells = collect(task, mixers, sizes, widths, lrs, seeds, out_root, batches)
    cols = [(w, n) for w in widths for n in sizes]
    lines = ["| mixer | " + ' | '.join(f"w={w}, {n} {spec['size_name']}" for w, n in cols) + ' |',
             '|---|' + '---|' * len(cols)]
    for mixer in mixers:
        texts = []
        for w, n in cols:
            c = cells[mixer, w, n]
            if c['mean'] is None:
                texts.append(c['state'])
                continue
            text = f"{c['mean']:.3f}"
            if len(c['seeds']) > 1:
                text += f" ±{c['spread']:.3f}"
            if len(lrs) * len(batches) > 1:
                text += f" ({', '.join(setting_label(*t) for t in c['settings'])})"
            if len(c['seeds']) < len(seeds):
                text += f", n={len(c['seeds'])} of {len(seeds)} seeds"
            if c['short']:
                text += ' †'
            texts.append(text)
        lines.append(f"| `{mixer}` | " + ' | '.join(texts) + ' |')
    if any(c['short'] for c in cells.values()):
        lines.append("\n† Not every setting this cell needed ran (an interrupted grid, --start_within, or a grid of "
                     "fewer settings into the same out_root): the cell is the best of those that did.")
    return '\n'.join(lines)


def plot(results, path):
    """The table's numbers as a figure: one row of panels per task, one panel per width; x = size, y = the
    cell's mean over seeds with error bars of half the range, one line per mixer, hollow where the table has '†';
    for MQAR chance (1/pairs) dotted.
    results: [(task, mixers, sizes, widths, collect()'s cells)]. Writes the PNG to path; returns the figure."""
    import matplotlib
    matplotlib.use('Agg')  # files only, no display needed
    import matplotlib.pyplot as plt
    ncols = max(len(widths) for _, _, _, widths, _ in results)
    fig, axes = plt.subplots(len(results), ncols, figsize=(4.5 * ncols, 3.6 * len(results)), squeeze=False,
                             sharey=True)
    any_short = False
    color = {m: f'C{i}' for i, m in enumerate(dict.fromkeys(m for r in results for m in r[1]))}  # same in every panel
    for row, (task, mixers, sizes, widths, cells) in enumerate(results):
        xs = sorted(sizes)
        for col, ax in enumerate(axes[row]):
            if col >= len(widths):  # a task with fewer widths than another leaves its last panels empty
                ax.axis('off')
                continue
            w = widths[col]
            for mixer in mixers:
                cs = [cells[mixer, w, n] for n in xs]
                nan = float('nan')  # no result: matplotlib leaves a gap in the line
                ax.errorbar(xs, [nan if c['mean'] is None else c['mean'] for c in cs],
                            yerr=[nan if c['mean'] is None else c['spread'] for c in cs],
                            marker='o', markersize=4, capsize=3, label=mixer, color=color[mixer])
                short = [(n, c['mean']) for n, c in zip(xs, cs) if c['mean'] is not None and c['short']]
                if short:  # the table's '†': hollow markers over those points
                    any_short = True
                    ax.plot(*zip(*short), 'o', markersize=7, markerfacecolor='white', markeredgecolor=color[mixer],
                            label='_short')
            if task == 'mqar':  # guessing among the N stored values
                ax.plot(xs, [1 / n for n in xs], ':', color='grey', label='chance (1/pairs)')
            ax.set_title(f"{task}, width {w}")
            ax.set_xlabel(TASKS[task]['size_name'])
            ax.set_xticks(xs)
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel('final val accuracy')  # the table's number: mean over seeds of each one's best LR
        axes[row][0].legend(fontsize=7)
    title = "final val answer accuracy: mean over seeds of each seed's best setting (LR, batch), bars: half the range"
    fig.suptitle(title + " over seeds" + ("\nhollow: not every setting that cell needed ran (the table's †)"
                                          if any_short else ''), fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)  # pyplot lets go of it; the figure itself stays readable (the tests check what it drew)
    return fig


def settings(task, out_root, lrs, seeds, stop_at_val_acc, batches=(None,)):
    """The shared settings of a task's runs, as their logs state them (from the first run that has a log), then
    what a cell shows: the seeds and LRs of this grid."""
    seed_text = f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({', '.join(map(str, seeds))})"
    tried = [setting_label(lr, b) for b in batches for lr in lrs]
    kind = 'LRs' if batches == (None,) else 'settings (LR, and batch where not the one below)'
    what = "final val accuracy" if len(tried) == 1 else f"best final val accuracy over the {kind} {', '.join(tried)}"
    if len(seeds) > 1:
        protocol = f" Each cell: over {seed_text}, the mean ± half the range of each seed's {what}"
    else:
        protocol = f" Each cell: {seed_text}, its {what}"
    if len(tried) > 1:
        which = 'LR' if batches == (None,) else 'setting'
        protocol += f", then in parentheses {f'the {which}s that gave those bests' if len(seeds) > 1 else f'the {which} that gave it'}"
        if stop_at_val_acc > 0:
            protocol += (f"; the {which}s were tried in this order, and a later {which} is tried only where the earlier "
                         f"ones did not reach it (stop_at_val_acc {stop_at_val_acc:g})")
    protocol += '.'
    task_dir = os.path.join(out_root, task)
    # a run at the config's batch where there is one (its name has no '_bs'): the batch the sentence names
    for name in sorted(os.listdir(task_dir), key=lambda n: ('_bs' in n, n)) if os.path.isdir(task_dir) else []:
        if os.path.isfile(os.path.join(task_dir, name, 'log.txt')):
            c = read_log(os.path.join(task_dir, name))['config']
            if c is not None:
                if task == 'mqar':  # each log holds only its own task's keys (and older logs no needle keys)
                    extra = 'N queries of random stored keys'
                elif task == 'statetrack':
                    extra = f"{c['statetrack_num_vars']} variables, {c['statetrack_num_queries']} queries"
                else:
                    extra = f"{c['needle_value_len']} value tokens per needle, as many queries as needles"
                return (f"Sequences of {c['block_size']} tokens, vocabulary {c['task_vocab_size']}, {extra}; "
                        f"{c['n_layer']} layers; {c['max_iters']:,} steps × {c['batch_size'] * c['gradient_accumulation_steps']} "
                        f"sequences" + (f", stopped early at val accuracy ≥ {c['stop_at_val_acc']}"
                                        if c.get('stop_at_val_acc') else "")
                        + f"; accuracy on {c['eval_iters'] * c['batch_size']} fixed val sequences." + protocol)
    return "No run of this task has a log yet." + protocol


def describe_device(extra):
    device = next((a.split('=', 1)[1] for a in extra if a.startswith('--device=')), '')
    if (device or 'cuda').startswith('cuda') and torch.cuda.is_available():
        return torch.cuda.get_device_name(device or None)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], allow_abbrev=False,
                                 epilog="Arguments not listed here (--key=value) are passed to every train.py run.")
    ap.add_argument('--tasks', nargs='+', default=RECALL, choices=list(TASKS),
                    help=f"default {' '.join(RECALL)}; needle: the long-context study's runs (longctx.py scores them)")
    ap.add_argument('--mixers', nargs='+', default=MIXERS, help="mixer patterns (default: every mixer of model.MIXERS and 'kda*3,softmax')")
    ap.add_argument('--sizes', nargs='+', type=int, help="pairs (mqar) / assignments (statetrack) / needles (needle); default per task")
    ap.add_argument('--widths', nargs='+', type=int, help="n_embd values, multiples of 32; default per task")
    ap.add_argument('--learning_rates', nargs='+', type=float, default=[1e-3],
                    help="each cell and seed keeps its best; with --stop_at_val_acc=X tried in this order, a later "
                         "one only where the earlier ones did not reach X")
    ap.add_argument('--batch_sizes', nargs='+', type=int, default=None,
                    help="sequences per step, tried after all --learning_rates of the one before (like a later LR); "
                         "eval_iters is scaled so every batch is scored on the same val sequences; default: the config's")
    ap.add_argument('--seeds', nargs='+', type=int, default=[SEED],
                    help=f"train.py seeds (init and training data order; the val set is fixed), default {SEED}: "
                         f"a cell shows the mean over seeds ± half the range")
    ap.add_argument('--quick', action='store_true', help="tiny tasks and 200 steps per run: a CPU-sized smoke run")
    ap.add_argument('--resume', action='store_true', help="keep the runs that finished (an eval at max_iters, or stopped at "
                    "stop_at_val_acc), continue the unfinished ones that left a ckpt.pt, and run the rest")
    ap.add_argument('--jobs', type=int, default=1, help="runs at once on the same device; small models leave a GPU "
                    "mostly idle, so up to about one run per CPU core (each run's own CPU work is then the limit), "
                    "and no more than fit in GPU memory (each run keeps its own CUDA graphs and compile workspace)")
    ap.add_argument('--start_within', type=float, default=None, metavar='MIN',
                    help="start no run after this many minutes (a time-limited GPU lease): the runs under way finish, "
                         "the rest show '—' in the table; run the same command with --resume later to fill them in")
    ap.add_argument('--ahead', action='store_true',
                    help="with --stop_at_val_acc: start a cell's later settings without waiting for its earlier ones "
                         "(when a slot is free), and stop them when an earlier one reaches the threshold; the same "
                         "table in less wall time where most cells need every setting, more GPU time where they do not")
    ap.add_argument('--out_root', default=None, help="runs go to <out_root>/<task>/<run> (default out-grid, out-grid-quick)")
    ap.add_argument('--table', default=None, help="the markdown file to write (default <out_root>/results.md)")
    ap.add_argument('--plot', default=None, metavar='PATH.png',
                    help="also draw the table as a figure: a row per task, a panel per width, accuracy vs size")
    args, extra = ap.parse_known_args()
    # the keys the grid sets for each run come from its own flags; an override would silently break the table
    owned = {'out_dir': '--out_root', 'mixer': '--mixers', 'n_embd': '--widths', 'n_head': '--widths',
             'learning_rate': '--learning_rates', 'min_lr': '--learning_rates (min_lr = LR / 10)', 'seed': '--seeds',
             'mqar_num_pairs': '--sizes', 'statetrack_num_assignments': '--sizes', 'needle_num_needles': '--sizes'}
    if args.batch_sizes:  # each setting's batch and eval_iters come from --batch_sizes
        owned.update(batch_size='--batch_sizes', eval_iters='--batch_sizes (scaled to the same val sequences)')
    stop_at_val_acc = 0.0  # train.py's default; read here because it decides which later LRs run
    for a in extra:
        if not (a.startswith('--') and '=' in a):
            ap.error(f"unrecognised argument {a!r}: train.py overrides must look like --key=value")
        key, value = a[2:].split('=', 1)
        if key in owned:
            ap.error(f"{a}: the grid sets {key} for each run; use {owned[key]}")
        if key == 'stop_at_val_acc':  # the last one wins, as in train.py
            try:
                stop_at_val_acc = float(value)
            except ValueError:
                ap.error(f"{a}: stop_at_val_acc must be a number, an accuracy in [0, 1]")
    for flag, values, least in (('--jobs', [args.jobs], 1), ('--batch_sizes', args.batch_sizes or [], 1),
                                ('--sizes', args.sizes or [], 1), ('--widths', args.widths or [], 32)):
        if any(v < least for v in values):
            ap.error(f"{flag} {' '.join(map(str, values))}: each must be >= {least}")
    if any(s < 0 for s in args.seeds) or not all(0 < lr < float('inf') for lr in args.learning_rates):
        ap.error(f"--seeds must be >= 0 and --learning_rates > 0 and finite, got {args.seeds}, {args.learning_rates}")
    for m in args.mixers:  # every pattern's names, before any run starts (the layer count is the task's: 4 divides)
        try:
            model.parse_mixer_pattern(m, 4 * len(m.split(',')))
        except ValueError as e:
            ap.error(f"--mixers: {e}")
    if any(w % 32 for w in args.widths or []):  # two softmax heads of a multiple of 16, and every mixer's head_dim
        ap.error(f"--widths {' '.join(map(str, args.widths))}: each must be a multiple of 32")
    if args.ahead and stop_at_val_acc <= 0:
        ap.error("--ahead needs --stop_at_val_acc=X: without a threshold every setting runs anyway, none waits")
    # two runs with the same name would share an out_dir (and train.py's lock would stop the second)
    for flag, values in (('--seeds', args.seeds), ('--learning_rates', [f'{lr:g}' for lr in args.learning_rates]),
                         ('--batch_sizes', args.batch_sizes or [])):
        if len(set(values)) < len(values):
            ap.error(f"{flag} {' '.join(map(str, values))}: give each value once")
    if args.plot:  # now, not after hours of runs
        try:
            import matplotlib  # noqa: F401 (only checked here; plot() imports it to draw)
        except ImportError:
            ap.error("--plot needs matplotlib, which is not installed: pip install matplotlib")
    out_root = args.out_root or ('out-grid-quick' if args.quick else 'out-grid')
    table_path = args.table or os.path.join(out_root, 'results.md')

    plan = []  # (task, mixers, sizes, widths, train.py overrides)
    for task in args.tasks:
        spec = TASKS[task]
        sizes = args.sizes or (spec['quick']['sizes'] if args.quick else spec['sizes'])
        widths = args.widths or (spec['quick']['widths'] if args.quick else spec['widths'])
        overrides = (spec['quick']['overrides'] + QUICK if args.quick else []) + extra  # the user's come last and win
        plan.append((task, args.mixers, sizes, widths, overrides))

    # the settings of a task, in the order tried: (train.py overrides, batch for the run's name: None at the config's)
    tried = {}
    for task, _, _, _, overrides in plan:
        tried[task] = [(overrides, None)]
        if args.batch_sizes:
            tried[task] = []
            for b in args.batch_sizes:
                try:
                    more, is_base = batch_overrides(TASKS[task]['config'], overrides, b)
                except ValueError as e:
                    ap.error(f"--batch_sizes: {e}")
                tried[task].append((overrides + more, None if is_base else b))
    batches = {task: tuple(b for _, b in tried[task]) for task in tried}
    runs = [Run(task, mixer, size, width, seed, lr,
                os.path.join(out_root, task, run_name(mixer, size, width, lr, seed, batch)), run_overrides, batch)
            for task, mixers, sizes, widths, _ in plan
            for width in widths for size in sizes for mixer in mixers for seed in args.seeds
            for run_overrides, batch in tried[task] for lr in args.learning_rates]
    print(f"grid: {'up to ' if stop_at_val_acc > 0 and len(args.learning_rates) > 1 else ''}{len(runs)} runs into "
          f"{out_root}/, {args.jobs} at a time, table -> {table_path}")
    env = dict(os.environ)
    if args.jobs > 1:
        env.setdefault('OMP_NUM_THREADS', '1')  # the runs share the CPU too: one thread each, unless the caller chose
        env.setdefault('TORCHINDUCTOR_COMPILE_THREADS', '1')  # and torch.compile's workers: one each, not one per core
    t_start, started = time.time(), []

    def launch(run):
        started.append(run)
        return start(run, env)
    failures, not_started, not_needed = run_all(runs, launch, args.jobs, stop_at_val_acc, args.resume, args.start_within,
                                                args.ahead)

    cmd = ' '.join(['python', 'grid.py'] + sys.argv[1:])
    parts = ["# Recall grid: final val answer accuracy\n",
             f"Made by `{cmd}`, {time.strftime('%Y-%m-%d')}: "
             + (f"on {describe_device(extra)}, {len(started)} runs in {(time.time() - t_start) / 60:.1f} min; "
                if started else "from the logs of earlier invocations only (this one started no run; their logs "
                                "name the device); ")
             + "every run: its task config "
             f"(`config/<task>.py`){' with the --quick overrides in grid.py' if args.quick else ''}, "
             f"n_embd = w, 32-wide heads; logs in `{out_root}/<task>/`.\n"]
    for task, mixers, sizes, widths, overrides in plan:
        parts.append(f"## {task}\n\n{settings(task, out_root, args.learning_rates, args.seeds, stop_at_val_acc, batches[task])}"
                     f"\n\n{table(task, mixers, sizes, widths, args.learning_rates, args.seeds, out_root, batches[task])}\n")
    os.makedirs(os.path.dirname(os.path.abspath(table_path)), exist_ok=True)
    with open(table_path, 'w') as f:
        f.write('\n'.join(parts))
    print('\n'.join(parts))
    print(f"wrote {table_path}")
    if args.plot:
        plot([(task, mixers, sizes, widths, collect(task, mixers, sizes, widths, args.learning_rates, args.seeds, out_root,
                                                    batches[task]))
              for task, mixers, sizes, widths, _ in plan], args.plot)
        print(f"wrote {args.plot}")
    if not_needed:
        print(f"{not_needed} runs not needed: an earlier setting of their cell and seed reached stop_at_val_acc {stop_at_val_acc:g}")
    if not_started:
        print(f"{not_started} runs not started (--start_within {args.start_within:g} min): add --resume to run them")
    if failures:
        print(f"{len(failures)} runs failed: " + ', '.join(failures))
        sys.exit(1)


if __name__ == '__main__':
    main()
