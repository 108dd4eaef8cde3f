"""
tools/ttl.py, the time-to-loss benchmark: its arithmetic on logs written by hand (numbers worked out here), and one
tiny sweep through train.py on CPU.

$ python -m pytest tests/test_ttl.py -q
"""
import os
import re
import subprocess
import sys

import pytest

import ttl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_log(folder, mixer, lr, seed, evals, step_ms, tokens_per_step=1_000_000, max_iters=None, optimizer='adamw',
              losses=None, gpu=None):
    """A train.py log.txt: evals = [(step, val loss, train clock s)], step_ms = each step's time (ms), losses =
    each step's training loss (default: from 9 down by 1 over the run), gpu: the card in its nvidia-smi table."""
    max_iters = max_iters or evals[-1][0]
    os.makedirs(folder, exist_ok=True)
    config = dict(out_dir=str(folder), eval_only=False, init_from='scratch', mixer=mixer, learning_rate=lr, seed=seed,
                  max_iters=max_iters, optimizer=optimizer)
    lines = [f"=== 2026-12-06 12:00:00 train.py", f"config: {config!r}"] + (
        [f"|   0  {gpu}          On  |   00000000:19:00.0 Off |                    0 |"] if gpu else []) + [
             f"data: pystdlib, 1 grad accum × 1 ranks × 1 batch × 1000 context = {tokens_per_step:,} tokens per step, "
             f"{max_iters} steps"]
    at = {s: (v, c) for s, v, c in evals}
    for n in range(max_iters + 1):
        if n in at:
            v, c = at[n]
            lines.append(f"step {n}: train loss {v:.4f}, val loss {v:.4f} (eval 0.10s, train clock {c:.3f}s)")
        if n < max_iters:
            loss = losses[n] if losses else 9 - n / max_iters
            lines.append(f"iter {n}/{max_iters}: loss {loss:.4f}, smooth 9.0, time {step_ms[n]:.2f}ms, "
                         f"tok/s {tokens_per_step / step_ms[n] * 1000:,.0f}, lr 1.00e-03, eta 1s")
    with open(os.path.join(folder, 'log.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')


def test_report_arithmetic_on_written_logs(tmp_path, capsys):
    """Compile time = the first ten steps' time beyond the median step; time at an eval = train clock − compile;
    the target = the baseline's final val loss (mean of its seeds at its best rate); time to it interpolated."""
    steps = 20
    fast = [1000.0] + [100.0] * (steps - 1)        # softmax: step 0 compiles for 0.9 s, then 0.1 s a step
    slow = [500.0, 300.0] + [200.0] * (steps - 2)  # gdn: 0.3 + 0.1 s beyond its median 0.2 s, then 0.2 s a step
    clock = lambda ms, s: sum(ms[:s]) / 1000
    for seed, final in ((1, 3.0), (2, 3.2)):  # softmax: final 3.0 and 3.2 -> mean 3.1 ± 0.1
        write_log(tmp_path / f'softmax_s{seed}', 'softmax', 1e-3, seed,
                  [(0, 10.0, 0.0), (10, 4.0, clock(fast, 10)), (20, final, clock(fast, 20))], fast)
    write_log(tmp_path / 'softmax_worse', 'softmax', 2e-3, 1, [(0, 10.0, 0.0), (20, 5.0, clock(fast, 20))], fast)
    for seed, mid in ((1, 3.4), (2, 3.6)):  # gdn's mean curve: 10, 3.5 at step 10, 2.5 at step 20
        write_log(tmp_path / f'gdn_s{seed}', 'gdn', 1e-3, seed,
                  [(0, 10.0, 0.0), (10, mid, clock(slow, 10)), (20, 2.5, clock(slow, 20))], slow)
    write_log(tmp_path / 'kda_s1', 'kda', 1e-3, 1, [(0, 10.0, 0.0), (20, 3.5, clock(fast, 20))], fast)
    ttl.main_args(['report', str(tmp_path), '--plot', ''])
    out = capsys.readouterr().out
    rows = {m.group(1) + m.group(2): m.group(0) for m in re.finditer(r'^\| `(\w+)` \| ([\d.e-]+) \|.*$', out, re.M)}
    # softmax at 1e-3 (mean 3.1) beats 2e-3 (5.0); compile 0.9 s; its own time to 3.1 is at its last eval, 2.9 - 0.9 s
    assert '| 3.1000 ± 0.1000 | 10,000,000 | 0.9 | 2.0 s (1.00×), 20.0M tokens |' in rows['softmax0.001'], out
    # gdn: compile 0.3 + 0.1 = 0.4 s; clock at step 10 = 0.5 + 0.3 + 8 x 0.2 - 0.4 = 2.0 s, at 20: 4.0 s;
    # 3.1 is crossed between 3.5 (2.0 s) and 2.5 (4.0 s): 2.0 + 0.4 / 1.0 x 2.0 = 2.8 s, at 10 + 0.4 x 10 = 14 steps
    assert '| 2.5000 ± 0.0000 | 5,000,000 | 0.4 | 2.8 s (1.40×), 14.0M tokens |' in rows['gdn0.001'], out
    assert 'not reached' in rows['kda0.001'], out
    assert 'softmax0.002' in rows and rows['softmax0.002'].count('|') == 9  # the sweep table lists every rate
    assert rows['gdn0.001'].endswith('| — (under 100 steps) |'), out
    # each seed apart: softmax's first crosses 3.1 at 0.9 of the way from step 10 (1.0 s) to 20 (2.0 s), its second
    # ends at 3.2; gdn's cross between 3.4 and 2.5 (a third of the way) and between 3.6 and 2.5 (5/11 of it)
    assert "- `softmax`: seed 1 3.0000, 1.9 s (19.0M tokens); seed 2 3.2000, not reached" in out, out
    assert "- `gdn`: seed 1 2.5000, 2.7 s (13.3M tokens); seed 2 2.5000, 2.9 s (14.5M tokens)" in out, out
    assert "- `kda`" not in out  # one seed: the table's row says it all


def test_runs_on_another_card_count_for_their_losses_not_their_clocks(tmp_path, capsys):
    """Times and speeds come from the runs on the baseline's card; a seed run on another counts for the loss."""
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    steps, clock = 20, lambda ms, s: sum(ms[:s]) / 1000
    base, slow, quick = [100.0] * steps, [200.0] * steps, [20.0] * steps
    for seed, final in ((1, 3.0), (2, 3.2)):  # the target: 3.1, reached by softmax at 2.0 s on the H100
        write_log(tmp_path / f'softmax_s{seed}', 'softmax', 1e-3, seed,
                  [(0, 10.0, 0.0), (10, 4.0, clock(base, 10)), (20, final, clock(base, 20))], base, gpu=h100)
    write_log(tmp_path / 'gdn_s1', 'gdn', 1e-3, 1, [(0, 10.0, 0.0), (10, 3.4, clock(slow, 10)), (20, 2.5,
              clock(slow, 20))], slow, gpu=h100)
    write_log(tmp_path / 'gdn_s2', 'gdn', 1e-3, 2, [(0, 10.0, 0.0), (10, 3.6, clock(quick, 10)), (20, 2.5,
              clock(quick, 20))], quick, gpu=h200)
    write_log(tmp_path / 'kda_s1', 'kda', 1e-3, 1, [(0, 10.0, 0.0), (10, 3.0, clock(quick, 10)), (20, 2.9,
              clock(quick, 20))], quick, gpu=h200)
    ttl.main_args(['report', str(tmp_path), '--plot', str(tmp_path / 'ttl.png')])
    captured = capsys.readouterr()
    out = captured.out
    assert f"Time to loss on {h100}:" in out and f"those of the runs on {h100}" in captured.err, captured
    rows = {m.group(1): m.group(0) for m in re.finditer(r'^\| `(\w+)` \|.*$', out, re.M)}
    # gdn: the loss over both seeds (mean curve 3.5 at step 10: tokens to 3.1 at 14M), the time and speed of seed 1
    # alone (crossing 3.1 a third of the way from 3.4 at 2.0 s to 2.5 at 4.0 s: 2.67 s); tokens/s 5M (0.2 s a step)
    assert '| 2.5000 ± 0.0000 | 5,000,000 | 0.0 | 2.7 s (1.33×), 14.0M tokens (time: its 1 of 2 seeds on ' + h100 + ') |' \
        in rows['gdn'], out
    # kda, only on the H200: 10.0 to 3.0 over 10 steps crosses 3.1 at 9.86M tokens; no time, no speed
    assert f"— (not run on {h100}) | — (not run on {h100}) | 9.9M tokens (no time: not run on {h100})" in rows['kda'], out
    assert f"seed 2 2.5000, 14.5M tokens (on {h200})" in out, out
    assert (tmp_path / 'ttl.png').stat().st_size > 0


def test_report_names_the_largest_spike_and_non_finite_steps(tmp_path, capsys):
    """The largest rise of a step's loss over the median of the 50 steps before it, from step 100 on, the largest
    over seeds; non-finite losses counted."""
    n = 300
    ms = [100.0] * n
    for seed, (at, height) in ((1, (150, 1.25)), (2, (250, 0.5))):
        losses = [5.0 - 0.001 * i for i in range(n)]
        losses[at] += height
        losses[40] += 3.0  # before step 100: warm-up noise, not counted
        if seed == 2:
            losses[260] = float('nan')
        write_log(tmp_path / f'softmax_s{seed}', 'softmax', 1e-3, seed, [(0, 9.0, 0.0), (n, 4.0, 30.0)], ms,
                  losses=losses)
    ttl.main_args(['report', str(tmp_path), '--plot', ''])
    out = capsys.readouterr().out
    # at step 150: 4.85 + 1.25 over the median of steps 100..149 (4.9 - 0.0245 = 4.8755): 1.2245 -> 1.22
    assert re.search(r'^\| `softmax` \|.*\| 1\.22 \(step 150\), 1 non-finite \|$', out, re.M), out


def test_time_and_tokens_to_target_interpolate_between_evals():
    assert ttl.reach([0, 10, 20], [10.0, 3.5, 2.5], 3.1) == pytest.approx(14.0)
    assert ttl.reach([0, 10, 20], [10.0, 3.5, 3.2], 3.1) is None
    assert ttl.reach([0, 10], [3.0, 2.0], 3.1) == 0


def test_a_resumed_run_and_bad_settings_are_one_line(tmp_path):
    fast = [100.0] * 10
    write_log(tmp_path / 'a', 'softmax', 1e-3, 1, [(0, 10.0, 0.0), (10, 4.0, 1.0)], fast)
    text = open(tmp_path / 'a' / 'log.txt').read()
    with open(tmp_path / 'a' / 'log.txt', 'a') as f:  # the run again, resumed: its config says so
        f.write(text.replace("'init_from': 'scratch'", "'init_from': 'resume'"))
    for args, message in (
            (['report', str(tmp_path / 'a')], 'a resumed run'),
            (['run', str(tmp_path / 'b'), '--mixers', 'softmax', '--lrs', '1e-3', '--', '--mixer=gdn'], '--mixer is set by'),
            (['run', str(tmp_path / 'b'), '--mixers', 'softmax', '--lrs', '1e-3'], "give train.py's settings after --"),
            (['report', str(tmp_path / 'none')], 'no such folder')):
        p = subprocess.run([sys.executable, 'tools/ttl.py'] + args, cwd=ROOT, capture_output=True, text=True)
        lines = 2 if message == 'a resumed run' else 1  # (the run left out, then: no finished runs)
        assert p.returncode == 1 and p.stderr.count('\n') == lines and message in p.stderr, (args, p.stderr)


def test_a_tiny_sweep_through_train_py(pystdlib, tmp_path):
    """Two mixers, two seeds, each run in its own out_dir; a second `run` keeps the finished runs; the report names
    both mixers, and the runs of one seed read the same batches (their first training losses agree across rates
    only through the data: the same seed and data give the same step-0 loss)."""
    settings = ['--dataset=pystdlib', '--n_layer=2', '--n_head=2', '--n_embd=32', '--head_dim=16', '--block_size=32',
                '--batch_size=4', '--gradient_accumulation_steps=1', '--eval_iters=2', '--log_interval=1',
                '--warmup_iters=2', '--max_iters=6', '--lr_decay_iters=6', '--eval_interval=3', '--device=cpu',
                '--compile=False']
    cmd = [sys.executable, 'tools/ttl.py', 'run', str(tmp_path), '--mixers', 'softmax', 'gdn', '--lrs', '3e-3', '1e-2',
           '--seeds', '1', '--'] + settings
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    names = sorted(n for n in os.listdir(tmp_path) if not n.startswith('.'))  # (each run's lock file beside it)
    assert names == ['gdn_adamw_lr0.003_s1', 'gdn_adamw_lr0.01_s1', 'softmax_adamw_lr0.003_s1',
                     'softmax_adamw_lr0.01_s1'], names
    first = lambda d: re.search(r'^iter 0/6: loss ([\d.]+)', open(tmp_path / d / 'log.txt').read(), re.M).group(1)
    assert first('softmax_adamw_lr0.003_s1') == first('softmax_adamw_lr0.01_s1')  # step 0's loss: before any update
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count('finished before, kept') == 4, again.stdout
    other = subprocess.run(cmd + ['--eval_iters=3'], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert other.returncode == 1 and 'finished with other settings' in other.stderr and '--eval_iters=3' in \
        other.stderr and 'train.py' not in other.stdout, other.stdout + other.stderr  # (refused before any run)
    p = subprocess.run([sys.executable, 'tools/ttl.py', 'report', str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True)
    assert p.returncode == 0 and '| `softmax` |' in p.stdout and '| `gdn` |' in p.stdout, p.stderr
    if os.path.exists(tmp_path / 'ttl.png'):  # (matplotlib, from requirements.txt)
        assert os.path.getsize(tmp_path / 'ttl.png') > 10_000
    # --lrs_from: each mixer again, at its own best rate of that sweep (lowest final val loss), with another seed
    final = {d: ttl.read_run(str(tmp_path / d))['val'][-1] for d in names}
    best = {m: min((d for d in names if d.startswith(m)), key=final.get).split('_lr')[1].split('_')[0] for m in ('softmax', 'gdn')}
    p = subprocess.run([sys.executable, 'tools/ttl.py', 'run', str(tmp_path / 'final'), '--mixers', 'softmax', 'gdn',
                        '--lrs_from', str(tmp_path), '--seeds', '2', '--'] + settings, cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    got = sorted(n for n in os.listdir(tmp_path / 'final') if not n.startswith('.'))
    assert got == sorted(f'{m}_adamw_lr{lr}_s2' for m, lr in best.items()), p.stdout
    p = subprocess.run([sys.executable, 'tools/ttl.py', 'run', str(tmp_path / 'x'), '--mixers', 'kda', '--lrs_from',
                        str(tmp_path), '--'] + settings, cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 1 and 'holds no finished run of kda with adamw' in p.stderr, p.stderr


def test_runs_at_once_one_per_gpu(pystdlib, tmp_path):
    """--gpus 2: two runs at once, each on its own GPU of those the process may use, each one's console in
    <run folder>.console; both finish."""
    settings = ['--dataset=pystdlib', '--n_layer=1', '--n_head=2', '--n_embd=32', '--head_dim=16', '--block_size=32',
                '--batch_size=2', '--gradient_accumulation_steps=1', '--eval_iters=1', '--log_interval=1',
                '--warmup_iters=1', '--max_iters=2', '--lr_decay_iters=2', '--eval_interval=2', '--device=cpu',
                '--compile=False']
    out = tmp_path / 'new'  # (a folder not there yet)
    p = subprocess.run([sys.executable, 'tools/ttl.py', 'run', str(out), '--mixers', 'softmax', 'gdn', '--lrs',
                        '1e-3', '--gpus', '2', '--'] + settings, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES='4,5'))  # the GPUs this process may use
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert '(GPU 4)' in p.stdout and '(GPU 5)' in p.stdout, p.stdout
    for name in ('softmax_adamw_lr0.001_s1337', 'gdn_adamw_lr0.001_s1337'):
        assert ttl.finished(str(out / name)), name
        assert 'step 2:' in open(out / f'{name}.console').read()


def test_runs_sharing_one_gpu_give_losses_not_clocks(pystdlib, tmp_path, capsys):
    """--per_gpu 2 on one GPU: two runs at once on that GPU, each marked <run>.shared; report gives their losses and
    tokens, and no tokens/s, compile time or time to the target (a shared GPU's clock is not one run's). A run
    started again alone drops its mark."""
    settings = ['--dataset=pystdlib', '--n_layer=1', '--n_head=2', '--n_embd=32', '--head_dim=16', '--block_size=32',
                '--batch_size=2', '--gradient_accumulation_steps=1', '--eval_iters=1', '--log_interval=1',
                '--warmup_iters=1', '--max_iters=4', '--lr_decay_iters=4', '--eval_interval=2', '--device=cpu',
                '--compile=False']
    out = tmp_path / 'sweep'
    p = subprocess.run([sys.executable, 'tools/ttl.py', 'run', str(out), '--mixers', 'softmax', 'gdn', '--lrs',
                        '1e-3', '--per_gpu', '2', '--'] + settings, cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, CUDA_VISIBLE_DEVICES='3'))
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert p.stdout.count('(GPU 3)') == 2, p.stdout
    names = ('softmax_adamw_lr0.001_s1337', 'gdn_adamw_lr0.001_s1337')
    assert all((out / f'{n}.shared').exists() and ttl.finished(str(out / n)) for n in names)
    ttl.main_args(['report', str(out), '--plot', ''])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith('| `')]
    assert len(rows) == 2 and all(r.count('— (GPU shared)') == 2 and 'GPU shared: no time' in r for r in rows), rows
    import shutil
    shutil.rmtree(out / names[1])  # gdn again, alone: its mark goes; softmax, finished, is kept with its mark
    p = subprocess.run([sys.executable, 'tools/ttl.py', 'run', str(out), '--mixers', 'softmax', 'gdn', '--lrs', '1e-3',
                        '--'] + settings, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and 'finished before, kept' in p.stdout, p.stdout + p.stderr[-2000:]
    assert (out / f'{names[0]}.shared').exists() and not (out / f'{names[1]}.shared').exists()
    ttl.main_args(['report', str(out), '--plot', ''])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith('| `')]
    assert '— (GPU shared)' in rows[0] and '— (GPU shared)' not in rows[1], rows
    assert 'GPU shared: no time' in rows[1] or 'not reached' in rows[1], rows  # (the target's clock was shared)


def test_report_compares_optimizers_by_the_tokens_to_their_adamw_loss(tmp_path, capsys):
    """With Muon runs beside AdamW ones: an optimizer column, and the tokens each Muon arm takes to its mixer's AdamW
    final val loss over AdamW's own tokens to it."""
    ms = [100.0] * 20
    clock = lambda s: sum(ms[:s]) / 1000
    write_log(tmp_path / 'a', 'softmax', 1e-3, 1, [(0, 10.0, 0.0), (10, 4.0, clock(10)), (20, 3.1, clock(20))], ms)
    write_log(tmp_path / 'm', 'softmax', 1e-3, 1, [(0, 10.0, 0.0), (10, 3.0, clock(10)), (20, 2.8, clock(20))], ms,
              optimizer='muon')
    ttl.main_args(['report', str(tmp_path), '--plot', ''])
    out = capsys.readouterr().out
    assert "| mixer | optimizer | lr |" in out, out
    muon = next(line for line in out.splitlines() if '| muon |' in line)
    # AdamW reaches its 3.1 at its last eval, 20M tokens; Muon between 10.0 (0) and 3.0 (10M): 6.9 / 7 x 10M
    assert muon.endswith(f"| {6.9 / 7 * 10 / 20:.2f}× |"), muon
    adamw = next(line for line in out.splitlines() if '| adamw |' in line)
    assert adamw.endswith('| — |') and '2.0 s (1.00×), 20.0M tokens' in adamw, adamw
    assert '1.0 s (0.49×), 9.9M tokens' in muon, muon


def test_diverged_truncated_and_unfair_runs(tmp_path, capsys):
    """A rate with a diverged seed (nan at its final eval) is ruled out, even when another seed did best; a log cut
    inside its final eval line is not finished; a baseline at its target from step 0 gives no division by zero;
    arms of different token counts are warned about."""
    ms = [100.0] * 20
    write_log(tmp_path / 'sm_a1', 'softmax', 1e-3, 1, [(0, 10.0, 0.0), (20, 2.0, 2.0)], ms)
    write_log(tmp_path / 'sm_a2', 'softmax', 1e-3, 2, [(0, 10.0, 0.0), (20, float('nan'), 2.0)], ms)
    write_log(tmp_path / 'sm_b1', 'softmax', 2e-3, 1, [(0, 10.0, 0.0), (20, 3.0, 2.0)], ms)
    write_log(tmp_path / 'sm_b2', 'softmax', 2e-3, 2, [(0, 10.0, 0.0), (20, 3.2, 2.0)], ms)
    write_log(tmp_path / 'gdn', 'gdn', 1e-3, 1, [(0, 10.0, 0.0), (20, 3.0, 2.0)], ms)
    text = open(tmp_path / 'gdn' / 'log.txt').read()
    cut = text[:text.index('step 20:') + len('step 20: train loss 3.0000, val loss 3.0')]
    os.makedirs(tmp_path / 'gdn_cut')
    open(tmp_path / 'gdn_cut' / 'log.txt', 'w').write(cut.replace("'seed': 1", "'seed': 2"))
    assert ttl.finished(str(tmp_path / 'gdn')) and not ttl.finished(str(tmp_path / 'gdn_cut'))
    found = ttl.groups(ttl.run_dirs([str(tmp_path)]))
    assert ttl.best_rates(found)[('softmax', 'adamw')] == 2e-3
    ttl.main_args(['report', str(tmp_path), '--plot', ''])
    out, err = capsys.readouterr()
    assert 'diverged (1 of 2)' in out and 'gdn_cut: not finished' in err, (out, err)
    write_log(tmp_path / 'more' / 'sm', 'softmax', 1e-3, 1, [(0, 3.0, 0.0), (20, 3.0, 2.0)], ms)  # at 3.0 from step 0
    write_log(tmp_path / 'more' / 'kda', 'kda', 1e-3, 1, [(0, 10.0, 0.0), (40, 2.0, 4.0)], ms * 2)
    ttl.main_args(['report', str(tmp_path / 'more'), '--plot', ''])
    out, err = capsys.readouterr()
    assert 'different token counts' in err and '0.0 s, 0.0M tokens' in out, (out, err)


def test_duplicate_rates_are_refused(tmp_path):
    p = subprocess.run([sys.executable, 'tools/ttl.py', 'run', str(tmp_path / 'x'), '--mixers', 'softmax', '--lrs',
                        '1e-2', '0.01', '--', '--dataset=none_such', '--device=cpu'],  # (were it run: a fast refusal)
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and 'distinct' in p.stderr and 'Traceback' not in p.stderr, p.stderr
