"""
Plot the eval curves of several runs against training tokens, read from their out_dir/log.txt, into one PNG.

$ python plot.py out-pystdlib-softmax out-pystdlib-kdax3+softmax --out=val_loss.png
$ python plot.py out-grid/mqar/*_n16_w128_* --metric=val_acc --out=mqar_acc.png --title="MQAR, 16 pairs, width 128"
$ python plot.py out-text/* --table     # markdown: mixer, parameters, tokens, final and best val loss, tokens/s

Each argument is a run's out_dir (or its log.txt); the legend names the run by its out_dir. The x axis is
step × tokens per iteration (from the log's "tokens per iteration" line), so runs with different batch shapes
line up by tokens seen. Needs matplotlib (`pip install matplotlib`), imported only when plotting: training and
the tests do not use it, so it is not in requirements.txt. grid.py uses read_log below to build its table.
"""
import argparse
import ast
import os
import re

# the eval line train.py prints: "step N: train loss X, val loss Y" (+ ", train acc A, val acc B" for tasks);
# a diverged run prints nan or inf
NUM = r'(nan|inf|[\d.]+)'
EVAL_LINE = re.compile(rf'^step (\d+): train loss {NUM}, val loss {NUM}(?:, train acc {NUM}, val acc {NUM})?', re.M)
METRICS = {'val_loss': 'val loss', 'train_loss': 'train loss', 'val_acc': 'val answer accuracy', 'train_acc': 'train answer accuracy'}


def read_log(path):
    """What a train.py log.txt says: {'config': the config dict of its last start (None if absent),
    'tokens_per_iter': int or None, 'params': 'N.NNM' or None, 'tok_s': [tokens/s of each iter line],
    'evals': [{'step', 'train_loss', 'val_loss', 'train_acc', 'val_acc'}, ...] by step}.
    A log holds every start of its out_dir (a resume appends); for a step evaluated twice the last line wins."""
    if os.path.isdir(path):
        path = os.path.join(path, 'log.txt')
    with open(path) as f:
        text = f.read()
    configs = re.findall(r'^config: (\{.*\})$', text, re.M)
    tokens = re.findall(r'^tokens per iteration: .* = ([\d,]+)$', text, re.M)
    params = re.findall(r'^number of parameters: ([\d.]+M)$', text, re.M)
    tok_s = [float(x.replace(',', '')) for x in re.findall(r'^iter \d+: .*tok/s ([\d,]+)', text, re.M)]
    evals = {}
    for m in EVAL_LINE.finditer(text):
        step = int(m.group(1))
        acc = [float(x) if x is not None else None for x in m.group(4, 5)]
        evals[step] = {'step': step, 'train_loss': float(m.group(2)), 'val_loss': float(m.group(3)),
                       'train_acc': acc[0], 'val_acc': acc[1]}
    return {'config': ast.literal_eval(configs[-1]) if configs else None,
            'tokens_per_iter': int(tokens[-1].replace(',', '')) if tokens else None,
            'params': params[-1] if params else None, 'tok_s': tok_s,
            'evals': [evals[s] for s in sorted(evals)]}


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
        points = [(e['step'] * log['tokens_per_iter'], e[metric]) for e in log['evals'] if e[metric] is not None]
        if not points or log['tokens_per_iter'] is None:
            raise ValueError(f"{run}: no '{METRICS[metric]}' evals in its log (is it a train.py out_dir, and for accuracy a task run?)")
        if None not in mixers and len(set(mixers)) < len(mixers):
            label = None if mixer in colors else mixer + (f" ({mixers.count(mixer)} runs)" if mixers.count(mixer) > 1 else '')
            color = colors.setdefault(mixer, f"C{len(colors) % 10}")
        else:
            label = os.path.basename(os.path.normpath(run if os.path.isdir(run) else os.path.dirname(run) or '.'))
            color = None
        ax.plot(*zip(*points), marker='o', markersize=3, label=label, color=color)
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
    ap.add_argument('--out', default='val_loss.png', help="the PNG to write")
    ap.add_argument('--metric', default='val_loss', choices=sorted(METRICS))
    ap.add_argument('--title', default=None)
    ap.add_argument('--ymax', type=float, default=None, help="top of the y axis")
    ap.add_argument('--table', action='store_true', help="print a markdown table of the runs instead of plotting")
    args = ap.parse_args()
    if args.table:
        print(table(args.runs))
    else:
        plot(args.runs, args.out, args.metric, args.title, args.ymax)
