"""
Recall-task tests (CPU, under a minute): the MQAR and state-tracking generators make the layout tasks.py
documents, checked against independent readings of the token stream; targets are -1 except at answers;
sequences are deterministic for a seed, ranks get disjoint shares and a resume continues the stream; a tiny
softmax model learns a tiny MQAR; train.py trains on a task (one process, and DDP then resumed in one
process, which must agree), prints and logs the answer accuracy, and grid.py turns the logs into its table and
figure (the mean over seeds of each seed's best LR, a later LR run only where the earlier ones did not reach
stop_at_val_acc: checked with stand-in runs and fake logs, and end to end).

$ python -m pytest tests/test_tasks.py -q
"""
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig
from tasks import MQAR, StateTracking, Needle, TaskLoader, count_correct, to_example
import grid
from plot import read_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rngs(n):
    return [np.random.default_rng([7, i]) for i in range(n)]


# --- layouts, checked by reading the tokens back independently ------------------------------------------

@pytest.mark.parametrize('V, T, N', [(32, 31, 4), (20, 15, 4), (8192, 256, 64), (9, 40, 4)])
def test_mqar_layout(V, T, N):
    task = MQAR(V, T, N)
    K = (V - 1) // 2
    for rng in rngs(20):
        seq, answer = task.sequence(rng)
        assert seq.shape == answer.shape == (T + 1,)
        keys, values = seq[0:2 * N:2], seq[1:2 * N:2]
        assert len(set(keys)) == N and all(1 <= k <= K for k in keys)            # distinct keys from the key range
        assert len(set(values)) == N and all(K < v < V for v in values)          # distinct values from the value range
        pairs = dict(zip(keys, values))
        # after the pairs: filler, and N queries of stored keys, each directly followed by its value, the answer
        queried, expected_answer = [], np.zeros(T + 1, dtype=bool)
        i = 2 * N
        while i <= T:
            if seq[i] == 0:
                i += 1
                continue
            assert seq[i] in pairs and seq[i + 1] == pairs[seq[i]], (i, seq)
            queried.append(seq[i])
            expected_answer[i + 1] = True
            i += 2
        assert len(queried) == N
        assert (answer == expected_answer).all()


def test_mqar_queries_draw_keys_with_replacement():
    # no elimination shortcut: some sequences ask a key twice (and so leave another out); over many, every pair
    # is asked about equally often, in every query slot
    task, N = MQAR(64, 127, 8), 8
    repeats, counts = 0, np.zeros((N, N))  # counts[slot, pair index]
    for rng in rngs(400):
        seq, answer = task.sequence(rng)
        keys = list(seq[0:2 * N:2])
        asked = [keys.index(k) for k in seq[np.flatnonzero(answer) - 1]]
        repeats += len(set(asked)) < N
        counts[np.arange(N), asked] += 1
    assert repeats > 300  # with replacement, P(all 8 distinct) = 8!/8^8 = 0.0024
    assert counts.min() > 20 and counts.max() < 80  # uniform: 50 expected per (slot, pair)


def replay_statetrack(seq, num_vars):
    """An independent reading of a state-tracking sequence: run it like a program, statement by statement,
    keeping each variable's value in a dict. Returns (assignments, queries [(position of the answer, expected)],
    and whether some query's variable had an older, different value)."""
    QUERY, first_value = 1, 2 + num_vars
    is_var = lambda t: 2 <= t < first_value
    env, history, assignments, queries, overwritten = {}, {}, 0, [], False
    i = 0
    while i < len(seq) and seq[i] != 0:
        if seq[i] == QUERY:
            var = seq[i + 1]
            assert is_var(var) and var in env, f"query of an unassigned variable at {i}: {seq}"
            queries.append((i + 2, env[var]))
            overwritten |= any(v != env[var] for v in history[var][:-1])
            i += 3
        else:
            assert is_var(seq[i]) and seq[i + 1] >= first_value, f"bad assignment at {i}: {seq}"
            env[seq[i]] = seq[i + 1]
            history.setdefault(seq[i], []).append(seq[i + 1])
            assignments += 1
            i += 2
    assert (seq[i:] == 0).all(), "only padding after the last statement"
    return assignments, queries, overwritten


@pytest.mark.parametrize('V, T, M, A, Q', [(32, 31, 3, 8, 3), (256, 256, 16, 96, 16), (12, 64, 2, 20, 8), (40, 23, 8, 6, 4)])
def test_statetrack_answer_is_the_latest_assignment(V, T, M, A, Q):
    task = StateTracking(V, T, M, A, Q)
    any_overwritten = False
    for rng in rngs(30):
        seq, answer = task.sequence(rng)
        assert seq.shape == answer.shape == (T + 1,)
        assignments, queries, overwritten = replay_statetrack(seq, M)
        any_overwritten |= overwritten
        assert assignments == A and len(queries) == Q
        for pos, expected in queries:
            assert seq[pos] == expected  # the answer token is the variable's latest value
        assert sorted(np.flatnonzero(answer)) == sorted(pos for pos, _ in queries)
    if A > M:
        # re-assignments with new values happen, so "latest" differs from "first" and the check above has teeth
        assert any_overwritten


def read_needles(seq, V, D, L):
    """An independent reading of a needle sequence: walk the haystack token by token, a key token opening a needle
    of L values, anything else noise; then the D queries. Returns (needles {key: (start, values)}, queries [(key,
    values, where its values are)], the haystack length)."""
    K = (V - 1) // 4
    H = len(seq) - D * (L + 2)
    needles, i = {}, 0
    while i < H:
        t = seq[i]
        if 1 <= t <= K:
            assert t not in needles, f"key {t} planted twice"
            values = tuple(seq[i + 1:i + 1 + L])
            assert i + L < H and all(K < v <= 2 * K for v in values), f"needle at {i}: {seq[i:i + L + 1]}"
            needles[t] = (i, values)
            i += L + 1
        else:
            assert 2 * K < t < V, f"haystack token {t} at {i} is not noise"
            i += 1
    queries = []
    for q in range(H, len(seq), L + 2):
        assert seq[q] == 0 and 1 <= seq[q + 1] <= K, f"query at {q}: '?', then a key"
        queries.append((seq[q + 1], tuple(seq[q + 2:q + L + 2]), list(range(q + 2, q + L + 2))))
    return needles, queries, H


@pytest.mark.parametrize('V, T, D, L, depth', [(128, 127, 4, 2, None), (33, 60, 8, 1, None), (128, 511, 4, 2, 0.0),
                                               (128, 100, 4, 2, 1.0), (64, 90, 3, 3, 0.37), (9, 11, 2, 1, 0.5)])
def test_needle_layout(V, T, D, L, depth):
    task = Needle(V, T, D, L, depth)
    for rng in rngs(30):
        seq, answer = task.sequence(rng)
        assert seq.shape == answer.shape == (T + 1,)
        needles, queries, H = read_needles(seq, V, D, L)
        assert len(needles) == D and len(queries) == D
        for key, values, _ in queries:  # every query asks a planted needle and is followed by its values
            assert key in needles and needles[key][1] == values
        scored = [p for _, _, at in (queries if depth is None else queries[:1]) for p in at]
        assert (np.flatnonzero(answer) == scored).all()  # answers: every query's values, or at a depth the first's
        if depth is not None:
            assert needles[queries[0][0]][0] == round(depth * (H - L - 1))


def test_needle_training_depths_cover_the_haystack():
    # depth None: the first query's needle anywhere, from the first token to just before the queries, with
    # distractors on either side of it; every key equally likely to be asked; the other queries with replacement
    task, n = Needle(64, 63, 4, 2), 3
    starts, before, asked, repeats = [], [], np.zeros(15), 0  # (64 - 1) // 4 keys
    for rng in rngs(600):
        seq, _ = task.sequence(rng)
        needles, queries, H = read_needles(seq, 64, 4, 2)
        first = needles[queries[0][0]][0]
        starts.append(first)
        before.append(sum(s < first for s, _ in needles.values()))
        asked[queries[0][0] - 1] += 1
        repeats += len({k for k, _, _ in queries}) < 4
    assert min(starts) == 0 and max(starts) == H - n
    assert np.histogram(starts, bins=4, range=(0, H - n + 1))[0].min() > 100      # uniform: 150 expected per quarter
    assert set(before) == {0, 1, 2, 3}
    assert asked.min() > 15 and asked.max() < 65                                    # 40 expected per key
    assert repeats > 400                                     # with replacement: P(4 distinct) = 3/4 · 2/4 · 1/4 = 0.09


def test_needle_sequences_at_a_depth_differ_only_in_where_the_needle_is():
    # the same generator state gives the same keys and values at every depth and length; only the layout moves
    for depth in (0.0, 0.5, 1.0):
        a, _ = Needle(64, 63, 3, 2, depth).sequence(np.random.default_rng(5))
        b, _ = Needle(64, 255, 3, 2, depth).sequence(np.random.default_rng(5))
        assert (a[-12:] == b[-12:]).all()  # the three queries and their values


def test_targets_are_minus_one_except_answers():
    for task in (MQAR(32, 31, 4), StateTracking(32, 31, 3, 8, 3), Needle(32, 31, 2, 2)):
        seq, answer = task.sequence(np.random.default_rng(0))
        x, y = to_example(seq, answer)
        assert (x == seq[:-1]).all()
        is_answer = answer[1:]  # y[t] is the token after x[t]
        assert (y[is_answer] == seq[1:][is_answer]).all() and (y[~is_answer] == -1).all()
        # and the model's loss is the mean cross-entropy over exactly those positions
        bx, by = TaskLoader(task, 'train', 4, 0).next_batch()
        n_answers = {MQAR: 4, StateTracking: 3, Needle: 4}[type(task)]
        assert ((by != -1).sum(dim=1) == n_answers).all()  # the same number of answers in every sequence
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=31, vocab_size=32))
        logits, loss = model(bx, by)
        mask = by != -1
        assert torch.allclose(loss, F.cross_entropy(logits[mask], by[mask]))
        correct, total = count_correct(logits, by)
        assert total == mask.sum() and correct == (logits.argmax(-1)[mask] == by[mask]).sum()


def test_bad_parameters_name_the_problem():
    with pytest.raises(ValueError, match=r'num_pairs=8 needs 8 distinct keys.*vocab_size >= 17'):
        MQAR(12, 256, 8)
    with pytest.raises(ValueError, match=r'num_pairs=10 needs 4 × 10 = 40 tokens.*num_pairs <= 8'):
        MQAR(8192, 32, 10)
    with pytest.raises(ValueError, match='num_pairs must be >= 1'):
        MQAR(8192, 32, 0)
    with pytest.raises(ValueError, match=r'64 assignments × 2 \+ 16 queries × 3 = 176 tokens.*block_size=128'):
        StateTracking(256, 128, 16, 64, 16)
    with pytest.raises(ValueError, match=r'vocab_size=19 leaves 1 value tokens.*vocab_size >= 20'):
        StateTracking(19, 128, 16, 8, 4)
    StateTracking(20, 128, 16, 8, 4)  # the boundary: two values are enough
    with pytest.raises(ValueError, match='num_queries must be >= 1'):
        StateTracking(256, 128, 16, 8, 0)
    with pytest.raises(ValueError, match=r'5 needles need 5 distinct keys.*vocab_size=20 has 4.*vocab_size >= 21'):
        Needle(20, 128, 5, 2)
    with pytest.raises(ValueError, match=r'4 needles of 3 tokens and their 4 queries of 4 need 28 tokens.*block_size=26'):
        Needle(64, 26, 4, 2)
    Needle(64, 27, 4, 2)  # the boundary: needles and queries fill the sequence
    with pytest.raises(ValueError, match=r'depth must be in \[0, 1\]'):
        Needle(64, 64, 4, 2, depth=1.5)
    with pytest.raises(ValueError, match='non-negative'):
        TaskLoader(MQAR(32, 31, 4), 'train', 4, seed=-1)


# --- seeds, ranks, resume ---------------------------------------------------------------------------------

def batches(loader, n):
    return [loader.next_batch() for _ in range(n)]


def rows(batch_list):
    return [tuple(x.tolist()) for X, _ in batch_list for x in X]


@pytest.mark.parametrize('task', [MQAR(64, 47, 6), StateTracking(64, 47, 4, 12, 4), Needle(64, 47, 3, 2)],
                         ids=['mqar', 'statetrack', 'needle'])
def test_determinism_rank_shares_and_resume(task):
    # the same seed gives the same batches; another seed other batches
    a, b = batches(TaskLoader(task, 'train', 8, 1), 3), batches(TaskLoader(task, 'train', 8, 1), 3)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    assert not torch.equal(a[0][0], TaskLoader(task, 'train', 8, 2).next_batch()[0])
    # the val set is one fixed set whatever the run's seed, and is not the training stream
    assert torch.equal(TaskLoader(task, 'val', 8, 1).next_batch()[0], TaskLoader(task, 'val', 8, 2).next_batch()[0])
    assert not set(rows(batches(TaskLoader(task, 'val', 8, 1), 3))) & set(rows(a))
    # two ranks: disjoint shares that together are what one process reads in two micro-steps
    r0, r1 = batches(TaskLoader(task, 'train', 4, 1, rank=0, world_size=2), 3), batches(TaskLoader(task, 'train', 4, 1, rank=1, world_size=2), 3)
    assert len(set(rows(r0)) | set(rows(r1))) == 2 * 3 * 4  # all different
    single = batches(TaskLoader(task, 'train', 4, 1), 6)
    for c in range(3):
        assert torch.equal(r0[c][0], single[2 * c][0]) and torch.equal(r1[c][0], single[2 * c + 1][0])
        assert torch.equal(r0[c][1], single[2 * c][1]) and torch.equal(r1[c][1], single[2 * c + 1][1])
    # state_dict / load_state_dict continue the stream; reset starts it again
    loader = TaskLoader(task, 'train', 8, 1)
    loader.next_batch()
    state = loader.state_dict()
    expected = loader.next_batch()
    fresh = TaskLoader(task, 'train', 8, 1)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.next_batch()[0], expected[0])
    fresh.reset()
    assert torch.equal(fresh.next_batch()[0], a[0][0])


# --- learning ------------------------------------------------------------------------------------------

def test_tiny_softmax_model_learns_tiny_mqar():
    """2 layers × 64 (two 32-wide heads), 3 pairs in 24 tokens, vocab 32: an induction circuit must form.
    Measured on 2 CPU cores (torch 2.13): val accuracy 0.00, 0.24, 0.30, 0.70, 0.92 at steps 0, 50, ..., 200
    (~8 s; 0.25-0.33 is what knowing which values are in the context gives); the budget is 500 steps."""
    torch.manual_seed(0)
    task = MQAR(32, 24, 3)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=24, vocab_size=32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, betas=(0.9, 0.98))
    train_loader, val_x, val_y = TaskLoader(task, 'train', 32, 0), *TaskLoader(task, 'val', 256, 0).next_batch()

    def val_accuracy():
        model.eval()
        with torch.no_grad():
            correct, total = count_correct(model(val_x, val_y)[0], val_y)
        model.train()
        return (correct / total).item()

    accuracies = [val_accuracy()]
    assert accuracies[0] < 0.2  # an untrained model is not already right (1/16 values is chance)
    for it in range(1, 501):
        for group in optimizer.param_groups:
            group['lr'] = 1e-3 * min(1.0, it / 20)  # short warmup
        x, y = train_loader.next_batch()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if it % 50 == 0:
            accuracies.append(val_accuracy())
            if accuracies[-1] > 0.9:
                break
    assert accuracies[-1] > 0.9, f"val accuracy every 50 steps: {accuracies}"


# --- train.py and grid.py -------------------------------------------------------------------------------

# one grid cell (MQAR, softmax, 2 pairs, width 64), 6 steps of 2 micro-batches of 8 sequences, evals at 0, 3, 6
CELL = dict(task='mqar', mixer='softmax', size=2, width=64, lr=1e-3, seed=grid.SEED)
SHORT = ['--max_iters=6', '--eval_interval=3', '--gradient_accumulation_steps=2', '--batch_size=8', '--eval_iters=2',
         '--log_interval=1', '--device=cpu']


def run(cmd, **kw):
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    env.pop('RANK', None)
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, **kw)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def iter_losses(text):
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r'^iter (\d+)/\d+: loss ([\d.]+)', text, re.M)}


def test_stop_at_val_acc_ends_the_run_and_counts_as_finished(tmp_path):
    """train.py --stop_at_val_acc stops after the first eval that reaches it (checkpoint written, no further
    steps), and grid.py counts such a run as finished (so --resume does not run it again); a run that never
    reaches it goes to max_iters. The threshold is taken from a full run of the same seed (CPU runs are
    deterministic), just under its first non-zero eval accuracy."""
    # the grid's --quick cell, 12 steps at a high LR without warmup, so that the answers' accuracy leaves 0 early
    quick = grid.TASKS['mqar']['quick']['overrides'] + grid.QUICK + SHORT + ['--max_iters=12', '--warmup_iters=0',
                                                                            '--learning_rate=0.01']
    cmd = lambda out_dir, *more: [sys.executable, 'train.py'] + grid.train_args(**CELL, out_dir=out_dir,
                                                                                extra=quick + list(more))
    full = tmp_path / 'full'
    run(cmd(full))
    evals = read_log(full)['evals']
    first = next(e for e in evals if e['step'] > 0 and e['val_acc'] > 0)
    assert not grid.finished(tmp_path / 'none') and grid.finished(full)
    early = tmp_path / 'early'
    p = run(cmd(early, f"--stop_at_val_acc={first['val_acc'] - 1e-4:.4f}"))
    assert re.search(rf"^stopping at step {first['step']}: val acc", p.stdout, re.M), p.stdout[-2000:]
    assert max(iter_losses(p.stdout)) == first['step'] - 1  # no optimizer step after the stopping eval
    assert os.path.isfile(early / 'ckpt.pt') and grid.finished(early)
    assert [e['step'] for e in read_log(early)['evals']][-1] == first['step']


def test_grid_and_train_py_with_ddp_and_resume(tmp_path, torchrun_train):
    """grid.py runs one cell in one process and writes the table from its log. The same cell under torchrun
    (2 ranks × 1 micro-step) to step 3, resumed in one process (1 × 2 micro-steps) to step 6, must continue
    exactly like the single-process run: same sequences on the same global positions, whatever the rank count."""
    out_root = tmp_path / 'grid'
    run([sys.executable, 'tools/grid.py', '--quick', '--tasks', 'mqar', '--mixers', 'softmax', '--sizes', '2',
         f'--out_root={out_root}'] + SHORT)
    single_dir = out_root / 'mqar' / 'softmax_n2_w64_lr0.001_s1337'  # the default seed is train.py's
    with open(single_dir / 'log.txt') as f:
        single_log = f.read()
    assert 'data: mqar (a task: vocab_size 32,' in single_log
    assert re.search(r'^step 6: train loss [\d.]+, val loss [\d.]+, train acc [\d.]+, val acc [\d.]+ \(eval [\d.]+s, train clock [\d.]+s\)$', single_log, re.M)
    log = read_log(single_dir)
    assert [e['step'] for e in log['evals']] == [0, 3, 6] and log['config']['mqar_num_pairs'] == 2
    assert log['config']['seed'] == 1337
    with open(out_root / 'results.md') as f:
        results = f.read()
    assert re.search(rf"^\| `softmax` \| {log['evals'][-1]['val_acc']:.3f} \|$", results, re.M), results
    assert '| mixer | w=64, 2 pairs |' in results

    # the same cell: DDP for 3 steps, then one process from its checkpoint
    ddp_dir = tmp_path / 'ddp'
    extra = grid.TASKS['mqar']['quick']['overrides'] + grid.QUICK + SHORT
    args = grid.train_args(**CELL, out_dir=str(ddp_dir), extra=extra)
    ddp = run(torchrun_train + args + ['--max_iters=3'])
    assert 'world size 2' in ddp.stdout
    m = re.search(r'^step 3: .*, val acc ([\d.]+) \(eval [\d.]+s, train clock [\d.]+s\)$', ddp.stdout, re.M)  # accuracy summed over both ranks' answers
    assert m and 0.0 <= float(m.group(1)) <= 1.0
    resumed = run([sys.executable, 'train.py'] + args + ['--init_from=resume'])
    a, b = iter_losses(single_log), iter_losses(resumed.stdout)
    assert min(b) == 3  # the DDP run's end (after iters 0-2) was saved: it goes on from iter 3
    for it in range(3, 6):
        assert abs(a[it] - b[it]) < 1e-4, (it, a[it], b[it])
    final = read_log(ddp_dir)['evals'][-1]
    assert final['step'] == 6 and abs(final['val_loss'] - log['evals'][-1]['val_loss']) < 1e-4

    # sample.py on a task model: token ids in, ids out (no GPT-2 text); a text prompt is refused by name
    s = run([sys.executable, 'sample.py', f'--out_dir={single_dir}', '--start=3 20 5 25 0 3', '--num_samples=1',
             '--max_new_tokens=4', '--temperature=0', '--device=cpu'])
    line = s.stdout.split('---------------')[0].strip().splitlines()[-1]
    ids = [int(t) for t in line.split()]
    assert ids[:6] == [3, 20, 5, 25, 0, 3] and len(ids) == 10 and all(0 <= t < 32 for t in ids)
    bad = subprocess.run([sys.executable, 'sample.py', f'--out_dir={single_dir}', '--start=def f():', '--device=cpu'],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and 'token ids' in bad.stderr and 'mqar' in bad.stderr


def test_plot_reads_logs_and_draws(tmp_path):
    """read_log takes the last start's config and tokens per iteration, and the last line of a step evaluated twice
    (a resume appends to log.txt); plot() draws a PNG when matplotlib is installed (it is optional)."""
    run_dir = tmp_path / 'out-a'
    run_dir.mkdir()
    (run_dir / 'log.txt').write_text(
        "config: {'max_iters': 4, 'mixer': 'kda'}\n"
        "tokens per iteration: 1 grad accum × 1 ranks × 8 batch × 16 context = 128\n"
        "step 0: train loss 4.0000, val loss 4.1000, train acc 0.0000, val acc 0.0100\n"
        "iter 0: loss 4.0000, time 1.00ms, tok/s 1, lr 1.00e-03\n"
        "step 2: train loss 3.0000, val loss 3.1000, train acc 0.2000, val acc 0.2100\n"
        "config: {'max_iters': 6, 'mixer': 'kda'}\n"
        "tokens per iteration: 1 grad accum × 1 ranks × 8 batch × 16 context = 128\n"
        "step 2: train loss 2.9000, val loss 3.0000, train acc 0.2500, val acc 0.2600\n"
        "step 6: train loss nan, val loss nan, train acc 0.0000, val acc 0.0000\n")
    log = read_log(run_dir)
    assert log['config'] == {'max_iters': 6, 'mixer': 'kda'} and log['tokens_per_iter'] == 128
    assert [e['step'] for e in log['evals']] == [0, 2, 6]
    assert log['evals'][1]['val_loss'] == 3.0 and log['evals'][1]['val_acc'] == 0.26
    assert np.isnan(log['evals'][2]['val_loss'])
    assert grid.finished(str(run_dir))  # an eval at max_iters
    pytest.importorskip('matplotlib')
    from plot import plot
    plot([str(run_dir)], str(tmp_path / 'acc.png'), metric='val_acc')
    with open(tmp_path / 'acc.png', 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_resume_on_cuda_under_cuda_graphs_continues_the_run(tmp_path):
    """On CUDA with torch.compile's CUDA graphs (the recall configs' mode): iterations 0-2 (the run saves its end, at
    iter 3), then a resume to 6, log the same losses as 0-5 in one go (the checkpoint's RNG states once came back as
    CUDA tensors, which torch.set_rng_state refuses: every resume on CUDA failed)."""
    extra = grid.TASKS['mqar']['quick']['overrides'] + grid.QUICK + SHORT[:-1] + [
        '--device=cuda', '--compile=True', '--compile_mode=reduce-overhead', '--dtype=float32',
        '--gradient_accumulation_steps=1', '--batch_size=16']
    cmd = lambda out_dir, *more: [sys.executable, 'train.py'] + grid.train_args(**CELL, out_dir=out_dir,
                                                                                extra=extra + list(more))
    whole = iter_losses(run(cmd(tmp_path / 'whole')).stdout)
    run(cmd(tmp_path / 'cut', '--max_iters=3'))
    resumed = iter_losses(run(cmd(tmp_path / 'cut', '--init_from=resume')).stdout)
    assert min(resumed) == 3 and sorted(resumed) == [i for i in sorted(whole) if i >= 3]
    for i in resumed:  # fp32; compiled kernels may differ in the last bits between the two processes
        assert abs(resumed[i] - whole[i]) < 1e-3, (i, resumed[i], whole[i])


@pytest.mark.parametrize('mixer', ['softmax', 'kda'])
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_graphs_accumulate_gradients_as_without_them(tmp_path, mixer):
    """compile_mode='reduce-overhead' (CUDA graphs) with 2 micro-steps a step once failed at the first backward (the
    next replay overwrote the gradient autograd had kept as .grad); it now logs the same losses as the same run
    compiled without graphs (fp32, the same tied embedding, the custom ops for kda)."""
    extra = grid.TASKS['mqar']['quick']['overrides'] + SHORT[:-1] + ['--device=cuda', '--compile=True',
                                                                     '--dtype=float32', f'--mixer={mixer}']
    cmd = lambda name, mode: [sys.executable, 'train.py'] + grid.train_args(
        **CELL, out_dir=str(tmp_path / name), extra=extra + [f'--compile_mode={mode}'])
    graphs = iter_losses(run(cmd('graphs', 'reduce-overhead')).stdout)
    plain = iter_losses(run(cmd('plain', 'default')).stdout)
    assert sorted(graphs) == sorted(plain) == list(range(6))  # iterations 0..max_iters - 1
    for i in graphs:  # the same compiled kernels, replayed or launched: equal up to the last bits
        assert abs(graphs[i] - plain[i]) < 1e-4, (i, graphs[i], plain[i])


def test_grid_start_within_starts_nothing_late(tmp_path):
    """--start_within=0: the deadline has passed before the first run, so none starts, the table marks every
    cell absent (also one where an older grid left a finished log) and the output says how many were not started."""
    out_root = tmp_path / 'grid'
    stale = out_root / 'mqar' / grid.run_name('softmax', 2, 64, 1e-3, grid.SEED)  # a log left by an older grid
    stale.mkdir(parents=True)
    (stale / 'log.txt').write_text("config: {'max_iters': 200}\nstep 200: train loss 1.0, val loss 1.0, "
                                   "train acc 0.9, val acc 0.9\n")
    r = run([sys.executable, 'tools/grid.py', '--quick', '--tasks', 'mqar', '--mixers', 'softmax', 'retnet', '--sizes', '2',
             '--start_within=0', f'--out_root={out_root}'])
    assert '2 runs not started (--start_within 0 min)' in r.stdout
    assert not stale.exists()  # without --resume the grid reruns every cell, so the old log does not stand
    results = (out_root / 'results.md').read_text()
    assert '| `softmax` | — |' in results and '| `retnet` | — |' in results


# a stand-in for train.py in run_all's tests: sleeps, then writes a log.txt as train.py would (an eval at max_iters 10,
# or at step 5 with the stopping line when the accuracy reaches stop), and its start and end times to times.txt
FAKE_TRAIN = """
import sys, time
out_dir, seconds, acc, stop = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
t0 = time.time()
time.sleep(seconds)
step = 5 if 0 < stop <= acc else 10
lines = ["config: {'max_iters': 10}", "step 0: train loss 3.0000, val loss 3.0000, train acc 0.0000, val acc 0.0000",
         f"step {step}: train loss 1.0000, val loss 1.0000, train acc {acc:.4f}, val acc {acc:.4f}"]
if step == 5:
    lines.append(f"stopping at step 5: val acc {acc:.4f} >= stop_at_val_acc {stop}")
open(out_dir + '/log.txt', 'w').write('\\n'.join(lines) + '\\n')
open(out_dir + '/times.txt', 'w').write(f"{t0} {time.time()}")
"""


def fake_log(out_dir, acc, max_iters=10, stopped_at=None, stop=0.99):
    """A train.py log.txt: evals at 0 and at max_iters with val acc `acc`, or, stopped_at=N, at N with train.py's
    stopping line; with max_iters=None an unfinished run (its last eval before max_iters 10)."""
    os.makedirs(out_dir, exist_ok=True)
    step = stopped_at or max_iters or 5
    config = {'dataset': 'mqar', 'block_size': 32, 'task_vocab_size': 32, 'n_layer': 4, 'max_iters': 10,
              'batch_size': 8, 'gradient_accumulation_steps': 1, 'eval_iters': 2, 'seed': 1,
              'stop_at_val_acc': stop if stopped_at else 0.0,
              'statetrack_num_vars': 16, 'statetrack_num_queries': 16}  # the keys grid.settings reads
    text = (f"config: {config}\n"
            f"step 0: train loss 3.0000, val loss 3.0000, train acc 0.0000, val acc 0.0000\n"
            f"step {step}: train loss 1.0000, val loss 1.0000, train acc {acc:.4f}, val acc {acc:.4f}\n")
    if stopped_at:
        text += f"stopping at step {stopped_at}: val acc {acc:.4f} >= stop_at_val_acc {stop}\n"
    with open(os.path.join(out_dir, 'log.txt'), 'w') as f:
        f.write(text)


def test_grid_run_all_tries_later_lrs_only_where_needed(tmp_path, capsys):
    """With stop_at_val_acc, run_all (grid.py's scheduler) starts every cell's first LR before any second LR, a
    cell's second LR only after its first has ended, as soon as it has (not in table order), never more than `jobs`
    at once, and not at all where the first reached the threshold (an older log there is removed). --resume keeps
    every finished run and starts nothing; without stop_at_val_acc every LR runs, in table order; start_within=0
    starts none. The runs are a stand-in for train.py that sleeps and writes a log."""
    lrs = [3e-4, 1e-3]
    # (mixer, lr) -> (seconds, val acc): c's first LR reaches 0.99; b's first is slow, so d's second LR starts first
    fake = {('a', 3e-4): (0.05, 0.5), ('a', 1e-3): (0.05, 0.6), ('b', 3e-4): (4.0, 0.5), ('b', 1e-3): (0.05, 0.7),
            ('c', 3e-4): (0.05, 0.995), ('c', 1e-3): (0.05, 0.5), ('d', 3e-4): (0.05, 0.2), ('d', 1e-3): (0.05, 0.999)}

    def grid_runs(out_root):
        return [grid.Run('mqar', m, 2, 64, 1, lr, str(out_root / grid.run_name(m, 2, 64, lr, 1)), [])
                for m in 'abcd' for lr in lrs]

    def launcher(stop, launched):
        def launch(r):
            launched.append((r.mixer, r.lr))
            seconds, acc = fake[r.mixer, r.lr]
            return subprocess.Popen([sys.executable, '-c', FAKE_TRAIN, r.out_dir, str(seconds), str(acc), str(stop)])
        return launch

    out_root = tmp_path / 'stop'
    stale = out_root / grid.run_name('c', 2, 64, 1e-3, 1)
    fake_log(stale, 0.3)  # an older grid's finished run of c's second LR: it must not stand in the table
    launched = []
    assert grid.run_all(grid_runs(out_root), launcher(0.99, launched), jobs=2, stop_at_val_acc=0.99) == ([], 0, 1)
    # 2 slots: a and b start; a ends: c's first (not a's second); c ends: d's first; then a's and d's second, while
    # b's first still runs; b's second last
    assert launched == [('a', 3e-4), ('b', 3e-4), ('c', 3e-4), ('d', 3e-4), ('a', 1e-3), ('d', 1e-3), ('b', 1e-3)]
    assert not stale.exists()
    out = capsys.readouterr().out
    assert f"{stale}: not needed: lr 3e-4 reached stop_at_val_acc 0.99" in out
    times = {(m, lr): [float(t) for t in (out_root / grid.run_name(m, 2, 64, lr, 1) / 'times.txt').read_text().split()]
             for m, lr in launched}
    for m in 'abd':  # a second LR starts after its first has ended
        assert times[m, 1e-3][0] >= times[m, 3e-4][1]
    for t0, _ in times.values():  # at most 2 at once
        assert sum(s <= t0 < e for s, e in times.values()) <= 2

    launched = []  # --resume: every run that ran is finished, c's second LR is still not needed
    assert grid.run_all(grid_runs(out_root), launcher(0.99, launched), jobs=2, stop_at_val_acc=0.99, resume=True) \
        == ([], 0, 1)
    assert launched == [] and capsys.readouterr().out.count('finished earlier, kept') == 7

    launched = []  # without stop_at_val_acc: every LR, in table order
    for r in grid_runs(tmp_path / 'all'):
        fake[r.mixer, r.lr] = (0.05, fake[r.mixer, r.lr][1])
    assert grid.run_all(grid_runs(tmp_path / 'all'), launcher(0.0, launched), jobs=2) == ([], 0, 0)
    assert launched == [(m, lr) for m in 'abcd' for lr in lrs]

    launched = []  # past the deadline at once: nothing starts, with or without stop_at_val_acc
    assert grid.run_all(grid_runs(tmp_path / 'late'), launcher(0.99, launched), jobs=2, stop_at_val_acc=0.99,
                        start_within=0) == ([], 8, 0)
    assert launched == []


def test_grid_run_all_ahead_starts_later_lrs_at_once_and_stops_them_when_not_needed(tmp_path, capsys):
    """ahead=True: a cell's second LR starts while its first still runs (after every first LR), and is stopped when
    the first reaches the threshold (its out_dir removed without --resume); a second LR whose first has already
    reached does not start. grid.py refuses --ahead without --stop_at_val_acc."""
    lrs = [3e-4, 1e-3]
    # (mixer, lr) -> (seconds, val acc): a's first reaches 0.99 slowly while its second (slower still) runs;
    # b needs both; c's first reaches at once, so its second is not needed
    fake = {('a', 3e-4): (2.0, 0.995), ('a', 1e-3): (30.0, 0.5), ('b', 3e-4): (0.05, 0.5), ('b', 1e-3): (0.05, 0.7),
            ('c', 3e-4): (0.05, 0.995), ('c', 1e-3): (0.05, 0.5)}
    runs = [grid.Run('mqar', m, 2, 64, 1, lr, str(tmp_path / grid.run_name(m, 2, 64, lr, 1)), [])
            for m in 'abc' for lr in lrs]
    launched, t_launch = [], {}

    def launch(r):
        launched.append((r.mixer, r.lr))
        t_launch[r.mixer, r.lr] = time.time()
        seconds, acc = fake[r.mixer, r.lr]
        return subprocess.Popen([sys.executable, '-c', FAKE_TRAIN, r.out_dir, str(seconds), str(acc), '0.99'])
    t0 = time.time()
    assert grid.run_all(runs, launch, jobs=3, stop_at_val_acc=0.99, ahead=True) == ([], 0, 2)
    assert time.time() - t0 < 20  # a's second LR (30 s) was stopped, not waited for
    assert launched == [('a', 3e-4), ('b', 3e-4), ('c', 3e-4), ('a', 1e-3), ('b', 1e-3)]
    a_first_end = float((tmp_path / grid.run_name('a', 2, 64, 3e-4, 1) / 'times.txt').read_text().split()[1])
    assert t_launch['a', 1e-3] < a_first_end  # it did not wait
    assert not (tmp_path / grid.run_name('a', 2, 64, 1e-3, 1)).exists()
    out = capsys.readouterr().out
    assert f"{tmp_path / grid.run_name('a', 2, 64, 1e-3, 1)}: stopped, not needed: lr 3e-4 reached" in out
    assert f"{tmp_path / grid.run_name('c', 2, 64, 1e-3, 1)}: not needed: lr 3e-4 reached" in out
    p = subprocess.run([sys.executable, 'tools/grid.py', '--quick', '--ahead', f'--out_root={tmp_path / "x"}'], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and '--ahead needs --stop_at_val_acc' in p.stderr, p.stderr


def test_grid_resume_continues_an_unfinished_run_from_its_checkpoint(tmp_path, capsys):
    """--resume launches an unfinished run that left a ckpt.pt with --init_from=resume and keeps its out_dir (log and
    checkpoint); an unfinished run without a checkpoint, and every run without --resume, starts afresh in an emptied
    out_dir. The launcher records what it was given instead of training."""
    def runs(root):
        return [grid.Run('mqar', m, 2, 64, 1, 1e-3, str(root / grid.run_name(m, 2, 64, 1e-3, 1)), ['--x=1'])
                for m in ('cut', 'nockpt')]
    for resume in (True, False):
        root = tmp_path / f'resume{resume}'
        for r in runs(root):
            fake_log(r.out_dir, 0.4, max_iters=None)  # evals at 0 and 5 of 10: unfinished
        (root / grid.run_name('cut', 2, 64, 1e-3, 1) / 'ckpt.pt').write_bytes(b'the checkpoint of step 5')
        seen = {}

        def launch(r):
            seen[r.mixer] = (r.overrides, sorted(os.listdir(r.out_dir)))
            return subprocess.Popen([sys.executable, '-c', FAKE_TRAIN, r.out_dir, '0', '0.5', '0'])
        assert grid.run_all(runs(root), launch, jobs=2, resume=resume) == ([], 0, 0)
        if resume:
            assert seen['cut'] == (['--x=1', '--init_from=resume'], ['ckpt.pt', 'log.txt'])
            assert 'unfinished, continued from its ckpt.pt' in capsys.readouterr().out
        else:
            assert seen['cut'] == (['--x=1'], [])
        assert seen['nockpt'] == (['--x=1'], [])


def test_grid_batch_sizes_ladder(tmp_path):
    """--batch_sizes: each batch size is a further setting of every cell, its run named with _bs<B> unless it is the
    config's batch, scored on the same val sequences (eval_iters scaled); the table shows each seed's best setting
    over all of them. A batch that does not divide the val sequences, or batch_size / eval_iters given beside
    --batch_sizes, is refused with a one-line error. Real CPU runs of the --quick cell (batch 32, 4 × 32 val sequences)."""
    out_root = tmp_path / 'grid'
    base = [sys.executable, 'tools/grid.py', '--quick', '--tasks', 'mqar', '--mixers', 'softmax', '--sizes', '2',
            f'--out_root={out_root}', '--max_iters=6', '--eval_interval=3', '--log_interval=1', '--device=cpu']
    run(base + ['--batch_sizes', '32', '64'])
    d32, d64 = (out_root / 'mqar' / grid.run_name('softmax', 2, 64, 1e-3, grid.SEED, b) for b in (None, 64))
    c32, c64 = read_log(d32)['config'], read_log(d64)['config']
    assert (c32['batch_size'], c32['eval_iters'], c64['batch_size'], c64['eval_iters']) == (32, 4, 64, 2)
    accs = {label: read_log(d)['evals'][-1]['val_acc'] for label, d in (('1e-3', d32), ('1e-3 bs64', d64))}
    best = max(accs, key=lambda k: (accs[k], k == '1e-3'))  # a tie keeps the earlier setting
    results = (out_root / 'results.md').read_text()
    assert re.search(rf"^\| `softmax` \| {accs[best]:.3f} \({best}\) \|$", results, re.M), results
    assert 'settings (LR, and batch where not the one below) 1e-3, 1e-3 bs64' in results
    for bad, message in ((['--batch_sizes', '48'], 'does not divide the 128 val sequences'),
                         (['--batch_sizes', '64', '--batch_size=8'], 'the grid sets batch_size for each run')):
        p = subprocess.run(base + bad, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and message in p.stderr, p.stderr


def test_grid_refuses_counts_that_cannot_run_in_one_line(tmp_path, monkeypatch, capsys):
    """--jobs 0 hung, --jobs -1 started every run at once, --widths 33 and --batch_sizes 0 failed in each run.
    The first through the command line, the rest through grid.main in this process (the same parser, no start-up)."""
    base = ['tools/grid.py', '--quick', '--tasks', 'mqar', '--mixers', 'softmax', '--sizes', '2',
            f'--out_root={tmp_path / "grid"}', '--device=cpu']
    p = subprocess.run([sys.executable] + base + ['--jobs', '0'], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and '--jobs 0: each must be >= 1' in p.stderr and 'Traceback' not in p.stderr, p.stderr
    for bad, message in ((['--jobs', '-1'], '--jobs -1: each must be'),
                         (['--widths', '33'], '--widths 33: each must be a multiple of 32'),
                         (['--widths', '16'], '--widths 16: each must be >= 32'),
                         (['--batch_sizes', '0'], '--batch_sizes 0: each must be >= 1'),
                         (['--sizes', '0'], '--sizes 0: each must be >= 1'),
                         (['--mixers', 'nosuch'], "--mixers: unknown mixer 'nosuch'"),  # each started a failing run
                         (['--seeds', '-1'], '--seeds must be >= 0'), (['--learning_rates', '0'], '> 0 and finite')):
        monkeypatch.setattr(sys, 'argv', base + bad)
        with pytest.raises(SystemExit) as e:
            grid.main()
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err.strip().splitlines()[-1], (bad, err[-1000:])  # the last line
    assert not (tmp_path / 'grid').exists()


def test_grid_table_means_over_seeds_of_each_seeds_best_lr(tmp_path):
    """collect() and the table from fake logs: a cell is the mean over seeds of each seed's best final val accuracy,
    ± half the range, the LRs of those bests (each once, a tie keeps the earlier LR); a seed with no finished run
    leaves the mean over the others with 'n=1 of 2 seeds'; 'failed' when no run finished, '—' when none has a log.
    A run reached stop_at_val_acc (so later LRs are skipped) when its log's stopping line meets the threshold; a
    seed's later LRs after a run that stopped early are not counted."""
    root = tmp_path / 'grid'
    d = lambda mixer, n, lr, seed: root / 'mqar' / grid.run_name(mixer, n, 64, lr, seed)
    fake_log(d('softmax', 2, 3e-4, 1), 0.990, stopped_at=5)  # seed 1: reached at 3e-4, so 1e-3 never ran
    fake_log(d('softmax', 2, 3e-4, 2), 0.950)
    fake_log(d('softmax', 2, 1e-3, 2), 0.996)                 # seed 2: best at 1e-3
    fake_log(d('softmax', 4, 3e-4, 1), 0.500)
    fake_log(d('softmax', 4, 1e-3, 1), 0.700)                 # seed 2 of this cell: no log
    fake_log(d('kda', 2, 3e-4, 1), 0.800)
    fake_log(d('kda', 2, 3e-4, 2), 0.600)
    fake_log(d('kda', 2, 1e-3, 2), 0.600)                     # a tie: 3e-4 stays the best of seed 2
    fake_log(d('kda', 4, 3e-4, 1), 0.900, max_iters=None)     # did not finish
    mixers, lrs, seeds = ['softmax', 'kda', 'retnet'], [3e-4, 1e-3], [1, 2]
    # reached: the stopping line at an accuracy that meets this grid's threshold (a resumed grid may ask for more)
    assert grid.reached(d('softmax', 2, 3e-4, 1), 0.99) and not grid.reached(d('softmax', 2, 3e-4, 1), 0.995)
    assert not grid.reached(d('softmax', 2, 1e-3, 2), 0.5)  # finished at max_iters, not stopped early

    cells = grid.collect('mqar', mixers, [2, 4], [64], lrs, seeds, str(root))
    c = cells['softmax', 64, 2]
    assert c['seeds'] == [1, 2] and c['lrs'] == [3e-4, 1e-3]
    assert c['mean'] == pytest.approx(0.993) and c['spread'] == pytest.approx(0.003)
    assert cells['softmax', 64, 4]['seeds'] == [1] and cells['softmax', 64, 4]['mean'] == pytest.approx(0.7)
    assert cells['kda', 64, 2]['lrs'] == [3e-4]
    assert cells['kda', 64, 4]['mean'] is None and cells['kda', 64, 4]['state'] == 'failed'

    lines = grid.table('mqar', mixers, [2, 4], [64], lrs, seeds, str(root)).splitlines()
    assert lines[0] == '| mixer | w=64, 2 pairs | w=64, 4 pairs |'
    assert lines[2] == '| `softmax` | 0.993 ±0.003 (3e-4, 1e-3) | 0.700 (1e-3), n=1 of 2 seeds |'
    assert lines[3] == '| `kda` | 0.700 ±0.100 (3e-4) † | failed |'  # seed 1's 1e-3 run is missing: '†' below
    assert lines[4] == '| `retnet` | — | — |'
    # one seed: no ±; one LR: no LRs (the cells read only the runs of the given seeds and LRs)
    lines = grid.table('mqar', ['softmax'], [2, 4], [64], [3e-4], [1], str(root)).splitlines()
    assert lines[2] == '| `softmax` | 0.990 | 0.500 |'
    lines = grid.table('mqar', ['softmax'], [2, 4], [64], [1e-3], [1, 2], str(root)).splitlines()
    assert lines[2] == '| `softmax` | 0.996, n=1 of 2 seeds | 0.700, n=1 of 2 seeds |'
    # a log left at a setting after one that reached the threshold (an interrupted grid ran it) does not count: seed 1
    # of softmax at 2 pairs stopped early at 3e-4, so its 1e-3 run is not part of the cell, however well it did
    fake_log(d('softmax', 2, 1e-3, 1), 0.999)
    assert grid.collect('mqar', mixers, [2, 4], [64], lrs, seeds, str(root))['softmax', 64, 2] == c
    text = grid.settings('mqar', str(root), lrs, seeds, 0.99)
    assert '2 seeds (1, 2)' in text and 'a later LR is tried only where the earlier ones did not reach it' in text
    assert 'a later LR' not in grid.settings('mqar', str(root), lrs, seeds, 0.0)
    # a seed whose ladder was cut short (no setting reached the threshold and a later one has no finished run) is
    # marked '†' with a footnote; one whose later setting reached it while an earlier one was cut (--ahead) is not
    fake_log(d('retnet', 2, 3e-4, 1), 0.800)                  # its 1e-3 run: no log
    fake_log(d('retnet', 2, 3e-4, 2), 0.850)
    fake_log(d('retnet', 2, 1e-3, 2), 0.900, max_iters=None)  # cut: did not finish
    fake_log(d('retnet', 4, 1e-3, 1), 0.995, stopped_at=5)    # its 3e-4 run: no log
    cells = grid.collect('mqar', mixers, [2, 4], [64], lrs, seeds, str(root))
    assert cells['retnet', 64, 2]['short'] == [1, 2] and cells['retnet', 64, 4]['short'] == []
    assert cells['softmax', 64, 2]['short'] == [] and cells['softmax', 64, 4]['short'] == []
    lines = grid.table('mqar', mixers, [2, 4], [64], lrs, seeds, str(root)).splitlines()
    assert lines[4] == '| `retnet` | 0.825 ±0.025 (3e-4) † | 0.995 (1e-3), n=1 of 2 seeds |'
    assert lines[-1].startswith('† Not every setting this cell needed ran')
    assert '†' not in grid.table('mqar', ['softmax'], [2, 4], [64], lrs, seeds, str(root))


def test_grid_plot_draws_cut_short_cells_hollow(tmp_path):
    """plot(): a cell the table marks '†' (a seed's ladder cut short) gets a hollow marker over its point, in its
    mixer's colour, and the title says what hollow means; a complete cell gets none."""
    pytest.importorskip('matplotlib')
    root = tmp_path / 'grid'
    d = lambda mixer, n, lr: root / 'mqar' / grid.run_name(mixer, n, 64, lr, 1)
    fake_log(d('kda', 2, 3e-4), 0.995, stopped_at=5)  # complete: reached at the first LR
    fake_log(d('kda', 4, 3e-4), 0.600)
    fake_log(d('kda', 4, 1e-3), 0.700)                # complete: both LRs ran
    fake_log(d('retnet', 2, 3e-4), 0.400)             # cut short: its 1e-3 run has no log
    fake_log(d('retnet', 4, 3e-4), 0.300)
    fake_log(d('retnet', 4, 1e-3), 0.200, max_iters=None)  # cut short: its 1e-3 run did not finish
    cells = grid.collect('mqar', ['kda', 'retnet'], [2, 4], [64], [3e-4, 1e-3], [1], str(root))
    fig = grid.plot([('mqar', ['kda', 'retnet'], [2, 4], [64], cells)], str(tmp_path / 'grid.png'))
    hollow = [line for line in fig.axes[0].lines if line.get_label() == '_short']
    assert len(hollow) == 1 and 'hollow' in fig._suptitle.get_text()
    assert list(hollow[0].get_xdata()) == [2, 4] and list(hollow[0].get_ydata()) == pytest.approx([0.4, 0.3])
    bars = {c.get_label(): c for c in fig.axes[0].containers}
    assert hollow[0].get_markeredgecolor() == bars['retnet'].lines[0].get_color() != bars['kda'].lines[0].get_color()
    complete = grid.collect('mqar', ['kda'], [2, 4], [64], [3e-4, 1e-3], [1], str(root))
    fig = grid.plot([('mqar', ['kda'], [2, 4], [64], complete)], str(tmp_path / 'complete.png'))
    assert not [line for line in fig.axes[0].lines if line.get_label() == '_short']
    assert 'hollow' not in fig._suptitle.get_text()


def test_grid_end_to_end_skips_the_second_lr_where_the_first_reached(tmp_path):
    """grid.py with 2 seeds, 2 LRs and a stop_at_val_acc that any right answer reaches: each seed's run at the
    first LR (high, no warmup) stops early, so the second LR does not run (no out_dir) wherever the first's log
    has the stopping line; the runs got their seeds; the table is the mean over seeds ± half the range."""
    out_root = tmp_path / 'grid'
    r = run([sys.executable, 'tools/grid.py', '--quick', '--tasks', 'mqar', '--mixers', 'softmax', '--sizes', '2',
             '--learning_rates', '1e-2', '1e-3', '--seeds', '1337', '1338', '--jobs', '2', f'--out_root={out_root}']
            + SHORT + ['--max_iters=12', '--warmup_iters=0', '--stop_at_val_acc=0.0001'])
    best = {}
    for seed in (1337, 1338):
        first = out_root / 'mqar' / f'softmax_n2_w64_lr0.01_s{seed}'
        second = out_root / 'mqar' / f'softmax_n2_w64_lr0.001_s{seed}'
        log = read_log(first)
        assert log['config']['seed'] == seed and log['config']['learning_rate'] == 0.01
        stopped = re.search(r'^stopping at step \d+: val acc', (first / 'log.txt').read_text(), re.M)
        assert second.exists() != bool(stopped)
        accs = [(read_log(d)['evals'][-1]['val_acc'], lr) for d, lr in ((first, '1e-2'), (second, '1e-3'))
                if d.exists()]
        best[seed] = max(accs, key=lambda a: a[0])  # (max keeps the first of a tie, as the grid does)
    assert not (out_root / 'mqar' / 'softmax_n2_w64_lr0.001_s1337').exists(), r.stdout  # 12 steps at 1e-2 reach it
    assert 'not needed: lr 1e-2 reached stop_at_val_acc 0.0001' in r.stdout
    a, b = best[1337][0], best[1338][0]
    lrs = ', '.join(lr for lr in ('1e-2', '1e-3') if lr in (best[1337][1], best[1338][1]))
    results = (out_root / 'results.md').read_text()
    assert f"| `softmax` | {(a + b) / 2:.3f} ±{abs(a - b) / 2:.3f} ({lrs}) |" in results, results
    assert '2 seeds (1337, 1338)' in results


def test_grid_resume_plot_redraws_without_running(tmp_path):
    """grid.py --resume --plot over a grid whose runs all finished starts no run, rewrites the table and draws the
    PNG; plot() draws the table's numbers (per mixer: the means, with half the range as error bars) and chance."""
    pytest.importorskip('matplotlib')
    root = tmp_path / 'grid'
    accs = {('softmax', 2): (0.9, 1.0), ('softmax', 4): (0.7, 0.8), ('kda', 2): (0.5, 0.6), ('kda', 4): (0.3, 0.3)}
    for (mixer, n), per_seed in accs.items():
        for seed, acc in zip((1, 2), per_seed):
            fake_log(root / 'mqar' / grid.run_name(mixer, n, 64, 1e-3, seed), acc)
    png = tmp_path / 'recall.png'
    r = run([sys.executable, 'tools/grid.py', '--resume', '--plot', str(png), '--tasks', 'mqar', '--mixers', 'softmax', 'kda',
             '--sizes', '2', '4', '--widths', '64', '--seeds', '1', '2', f'--out_root={root}', '--device=cpu',
             '--start_within=0'])  # a safety net: a run started by mistake would train for minutes
    assert r.stdout.count('finished earlier, kept') == 8 and not list(root.glob('mqar/*/run.txt'))
    assert '| `softmax` | 0.950 ±0.050 | 0.750 ±0.050 |' in (root / 'results.md').read_text()
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'

    cells = grid.collect('mqar', ['softmax', 'kda'], [4, 2], [64], [1e-3], [1, 2], str(root))
    fig = grid.plot([('mqar', ['softmax', 'kda'], [4, 2], [64], cells)], str(tmp_path / 'direct.png'))
    ax = fig.axes[0]
    drawn = {c.get_label(): c for c in ax.containers}  # one errorbar per mixer
    assert list(drawn) == ['softmax', 'kda']
    assert list(drawn['softmax'].lines[0].get_xdata()) == [2, 4]  # sizes in order
    assert list(drawn['softmax'].lines[0].get_ydata()) == pytest.approx([0.95, 0.75])
    assert list(drawn['kda'].lines[0].get_ydata()) == pytest.approx([0.55, 0.3])
    chance = next(line for line in ax.lines if line.get_label() == 'chance (1/pairs)')
    assert list(chance.get_ydata()) == pytest.approx([0.5, 0.25])


def test_grid_refuses_seed_override_and_plot_without_matplotlib(tmp_path):
    """--seed=... is the grid's to set (use --seeds); --plot without matplotlib stops at once, saying to install it."""
    def fails(cmd, env=None):
        # --start_within=0: should the grid not refuse, it starts no run (the default grid trains for hours)
        p = subprocess.run([sys.executable, 'tools/grid.py', '--tasks', 'mqar', '--start_within=0', f'--out_root={tmp_path}']
                           + cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode != 0 and not (tmp_path / 'mqar').exists()
        return p.stderr.strip().splitlines()[-1]
    assert '--seed=3: the grid sets seed for each run; use --seeds' in fails(['--seed=3'])
    assert 'give each value once' in fails(['--seeds', '1', '1'])
    blocked = tmp_path / 'blocked'  # a matplotlib that fails to import, as if it were not installed
    (blocked / 'matplotlib').mkdir(parents=True)
    (blocked / 'matplotlib' / '__init__.py').write_text("raise ImportError('no matplotlib here')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(blocked), os.environ.get('PYTHONPATH')) if p))
    assert 'pip install matplotlib' in fails(['--plot', str(tmp_path / 'x.png')], env)
