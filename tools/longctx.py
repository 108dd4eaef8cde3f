"""
Long context, measured: how models trained at block_size tokens do on longer sequences.

$ python tools/longctx.py needle out-grid/needle/*                 # needle accuracy by context length and depth
$ python tools/longctx.py text out-text/*-s1337 out-text/*-s1338   # loss against position, up to 16 x block_size
$ python tools/longctx.py needle out-grid/needle/* --scales 1 4 16 --depths 0 0.5 1 --plot assets/needle.png

Each argument is a train.py out_dir; its ckpt.pt (data only: no code runs) is evaluated at contexts of
scale x block_size for each --scales, the block_size it was trained at being scale 1.

needle: runs of dataset='needle' (tasks.py's Needle: needles `key values` in a haystack of noise tokens, then a
query per needle, the first asking the needle at the cell's depth). Every (context, depth) cell scores --sequences
fixed sequences with the run's vocabulary, needles and values; sequence j of every cell has the same needles and
queries (its own seed, apart from train and val), so cells differ only in the haystack's length and where the first
query's needle lies: depth 0 at the first token, 1 just before the queries. A cell is the share of the first
query's value tokens right (the model has read nothing after the haystack but that query).
text: runs of a token dataset. --windows windows of max(scales) x block_size + 1 consecutive tokens from the start
of its val split (non-overlapping), each one forward: the mean loss per position, reported per bucket [0, T),
[T, 2T), [2T, 4T) ... (T = block_size); beside it, the same tokens with the context cut at every T (each piece of T
scored alone, as in training; pieces batched, CUT_TOKENS a forward): their difference is what the longer context
buys, apart from how hard the text at those positions is (with few windows, that difficulty dominates the loss
itself). Windows cross document boundaries, as training's did; a model trained with documents=True resets at each
EOT, so for it a position is no longer a context length.

Runs that differ only in seed make one row: the mean over seeds ± half the range. Needle runs of one mixer and seed
at several settings (grid.py's LR and batch ladder) count once, at the setting most accurate at block_size: chosen
in distribution, then seen at length. Output: a markdown table on stdout, each run's numbers in
<out_dir>/longctx-<study>.json (read back with --table_only), and with --plot PATH one picture (accuracy or loss
against context length, one line per mixer; matplotlib).
A model with softmax layers is warned about once past its block_size: its rotary positions there were never seen.
"""
import argparse
import json
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's modules
import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from checkpoint import load_checkpoint, build_model
from configurator import UserError, device_and_dtype
from dataloader import read_shard, shard_paths
from model import MIXERS
from tasks import Needle, NAMES as TASK_NAMES, to_example

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONG_SEED = 20261126  # the needle cells' sequences: seeded apart from tasks.py's train and val streams


def load_run(out_dir, device, kernels):
    """(model in eval mode on device, the run's train.py config dict) from out_dir/ckpt.pt."""
    path = os.path.join(out_dir, 'ckpt.pt')
    checkpoint = load_checkpoint(path, map_location=device, need='model')
    model_args = dict(checkpoint['model_args'], **({'kernels': kernels} if kernels else {}))
    if model_args.get('kernels') == 'triton' and not device.startswith('cuda'):
        model_args['kernels'] = 'auto'  # trained on a GPU, scored here: the chunked torch path computes the same
    model = build_model(checkpoint, path, model_args).eval().to(device)
    return model, checkpoint.get('config', {})


def needle_cells(model, config, scales, depths, sequences, tokens_per_batch, device, ctx):
    """{(context, depth): accuracy} over `sequences` sequences per cell."""
    T0, cells = config['block_size'], {}
    for T in (s * T0 for s in scales):
        B = max(1, min(sequences, tokens_per_batch // T))
        for depth in depths:
            task = Needle(config['task_vocab_size'], T, config['needle_num_needles'], config['needle_value_len'], depth)
            correct = total = 0
            for first in range(0, sequences, B):
                xs, ys = zip(*(to_example(*task.sequence(np.random.default_rng([LONG_SEED, j])))
                               for j in range(first, min(first + B, sequences))))
                x, y = torch.from_numpy(np.stack(xs)).to(device), torch.from_numpy(np.stack(ys)).to(device)
                with torch.no_grad(), ctx:
                    logits, _ = model(x)
                answer = y != -1
                correct += int((logits.argmax(-1)[answer] == y[answer]).sum())
                total += int(answer.sum())
            cells[T, depth] = correct / total
    return cells


def text_losses(model, config, scales, windows, device, ctx):
    """Over `windows` windows of max(scales) · block_size tokens of the val split: the mean loss per position with the
    whole window as context, the same with the context cut at every block_size boundary (each piece of block_size
    tokens scored alone, as in training), and the window count. The two see the same tokens: their difference at a
    position is what the context before the piece's start gives there, apart from how hard the text is."""
    T0 = config['block_size']
    L = max(scales) * T0
    tokens = np.concatenate([read_shard(p) for p in shard_paths(os.path.join(ROOT, 'data', config['dataset']), 'val')])
    n = min(windows, (len(tokens) - 1) // L)
    if n < 1:
        raise UserError(f"the {config['dataset']} val split holds {len(tokens):,} tokens, fewer than one window of "
                        f"{L + 1:,}: use smaller --scales")
    whole, cut = torch.zeros(L, dtype=torch.float64), torch.zeros(L, dtype=torch.float64)
    group = max(1, CUT_TOKENS // T0)  # pieces per forward
    for w in range(n):
        chunk = torch.from_numpy(tokens[w * L:w * L + L + 1].astype(np.int64)).to(device)
        x, y = chunk[:-1], chunk[1:]
        with torch.no_grad(), ctx:
            whole += position_losses(model, x[None], y[None]).double().cpu()
            xs, ys = x.view(-1, T0), y.view(-1, T0)
            cut += torch.cat([position_losses(model, xs[i:i + group], ys[i:i + group]).double().cpu()
                              for i in range(0, len(xs), group)])
    return (whole / n).numpy(), (cut / n).numpy(), n


CUT_TOKENS = 65536  # text: tokens per forward of the cut-context pass (its pieces batched)


def position_losses(model, idx, targets):
    """The cross-entropy at each position of the sequences idx [B, L], flattened to [B·L] (the model's forward, then
    its output layer GPT.LOSS_CHUNK positions at a time: the [L, vocab] logits of a long window never exist whole)."""
    docs = model.documents(idx) if model.config.documents else None  # each document its own sequence, as in training
    x = model.transformer.wte(idx)
    for block in model.transformer.h:
        x = block(x, None, docs)
    x = model.transformer.ln_f(x).flatten(0, 1)
    return torch.cat([F.cross_entropy(model.lm_head(a).float(), t, reduction='none')
                      for a, t in zip(x.split(model.LOSS_CHUNK), targets.flatten().split(model.LOSS_CHUNK))])


def buckets(scales, T0):
    """Position buckets [0, T0), then [s_{i-1}·T0, s_i·T0) for each larger scale."""
    edges = [0] + [s * T0 for s in sorted(scales)]
    return list(zip(edges[:-1], edges[1:]))


def evaluate(study, out_dir, args, device, ctx):
    """Score one run and write out_dir/longctx-<study>.json; returns what it wrote."""
    model, config = load_run(out_dir, device, args.kernels)
    is_task = config.get('dataset') in TASK_NAMES
    if study == 'needle' and config.get('dataset') != 'needle':
        raise UserError(f"{out_dir} was trained on dataset={config.get('dataset')!r}: the needle study scores "
                        f"dataset='needle' runs (train them with config/needle.py or grid.py --tasks needle)")
    if study == 'text' and is_task:
        raise UserError(f"{out_dir} was trained on the {config['dataset']} task: the text study scores runs on a "
                        f"token dataset (e.g. config/text.py)")
    T0 = config['block_size']
    warning = model.length_warning(max(args.scales) * T0)
    if warning:
        print(f"{out_dir}: {warning}", file=sys.stderr)
    result = dict(mixer=config['mixer'], seed=config['seed'], block_size=T0, dataset=config['dataset'], out_dir=out_dir,
                  learning_rate=config['learning_rate'], batch_size=config['batch_size'])
    if study == 'needle':
        cells = needle_cells(model, config, args.scales, args.depths, args.sequences, args.tokens_per_batch, device, ctx)
        result.update(sequences=args.sequences, num_needles=config['needle_num_needles'],
                      chance=1 / ((config['task_vocab_size'] - 1) // 4),  # a value token guessed among the values
                      cells=[dict(context=T, depth=d, accuracy=a) for (T, d), a in cells.items()])
    else:
        losses, cut, n = text_losses(model, config, args.scales, args.windows, device, ctx)
        result.update(windows=n, documents=config.get('documents', False),
                      buckets=[dict(start=a, end=b, loss=float(losses[a:b].mean()), cut_loss=float(cut[a:b].mean()))
                               for a, b in buckets(args.scales, T0)],
                      curve=[float(v) for v in losses],  # the per-position means, for the picture
                      cut_curve=[float(v) for v in cut])
    path = os.path.join(out_dir, f'longctx-{study}.json')
    try:
        with open(path, 'w') as f:
            json.dump(result, f)
    except OSError as e:  # disk full, or the folder changed since the check in main(): the table still shows it
        print(f"{path}: not saved ({e.strerror or e}); the table below is all there is of this run's result",
              file=sys.stderr)
    return result


def at_training_length(r):
    """A needle run's accuracy at its own block_size, over the depths: what picks a seed's best setting."""
    return np.mean([c['accuracy'] for c in r['cells'] if c['context'] == r['block_size']])


def by_mixer(results):
    """{mixer: [result of each seed]}, the mixers in model.MIXERS' order, patterns (hybrids) after them. Needle runs
    of one mixer and seed at several settings (grid.py --learning_rates, --batch_sizes) keep the one most accurate at
    the training length: the setting is chosen in distribution, and then seen at the longer contexts."""
    order = list(MIXERS)
    best = {}
    for r in results:
        key = (r['mixer'], r['seed'])
        if key not in best or ('cells' in r and at_training_length(r) > at_training_length(best[key])):
            best[key] = r
    rows = {}
    for r in sorted(best.values(), key=lambda r: (order.index(r['mixer']) if r['mixer'] in order else len(order),
                                                  r['mixer'], r['seed'])):
        rows.setdefault(r['mixer'], []).append(r)
    return rows


def check_comparable(study, results):
    """One table holds runs trained and scored alike: refuse (one line) runs of different block_size, dataset,
    needle count or position buckets, and two text runs of one mixer and seed (a row holds one run per seed)."""
    keys = ('block_size', 'num_needles') if study == 'needle' else ('dataset', 'block_size', 'documents')
    def setting(r):
        extra = () if study == 'needle' else (tuple((b['start'], b['end']) for b in r['buckets']),)
        return tuple(r.get(k) for k in keys) + extra
    first = setting(results[0])
    for r in results[1:]:
        if setting(r) != first:
            what = ', '.join(f"{k} {results[0].get(k)!r} / {r.get(k)!r}" for k in keys if results[0].get(k) != r.get(k))
            raise UserError(f"{results[0]['out_dir']} and {r['out_dir']} differ ({what or 'their position buckets (--scales)'}"
                            f"): one table compares runs trained and scored alike; give them in separate calls (each "
                            f"run's result is saved: --table_only shows it again)")
    if study == 'text':
        seen = {}
        for r in results:
            other = seen.setdefault((r['mixer'], r['seed']), r['out_dir'])
            if other != r['out_dir']:
                raise UserError(f"{other} and {r['out_dir']} are both {r['mixer']} with seed {r['seed']}: a row holds "
                                f"one run per seed; give them in separate calls")


def settings_line(results):
    """Which run (its LR and batch) each row's seeds took, where the runs tried more than one setting."""
    tried = {(r['learning_rate'], r['batch_size']) for r in results}
    if len(tried) < 2:
        return ''
    picked = '; '.join(f"{m}: " + ', '.join(f"{r['learning_rate']:g} bs{r['batch_size']}" for r in runs)
                       for m, runs in by_mixer(results).items())
    return (f"\nEach seed's run at the setting most accurate at {results[0]['block_size']:,} tokens (of "
            f"{len(tried)} tried): {picked}.")


def spread(values):
    """'mean ±half-range' over seeds ('mean' for one)."""
    mean = sum(values) / len(values)
    return f"{mean:.3f}" + (f" ±{(max(values) - min(values)) / 2:.3f}" if len(values) > 1 else '')


def needle_table(results):
    """Rows: mixer; columns: each context (accuracy averaged over depths), then the worst depth at the longest."""
    contexts = sorted({c['context'] for r in results for c in r['cells']})
    head = ['mixer', 'seeds'] + [f"{T:,}" for T in contexts]
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for mixer, runs in by_mixer(results).items():
        row = [f'`{mixer}`', str(len(runs))]
        for T in contexts:
            per_seed = [np.mean([c['accuracy'] for c in r['cells'] if c['context'] == T]) for r in runs]
            row.append(spread(per_seed))
        lines.append('| ' + ' | '.join(row) + ' |')
    return '\n'.join(lines)


def depth_table(results):
    """Per mixer, accuracy by depth (rows) and context (columns), mean over seeds: where in the haystack it fails."""
    contexts = sorted({c['context'] for r in results for c in r['cells']})
    depths = sorted({c['depth'] for r in results for c in r['cells']})
    out = []
    for mixer, runs in by_mixer(results).items():
        out += [f"`{mixer}` ({len(runs)} seed{'s' if len(runs) > 1 else ''}), accuracy by depth × context:", '',
                '| depth | ' + ' | '.join(f"{T:,}" for T in contexts) + ' |', '|---|' + '---|' * len(contexts)]
        for d in depths:
            vals = [np.mean([c['accuracy'] for r in runs for c in r['cells'] if c['context'] == T and c['depth'] == d])
                    for T in contexts]
            out.append(f"| {d:g} | " + ' | '.join(f"{v:.2f}" for v in vals) + ' |')
        out.append('')
    return '\n'.join(out)


def text_table(results):
    """Rows: mixer; columns: the loss in each position bucket, then (results that have it) its difference from the
    same tokens' loss with the context cut at block_size."""
    spans = [(b['start'], b['end']) for b in results[0]['buckets']]
    head = ['mixer', 'seeds'] + [f"{a:,}–{b:,}" for a, b in spans]
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for mixer, runs in by_mixer(results).items():
        row = [f'`{mixer}`', str(len(runs))]
        for i in range(len(spans)):
            cell = spread([r['buckets'][i]['loss'] for r in runs])
            if all('cut_loss' in r['buckets'][i] for r in runs):  # (a row with an older result among its seeds: none)
                cell += f" ({np.mean([r['buckets'][i]['loss'] - r['buckets'][i]['cut_loss'] for r in runs]):+.3f})"
            row.append(cell)
        lines.append('| ' + ' | '.join(row) + ' |')
    return '\n'.join(lines)


def plot(study, results, path, title):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    T0 = results[0]['block_size']
    for i, (mixer, runs) in enumerate(by_mixer(results).items()):
        if study == 'needle':
            xs = sorted({c['context'] for c in runs[0]['cells']})
            ys = [np.mean([c['accuracy'] for r in runs for c in r['cells'] if c['context'] == T]) for T in xs]
            ax.plot(xs, ys, marker='o', label=mixer, color=f'C{i}')
        else:  # the per-position mean over seeds, smoothed over log-spaced bins so the lines can be told apart
            curve = np.mean([r['curve'] for r in runs], axis=0)
            edges = np.unique(np.geomspace(1, len(curve), 28).astype(int))
            xs = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
            ax.plot(xs, [curve[a:b].mean() for a, b in zip(edges[:-1], edges[1:])], label=mixer, color=f'C{i}')
    ax.axvline(T0, color='grey', linestyle=':', label=f'training length {T0:,}')
    if study == 'needle':
        ax.axhline(results[0]['chance'], color='grey', linestyle='--', linewidth=0.8, label='chance')
    ax.set_xscale('log', base=2)
    ax.set_xlabel('context length (tokens)' if study == 'needle' else 'position in the sequence (tokens)')
    ax.set_ylabel('needle answer accuracy (mean over depths and seeds)' if study == 'needle' else 'val loss at that position')
    if study == 'needle':
        ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], allow_abbrev=False)
    ap.add_argument('study', choices=['needle', 'text'])
    ap.add_argument('out_dirs', nargs='+', help="train.py out_dirs holding a ckpt.pt")
    ap.add_argument('--scales', nargs='+', type=int, default=[1, 2, 4, 8, 16], help="contexts as multiples of each run's block_size")
    ap.add_argument('--depths', nargs='+', type=float, default=[0.0, 0.25, 0.5, 0.75, 1.0], help="needle: where the asked needle starts, 0 (first token) .. 1 (just before the query)")
    ap.add_argument('--sequences', type=int, default=128, help="needle: sequences per (context, depth) cell")
    ap.add_argument('--windows', type=int, default=32, help="text: val windows of max(scales) x block_size tokens (fewer if the split is shorter)")
    ap.add_argument('--tokens_per_batch', type=int, default=65536, help="needle: sequences per forward = this / context")
    ap.add_argument('--table_only', action='store_true', help="no evaluation: the table (and --plot) from each out_dir's longctx-<study>.json")
    ap.add_argument('--by_depth', action='store_true', help="needle: also a depth x context table per mixer")
    ap.add_argument('--plot', default=None, help="PNG path for the picture")
    ap.add_argument('--title', default=None)
    ap.add_argument('--device', default='', help="'' = cuda if available, else cpu")
    ap.add_argument('--dtype', default='', help="'' = bfloat16 on CUDA, float32 elsewhere")
    ap.add_argument('--kernels', default='', help="'' = the checkpoint's (triton becomes auto off CUDA)")
    args = ap.parse_args()
    if min(args.scales) < 1 or sorted(set(args.scales)) != args.scales:
        raise UserError(f"--scales must be increasing integers >= 1, got {args.scales}")
    if not all(0 <= d <= 1 for d in args.depths):
        raise UserError(f"--depths must lie in [0, 1] (0: the first token, 1: just before the query), got {args.depths}")
    for flag in ('sequences', 'windows', 'tokens_per_batch'):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag}={getattr(args, flag)} must be >= 1")
    if args.plot and os.path.splitext(args.plot)[1].lower() not in ('.png', '.pdf', '.svg', '.jpg', '.jpeg'):
        raise UserError(f"--plot {args.plot}: give a picture's path ending .png, .pdf, .svg or .jpg")
    # where the results go, checked before hours of scoring: each out_dir's longctx-<study>.json, and the picture
    for folder in ([] if args.table_only else args.out_dirs) + ([os.path.dirname(os.path.abspath(args.plot))] if args.plot else []):
        probe = folder
        while not os.path.isdir(probe):  # a --plot folder not made yet: its nearest existing parent must be writable
            if os.path.exists(probe):
                raise UserError(f"cannot write into {folder}: {probe} is a file, not a folder")
            probe = os.path.dirname(probe)
        if not os.access(probe, os.W_OK):
            raise UserError(f"cannot write into {folder} (read-only or permissions), where the results go: make it "
                            f"writable, or copy the run elsewhere / give another --plot path")
    device, dtype = device_and_dtype(args.device, args.dtype)
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
    kind = torch.device(device).type
    ctx = nullcontext() if ptdtype == torch.float32 else torch.amp.autocast(device_type=kind, dtype=ptdtype)
    results = []
    for out_dir in args.out_dirs:
        if args.table_only:
            path = os.path.join(out_dir, f'longctx-{args.study}.json')
            if not os.path.isfile(path):
                raise UserError(f"{path}: no such file: run `python tools/longctx.py {args.study} {out_dir}` first")
            try:
                with open(path) as f:
                    result = json.load(f)
            except ValueError as e:  # truncated, or not JSON
                raise UserError(f"{path}: not a longctx.py result ({e}): run `python tools/longctx.py {args.study} "
                                f"{out_dir}` again") from None
            if not (isinstance(result, dict) and isinstance(result.get('block_size'), int)
                    and isinstance(result.get('cells' if args.study == 'needle' else 'buckets'), list)):
                raise UserError(f"{path}: not a longctx.py {args.study} result: run `python tools/longctx.py "
                                f"{args.study} {out_dir}` again")
            results.append(result)
        else:
            results.append(evaluate(args.study, out_dir, args, device, ctx))
            print(f"{out_dir}: scored", file=sys.stderr, flush=True)
    check_comparable(args.study, results)
    r0 = results[0]
    if args.study == 'needle':
        print(f"Needle answer accuracy by context length (mean over depths {', '.join(f'{d:g}' for d in args.depths)}; "
              f"{r0['sequences']} sequences per cell; {r0['num_needles']} needles, trained at {r0['block_size']:,} tokens):\n")
        print(needle_table(results))
        print(settings_line(results))
        if args.by_depth:
            print('\n' + depth_table(results))
    else:
        cut = any('cut_loss' in b for r in results for b in r['buckets'])  # (results written before it have none)
        print(f"Val loss by position bucket ({r0['dataset']}, {r0['windows']} windows; trained at {r0['block_size']:,} tokens)"
              + (f"; in brackets, less the same tokens' loss with the context cut at every {r0['block_size']:,} tokens "
                 f"(negative: the longer context helps; none where a seed's result predates that pass)" if cut else "")
              + ":\n")
        print(text_table(results))
    if args.plot:
        default = (f"needle accuracy against context, trained at {r0['block_size']:,}" if args.study == 'needle'
                   else f"{r0['dataset']} val loss against position, trained at {r0['block_size']:,}")
        try:
            plot(args.study, results, args.plot, args.title or default)
        except OSError as e:
            raise UserError(f"the picture could not be written to {args.plot} ({e.strerror or e}); the table above "
                            f"stands: draw it again with --table_only --plot PATH") from None
        print(f"\npicture: {args.plot}")


if __name__ == '__main__':
    try:
        main()
    except UserError as e:
        sys.exit(f"longctx.py: {e}")
