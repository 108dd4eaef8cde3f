"""
Long-context study tests (CPU): longctx.py's needle cells scored against stand-in models whose answers are known
(an oracle that looks the asked key up, one that only remembers the last w tokens), its text buckets against the
losses computed here from the val tokens themselves, the softmax length warning, and the command end to end on a
tiny needle run trained here (table, json, picture, errors).

$ python -m pytest tests/test_longctx.py -q
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import longctx
from configurator import UserError
from dataloader import read_shard, shard_paths
from model import GPT, GPTConfig
from tasks import Needle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V, D, L = 64, 3, 2  # the stand-ins' task: vocab, needles, values per needle
CONFIG = dict(block_size=40, task_vocab_size=V, needle_num_needles=D, needle_value_len=L)


class LookBack(torch.nn.Module):
    """Answers a query '? key' with the values after that key's latest place among the w tokens before the '?'
    (w = None: anywhere before it); elsewhere, and when the key is not found, it predicts token 0 (never an answer)."""

    def __init__(self, w=None):
        super().__init__()
        self.w = w

    def forward(self, x):
        B, T = x.shape
        logits = torch.zeros(B, T, V)
        logits[..., 0] = 1.0
        for b in range(B):
            row = x[b].tolist()
            for q in (i for i in range(T - 1) if row[i] == 0):
                lo = 0 if self.w is None else max(0, q - self.w)
                found = [i for i in range(lo, q) if row[i] == row[q + 1]]
                for l in range(L):
                    if found and q + 1 + l < T:
                        logits[b, q + 1 + l, row[found[-1] + 1 + l]] = 2.0
        return logits, None


def test_oracle_is_right_everywhere_and_a_short_memory_only_near_the_queries():
    scales, depths = [1, 2, 4], [0.0, 0.5, 1.0]
    cells = longctx.needle_cells(LookBack(), CONFIG, scales, depths, 6, 100, 'cpu', torch.no_grad())
    assert sorted(cells) == sorted((s * 40, d) for s in scales for d in depths)
    assert all(a == 1.0 for a in cells.values())
    # remembering the last w tokens: right exactly where the first query's needle starts within w of the queries
    w = 30
    cells = longctx.needle_cells(LookBack(w), CONFIG, scales, depths, 6, 100, 'cpu', torch.no_grad())
    for (T, d), acc in cells.items():
        H = T + 1 - D * (L + 2)                 # the haystack: what comes before the first '?'
        start = round(d * (H - L - 1))          # the first query's needle
        assert acc == (1.0 if H - start <= w else 0.0), (T, d, acc)
    assert 0 < sum(cells.values()) < len(cells)  # both kinds of cell occur


class CopyCurrent(torch.nn.Module):
    """Logits c at the current token, 0 elsewhere: the loss at t is log(e^c + V - 1) - c·[x_t+1 == x_t]."""
    c, V = 3.0, 50304

    def forward(self, x):
        logits = torch.zeros(*x.shape, self.V)
        logits.scatter_(-1, x[..., None], self.c)
        return logits, None


class CopyFirst(torch.nn.Module):
    """Logits c at the first token of the sequence it is given, 0 elsewhere: the loss at t is log(e^c + V - 1) -
    c·[x_t+1 == x_0], so it depends on where the context starts (the whole window's first token, or a piece's)."""
    c, V = 3.0, 50304

    def forward(self, x):
        logits = torch.zeros(*x.shape, self.V)
        logits.scatter_(-1, x[:, :1, None].expand(*x.shape, 1), self.c)
        return logits, None


def test_text_buckets_are_the_mean_loss_of_their_positions(pystdlib, monkeypatch):
    import torch.nn.functional as F  # the fake models' logits whole (position_losses: tested below)
    monkeypatch.setattr(longctx, 'position_losses',
                        lambda m, idx, t: F.cross_entropy(m(idx)[0].flatten(0, 1), t.flatten(), reduction='none'))
    monkeypatch.setattr(longctx, 'CUT_TOKENS', 24)  # three pieces of 8 a forward: the window's four as 3 + 1
    config, scales, windows = dict(block_size=8, dataset='pystdlib'), [1, 2, 4], 5
    tokens = np.concatenate([read_shard(p) for p in shard_paths(os.path.join(ROOT, 'data', 'pystdlib'), 'val')])
    for model in (CopyCurrent(), CopyFirst()):
        losses, cut, n = longctx.text_losses(model, config, scales, windows, 'cpu', torch.no_grad())
        assert n == windows and losses.shape == cut.shape == (32,)
        c, Vs = model.c, model.V
        expected, expected_cut = np.zeros(32), np.zeros(32)
        for w in range(windows):  # non-overlapping windows of 32 + 1 tokens from the split's start
            x, y = tokens[w * 32:w * 32 + 32], tokens[w * 32 + 1:w * 32 + 33]
            if isinstance(model, CopyCurrent):
                expected += math.log(math.exp(c) + Vs - 1) - c * (x == y)
                expected_cut += math.log(math.exp(c) + Vs - 1) - c * (x == y)
            else:  # the whole window's first token; the cut context's: each piece of 8's first
                expected += math.log(math.exp(c) + Vs - 1) - c * (y == x[0])
                expected_cut += math.log(math.exp(c) + Vs - 1) - c * (y == np.repeat(x[::8], 8))
        assert np.allclose(losses, expected / windows, atol=1e-4)
        assert np.allclose(cut, expected_cut / windows, atol=1e-4)
    assert not np.allclose(losses[8:], cut[8:])  # (CopyFirst: the cut changes the loss past the first piece)
    assert longctx.buckets(scales, 8) == [(0, 8), (8, 16), (16, 32)]
    result = dict(mixer='gdn', seed=1, buckets=[dict(start=0, end=8, loss=2.5, cut_loss=2.5),
                                                dict(start=8, end=16, loss=2.0, cut_loss=2.25)])
    assert '| `gdn` | 1 | 2.500 (+0.000) | 2.000 (-0.250) |' in longctx.text_table([result])
    older = dict(result, seed=2, buckets=[dict(start=0, end=8, loss=2.7), dict(start=8, end=16, loss=2.2)])
    assert '| `gdn` | 2 | 2.600 ±0.100 | 2.100 ±0.100 |' in longctx.text_table([result, older])  # no Δ: one seed lacks it


def test_length_warning_only_for_softmax_past_block_size():
    def model(mixer):
        return GPT(GPTConfig(n_layer=4, n_head=2, n_embd=32, head_dim=16, d_state=16, block_size=32, vocab_size=64,
                             mixer=mixer))
    assert model('softmax').length_warning(32) is None
    assert model('softmax').length_warning(33).startswith('warning: 33 tokens of context > block_size 32')
    assert model('kda*3,softmax').length_warning(64) is not None
    assert model('gdn').length_warning(10_000) is None and model('retnet').length_warning(10_000) is None


def run(args, script='tools/longctx.py'):
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    env.pop('RANK', None)
    return subprocess.run([sys.executable, script] + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_needle_study_end_to_end(tmp_path, monkeypatch):
    """A tiny needle run of each kind (softmax, gdn), scored at 1x and 2x its block_size: a table row per mixer,
    the json per run, the picture, the warning for softmax only; then --table_only from the json; bad input is one
    line."""
    outs = []
    for mixer in ('softmax', 'gdn'):
        out = str(tmp_path / mixer)
        p = run(['config/needle.py', f'--mixer={mixer}', f'--out_dir={out}', '--device=cpu', '--task_vocab_size=32',
                 '--block_size=32', '--needle_num_needles=2', '--n_layer=2', '--n_embd=32', '--n_head=1',
                 '--head_dim=16', '--d_state=16', '--batch_size=4', '--max_iters=2', '--eval_interval=2',
                 '--eval_iters=1', '--warmup_iters=1'], script='train.py')
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        outs.append(out)
    png = str(tmp_path / 'needle.png')
    p = run(['needle'] + outs + ['--scales', '1', '2', '--depths', '0', '1', '--sequences', '3', '--device=cpu',
                                  '--plot', png, '--by_depth'])
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stderr.count('warning:') == 1 and 'softmax' in p.stderr.split('warning:')[0].splitlines()[-1]
    rows = [line for line in p.stdout.splitlines() if line.startswith('| `')]
    assert [r.split('|')[1].strip() for r in rows[:2]] == ['`softmax`', '`gdn`']
    assert '| mixer | seeds | 32 | 64 |' in p.stdout.splitlines()
    for out in outs:
        with open(os.path.join(out, 'longctx-needle.json')) as f:
            r = json.load(f)
        assert sorted((c['context'], c['depth']) for c in r['cells']) == [(32, 0.0), (32, 1.0), (64, 0.0), (64, 1.0)]
        assert all(0 <= c['accuracy'] <= 1 for c in r['cells']) and r['sequences'] == 3
    assert os.path.getsize(png) > 10_000
    again = run(['needle'] + outs + ['--table_only'])
    assert again.returncode == 0 and [l for l in again.stdout.splitlines() if l.startswith('| `')] == rows[:2]
    # bad input: one line naming the problem (the command's exit once, the rest in this process)
    p = run(['needle', str(tmp_path / 'nothing'), '--device=cpu'])
    assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1 and 'no checkpoint at' in p.stderr, p.stderr
    (tmp_path / 'a_file').write_text('')
    with open(os.path.join(outs[1], 'longctx-needle.json'), 'w') as f:
        f.write('{"block_size": 32, "cel')  # truncated
    for args, says in ((['needle', outs[0], '--sequences', '0'], '--sequences=0 must be >= 1'),
                       (['text', outs[0], '--windows', '0'], '--windows=0 must be >= 1'),
                       (['needle', outs[0], '--plot', str(tmp_path / 'a_file' / 'p.png')], 'a_file is a file, not a folder'),
                       (['needle', outs[1], '--table_only'], 'longctx-needle.json: not a longctx.py result'),
                       (['text', outs[0]], "the text study scores runs on a token dataset"),
                       (['needle', outs[0], '--scales', '2', '1'], '--scales must be increasing integers'),
                       (['needle', outs[0], '--depths', '1.5'], r'--depths must lie in \[0, 1\]')):
        monkeypatch.setattr(sys, 'argv', ['longctx.py'] + args + ['--device=cpu'])
        with pytest.raises(UserError, match=says):
            longctx.main()


def test_a_seed_keeps_its_setting_most_accurate_at_the_training_length():
    def result(mixer, seed, lr, at_512, at_4096):
        return dict(mixer=mixer, seed=seed, learning_rate=lr, batch_size=64, block_size=512,
                    cells=[dict(context=512, depth=0.0, accuracy=at_512), dict(context=4096, depth=0.0, accuracy=at_4096)])
    results = [result('gdn', 1, 1e-3, 0.9, 0.9), result('softmax', 1, 1e-3, 0.5, 0.4),
               result('softmax', 1, 3e-4, 0.9, 0.1), result('softmax', 2, 3e-4, 0.7, 0.0), result('softmax', 2, 1e-3, 0.8, 0.0)]
    rows = longctx.by_mixer(results)
    assert list(rows) == ['softmax', 'gdn']  # model.MIXERS' order
    assert [(r['seed'], r['learning_rate']) for r in rows['softmax']] == [(1, 3e-4), (2, 1e-3)]  # not the best at 4,096
    table = longctx.needle_table(results)
    assert '| `softmax` | 2 | 0.850 ±0.050 | 0.050 ±0.050 |' in table
    assert 'softmax: 0.0003 bs64, 0.001 bs64; gdn: 0.001 bs64' in longctx.settings_line(results)


def test_position_losses_equal_the_whole_logits():
    """longctx's per-position loss, the output layer in pieces, equals the cross-entropy of the model's whole logits."""
    import torch.nn.functional as F
    from model import GPT, GPTConfig
    from longctx import position_losses
    for documents in (False, True):  # (documents: EOT 0 starts each; its tokens below hold several)
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_kv_head=1, n_embd=32, block_size=64, vocab_size=61,
                              mixer='kda,softmax', head_dim=16, documents=documents, eot_token=0)).eval()
        model.LOSS_CHUNK = 7  # several pieces, the last one short
        idx = torch.randint(0, 61, (1, 41), generator=torch.Generator().manual_seed(1))
        idx[0, [9, 22]] = 0
        with torch.no_grad():
            logits, _ = model(idx[:, :-1])
            want = F.cross_entropy(logits[0], idx[0, 1:], reduction='none')
            torch.testing.assert_close(position_losses(model, idx[:, :-1], idx[0, 1:]), want)
            batch = idx[:, :-1].view(5, 8)  # several sequences at once (the cut-context pass): each on its own
            want = torch.cat([F.cross_entropy(model(row[None])[0][0], t, reduction='none')
                              for row, t in zip(batch, idx[0, 1:].view(5, 8))])
            torch.testing.assert_close(position_losses(model, batch, idx[0, 1:].view(5, 8)), want)


def test_one_table_holds_runs_trained_and_scored_alike():
    """Runs of another block_size, dataset or position buckets, or two text runs of one mixer and seed, are refused
    in one line (a row would drop one silently, and the buckets would be another run's); needle runs of one mixer
    and seed at several settings are kept (the grid's LR ladder: the best is chosen)."""
    def text(out_dir, mixer='gdn', seed=1, T=8, dataset='pystdlib', scales=(1, 2)):
        return dict(out_dir=out_dir, mixer=mixer, seed=seed, block_size=T, dataset=dataset, documents=False,
                    buckets=[dict(start=a, end=b, loss=2.0) for a, b in longctx.buckets(list(scales), T)])
    longctx.check_comparable('text', [text('a'), text('b', seed=2), text('c', mixer='kda')])
    for other, says in ((text('b', T=16), "block_size 8 / 16"), (text('b', dataset='pkgtext'), "dataset 'pystdlib' / 'pkgtext'"),
                        (text('b', scales=(1, 4)), "position buckets"), (text('b'), "both gdn with seed 1")):
        with pytest.raises(UserError, match=says):
            longctx.check_comparable('text', [text('a'), other])
    needle = lambda out_dir, T=512, lr=1e-3: dict(out_dir=out_dir, mixer='gdn', seed=1, block_size=T, num_needles=4,
                                                   learning_rate=lr, cells=[])
    longctx.check_comparable('needle', [needle('a'), needle('b', lr=3e-4)])
    with pytest.raises(UserError, match="block_size 512 / 256"):
        longctx.check_comparable('needle', [needle('a'), needle('b', T=256)])
