"""
The researcher's loop: a run's output at a glance, a short run that ends evaluated and saved, wandb that
follows its environment, plot.py that compares the runs now in their out_dirs. CPU, about a minute.

$ python -m pytest tests/test_loop.py -q
"""
import fcntl
import glob
import math
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
import threading

import pytest
import torch

from plot import default_out, read_log, table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a tiny model on the offline dataset (as test_train.py's): 2 layers × 32 wide, 4 × 32 tokens per step
TINY = ['--dataset=pystdlib', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
        '--gradient_accumulation_steps=1', '--eval_iters=2', '--log_interval=1', '--learning_rate=3e-3',
        '--warmup_iters=2', '--lr_decay_iters=20', '--min_lr=3e-4', '--device=cpu', '--compile=False']


def run(args, check=True, env_extra=None):
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    env.pop('RANK', None)
    env.update(env_extra or {})
    p = subprocess.run([sys.executable, 'train.py'] + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def iter_losses(text):
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r'^iter (\d+)/\d+: loss ([\d.]+)', text, re.M)}


ITER = re.compile(r'^iter (\d+)/(\d+): loss ([\d.]+), smooth ([\d.]+), time ([\d.]+)ms, .*, eta (\w+)$', re.M)
EVAL = re.compile(r'^step (\d+): train loss ([\d.]+), val loss ([\d.]+) \(eval ([\d.]+)s, train clock [\d.]+s\)$', re.M)


def run_on_a_terminal(args):
    """train.py with stderr on a pseudo-terminal (stdout a pipe): (returncode, stdout, what the terminal got)."""
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    env.pop('RANK', None)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 100, 0, 0))  # 24 x 100, as a terminal window has
    p = subprocess.Popen([sys.executable, 'train.py'] + args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=slave, text=True)
    os.close(slave)
    seen = []

    def drain():  # the terminal must be read while the run writes to it, or its writes block
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the run closed its end
                return
            if not data:
                return
            seen.append(data)
    reader = threading.Thread(target=drain)
    reader.start()
    stdout = p.communicate(timeout=600)[0]
    reader.join(timeout=60)
    os.close(master)
    return p.returncode, stdout, b''.join(seen).decode(errors='replace')


def test_output_header_iter_lines_eta_and_eval_time(pystdlib, tmp_path):
    """The terminal gets a short header (no config file echoed, no config dict: those go to log.txt), then
    `iter N/max` lines whose smoothed loss is the debiased EMA (0.9) of the raw ones and whose ETA is the steps left at
    the mean step time plus the evals left at the last eval's time; the step of an iteration that evaluated does not
    include the eval, which its eval line reports. stderr is no terminal here: no progress bar, though evals take
    seconds."""
    out = tmp_path / 'out'
    p = run(['config/pystdlib.py', '--mixer=softmax'] + TINY +
            [f'--out_dir={out}', '--max_iters=6', '--eval_interval=3', '--eval_iters=20'])
    header = p.stdout.split('\nstep 0:')[0].splitlines()
    assert len(header) <= 8, p.stdout[:3000]  # the ===, torch, model, data and out_dir lines, and the notice
    assert 'config:' not in p.stdout and 'Overriding' not in p.stdout and 'dataset = ' not in p.stdout
    from model import GPT, GPTConfig
    params = sum(p.numel() for p in GPT(GPTConfig(**torch.load(out / 'ckpt.pt', weights_only=True)['model_args'])).parameters())
    assert re.search(rf'^model: softmax softmax \(2 layers × 32\), {params / 1e6:.2f}M parameters$', p.stdout, re.M)
    assert re.search(r'^data: pystdlib, 1 grad accum × 1 ranks × 4 batch × 32 context = 128 tokens per step, 6 steps$',
                     p.stdout, re.M)
    assert f'out_dir: {out} ' in p.stdout
    log = (out / 'log.txt').read_text()
    assert "dataset = 'pystdlib'" in log and 'Overriding: max_iters = 6' in log and re.search(r'^config: \{', log, re.M)
    assert p.stderr == '', p.stderr[-2000:]

    seconds = lambda eta: sum(int(v) * {'h': 3600, 'm': 60, 's': 1}[u] for v, u in re.findall(r'(\d+)([hms])', eta))
    iters = [(int(n), int(m), float(loss), float(smooth), float(ms) / 1000, seconds(eta))
             for n, m, loss, smooth, ms, eta in ITER.findall(p.stdout)]
    evals = {int(s): float(t) for s, _, _, t in EVAL.findall(p.stdout)}
    assert [i[0] for i in iters] == list(range(6)) and {i[1] for i in iters} == {6}, p.stdout[-3000:]
    assert sorted(evals) == [0, 3, 6]
    ema = 0.0
    for k, (_, _, loss, smooth, _, _) in enumerate(iters):
        ema = 0.9 * ema + 0.1 * loss
        assert abs(smooth - ema / (1 - 0.9 ** (k + 1))) < 2e-4, (k, smooth, iters)
    times = [i[4] for i in iters]
    assert times[3] < evals[3] / 2, (times, evals)  # iteration 3 evaluated for seconds; its step did not
    # the step before an eval and the last step take as long as the others (each step's time is its own: with the
    # numbers read a step late, the host's clock once gave these two almost nothing on the CPU, 2-4x too little on CUDA)
    assert min(times[1:]) > 0.2 * sorted(times[1:])[2], times
    for k, (*_, eta) in enumerate(iters):
        mean = sum(times[1:k + 1]) / k if k else times[0]
        last_eval = evals[0] if k < 3 else evals[3]
        expected = (5 - k) * mean + sum(1 for e in (3, 6) if e > k) * last_eval
        assert abs(eta - expected) <= 1.0, (k, eta, expected)


def test_short_run_is_evaluated_saved_and_noticed_with_bars_on_a_terminal(pystdlib, tmp_path):
    """max_iters below eval_interval and lr_decay_iters: one notice line each, and the run's last step is evaluated and
    saved (ckpt.pt holds that step's weights and its val loss), so sample.py has a model. On a terminal, the evals and
    the steps between two iter lines get a progress bar (at batch 8 each takes 4-7 s on this CPU: the bar shows
    after 1 s, and at batch 4, ~2 s here, the last eval once took under a second in CI)."""
    out = tmp_path / 'out'
    code, stdout, terminal = run_on_a_terminal(TINY + [f'--out_dir={out}', '--max_iters=24', '--lr_decay_iters=30',
                                                       '--eval_interval=100', '--eval_iters=20', '--log_interval=20',
                                                       '--batch_size=8'])
    assert code == 0, stdout[-2000:] + terminal[-2000:]
    lr = 3e-4 + 0.5 * (1 + math.cos(math.pi * (23 - 2) / (30 - 2))) * (3e-3 - 3e-4)  # TINY's cosine at the last step
    assert (f"notice: max_iters=24 < lr_decay_iters=30: the run ends at lr {lr:.2e}, not min_lr 3.00e-04 "
            f"(--lr_decay_iters=24 decays it fully)\n") in stdout, stdout[:3000]
    assert "notice: max_iters=24 < eval_interval=100: evaluated only at step 0 and the end, step 24\n" in stdout
    evals = {int(s): float(v) for s, _, v, _ in EVAL.findall(stdout)}
    assert sorted(evals) == [0, 24] and sorted(iter_losses(stdout)) == [0, 20, 23], stdout[-3000:]
    ckpt = torch.load(out / 'ckpt.pt', weights_only=True)
    assert ckpt['iter_num'] == 24 and abs(ckpt['val_loss'] - evals[24]) < 1e-4
    assert 'eval at step 0' in terminal and 'eval at step 24' in terminal and 'steps to iter 20' in terminal, terminal
    # a run as long as both has neither notice
    p = run(TINY + [f'--out_dir={tmp_path}/long', '--max_iters=1', '--eval_interval=1', '--lr_decay_iters=1',
                    '--warmup_iters=0', '--eval_iters=1'])
    assert 'notice:' not in p.stdout, p.stdout


def test_wandb_follows_its_environment_unless_the_config_says(pystdlib, tmp_path):
    """WANDB_MODE=offline used to be overridden by the config's wandb_mode='online' (a raw UsageError without an API
    key): now WANDB_MODE, WANDB_PROJECT and WANDB_NAME apply unless the config sets the setting (here the project), and
    no metric is logged as -100 (mfu, unmeasured on CPU, is not logged). Online without an API key is one line."""
    env = {'WANDB_DIR': str(tmp_path), 'WANDB_SILENT': 'true', 'WANDB_MODE': 'offline', 'WANDB_PROJECT': 'envproject',
           'WANDB_NAME': 'envname'}
    run(TINY + [f'--out_dir={tmp_path}/out', '--max_iters=2', '--eval_interval=2', '--wandb_log=True',
                '--wandb_project=configproject'], env_extra=env)
    runs = glob.glob(str(tmp_path / 'wandb' / 'offline-run-*' / 'run-*.wandb'))
    assert len(runs) == 1
    with open(runs[0], 'rb') as f:
        records = f.read()  # protobuf records: the strings are there as they are
    assert b'val/loss' in records and b'train/loss' in records  # (so a key's absence below means something)
    assert b'configproject' in records and b'envproject' not in records and b'envname' in records
    assert b'mfu' not in records
    home = tmp_path / 'home'
    home.mkdir()
    p = run(TINY + [f'--out_dir={tmp_path}/online', '--max_iters=2', '--wandb_log=True'], check=False,
            env_extra={'HOME': str(home), 'WANDB_DIR': str(tmp_path), 'WANDB_API_KEY': '', 'WANDB_MODE': ''})
    assert p.returncode == 1 and p.stderr.count('\n') == 1 and 'wandb.init failed: ' in p.stderr, p.stderr[-2000:]
    assert 'WANDB_MODE=offline' in p.stderr


def test_plot_table_and_picture_use_the_current_run_of_a_reused_out_dir(pystdlib, tmp_path):
    """A reused out_dir (a run, its checkpoints deleted by hand, then another run) holds both runs in log.txt:
    --table reports the second only, and again after a resume of it (which continues it). A picture without --out
    goes to the out_dir, not the current folder."""
    out = tmp_path / 'reused'
    first = run(TINY + [f'--out_dir={out}', '--max_iters=4', '--eval_interval=2', '--eval_iters=1', '--learning_rate=1e-2'])
    for name in ('ckpt.pt', 'best.pt'):
        (out / name).unlink()
    second = run(TINY + [f'--out_dir={out}', '--max_iters=2', '--eval_interval=1', '--eval_iters=1', '--batch_size=2'])
    val = lambda p: [float(v) for _, _, v, _ in EVAL.findall(p.stdout)]
    assert len(val(first)) == 3 and len(val(second)) == 3
    cells = [c.strip() for c in table([str(out)]).splitlines()[2].strip('|').split('|')]
    assert cells[3:6] == [f"{2 * 2 * 32 / 1e6:.1f}M", f"{val(second)[-1]:.3f}", f"{min(val(second)):.3f}"], cells
    log = read_log(str(out))
    assert [e['step'] for e in log['evals']] == [0, 1, 2] and log['tokens_per_iter'] == 64
    assert len(log['tok_s']) == 2  # the second run's two iter lines
    resumed = run(TINY + [f'--out_dir={out}', '--max_iters=4', '--eval_interval=1', '--eval_iters=1', '--batch_size=2',
                          '--init_from=resume'])
    both = val(second) + val(resumed)
    cells = [c.strip() for c in table([str(out)]).splitlines()[2].strip('|').split('|')]
    assert cells[3:6] == [f"{4 * 2 * 32 / 1e6:.1f}M", f"{both[-1]:.3f}", f"{min(both):.3f}"], cells
    assert [e['step'] for e in read_log(str(out))['evals']] == [0, 1, 2, 3, 4]

    pytest.importorskip('matplotlib', reason='in requirements.txt: pip install -r requirements.txt')
    before = set(os.listdir(ROOT))
    other = tmp_path / 'other'
    shutil.copytree(out, other)
    for runs, where in (([out], out / 'val_loss.png'), ([out, other], tmp_path / 'val_loss.png')):
        p = subprocess.run([sys.executable, 'tools/plot.py'] + [str(r) for r in runs], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        with open(where, 'rb') as f:
            assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    assert set(os.listdir(ROOT)) == before  # nothing written into the repository
    # the per-step training loss: every iter line of the current run (after its resume), the same numbers
    losses = iter_losses(second.stdout) | iter_losses(resumed.stdout)
    assert read_log(str(out))['steps'] == sorted(losses.items())
    p = subprocess.run([sys.executable, 'tools/plot.py', str(out), '--metric=step_loss'], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and (out / 'step_loss.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n', p.stderr[-2000:]


def test_read_log_keeps_one_run(tmp_path):
    """read_log's rules on a written log: a start from scratch that logged nothing (it failed at once) does not hide
    the run before it; a resume at iter N drops that run's evals after step N (a timeline it abandoned); a log with
    no init_from in its configs (older) is one run; default_out puts a picture beside the runs."""
    (tmp_path / 'log.txt').write_text(
        "config: {'init_from': 'scratch', 'mixer': 'softmax'}\n"
        "step 0: train loss 9.0000, val loss 9.0000\n"
        "config: {'init_from': 'scratch', 'mixer': 'kda'}\n"
        "tokens per iteration: 1 grad accum × 1 ranks × 4 batch × 8 context = 32\n"
        "step 0: train loss 8.0000, val loss 8.0000 (eval 0.10s)\n"
        "iter 0/4: loss 8.0000, smooth 8.0000, time 1.00ms, tok/s 5, lr 1.00e-03, eta 0s\n"
        "step 2: train loss 7.0000, val loss 7.0000 (eval 0.10s)\n"
        "step 4: train loss 6.0000, val loss 6.0000 (eval 0.10s)\n"
        "config: {'init_from': 'resume', 'mixer': 'kda'}\n"
        "Resuming training from out/ckpt.pt (iter 2)\n"
        "iter 2/4: loss 7.5000, smooth 7.5000, time 1.00ms, tok/s 7, lr 1.00e-03, eta 0s\n"
        "step 4: train loss 6.5000, val loss 6.5000 (eval 0.10s)\n"
        "config: {'init_from': 'scratch', 'mixer': 'gdn'}\n")  # a start that failed before its first step
    log = read_log(str(tmp_path))
    assert log['config'] == {'init_from': 'scratch', 'mixer': 'gdn'} and log['tokens_per_iter'] == 32
    assert [(e['step'], e['val_loss']) for e in log['evals']] == [(0, 8.0), (2, 7.0), (4, 6.5)]
    assert log['tok_s'] == [5.0, 7.0]
    (tmp_path / 'log.txt').write_text("config: {'mixer': 'kda'}\nstep 0: train loss 2.0000, val loss 2.0000\n"
                                      "config: {'mixer': 'kda'}\nstep 1: train loss 1.0000, val loss 1.0000\n")
    assert [e['step'] for e in read_log(str(tmp_path))['evals']] == [0, 1]
    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        for d in ('a', 'b', 'runs/c', 'runs/d'):
            os.makedirs(d)
        open('runs/c/log.txt', 'w').close()
        assert default_out(['a', 'b']) == os.path.join('a', 'val_loss.png')  # not the current folder
        assert default_out(['runs/c', 'runs/d'], 'val_acc') == os.path.join('runs', 'val_acc.png')
        assert default_out(['runs/c/log.txt']) == os.path.join('runs', 'c', 'val_loss.png')
    finally:
        os.chdir(here)


def test_requirements_install_what_plot_py_needs():
    """plot.py's matplotlib was missing from requirements.txt, so CI skipped the plot tests."""
    with open(os.path.join(ROOT, 'requirements.txt')) as f:
        names = [re.split(r'[<>=;\s]', line.strip())[0] for line in f if line.strip() and not line.startswith('#')]
    assert 'matplotlib' in names


def test_plot_py_refuses_a_run_without_a_train_log_in_one_line(tmp_path):
    """A folder whose log.txt is not train.py's (no config line, no evals) gave a ValueError traceback."""
    (tmp_path / 'run').mkdir()
    (tmp_path / 'run' / 'log.txt').write_text('iter 10/20: loss 3.0\n')
    for extra in ([], ['--table']):
        p = subprocess.run([sys.executable, 'tools/plot.py', str(tmp_path / 'run')] + extra, cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 1 and p.stderr.count('\n') == 1 and 'Traceback' not in p.stderr, p.stderr
        assert p.stderr.startswith(f"plot.py: error: {tmp_path / 'run'}"), p.stderr


def test_plot_py_skips_its_own_picture_reads_eval_only_as_the_run_and_names_a_bad_config_line(tmp_path):
    """`plot.py out-cmp/*` run a second time read its own val_loss.png as a run ('utf-8' codec can't decode); a
    malformed config line was a SyntaxError traceback; an --eval_only=True run in an out_dir became the run's whole
    history in the picture."""
    log = tmp_path / 'a' / 'log.txt'
    log.parent.mkdir()
    log.write_text("config: {'init_from': 'scratch', 'mixer': 'gdn'}\ntokens per iteration: 1 x 1 = 32\n"
                   "step 0: train loss 9.0000, val loss 9.0000 (eval 0.1s)\nstep 2: train loss 7.0000, val loss 7.5000 (eval 0.1s)\n"
                   "config: {'init_from': 'scratch', 'mixer': 'gdn', 'eval_only': True}\nEvaluating a/ckpt.pt (iter 2)\n"
                   "step 2: train loss 7.0000, val loss 7.5000 (eval 0.1s)\n")
    assert [e['step'] for e in read_log(str(tmp_path / 'a'))['evals']] == [0, 2]
    (tmp_path / 'val_loss.png').write_bytes(b'\x89PNG\r\n')
    p = subprocess.run([sys.executable, 'tools/plot.py', str(tmp_path / 'a'), str(tmp_path / 'val_loss.png'), '--table'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == f"plot.py: skipping {tmp_path / 'val_loss.png'}: not an out_dir or a log.txt\n"
    (tmp_path / 'b').mkdir()
    (tmp_path / 'b' / 'log.txt').write_text("config: {'init_from': scratch}\nstep 0: train loss 9.0, val loss 9.0 (eval 0.1s)\n")
    p = subprocess.run([sys.executable, 'tools/plot.py', str(tmp_path / 'b'), '--table'], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1 and "a malformed 'config:' line" in p.stderr and p.stderr.count('\n') == 1, p.stderr


def test_lagged_step_time_is_read_off_the_gpu_timeline():
    """train.py's StepClock (CUDA only, so run here with stand-in events): a step's time runs from the end event of the
    step before it, or from its own start event after an eval or at the start, to its end event; the host's clock
    gave the last step of a run too little. Lagged, each step is read when the next one has been queued."""
    import ast
    src = open(os.path.join(ROOT, 'train.py')).read()
    clock_src = next(ast.get_source_segment(src, n) for n in ast.parse(src).body
                     if isinstance(n, ast.ClassDef) and n.name == 'StepClock')

    class Event:  # a recorded CUDA event at time t (s); elapsed_time in ms, as torch.cuda.Event's
        now = 0.0

        def __init__(self, enable_timing=True):
            self.t = None

        def record(self):
            self.t = Event.now

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.t - self.t) * 1000

    class Host(list):
        def tolist(self):
            return list(self)

    class FakeTorch:  # what StepClock uses of torch on CUDA
        cuda = type('cuda', (), {'Event': Event})

    class Numbers(Host):  # a step's numbers on the device
        def to(self, device, non_blocking=False):
            return Host(self)
    g = {'torch': FakeTorch, 'time': __import__('time')}
    exec(clock_src, g)
    clock = g['StepClock'](lagged=True, cuda=True)
    read = []
    # step 0 starts on an idle GPU at 0 and ends at 5 (it compiled); steps 1 and 2 were queued while the one before ran
    for n, (start, end) in enumerate([(0.0, 5.0), (4.0, 6.0), (5.5, 7.0)]):
        Event.now = start
        clock.start()
        Event.now = end
        read += [(m, dt) for m, _, dt in clock.end(n, Numbers([0.0] * 5))]
    read += [(m, dt) for m, _, dt in clock.settle()]
    clock.last_end = None  # an eval ran (train.py's loop resets it)
    Event.now = 18.5
    clock.start()
    Event.now = 20.0
    read += [(m, dt) for m, _, dt in clock.end(3, Numbers([0.0] * 5)) + clock.settle()]
    assert read == [(0, 5.0), (1, 1.0), (2, 1.0), (3, 1.5)]
