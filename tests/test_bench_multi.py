"""
tools/bench_multi.py (GPU only) from given train.py runs, on CPU: the DDP / FSDP and context-parallel tables, their
ratios, and the contexts tried where the expected one does not fit.

$ python -m pytest tests/test_bench_multi.py -q
"""
import os
import subprocess
import sys

import torch

import bench_multi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def test_multi_gpu_tables_from_given_runs(monkeypatch, capsys):
    """bench_multi.py (GPU only) from given train.py runs: every row's ratios as computed here, a run that failed
    shown with its error, the longest context that fit one GPU taken as the CP runs' base, and their losses compared."""
    runs = {}

    def train_run(nproc, overrides, steps, tag, gpus=None):
        T = int(next(o for o in overrides if o.startswith('--block_size=')).split('=')[1])
        fsdp = '--fsdp=True' in overrides
        if nproc == 1 and T == 8192 + 16384:
            return dict(tag=tag, nproc=1, T=T, losses={}, error='CUDA out of memory')
        tokens = {(1, False): 200.0, (2, False): 380.0, (1, True): 180.0, (2, True): 300.0}.get((nproc, fsdp), 150.0 * nproc)
        r = dict(tag=tag, nproc=nproc, T=T, overrides=overrides, tokens_s=tokens, quartiles=(tokens - 5, tokens + 5),
                 peak_gib=(12.0 if fsdp else 10.0) / nproc, losses={i: 5.0 - 0.01 * i + 0.003 * (nproc > 1) for i in range(9)})
        runs[tag] = dict(r, gpus=gpus)
        return r

    monkeypatch.setattr(bench_multi, 'train_run', train_run)
    monkeypatch.setattr(bench_multi, 'long_rows_dataset', lambda: 'pystdlib_long')
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'test GPU')
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    res = bench_multi.multi_gpu_bench(['dp', 'cp'], [2], 8192, steps=9, cp_multiples=['1', 'n', '4'], dp_batch=24)
    out = capsys.readouterr().out
    for t in ('DDP-1', 'FSDP-1', 'DDP-2', 'FSDP-2'):  # the micro-batch given, 2 micro-steps per GPU
        assert '--batch_size=24' in runs[t]['overrides'] and f"--gradient_accumulation_steps={2 * runs[t]['nproc']}" in runs[t]['overrides']
    assert 'T = 1,024, 24 sequences x 2 micro-steps per GPU' in out
    rows = {tuple(c.strip() for c in line.strip('|').split('|')[:3]): [c.strip() for c in line.strip('|').split('|')]
            for line in out.splitlines() if line.startswith('| ') and 'layout' not in line}
    fsdp2 = rows[('FSDP', '2', '300 (295–305)')]
    assert fsdp2[3:7] == ['150', f"{150 / 180:.2f}", f"{300 / 380:.2f}", '6.0']  # per GPU, ÷ 1 GPU, ÷ DDP, peak
    assert rows[('DDP', '2', '380 (375–385)')][4] == f"{190 / 200:.2f}"
    assert rows[('1 GPU', '1', '24,576')][3] == 'CUDA out of memory'
    cp = rows[('CP over 2', '2', '8,192')]
    assert cp[3:7] == ['380', f"{380 / 200:.2f}", '5.0', f"{5.0 / 10.0:.2f}"]  # against one GPU at 8,192
    assert ('CP over 2, recompute', '2', '16,384') in rows  # twice the longest context that fit one GPU
    assert 'largest difference 0.0030' in out
    assert [r['T'] for r in res['cp']['cp']] == [8192, 16384, 32768]
    # 2 GPUs here: DDP and FSDP on 1 GPU ran side by side, on 2 one after the other
    assert [runs[t]['gpus'] for t in ('DDP-1', 'FSDP-1', 'DDP-2', 'FSDP-2')] == ['0', '1', None, None]
    assert ('CP over 2, recompute', '2', '32,768') in rows  # n times or more: with activation checkpointing
    assert [('--activation_checkpointing=True' in r['overrides']) for r in res['cp']['cp']] == [False, True, True]


def test_multi_gpu_optimizer_table_from_given_runs(monkeypatch, capsys):
    """bench_multi.py opt: AdamW and Muon under FSDP and DDP at T = 4,096, 8 sequences per GPU, side by side on GPUs
    0..n-1 and n..2n-1 where the host has 2n, one after the other where not; Muon's tokens/s over AdamW's per layout."""
    runs = {}

    def train_run(nproc, overrides, steps, tag, gpus=None):
        opt = next(o for o in overrides if o.startswith('--optimizer=')).split('=')[1]
        fsdp = '--fsdp=True' in overrides
        tokens = {('adamw', True): 400.0, ('muon', True): 350.0, ('adamw', False): 410.0, ('muon', False): 390.0}[opt, fsdp]
        runs[tag] = dict(overrides=overrides, gpus=gpus, nproc=nproc)
        return dict(tag=tag, nproc=nproc, T=4096, tokens_s=tokens * nproc, quartiles=(1.0, 2.0), peak_gib=20.0, losses={})

    monkeypatch.setattr(bench_multi, 'train_run', train_run)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'test GPU')
    for count, n, side in ((4, 2, True), (2, 2, False)):
        runs.clear()
        monkeypatch.setattr(torch.cuda, 'device_count', lambda: count)
        res = bench_multi.multi_gpu_bench(['opt'], [n], 8192, steps=9)
        out = capsys.readouterr().out
        assert sorted(runs) == ['DDP-adamw-2', 'DDP-muon-2', 'FSDP-adamw-2', 'FSDP-muon-2']
        for tag, r in runs.items():
            assert {'--block_size=4096', '--batch_size=8', '--gradient_accumulation_steps=2'} <= set(r['overrides'])
            assert ('--fsdp=True' in r['overrides']) == tag.startswith('FSDP')
            assert r['gpus'] == (('2,3' if 'muon' in tag else '0,1') if side else None)
        assert '| FSDP | 2 | muon | 700 (1–2) | 0.875 | 20.0 |' in out
        assert '| DDP | 2 | muon | 780 (1–2) | 0.951 | 20.0 |' in out
        assert '| FSDP | 2 | adamw | 800 (1–2) | 1.000 | 20.0 |' in out
        assert [(l, n, o) for l, n, o, _ in res['opt']] == [('FSDP', 2, 'adamw'), ('FSDP', 2, 'muon'),
                                                              ('DDP', 2, 'adamw'), ('DDP', 2, 'muon')]


def test_multi_gpu_cp_steps_down_where_the_expected_context_does_not_fit(monkeypatch, capsys):
    """bench_multi.py cp on a smaller card (GPU only; train.py runs given): where neither --cp_context nor one
    step more fits one GPU, the two contexts below are tried side by side, and the CP runs take the longest that fit."""
    tried = []

    def train_run(nproc, overrides, steps, tag, gpus=None):
        T = int(next(o for o in overrides if o.startswith('--block_size=')).split('=')[1])
        tried.append((nproc, T, gpus))
        if nproc == 1 and T > 24576:
            return dict(tag=tag, nproc=1, T=T, losses={}, error='CUDA out of memory')
        return dict(tag=tag, nproc=nproc, T=T, overrides=overrides, tokens_s=100.0 * nproc, quartiles=(1, 2),
                    peak_gib=10.0 / nproc, losses={i: 5.0 for i in range(3)})

    monkeypatch.setattr(bench_multi, 'train_run', train_run)
    monkeypatch.setattr(bench_multi, 'long_rows_dataset', lambda: 'pystdlib_long')
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'test GPU')
    res = bench_multi.multi_gpu_bench(['cp'], [2], 40960, steps=3, cp_multiples=['1'])
    assert sorted(tried[:2]) == [(1, 40960, '0'), (1, 57344, '1')] and sorted(tried[2:4]) == [(1, 8192, '0'), (1, 24576, '1')]
    assert tried[4:] == [(2, 24576, None)]  # CP at the longest that fit
    assert [r['T'] for r in res['cp']['single']] == [8192, 24576, 40960, 57344]
    assert 'CUDA out of memory' in capsys.readouterr().out


def test_unknown_parts_are_refused_in_one_line():
    for parts, named in (('dp,foo', "'foo'"), ('dp,', "''"), ('DP', "'DP'")):
        p = subprocess.run([sys.executable, 'tools/bench_multi.py', parts], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 2 and f"unknown part(s) {named}: give dp, cp and/or opt" in p.stderr, p.stderr


def test_help():
    p = subprocess.run([sys.executable, 'tools/bench_multi.py', '--help'], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and '--cp_context' in p.stdout and '--tiles' not in p.stdout, p.stderr[-2000:]


def test_a_run_that_train_py_refuses_reports_train_pys_line(pystdlib):
    """A run that train.py refuses (here: a mixer pattern longer than the model) reports train.py's own one-line
    error, not the tail of torchrun's report around it."""
    rec = bench_multi.train_run(1, ["--block_size=32", "--batch_size=2", "--n_layer=2", "--n_embd=32", "--n_head=2",
                                    "--device=cpu", "--compile=False"], 2, "refused")
    assert rec["error"].startswith("train.py: error: repeat count must be in [1, n_layer=2]"), rec["error"]


def test_a_second_run_of_one_tag_trains_again(pystdlib):
    """Each run writes to its own temp out_dir, which the next run of that tag overwrites (it was refused: the folder
    held an earlier run's checkpoint)."""
    args = ["--block_size=32", "--batch_size=2", "--n_layer=4", "--n_embd=32", "--n_head=2", "--head_dim=16",
            "--gradient_accumulation_steps=1", "--device=cpu", "--compile=False"]
    for _ in range(2):
        rec = bench_multi.train_run(1, args, 2, "again")  # (on CPU no iter line has a peak, so no tokens/s)
        assert "train.py: error:" not in rec.get("error", ""), rec["error"]
