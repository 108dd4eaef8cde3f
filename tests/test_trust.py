"""
Trust tests (CPU, about three minutes): a checkpoint is data and never runs code; no run destroys another run's work
(checkpoints, out_dir, grid.py's runs); SIGTERM / Ctrl-C and the end of a run are saved and resume exactly; a
failed save or a bad file is one line, not a traceback.

$ python -m pytest tests/test_trust.py -q
"""
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import grid
from checkpoint import CheckpointUnusable, load_checkpoint, lock_out_dir, rng_state, set_rng_state
from test_train import train_settings_error  # train.py in this process, up to where a bad input stops it

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a checkpoint written by train.py on 2026-11-25, before checkpoints were plain data (its numpy RNG state is a pickled
# numpy array): `train.py --dataset=mqar --task_vocab_size=16 --block_size=16 --mqar_num_pairs=2 --n_layer=2
# --n_head=1 --n_embd=16 --head_dim=16 --d_state=16 --mixer=gdn,softmax --batch_size=4 --gradient_accumulation_steps=1
# --eval_iters=1 --max_iters=4 --eval_interval=4 --warmup_iters=1 --lr_decay_iters=8 --dropout=0.1 --seed=7`
OLD_CKPT = os.path.join(ROOT, 'tests', 'fixtures', 'ckpt-2026-11-25.pt')

# a tiny model on the offline dataset (as test_train.py's): 2 layers × 32 wide, 4 × 32 tokens per step
TINY = ['--dataset=pystdlib', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
        '--gradient_accumulation_steps=1', '--eval_iters=2', '--log_interval=1', '--learning_rate=3e-3',
        '--warmup_iters=2', '--lr_decay_iters=20', '--min_lr=3e-4', '--device=cpu', '--compile=False']


def env():
    e = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    e.pop('RANK', None)
    return e


def run(args, script='train.py', check=True, **kw):
    p = subprocess.run([sys.executable, script] + args, cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=600, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{script} {args} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def one_line(p, code=1):
    """The process failed with exactly one line on stderr (no traceback): return it."""
    assert p.returncode == code and p.stderr.count('\n') == 1 and 'Traceback' not in p.stderr, \
        (p.returncode, p.stderr[-3000:], p.stdout[-1000:])
    return p.stderr


def iter_losses(text):
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r'^iter (\d+)/\d+: loss ([\d.]+)', text, re.M)}


def start(args, **kw):
    return subprocess.Popen([sys.executable, 'train.py'] + args, cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def wait_for(proc, pattern):
    """Read proc's stdout until a line matches pattern; return what was read."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if re.search(pattern, line):
            return ''.join(seen)
    raise AssertionError(f"never printed {pattern!r}:\n{''.join(seen)[-3000:]}\n{proc.stderr.read()[-3000:]}")


@pytest.fixture(scope='module')
def finished(pystdlib, tmp_path_factory):
    """A finished 20-iteration run (evals at 10 and 20), copied by the tests that need one."""
    out = str(tmp_path_factory.mktemp('finished') / 'out')
    p = run(TINY + [f'--out_dir={out}', '--max_iters=20', '--eval_interval=10'])
    return out, p.stdout


class RunsCode:
    """A pickle that calls os.mkdir(marker) when unpickled: the smallest stand-in for os.system(...)."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


# -----------------------------------------------------------------------------
# 1. a checkpoint is data


def test_checkpoint_that_runs_code_is_refused_and_nothing_runs(finished, tmp_path):
    """A ckpt.pt whose pickle calls a function ran it, silently, under sample.py and train.py --init_from=resume
    (torch.load(weights_only=False)). Now: one line naming the file, exit 1, and the function never ran."""
    out, marker = tmp_path / 'out', tmp_path / 'code-ran'
    shutil.copytree(finished[0], out)
    ckpt = torch.load(out / 'ckpt.pt', weights_only=True)
    ckpt['config']['note'] = RunsCode(str(marker))
    torch.save(ckpt, out / 'ckpt.pt')
    with pytest.raises(CheckpointUnusable, match=r'refusing to load .*ckpt\.pt: .*asks to run (posix|os)\.mkdir'):
        load_checkpoint(str(out / 'ckpt.pt'))
    for p in (run([f'--out_dir={out}', '--device=cpu', '--max_new_tokens=2'], 'sample.py', check=False),
              run(TINY + [f'--out_dir={out}', '--init_from=resume', '--max_iters=30'], check=False)):
        assert f'refusing to load {out}/ckpt.pt' in one_line(p)
        assert not marker.exists()


def test_a_checkpoint_sets_only_the_models_shape_on_resume(finished, tmp_path):
    """A ckpt.pt whose model_args held out_dir='/tmp/victim' made a resume save into another run's folder, and
    eval_interval=0 or learning_rate='abc' crashed it raw. A checkpoint sets only GPTConfig's fields, type-checked;
    anything else refuses the file in one line, and nothing is written into the folder it named."""
    victim = tmp_path / 'victim'
    for extra, message in [({'out_dir': str(victim)}, "model_args has keys this model.py does not know (out_dir)"),
                           ({'eval_interval': 0}, "model_args has keys this model.py does not know (eval_interval)"),
                           ({'n_layer': 'abc'}, "config key 'n_layer' from"),
                           ({'mixer': 3}, "config key 'mixer' from")]:
        out = tmp_path / f'out-{next(iter(extra))}'
        shutil.copytree(finished[0], out)
        ckpt = torch.load(out / 'ckpt.pt', weights_only=True)
        ckpt['model_args'].update(extra)
        torch.save(ckpt, out / 'ckpt.pt')
        p = run(TINY + [f'--out_dir={out}', '--init_from=resume', '--max_iters=30'], check=False)
        assert message in one_line(p), p.stderr
    assert not victim.exists()


def test_new_checkpoints_are_plain_data_and_rng_round_trips(finished):
    """What train.py writes loads with torch.load(weights_only=True) as it is, and rng_state() / set_rng_state()
    bring back every generator (numpy's included: its state was a numpy array, which weights_only refuses)."""
    ckpt = torch.load(os.path.join(finished[0], 'ckpt.pt'), weights_only=True)
    assert ckpt['iter_num'] == 20 and isinstance(ckpt['rng'][0]['numpy']['keys'], torch.Tensor)
    np.random.seed(5)
    random_state = rng_state('cpu', 'cpu')
    expected = (np.random.rand(3), torch.rand(3), __import__('random').random())
    np.random.seed(6), torch.manual_seed(6), __import__('random').seed(6)
    set_rng_state(random_state, 'cpu')
    again = (np.random.rand(3), torch.rand(3), __import__('random').random())
    assert np.array_equal(expected[0], again[0]) and torch.equal(expected[1], again[1]) and expected[2] == again[2]


def test_old_checkpoint_still_loads_resumes_and_samples(tmp_path):
    """A checkpoint written by yesterday's code (numpy RNG state as a numpy array) loads, its numpy state converted
    to the same generator state, and train.py resumes it and sample.py samples from it."""
    old = torch.load(OLD_CKPT, weights_only=False)  # our own file: the reference, read the old way
    new = load_checkpoint(OLD_CKPT)
    name, keys, pos, has_gauss, cached = old['rng'][0]['numpy']
    n = new['rng'][0]['numpy']
    assert (n['bit_generator'], n['pos'], n['has_gauss'], n['cached_gaussian']) == (name, pos, has_gauss, cached)
    assert np.array_equal(n['keys'].numpy().astype(np.uint32), keys)
    set_rng_state(new['rng'][0], 'cpu')
    converted = np.random.rand(4)
    np.random.set_state(old['rng'][0]['numpy'])
    assert np.array_equal(converted, np.random.rand(4))

    out = tmp_path / 'old'
    out.mkdir()
    shutil.copy(OLD_CKPT, out / 'ckpt.pt')
    args = ['--dataset=mqar', '--task_vocab_size=16', '--block_size=16', '--mqar_num_pairs=2', '--batch_size=4',
            '--gradient_accumulation_steps=1', '--eval_iters=1', '--eval_interval=4', '--warmup_iters=1',
            '--lr_decay_iters=8', '--dropout=0.1', '--seed=7', '--device=cpu', '--compile=False']
    p = run(args + [f'--out_dir={out}', '--init_from=resume', '--max_iters=6'])
    assert min(iter_losses(p.stdout)) == 4 and 'resume: mixer = ' in p.stdout  # the architecture from the checkpoint
    s = run([f'--out_dir={out}', '--start=3 4 5 6 0 3', '--num_samples=1', '--max_new_tokens=2', '--temperature=0',
             '--device=cpu'], 'sample.py')
    assert re.search(r'^3 4 5 6 0 3 \d+ \d+$', s.stdout, re.M), s.stdout[-1000:]


def test_foreign_checkpoints_are_one_line(tmp_path):
    """A dict without model_args (KeyError) or a bare tensor (IndexError) was a traceback; a model without its
    training state cannot be resumed."""
    cases = {'dict': {'model': {'w': torch.ones(2)}}, 'tensor': torch.ones(3), 'noresume': None}
    for name, content in cases.items():
        out = tmp_path / name
        out.mkdir()
        if name == 'noresume':  # a model without a training state: sample.py reads it, a resume needs more
            full = load_checkpoint(OLD_CKPT)
            torch.save({'model': full['model'], 'model_args': full['model_args']}, out / 'ckpt.pt')
            p = run(TINY + [f'--out_dir={out}', '--init_from=resume'], check=False)
            assert 'is not a checkpoint of this trainer that can be resumed' in one_line(p)
            assert 'optimizer' in p.stderr
            continue
        torch.save(content, out / 'ckpt.pt')
        line = one_line(run([f'--out_dir={out}', '--device=cpu'], 'sample.py', check=False))
        assert f'{out}/ckpt.pt is not a checkpoint of this trainer' in line


def test_damaged_training_state_and_random_bytes_are_one_line(finished, tmp_path):
    """A checkpoint whose training state had the wrong types (best_val_loss, iter_num, train_loader, optimizer, rng as
    strings or None; config=None) crashed a resume raw or later; NaN in its optimizer state trained on and blamed the
    learning rate; a file of random bytes was said to ask to run code. The first and the last through train.py, the
    rest through load_checkpoint, the one place a resume reads a checkpoint."""
    good = torch.load(os.path.join(finished[0], 'ckpt.pt'), weights_only=True)
    nan_state = {i: {k: (v * float('nan') if torch.is_tensor(v) and v.dim() else v) for k, v in st.items()}
                 for i, st in good['optimizer']['state'].items()}
    for i, (key, value, message) in enumerate([
            ('best_val_loss', 'low', "its best_val_loss is str 'low', not a number"),
            ('iter_num', -3, "its iter_num is int '-3', not an iteration >= 0"),
            ('train_loader', None, "its train_loader is NoneType"),
            ('rng', 'x', "its rng is str"),
            ('optimizer', {'state': {}}, "its optimizer is dict"),
            ('config', None, "its config is NoneType"),
            ('optimizer', dict(good['optimizer'], state=nan_state), "its optimizer state holds non-finite values")]):
        out = tmp_path / f'out-{key}-{len(message)}'
        out.mkdir()
        torch.save(dict(good, **{key: value}), out / 'ckpt.pt')
        if i == 0:
            p = run(TINY + [f'--out_dir={out}', '--init_from=resume', '--max_iters=30'], check=False)
            assert message in one_line(p), (key, p.stderr)
        else:
            with pytest.raises(CheckpointUnusable, match=re.escape(message)):
                load_checkpoint(str(out / 'ckpt.pt'), need='resume')
    # random bytes parse as a few pickle opcodes before failing, each way its own: a GLOBAL ('c'), a pop on an empty
    # stack ('0', the IndexError CI once met), a mark ('('), and seeded noise
    rng = random.Random(0)
    blobs = [b'cos\nsystem\n', b'0', b'(', b'}'] + [bytes(rng.randrange(256) for _ in range(64)) for _ in range(40)]
    for i, blob in enumerate(blobs):
        path = tmp_path / f'random-{i}.pt'
        path.write_bytes(blob + bytes(rng.randrange(256) for _ in range(5000)))
        with pytest.raises(CheckpointUnusable, match=re.escape(f"cannot read checkpoint {path}: it holds no pickle of "
                                                               f"tensors (a truncated or foreign file?")):
            load_checkpoint(str(path), need='resume')
    out = tmp_path / 'random'
    out.mkdir()
    (out / 'ckpt.pt').write_bytes(b'0' + os.urandom(5000))
    line = one_line(run(TINY + [f'--out_dir={out}', '--init_from=resume'], check=False))
    assert line.endswith(f"cannot read checkpoint {out}/ckpt.pt: it holds no pickle of tensors (a truncated or foreign "
                         f"file? train again or pick another out_dir)\n"), line


# -----------------------------------------------------------------------------
# 2, 3. no run destroys another's work


def test_run_from_scratch_never_replaces_an_earlier_runs_checkpoints(finished, tmp_path):
    """The same command again without --init_from=resume replaced ckpt.pt and best.pt of a finished run, exit 0. Now
    it stops at once, saying how to continue or start over; --overwrite=True starts over."""
    out = tmp_path / 'out'
    shutil.copytree(finished[0], out)
    before = {f: (out / f).read_bytes() for f in ('ckpt.pt', 'best.pt')}
    p = run(TINY + [f'--out_dir={out}', '--max_iters=10'], check=False)
    line = one_line(p)
    assert "holds an earlier run's ckpt.pt and best.pt" in line and '--init_from=resume' in line
    assert '--overwrite=True' in line
    assert {f: (out / f).read_bytes() for f in before} == before
    assert (out / 'log.txt').read_text().count('=== ') == 1  # the refused run wrote nothing
    (out / 'ckpt.pt').unlink()  # best.pt alone is a finished run's too
    one_line(run(TINY + [f'--out_dir={out}', '--max_iters=10'], check=False))
    p = run(TINY + [f'--out_dir={out}', '--max_iters=3', '--overwrite=True'])
    assert "overwrite=True: deleted the earlier run's best.pt, log.txt" in p.stdout
    assert (out / 'log.txt').read_text().count('=== ') == 1
    assert torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == 3


def test_lock_holds_when_out_dir_is_deleted_and_recreated(pystdlib, tmp_path):
    """The lock was a file inside out_dir: deleting and recreating the folder let a second run in beside a live one."""
    out = tmp_path / 'out'
    # no log line after iter 0: a live run whose out_dir vanished stops at its next log line (it cannot write it),
    # which would free the lock for a reason other than the one tested here
    first = start(TINY + [f'--out_dir={out}', '--max_iters=100000', '--eval_interval=100000', '--log_interval=100000'])
    try:
        wait_for(first, r'^iter 0/')
        # train.py prints a line, then appends it to log.txt: wait for the append too. An rmtree between the two
        # stopped the first run (cannot write log.txt), which freed the lock: under -n 2, where this process and
        # the run share one core, the print woke this process and its rmtree came first every time (taskset -c 0)
        log, t0 = out / 'log.txt', time.time()
        while not re.search(r'^iter 0/', log.read_text(), re.M):
            assert time.time() - t0 < 60 and first.poll() is None, first.stderr.read() if first.poll() else ''
            time.sleep(0.05)
        shutil.rmtree(out)
        out.mkdir()
        second = run(TINY + [f'--out_dir={out}', '--max_iters=2'], check=False)
        alive = first.poll()
        assert second.returncode == 1, (alive, first.stderr.read() if alive is not None else '', second.stdout[-600:])
        assert f"out_dir '{out}' is in use by another run (pid {first.pid} on" in one_line(second)
    finally:
        first.kill()
        first.wait()


def test_a_run_refused_at_start_leaves_no_trace(pystdlib, tmp_path):
    """A run refused for its data, its checkpoint or its seed still made out_dir, its log.txt and the lock beside it;
    a mistyped out_dir with --init_from=resume made an empty folder; --seed=-1 was a raw numpy error."""
    for extra, message in [(['--dataset=nosuch'], "dataset='nosuch': no train shards"),
                           (['--init_from=resume'], 'no checkpoint at'),
                           (['--vocab_size=64'], 'holds token id'),
                           (['--seed=-1'], 'seed=-1 must be in [0, 2**32 - 65536)')]:
        out = tmp_path / 'typo'
        if extra == ['--seed=-1']:  # one through the command line
            assert message in one_line(run(TINY + [f'--out_dir={out}'] + extra, check=False))
        else:  # the rest: train.py in this process, up to where it stops
            assert message in train_settings_error(tmp_path, *TINY, f'--out_dir={out}', *extra), extra
        assert sorted(os.listdir(tmp_path)) == [], (extra, os.listdir(tmp_path))


def test_settings_typed_wrong_are_one_line(pystdlib, tmp_path):
    """Each was a raw traceback or a misleading message: a huge repeat count in the mixer pattern (MemoryError after
    gigabytes), 1e999 for a float setting (inf, then a loss blamed on the learning rate), kernels='triton' on a CPU
    without the interpreter (53 lines), a mistyped key (every one of the 60 keys in one line, no suggestion)."""
    for extra, message in [(["--mixer=kda*99999999999999"], "repeat count must be in [1, n_layer=2]"),
                           (['--learning_rate=1e999'], "'learning_rate' from --learning_rate=1e999: inf is not a finite"),
                           (['--weight_decay=1e999'], "'weight_decay' from --weight_decay=1e999: inf is not a finite"),
                           (['--lerning_rate=1e-3'], "unknown config key 'lerning_rate' in --lerning_rate=1e-3; did you "
                                                     "mean learning_rate? (--help lists every setting)")]:
        assert message in train_settings_error(tmp_path, *TINY, f'--out_dir={tmp_path}/out', *extra), extra
    e = dict(env())  # the command line, without the interpreter that lets Triton's kernels run on a CPU
    e.pop('TRITON_INTERPRET', None)
    p = subprocess.run([sys.executable, 'train.py'] + TINY + [f'--out_dir={tmp_path}/out', '--kernels=triton',
                        '--mixer=gdn', '--head_dim=16', '--max_iters=1'], cwd=ROOT, env=e, capture_output=True,
                       text=True, timeout=300)
    assert "kernels='triton' runs on a CUDA GPU" in one_line(p), p.stderr[-2000:]


def test_overwrite_deletes_what_the_tools_wrote_too(finished, tmp_path):
    """--overwrite=True left the old run's longctx-text.json and plots, which longctx.py --table_only then reported as
    the new run's."""
    out = tmp_path / 'out'
    shutil.copytree(finished[0], out)
    for name in ('longctx-text.json', 'val_loss.png', 'notes.txt'):
        (out / name).write_text('old')
    p = run(TINY + [f'--out_dir={out}', '--max_iters=2', '--overwrite=True'])
    assert "deleted the earlier run's ckpt.pt, best.pt, log.txt, longctx-text.json, val_loss.png" in p.stdout
    assert sorted(os.listdir(out)) == ['best.pt', 'ckpt.pt', 'log.txt', 'notes.txt']  # a file of the user's stays


def test_lock_holds_however_out_dir_is_spelled(pystdlib, tmp_path):
    """The lock was keyed on the path as given: a second run through a symlink to a live run's out_dir, with
    --overwrite=True, deleted the first run's files and trained beside it."""
    real, link = tmp_path / 'real', tmp_path / 'link'
    first = start(TINY + [f'--out_dir={real}', '--max_iters=100000', '--eval_interval=100000', '--log_interval=100000'])
    try:
        wait_for(first, r'^iter 0/')
        link.symlink_to(real)
        for spelled in (link, f'{tmp_path}/./real'):
            second = run(TINY + [f'--out_dir={spelled}', '--max_iters=2', '--overwrite=True'], check=False)
            assert second.returncode == 1 and f"is in use by another run (pid {first.pid} on" in one_line(second)
        assert (real / 'log.txt').read_text().count('=== ') == 1  # the first run's files untouched
    finally:
        first.kill()
        first.wait()


def test_grid_never_clears_an_out_dir_whose_run_is_alive(tmp_path, capsys):
    """Two grid.py runs into the same out_root: the second rmtree'd the first's running out_dirs and trained in
    them. A live run's lock (here held by this test, as a train.py would) now keeps the grid out: the out_dir and
    its files stay, the run counts as failed, nothing is launched there."""
    out_dir = tmp_path / 'mqar' / grid.run_name('softmax', 2, 64, 1e-3, 1)
    out_dir.mkdir(parents=True)
    (out_dir / 'log.txt').write_text('a live run writes here\n')
    free = tmp_path / 'mqar' / grid.run_name('gdn', 2, 64, 1e-3, 1)
    runs = [grid.Run('mqar', m, 2, 64, 1, 1e-3, str(d), []) for m, d in (('softmax', out_dir), ('gdn', free))]
    launched = []

    def launch(r):
        launched.append(r.mixer)
        return subprocess.Popen([sys.executable, '-c', 'pass'])
    held = lock_out_dir(str(out_dir))
    try:
        failures, _, _ = grid.run_all(runs, launch)
        assert str(out_dir) in failures and launched == ['gdn']  # (the stand-in for gdn's run writes no log)
        assert (out_dir / 'log.txt').read_text() == 'a live run writes here\n'
        assert f'{out_dir}: left alone: out_dir' in capsys.readouterr().out
        # not needed / not started: its older log would be removed, but not while the run lives
        assert grid.run_all(runs[:1], launch, start_within=0) == ([], 1, 0) and out_dir.exists()
    finally:
        held.close()
    grid.run_all(runs[:1], launch, start_within=0)
    assert not out_dir.exists()  # free now: cleared as before


def test_grid_passes_sigterm_to_its_runs_and_waits(tmp_path):
    """kill -TERM on grid.py left its train.py runs going as orphans. Now each run saves and stops, grid.py waits for
    them and exits 143, and --resume continues the run from its checkpoint."""
    out_root = tmp_path / 'grid'
    cmd = [sys.executable, 'tools/grid.py', '--quick', '--tasks', 'mqar', '--mixers', 'softmax', '--sizes', '2',
           f'--out_root={out_root}', '--max_iters=100000', '--lr_decay_iters=100000', '--eval_interval=100000',
           '--log_interval=1', '--device=cpu']
    g = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = out_root / 'mqar' / grid.run_name('softmax', 2, 64, 1e-3, grid.SEED) / 'log.txt'
    t0 = time.time()
    while not (log.exists() and re.search(r'^iter 3/', log.read_text(), re.M)):
        assert time.time() - t0 < 120 and g.poll() is None, g.stdout.read()
        time.sleep(0.2)
    g.send_signal(signal.SIGTERM)
    out = g.communicate(timeout=120)[0]
    assert g.returncode == 143 and 'grid: stopped by SIGTERM' in out, out
    m = re.search(r'^stopped by SIGTERM at iter (\d+); resume with --init_from=resume$', log.read_text(), re.M)
    assert m, log.read_text()[-2000:]
    assert subprocess.run(['pgrep', '-f', str(out_root)], capture_output=True).stdout == b''  # no orphans
    assert torch.load(log.parent / 'ckpt.pt', weights_only=True)['iter_num'] == int(m.group(1))


# -----------------------------------------------------------------------------
# 4, 5. stopping and ending save, and resume exactly


def test_sigterm_and_end_of_run_are_saved_and_resume_exactly(pystdlib, tmp_path):
    """SIGTERM exited 143 with no save and no word; the last steps after the last eval were never saved. Now SIGTERM
    finishes the step, saves, says so and exits 143, and the resumed run continues exactly like one uninterrupted
    run; a run's end is saved (iter max_iters, evaluated), and resuming a finished run trains nothing. (test_train.py's
    resume tests continue from a run's saved end.)"""
    p = start(TINY + [f'--out_dir={tmp_path}/stopped', '--max_iters=100000', '--eval_interval=100000',
                      '--lr_decay_iters=100000'])
    wait_for(p, r'^iter 4/')
    p.send_signal(signal.SIGTERM)
    assert p.stderr.readline() == 'train.py: SIGTERM: finishing this step, then saving\n'
    p.send_signal(signal.SIGTERM)  # a repeat (a scheduler signals every rank, torchrun forwards its own): still saved
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 143 and stderr == '', stderr
    m = re.search(r'^stopped by SIGTERM at iter (\d+); resume with --init_from=resume$', stdout, re.M)
    n = int(m.group(1))
    assert torch.load(f'{tmp_path}/stopped/ckpt.pt', weights_only=True)['iter_num'] == n
    common = TINY + ['--eval_interval=100000', '--lr_decay_iters=100000']
    resumed = run(common + [f'--out_dir={tmp_path}/stopped', '--init_from=resume', f'--max_iters={n + 2}'])
    assert torch.load(f'{tmp_path}/stopped/ckpt.pt', weights_only=True)['iter_num'] == n + 2  # the run's end
    straight = iter_losses(run(common + [f'--out_dir={tmp_path}/straight', f'--max_iters={n + 2}']).stdout)
    losses = iter_losses(resumed.stdout)
    assert sorted(losses) == [n, n + 1]
    for it in losses:
        assert abs(losses[it] - straight[it]) < 1e-5, (it, losses[it], straight[it])
    again = run(common + [f'--out_dir={tmp_path}/stopped', '--init_from=resume', f'--max_iters={n + 2}'])
    assert 'nothing to train' in again.stdout and not iter_losses(again.stdout)  # a finished run stays finished


def test_a_stop_on_an_eval_step_is_evaluated_on_resume(pystdlib, tmp_path):
    """Stopped at iter 38 with eval_interval 2, the log read 34, 36, 40 after resume: the stop saved before the eval of
    its iteration, and a resume skipped the eval of the iteration it starts at. Now the checkpoint says whether its
    iteration was evaluated, and a resume evaluates it when it was not (every iteration an eval step here)."""
    args = TINY + [f'--out_dir={tmp_path}/out', '--eval_interval=1', '--lr_decay_iters=100000']
    p = start(args + ['--max_iters=100000'])
    seen = wait_for(p, r'^iter 3/')
    p.send_signal(signal.SIGTERM)
    stdout = seen + p.communicate(timeout=120)[0]
    n = int(re.search(r'^stopped by SIGTERM at iter (\d+)', stdout, re.M).group(1))
    evals = lambda text: [int(i) for i in re.findall(r'^step (\d+):', text, re.M)]
    assert evals(stdout) == list(range(n)), stdout[-2000:]
    resumed = run(args + ['--init_from=resume', f'--max_iters={n + 2}'])
    assert evals(resumed.stdout) == [n, n + 1, n + 2], resumed.stdout[-2000:]


def test_eval_only_evaluates_the_runs_checkpoint(finished, tmp_path):
    """--eval_only=True in a finished out_dir evaluated fresh random weights (init_from defaults to scratch) and logged
    that as the run's result. Now it evaluates out_dir's ckpt.pt, and writes no checkpoint."""
    out = tmp_path / 'out'
    shutil.copytree(finished[0], out)
    final = re.findall(r'^step 20: .*val loss ([\d.]+)', finished[1], re.M)
    before = (out / 'ckpt.pt').stat().st_mtime_ns
    p = run(TINY + [f'--out_dir={out}', '--eval_only=True'])
    assert re.findall(r'^step 20: .*val loss ([\d.]+)', p.stdout, re.M) == final, p.stdout[-2000:]
    assert (out / 'ckpt.pt').stat().st_mtime_ns == before and 'saving' not in p.stdout


def test_out_dir_deleted_under_a_live_run_is_named(pystdlib, tmp_path):
    """out_dir deleted under a live run: the message said "free space" and "the checkpoints there are as they were"."""
    out = tmp_path / 'out'
    p = start(TINY + [f'--out_dir={out}', '--max_iters=100000', '--eval_interval=100000'])
    wait_for(p, r'^iter 1/')
    shutil.rmtree(out)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 1 and stderr.count('\n') == 1, stderr[-2000:]
    assert f"out_dir '{out}' was deleted while this run wrote to it" in stderr


def test_ctrl_c_saves_and_a_second_exits_at_once(pystdlib, tmp_path):
    """Ctrl-C printed a 41-line KeyboardInterrupt traceback and saved nothing. Now one Ctrl-C saves and exits 130; a
    second one exits at once, leaving no temp file."""
    p = start(TINY + [f'--out_dir={tmp_path}/one', '--max_iters=100000', '--eval_interval=100000'])
    wait_for(p, r'^iter 2/')
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130 and 'Traceback' not in stderr and 'stopped by SIGINT at iter' in stdout, stderr
    assert os.path.exists(f'{tmp_path}/one/ckpt.pt')
    p = start(TINY + [f'--out_dir={tmp_path}/two', '--max_iters=100000', '--eval_interval=100000'])
    wait_for(p, r'^iter 2/')
    p.send_signal(signal.SIGINT)
    assert p.stderr.readline() == 'train.py: SIGINT: finishing this step, then saving (again: exit at once)\n'
    p.send_signal(signal.SIGINT)  # within the step and the save (two at once would arrive as one)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130 and stderr == 'train.py: SIGINT again: exiting now without saving\n', stderr
    # log.txt said "saving checkpoint" and nothing more when the second Ctrl-C aborted that save
    assert (tmp_path / 'two' / 'log.txt').read_text().endswith('SIGINT again: exited without saving\n')
    assert not [f for f in os.listdir(f'{tmp_path}/two') if f.endswith('.tmp')]


def test_sigterm_under_torchrun_stops_every_rank_at_one_step(pystdlib, tmp_path, torchrun_train):
    """torchrun passes SIGTERM to each rank, at slightly different moments: the ranks agree on the step to stop at
    (or the collectives of the save would hang), rank 0 saves every rank's data position, and the run resumes."""
    args = TINY + ['--gradient_accumulation_steps=2', '--eval_interval=100000', '--lr_decay_iters=100000']
    p = subprocess.Popen(torchrun_train + args + [f'--out_dir={tmp_path}', '--max_iters=100000'], cwd=ROOT, env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(p, r'^iter 3/')
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode != 0
    m = re.search(r'^stopped by SIGTERM at iter (\d+); resume with --init_from=resume$', stdout, re.M)
    assert m, stdout[-2000:] + stderr[-2000:]
    ckpt = torch.load(f'{tmp_path}/ckpt.pt', weights_only=True)
    assert ckpt['iter_num'] == int(m.group(1)) and len(ckpt['train_loader']) == 2
    resumed = run(args + [f'--out_dir={tmp_path}', '--init_from=resume', f'--max_iters={int(m.group(1)) + 1}'])
    assert min(iter_losses(resumed.stdout)) == int(m.group(1))


# -----------------------------------------------------------------------------
# 5. a failed save


def test_failed_save_is_one_line_keeps_the_previous_and_leaves_no_temp(finished, tmp_path):
    """A full disk gave two chained tracebacks ('basic_ios::clear: iostream error') and left a ckpt.pt.tmp that made
    the next save fail too. Here the files may grow to 1 MB only (RLIMIT_FSIZE, as a quota does): the save fails
    with one line naming the file and the cause, the previous ckpt.pt is intact, and no .tmp is left."""
    out = tmp_path / 'out'
    shutil.copytree(finished[0], out)
    before = (out / 'ckpt.pt').read_bytes()

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    p = run(TINY + [f'--out_dir={out}', '--init_from=resume', '--max_iters=25', '--eval_interval=10'], check=False,
            preexec_fn=small_files)
    line = one_line(p)
    assert f'could not save {out}/ckpt.pt: file too large; the previous ckpt.pt there is intact' in line
    assert (out / 'ckpt.pt').read_bytes() == before and not [f for f in os.listdir(out) if f.endswith('.tmp')]
    p = run(TINY + [f'--out_dir={out}', '--init_from=resume', '--max_iters=25', '--eval_interval=10'])
    assert torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == 25  # the end of a run to max_iters 25


# -----------------------------------------------------------------------------
# 7. one line, not a traceback


def test_bad_files_and_places_are_one_line(finished, tmp_path):
    """Each of these was a traceback: a config file with a syntax error or one that raises (one of them through
    train.py), a non-UTF-8 prompt file (after the checkpoint had loaded), an out_dir that is a file or that cannot be
    written."""
    from configurator import UserError, configure
    (tmp_path / 'syntax.py').write_text('batch_size = 8\nlearning_rate = = 1\n')
    (tmp_path / 'raises.py').write_text('batch_size = 8\nx = 1 / 0\n')
    with pytest.raises(UserError, match=r'syntax\.py, line 2: invalid syntax'):
        configure({'batch_size': 1, 'learning_rate': 1.0}, [str(tmp_path / 'syntax.py')])
    with pytest.raises(UserError, match=r'raises\.py, line 2 raised ZeroDivisionError: division by zero'):
        configure({'batch_size': 1, 'x': 0}, [str(tmp_path / 'raises.py')])
    assert 'syntax.py, line 2: invalid syntax' in one_line(run([str(tmp_path / 'syntax.py')], check=False))
    (tmp_path / 'prompt.txt').write_bytes(b'caf\xe9\n')
    line = one_line(run([f'--out_dir={finished[0]}', f'--start=FILE:{tmp_path}/prompt.txt', '--device=cpu'],
                        'sample.py', check=False))
    assert 'prompt.txt is not UTF-8 text (byte 0xe9 at offset 3)' in line
    (tmp_path / 'afile').write_text('x')
    assert 'is a file, not a folder' in train_settings_error(tmp_path, *TINY, f'--out_dir={tmp_path}/afile')
    # sysfs refuses new files even to root: what a read-only file system or missing permissions look like
    assert 'cannot create out_dir' in train_settings_error(tmp_path, *TINY, '--out_dir=/sys/kernel/linear-gpt-test')
    assert 'cannot create the lock' in train_settings_error(tmp_path, *TINY, '--out_dir=/sys/kernel')


def test_divergence_advice_matches_grad_clip(finished, tmp_path):
    """The divergence line advised 'set grad_clip > 0 (now 1)' when it already was 1."""
    shutil.copytree(finished[0], tmp_path / 'out')
    p = run(TINY + [f'--out_dir={tmp_path}/out', '--init_from=resume', '--learning_rate=1e6', '--decay_lr=False',
                    '--max_iters=60', '--eval_interval=1000'], check=False)
    line = one_line(p)
    assert 'training diverged' in line and 'lower grad_clip (now 1)' in line and 'set grad_clip' not in line


def test_resume_uses_the_checkpoints_block_size_everywhere(finished, tmp_path):
    """On resume with --block_size=64 over a 32-token checkpoint the notice said the checkpoint's value was used,
    but the loader cut 64-token rows and the log's config line recorded 64."""
    shutil.copytree(finished[0], tmp_path / 'out')
    p = run(TINY + [f'--out_dir={tmp_path}/out', '--init_from=resume', '--block_size=64', '--max_iters=22',
                    '--eval_interval=1000'])
    assert 'resume: block_size = 32 from the checkpoint (the config asked for 64)' in p.stdout
    assert '4 batch × 32 context = 128' in p.stdout
    config = [line for line in (tmp_path / 'out' / 'log.txt').read_text().splitlines() if line.startswith('config:')][-1]
    assert "'block_size': 32" in config


def test_readme_says_what_is_trusted():
    with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
        readme = f.read()
    assert 'weights_only=True' in readme and '--overwrite=True' in readme and 'SIGTERM' in readme


def _torch_loading(pid):
    try:
        with open(f'/proc/{pid}/maps') as f:
            return 'libtorch' in f.read()
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.exists('/proc/self/maps'), reason="needs Linux's /proc to see torch loading")
@pytest.mark.parametrize('script', ['train.py', 'sample.py', 'tools/longctx.py'])
def test_ctrl_c_while_torch_loads_is_one_line(script):
    """A Ctrl-C while a script still imported torch printed a 19-line KeyboardInterrupt traceback."""
    p = subprocess.Popen([sys.executable, script], cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not _torch_loading(p.pid) and time.time() < deadline:
        time.sleep(0.005)
    p.send_signal(signal.SIGINT)  # libtorch is mapped; importing torch's Python side takes a second more
    stdout, stderr = p.communicate(timeout=120)
    assert not stdout and p.returncode == 130, (p.returncode, stdout[-2000:], stderr[-2000:])
    assert stderr == f'{os.path.basename(script)}: interrupted (Ctrl-C); nothing was saved\n', stderr


def test_every_script_installs_its_excepthook_before_torch():
    """The rule behind the test above, for every script: main_script(__name__) comes before `import torch`."""
    scripts = ['train.py', 'sample.py'] + [f'tools/{f}' for f in sorted(os.listdir(os.path.join(ROOT, 'tools')))
                                           if f.endswith('.py')]
    for script in scripts:
        text = open(os.path.join(ROOT, script)).read()
        if "if __name__ == '__main__'" not in text and 'if __name__ == "__main__"' not in text and \
                script not in ('train.py', 'sample.py'):
            continue  # a library module (benchlib.py), never run as a program
        first = text.find('configurator.main_script(__name__)')
        assert first != -1, f"{script} never calls configurator.main_script(__name__)"
        torch_at = re.search(r'^import torch', text, re.M)
        assert torch_at is None or first < torch_at.start(), f"{script} imports torch before main_script"


def test_sample_that_cannot_fit_in_memory_is_one_line(finished):
    """sample.py --num_samples=100000000 was killed by the kernel for memory, with no message."""
    line = one_line(run([f'--out_dir={finished[0]}', '--num_samples=100000000', '--max_new_tokens=5', '--device=cpu'],
                        script='sample.py', check=False))
    assert 'num_samples=100000000' in line and 'at most' in line and 'samples fit' in line, line
    n = int(re.search(r'at most ([\d,]+) samples fit', line).group(1).replace(',', ''))
    assert 1 <= n < 100000000


def test_longctx_keeps_its_table_when_a_result_cannot_be_written(finished, tmp_path):
    """A result file that could not be written (here: a folder in its place, which even root cannot write) was a
    traceback after all the scoring, and the table was lost."""
    out = tmp_path / 'run'
    shutil.copytree(finished[0], out)
    (out / 'longctx-text.json').mkdir()
    p = run(['text', str(out), '--scales', '1', '2', '--windows', '2', '--device=cpu'], script='tools/longctx.py')
    assert 'Traceback' not in p.stderr and 'not saved' in p.stderr, p.stderr
    assert 'Val loss by position bucket' in p.stdout, p.stdout
    (out / 'pic.png').mkdir()
    p = run(['text', str(out), '--scales', '1', '2', '--windows', '2', '--device=cpu', '--plot', str(out / 'pic.png')],
            script='tools/longctx.py', check=False)
    assert p.returncode == 1 and 'Traceback' not in p.stderr and 'Val loss by position bucket' in p.stdout, p.stderr
    assert 'the table above stands' in p.stderr.splitlines()[-1], p.stderr
    line = one_line(run(['text', str(out), '--table_only', '--plot', str(out / 'pic.json')], script='tools/longctx.py',
                        check=False))
    assert 'ending .png' in line, line


def test_out_of_memory_while_loading_a_checkpoint_says_so(tmp_path, monkeypatch):
    """Not 'a truncated or foreign file?': the file is fine, the device is full."""
    import torch
    from checkpoint import load_checkpoint
    from configurator import UserError
    path = tmp_path / 'ckpt.pt'
    torch.save({'model': {}}, path)
    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(torch, 'load', full)
    with pytest.raises(UserError, match='out of memory loading checkpoint') as e:
        load_checkpoint(str(path), map_location='cpu', need='model')
    assert 'truncated' not in str(e.value)
