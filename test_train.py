"""
Training-loop tests (CPU, a few minutes): train.py runs, resumes exactly, runs under torchrun DDP,
writes checkpoints atomically, and sample.py decodes from what it wrote.

$ python -m pytest test_train.py -q
"""
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.abspath(__file__))
SHARED_TIKTOKEN = os.path.join(ROOT, '..', 'shared', 'tiktoken')
if os.path.isdir(SHARED_TIKTOKEN) and 'TIKTOKEN_CACHE_DIR' not in os.environ:
    os.environ['TIKTOKEN_CACHE_DIR'] = SHARED_TIKTOKEN  # offline copy of the GPT-2 BPE

# a tiny model on the offline dataset: 2 layers × 32 wide, 4 × 32 tokens per step
TINY = ['--dataset=pystdlib', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
        '--gradient_accumulation_steps=1', '--eval_iters=2', '--log_interval=1', '--learning_rate=3e-3',
        '--warmup_iters=2', '--lr_decay_iters=20', '--min_lr=3e-4', '--device=cpu', '--compile=False']


def run(args, cmd=None, check=True, env_extra=None):
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    env.pop('RANK', None)
    env.update(env_extra or {})
    p = subprocess.run((cmd or [sys.executable, 'train.py']) + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def iter_losses(text):
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r'^iter (\d+): loss ([\d.]+)', text, re.M)}


@pytest.fixture(scope='session')
def pystdlib():
    if not os.path.exists(os.path.join(ROOT, 'data', 'pystdlib', 'pystdlib_val_000000.bin')):
        subprocess.run([sys.executable, 'data/pystdlib/prepare.py'], cwd=ROOT, check=True, timeout=600)


@pytest.fixture(scope='session')
def trained(pystdlib, tmp_path_factory):
    """One short run shared by the tests that need a checkpoint."""
    out = str(tmp_path_factory.mktemp('out'))
    p = run(TINY + [f'--out_dir={out}', '--max_iters=20', '--eval_interval=10'])
    return out, p.stdout


def test_training_lowers_the_loss(trained):
    out, stdout = trained
    evals = [float(x) for x in re.findall(r'val loss ([\d.]+)', stdout)]
    assert len(evals) == 3 and evals[-1] < evals[0] - 0.5, stdout[-2000:]
    assert os.path.exists(os.path.join(out, 'ckpt.pt'))
    with open(os.path.join(out, 'log.txt')) as f:
        log = f.read()
    assert 'iter 20: loss' in log and 'config:' in log  # the log holds the config and every iteration line


def test_resume_continues_exactly(pystdlib, tmp_path):
    """Stop after a checkpoint at iter 4, resume, and get the same losses as one uninterrupted run."""
    straight = run(TINY + [f'--out_dir={tmp_path}/a', '--max_iters=8', '--eval_interval=4'])
    run(TINY + [f'--out_dir={tmp_path}/b', '--max_iters=5', '--eval_interval=4'])  # last checkpoint: iter 4
    resumed = run(TINY + [f'--out_dir={tmp_path}/b', '--max_iters=8', '--eval_interval=4', '--init_from=resume'])
    a, b = iter_losses(straight.stdout), iter_losses(resumed.stdout)
    assert min(b) == 4, resumed.stdout[-2000:]  # iter_num continues from the checkpoint
    for it in range(4, 9):
        assert abs(a[it] - b[it]) < 1e-5, (it, a[it], b[it])


def test_resume_with_dropout_continues_rng(pystdlib, tmp_path):
    """With dropout the RNG state matters too: the resumed run must draw the same masks."""
    common = TINY + ['--dropout=0.2', '--eval_interval=3']
    straight = run(common + [f'--out_dir={tmp_path}/a', '--max_iters=5'])
    run(common + [f'--out_dir={tmp_path}/b', '--max_iters=3'])
    resumed = run(common + [f'--out_dir={tmp_path}/b', '--max_iters=5', '--init_from=resume'])
    a, b = iter_losses(straight.stdout), iter_losses(resumed.stdout)
    for it in range(3, 6):
        assert abs(a[it] - b[it]) < 1e-5, (it, a[it], b[it])


def test_ddp_two_processes_gloo(pystdlib, tmp_path):
    """2 ranks × 1 micro-step read the same tokens as 1 process × 2 micro-steps, so the weights must agree
    (this checks the gradient averaging and the accumulation split), and the ranks must agree with each other."""
    args = TINY + ['--max_iters=3', '--eval_interval=3', '--gradient_accumulation_steps=2']
    p = run(args + [f'--out_dir={tmp_path}/ddp'],
            cmd=[sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py'])
    m = re.search(r'ddp: max weight difference across ranks ([\d.e+-]+)', p.stdout)
    assert m is not None, p.stdout[-2000:] + p.stderr[-2000:]
    assert float(m.group(1)) == 0.0
    assert 'world size 2' in p.stdout
    run(args + [f'--out_dir={tmp_path}/single'])
    from model import load_checkpoint
    ddp, single = load_checkpoint(f'{tmp_path}/ddp/ckpt.pt')['model'], load_checkpoint(f'{tmp_path}/single/ckpt.pt')['model']
    for k in single:
        torch.testing.assert_close(ddp[k], single[k], rtol=1e-4, atol=1e-6)


def test_interrupted_checkpoint_keeps_previous(tmp_path):
    """Kill a process in the middle of save_checkpoint: the old ckpt.pt must survive intact."""
    path = str(tmp_path / 'ckpt.pt')
    from model import save_checkpoint, load_checkpoint
    save_checkpoint({'iter_num': 1, 'w': torch.arange(10)}, path)
    writer = (
        "import sys, time, torch\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "from model import save_checkpoint\n"
        "class Slow:\n"
        "    def __reduce__(self):\n"
        "        print('writing', flush=True); time.sleep(60); return (int, ())\n"
        f"save_checkpoint({{'iter_num': 2, 'big': torch.zeros(1000), 'slow': Slow()}}, {path!r})\n")
    proc = subprocess.Popen([sys.executable, '-c', writer], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == 'writing'  # now inside torch.save, file half written
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpt = load_checkpoint(path)
    assert ckpt['iter_num'] == 1 and torch.equal(ckpt['w'], torch.arange(10))


def test_missing_shards_say_how_to_make_them(tmp_path):
    p = run(TINY + ['--dataset=no_such_dataset', f'--out_dir={tmp_path}'], check=False)
    assert p.returncode != 0 and 'python data/no_such_dataset/prepare.py' in p.stderr


def test_bad_override_is_rejected(tmp_path):
    p = run(['--n_layer=two', f'--out_dir={tmp_path}'], check=False)
    assert p.returncode != 0 and "config key 'n_layer'" in p.stderr
    p = run(['--no_such_key=1'], check=False)
    assert p.returncode != 0 and "unknown config key 'no_such_key'" in p.stderr


def test_resume_without_checkpoint_fails_clearly(pystdlib, tmp_path):
    p = run(TINY + [f'--out_dir={tmp_path}/empty', '--init_from=resume'], check=False)
    assert p.returncode != 0 and 'no checkpoint at' in p.stderr


def test_sample_from_trained_checkpoint(trained):
    out, _ = trained
    p = run([f'--out_dir={out}', '--start=def ', '--num_samples=2', '--max_new_tokens=12', '--device=cpu'],
            cmd=[sys.executable, 'sample.py'])
    assert p.stdout.count('---------------') == 2
    assert re.search(r'decode: [\d.]+ tokens/s', p.stdout)
    m = re.search(r'cache at (\d+) tokens of context: ([\d,]+) bytes', p.stdout)
    assert m and int(m.group(2).replace(',', '')) > 0
    assert p.stdout.count('def ') >= 2  # the prompt is echoed at the start of each sample


@pytest.mark.parametrize('mixer', ['retnet', 'mamba2', 'deltanet', 'gdn', 'kda', 'kda*3,softmax'])
def test_every_mixer_trains(pystdlib, tmp_path, mixer):
    """A few iterations of each linear mixer (and the 3:1 hybrid) on pystdlib lower the loss."""
    p = run(TINY + [f'--out_dir={tmp_path}', f'--mixer={mixer}', '--n_layer=4', '--head_dim=16', '--d_state=16',
                    '--max_iters=16', '--eval_interval=16'])
    evals = [float(x) for x in re.findall(r'val loss ([\d.]+)', p.stdout)]
    # the eval batches are the same at both evals, so any drop is real; 0.3 nats leaves no doubt
    assert len(evals) == 2 and evals[-1] < evals[0] - 0.3, p.stdout[-2000:]


def test_wandb_offline(pystdlib, tmp_path):
    """wandb is optional, imported lazily, and works without a network in offline mode."""
    run(TINY + [f'--out_dir={tmp_path}/out', '--max_iters=2', '--eval_interval=2', '--wandb_log=True', '--wandb_mode=offline'],
        env_extra={'WANDB_DIR': str(tmp_path), 'WANDB_SILENT': 'true'})
    runs = [d for d in os.listdir(tmp_path / 'wandb') if d.startswith('offline-run-')]
    assert len(runs) == 1 and any(f.endswith('.wandb') for f in os.listdir(tmp_path / 'wandb' / runs[0]))


def test_text_config_runs_and_plot_table_reads_its_log(pystdlib, tmp_path):
    """config/text.py (the README's equal-size text comparison) trains with the hybrid pattern at a tiny size, and
    plot.py --table reads the real log back: mixer, parameters, tokens, final/best val loss, tokens/s."""
    from plot import table
    out = str(tmp_path / 'kdax3+softmax')
    p = run(['config/text.py', "--mixer=kda*3,softmax", f'--out_dir={out}', '--n_layer=4', '--n_embd=64', '--n_head=2',
             '--head_dim=32', '--d_state=32', '--block_size=32', '--batch_size=2', '--max_iters=4', '--lr_decay_iters=4',
             '--warmup_iters=1', '--eval_interval=2', '--eval_iters=1', '--log_interval=1', '--device=cpu'])
    val = [float(x) for x in re.findall(r'val loss ([\d.]+)', p.stdout)]
    params = re.search(r'number of parameters: ([\d.]+M)', p.stdout).group(1)
    md = table([out]).splitlines()
    assert len(md) == 3 and md[0].startswith('| run | mixer |')
    cells = [c.strip() for c in md[2].strip('|').split('|')]
    assert cells[:4] == ['kdax3+softmax', '`kda*3,softmax`', params, f"{4 * 2 * 32 / 1e6:.1f}M"]
    assert float(cells[4]) == val[-1] and float(cells[5]) == min(val)
    assert float(cells[6].replace(',', '')) > 0
