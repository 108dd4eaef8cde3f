"""
Plot the eval curves of several runs against training tokens, read from their out_dir/log.txt, into one PNG.

$ python tools/plot.py out-pystdlib-softmax out-pystdlib-kdax3+softmax   # -> out-pystdlib-softmax/val_loss.png
$ python tools/plot.py out-text/* --ymax=4                               # -> out-text/val_loss.png
$ python tools/plot.py out-grid/mqar/*_n16_w128_* --metric=val_acc --out=mqar_acc.png --title="MQAR, 16 pairs, width 128"
$ python tools/plot.py out-text/* --metric=step_loss   # the training loss of every logged step (iter lines)
$ python tools/plot.py out-text/* --table     # markdown: mixer, parameters, tokens, final and best val loss, tokens/s

Each argument is a run's out_dir (or its log.txt); the legend names the run by its out_dir. The x axis is
step × tokens per step (from the log's "data:" line), so runs with different batch shapes
line up by tokens seen. The picture goes to --out, else to <metric>.png in the folder holding all the runs (out-text/
above) or, when they share none below the current folder, in the first run's out_dir. A reused out_dir's log.txt
holds several runs: each run is read from its last start from scratch on (with the resumes after it), never mixed with
the runs before. Needs matplotlib (in requirements.txt), imported only when plotting. grid.py uses read_log below to
build its table.
"""
import argparse
import ast
import os
import re
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules
import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback

# the eval line train.py prints: "step N: train loss X, val loss Y" (+ ", train acc A, val acc B" for tasks, then
# " (eval Ts)"); a diverged run prints nan or inf
NUM = r'(nan|inf|[\d.]+)'
EVAL_LINE = re.compile(rf'^step (\d+): train loss {NUM}, val loss {NUM}(?:, train acc {NUM}, val acc {NUM})?', re.M)
ITER_LINE = re.compile(rf'^iter (\d+)(?:/\d+)?: loss {NUM},.*tok/s ([\d,]+)', re.M)  # "iter N/max: ..." (older: "iter N:")
METRICS = {'val_loss': 'val loss', 'train_loss': 'train loss', 'val_acc': 'val answer accuracy',
           'train_acc': 'train answer accuracy', 'step_loss': 'training loss of each logged step'}


def _config(line, path):
    """A log's `config: {...}` line as a dict; a malformed one is a ValueError naming the file."""
    try:
        config = ast.literal_eval(line)
    except (SyntaxError, ValueError):
        config = None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a malformed 'config:' line (not a dict of settings): {line[:60]!r}")
    return config


def read_log(path):
    """What a train.py log.txt says about the run that last trained there: {'config': the config dict of its last
    start (None if absent), 'tokens_per_iter': int or None, 'params': 'N.NNM' or None, 'tok_s': [tokens/s of each iter
    line], 'evals': [{'step', 'train_loss', 'val_loss', 'train_acc', 'val_acc'}, ...] by step, 'steps': [(n, the loss of
    iter line n), ...]}.
    log.txt holds every start in its out_dir, each beginning with its config line. The run is the last start from
    scratch that logged a step or an eval, with the resumes after it (a config without init_from counts as one); the
    runs before it (a reused out_dir) are left out. A resume at iter N drops the earlier evals after step N (a
    timeline it abandoned), and for a step evaluated twice the last line wins."""
    if os.path.isdir(path):
        path = os.path.join(path, 'log.txt')
    with open(path) as f:
        text = f.read()
    cuts = [m.start() for m in re.finditer(r'^config: ', text, re.M)][1:]
    starts = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]  # [0]: the first start's header lines too
    first = 0
    for i, start in enumerate(starts):
        m = re.search(r'^config: (\{.*\})$', start, re.M)
        config = _config(m.group(1), path) if m else {}
        if (config.get('init_from', 'resume') != 'resume' and not config.get('eval_only')  # (an eval of the run)
                and (EVAL_LINE.search(start) or ITER_LINE.search(start))):
            first = i
    config, tokens, params, tok_s, evals, steps = None, None, None, [], {}, {}
    for start in starts[first:]:
        configs = re.findall(r'^config: (\{.*\})$', start, re.M)
        config = _config(configs[-1], path) if configs else config
        per_step = re.findall(r'^(?:data: .* = ([\d,]+) tokens per step|tokens per iteration: .* = ([\d,]+)$)', start,
                              re.M)  # (older logs: the "tokens per iteration" line)
        tokens = ([int((a or b).replace(',', '')) for a, b in per_step] or [tokens])[-1]
        params = (re.findall(r'^number of parameters: ([\d.]+M)$', start, re.M) or [params])[-1]
        resumed = re.search(r'^(?:Resuming training from|Evaluating) .* \(iter (\d+)\)$', start, re.M)
        if resumed:
            evals = {s: e for s, e in evals.items() if s <= int(resumed.group(1))}
            steps = {s: loss for s, loss in steps.items() if s < int(resumed.group(1))}
        for m in ITER_LINE.finditer(start):
            tok_s.append(float(m.group(3).replace(',', '')))
            steps[int(m.group(1))] = float(m.group(2))
        for m in EVAL_LINE.finditer(start):
            step = int(m.group(1))
            acc = [float(x) if x is not None else None for x in m.group(4, 5)]
            evals[step] = {'step': step, 'train_loss': float(m.group(2)), 'val_loss': float(m.group(3)),
                           'train_acc': acc[0], 'val_acc': acc[1]}
    return {'config': config, 'tokens_per_iter': tokens, 'params': params, 'tok_s': tok_s,
            'evals': [evals[s] for s in sorted(evals)], 'steps': sorted(steps.items())}


def default_out(runs, metric='val_loss'):
    """Where a picture of runs goes without --out: <metric>.png in the folder that holds all of them (out-text/ for
    out-text/*), or in the first run's out_dir when that folder is the current one or above it (the repository root)."""
    dirs = [os.path.abspath(os.path.dirname(r) or '.' if os.path.isfile(r) else r) for r in runs]
    parent, here = os.path.commonpath(dirs), os.getcwd()
    if os.path.commonpath([parent, here]) == parent:  # the current folder or above: not where pictures belong
        parent = dirs[0]
    out = os.path.join(parent, f'{metric}.png')
    return os.path.relpath(out) if out.startswith(here + os.sep) else out


def plot(runs, out, metric='val_loss', title=None, ymax=None):
    """One line per run: metric against tokens. runs: out_dirs or log.txt paths. Writes the PNG to out. When some
    mixer has several runs (seeds), each mixer gets one color and one legend entry.
    ymax: top of the y axis (the step-0 loss of ~10.8 would otherwise squash the differences that matter)."""
    import matplotlib
    matplotlib.use('Agg')  # files only, no display needed
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    logs = [read_log(run) for run in runs]
    mixers = [(log['config'] or {}).get('mixer') for log in logs]
    colors = {}  # runs of one mixer (several seeds) share a color and one legend entry: the mixer's name
    for run, log, mixer in zip(runs, logs, mixers):
        if metric == 'step_loss':  # the iter lines' loss (every log_interval steps), after step n's update: n + 1
            points = [((n + 1) * log['tokens_per_iter'], loss) for n, loss in log['steps']] if log['tokens_per_iter'] else []
        else:
            points = [(e['step'] * log['tokens_per_iter'], e[metric]) for e in log['evals'] if e[metric] is not None]
        if not points or log['tokens_per_iter'] is None:
            raise ValueError(f"{run}: no '{METRICS[metric]}' evals in its log (is it a train.py out_dir, and for accuracy a task run?)")
        if None not in mixers and len(set(mixers)) < len(mixers):
            label = None if mixer in colors else mixer + (f" ({mixers.count(mixer)} runs)" if mixers.count(mixer) > 1 else '')
            color = colors.setdefault(mixer, f"C{len(colors) % 10}")
        else:
            label = os.path.basename(os.path.normpath(run if os.path.isdir(run) else os.path.dirname(run) or '.'))
            color = None
        style = dict(linewidth=0.8) if metric == 'step_loss' else dict(marker='o', markersize=3)
        ax.plot(*zip(*points), label=label, color=color, **style)
    ax.set_xlabel('training tokens')
    ax.set_ylabel(METRICS[metric])
    ax.set_title(title or f"{METRICS[metric]} vs tokens")
    if ymax is not None:
        ax.set_ylim(top=ymax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out} ({len(runs)} runs)")


def table(runs):
    """Markdown, one row per run: its mixer, parameters, tokens trained, final and best val loss, and the median
    tokens/s of its iter lines after the first (which carry start-up and compile time)."""
    lines = ['| run | mixer | parameters | tokens | final val loss | best val loss | tokens/s (median) |',
             '|---|---|---|---|---|---|---|']
    for run in runs:
        log = read_log(run)
        if not log['evals'] or log['config'] is None or log['tokens_per_iter'] is None:
            raise ValueError(f"{run}: no evals or no config in its log (is it a train.py out_dir?)")
        last, best = log['evals'][-1], min(e['val_loss'] for e in log['evals'])
        rates = sorted(log['tok_s'][1:]) or log['tok_s']
        rate = f"{rates[len(rates) // 2]:,.0f}" if rates else '—'
        name = os.path.basename(os.path.normpath(run if os.path.isdir(run) else os.path.dirname(run) or '.'))
        lines.append(f"| {name} | `{log['config']['mixer']}` | {log['params'] or '—'} | "
                     f"{last['step'] * log['tokens_per_iter'] / 1e6:.1f}M | {last['val_loss']:.3f} | {best:.3f} | {rate} |")
    return '\n'.join(lines)


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('runs', nargs='+', help="out_dirs (or their log.txt files)")
    ap.add_argument('--out', default=None, help="the PNG to write (default: <metric>.png beside the runs, see above)")
    ap.add_argument('--metric', default='val_loss', choices=sorted(METRICS))
    ap.add_argument('--title', default=None)
    ap.add_argument('--ymax', type=float, default=None, help="top of the y axis")
    ap.add_argument('--table', action='store_true', help="print a markdown table of the runs instead of plotting")
    args = ap.parse_args()
    skipped = [r for r in args.runs if not (os.path.isdir(r) or os.path.basename(r) == 'log.txt')]
    for r in skipped:  # e.g. out-text/* run again: its own val_loss.png beside the runs
        print(f"plot.py: skipping {r}: not an out_dir or a log.txt", file=sys.stderr)
    args.runs = [r for r in args.runs if r not in skipped]
    if not args.runs:
        sys.exit("plot.py: error: no out_dir among the arguments (a run's folder, or its log.txt)")
    try:
        if args.table:
            print(table(args.runs))
        else:
            plot(args.runs, args.out or default_out(args.runs, args.metric), args.metric, args.title, args.ymax)
    except (ValueError, OSError) as e:  # a run without a train.py log, an unreadable file: one line, not a traceback
        sys.exit(f"plot.py: error: {e}")
