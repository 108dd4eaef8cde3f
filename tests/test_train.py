"""
Training-loop tests (CPU, a few minutes): train.py runs, resumes exactly, runs under torchrun DDP,
writes checkpoints atomically, and sample.py decodes from what it wrote.

$ python -m pytest tests/test_train.py -q
"""
import os
import math
import re
import signal
import subprocess
import sys

import pytest
import torch

from model import MIXERS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r'^iter (\d+)/\d+: loss ([\d.]+)', text, re.M)}


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
    assert 'iter 19/20: loss' in log and 'config:' in log  # the log holds the config and every iteration line
    assert 'config:' not in stdout  # the terminal gets a short header instead


@pytest.mark.parametrize('optimizer', ['adamw', 'muon'])
def test_resume_continues_exactly(pystdlib, tmp_path, optimizer):
    """Stop after iter 4 (checkpoints at the eval of step 4 and at the end, step 5), resume, and get the same losses
    as one uninterrupted run (Muon: its momentum buffers and its AdamW part's moments are in the checkpoint)."""
    args = TINY + [f'--optimizer={optimizer}', '--eval_interval=4']
    straight = run(args + [f'--out_dir={tmp_path}/a', '--max_iters=8'])
    run(args + [f'--out_dir={tmp_path}/b', '--max_iters=5'])  # last checkpoint: its end, step 5
    resumed = run(args + [f'--out_dir={tmp_path}/b', '--max_iters=8', '--init_from=resume'])
    a, b = iter_losses(straight.stdout), iter_losses(resumed.stdout)
    assert min(b) == 5, resumed.stdout[-2000:]  # iter_num continues from the checkpoint
    for it in range(5, 8):
        assert abs(a[it] - b[it]) < 1e-5, (it, a[it], b[it])


def test_save_interval_saves_at_its_evals_and_the_last(pystdlib, tmp_path):
    """--save_interval=4 with evals every 2 of 6 steps: checkpoints at steps 4 and 6 (the last), not at 2."""
    p = run(TINY + ['--eval_interval=2', '--max_iters=6', '--save_interval=4', f'--out_dir={tmp_path}/a'])
    saved = re.findall(r'^step (\d+):.*\n(saving checkpoint)?', p.stdout, re.M)
    assert [(int(n), bool(s)) for n, s in saved] == [(0, False), (2, False), (4, True), (6, True)], p.stdout
    from checkpoint import load_checkpoint
    assert load_checkpoint(f'{tmp_path}/a/ckpt.pt')['iter_num'] == 6
    # best_val_loss (and best.pt) is the best of the evals that may save (steps 0, 4, 6 here): this run at lr 0.1 has its
    # lowest val loss at step 2, which does not save; counted, it would name a loss no checkpoint holds
    p = run(TINY + ['--eval_interval=2', '--max_iters=6', '--save_interval=4', '--always_save_checkpoint=False',
                    '--learning_rate=1e-1', f'--out_dir={tmp_path}/b'])
    val = {int(n): float(v) for n, v in re.findall(r'^step (\d+):.*val loss ([\d.]+)', p.stdout, re.M)}
    assert val[2] < min(val[0], val[4], val[6]), val  # (the case this checks)
    best_val = load_checkpoint(f'{tmp_path}/b/ckpt.pt')['best_val_loss']
    assert abs(best_val - min(val[0], val[4], val[6])) < 1e-4, (best_val, val)
    if os.path.exists(f'{tmp_path}/b/best.pt'):
        assert load_checkpoint(f'{tmp_path}/b/best.pt')['val_loss'] == best_val


def test_resume_with_dropout_continues_rng(pystdlib, tmp_path):
    """With dropout the RNG state matters too: the resumed run must draw the same masks."""
    common = TINY + ['--dropout=0.2', '--eval_interval=3']
    straight = run(common + [f'--out_dir={tmp_path}/a', '--max_iters=5'])
    run(common + [f'--out_dir={tmp_path}/b', '--max_iters=3'])
    resumed = run(common + [f'--out_dir={tmp_path}/b', '--max_iters=5', '--init_from=resume'])
    a, b = iter_losses(straight.stdout), iter_losses(resumed.stdout)
    assert sorted(b) == [3, 4]  # from the end of the first run (iters 0-2), saved at 3
    for it in b:
        assert abs(a[it] - b[it]) < 1e-5, (it, a[it], b[it])


@pytest.mark.parametrize('optimizer', ['adamw', 'muon'])
def test_ddp_two_processes_gloo(pystdlib, tmp_path, torchrun_train, optimizer):
    """2 ranks × 1 micro-step read the same tokens as 1 process × 2 micro-steps, so the weights must agree
    (this checks the gradient averaging and the accumulation split), and the ranks must agree with each other."""
    from checkpoint import load_checkpoint
    args = TINY + ['--max_iters=3', '--eval_interval=3', '--gradient_accumulation_steps=2', f'--optimizer={optimizer}']
    p = run(args + [f'--out_dir={tmp_path}/ddp'], cmd=torchrun_train)
    assert 'world size 2' in p.stdout
    rank0, rank1 = (torch.load(f'{tmp_path}/ddp/rank{r}.pt', weights_only=True) for r in (0, 1))  # each rank's weights at the end
    assert max((rank0[k].float() - rank1[k].float()).abs().max().item() for k in rank0) == 0.0
    run(args + [f'--out_dir={tmp_path}/single'])
    ddp, single = load_checkpoint(f'{tmp_path}/ddp/ckpt.pt')['model'], load_checkpoint(f'{tmp_path}/single/ckpt.pt')['model']
    for k in single:
        torch.testing.assert_close(ddp[k], single[k], rtol=1e-4, atol=1e-6)


def test_activation_checkpointing_trains_as_without(pystdlib, tmp_path):
    """--activation_checkpointing=True (recomputed blocks; the loss in pieces when a micro-step holds more than
    GPT.LOSS_CHUNK tokens), here with --kernel_states=False (the kernels' backward recomputes its chunk states): the
    header says both, and the losses of 3 steps and the final weights are those of the run without them."""
    from checkpoint import load_checkpoint
    args = TINY + ['--mixer=kda,softmax', '--head_dim=16', '--max_iters=3', '--eval_interval=3']
    a = run(args + ['--activation_checkpointing=True', '--kernel_states=False', f'--out_dir={tmp_path}/ac'])
    b = run(args + [f'--out_dir={tmp_path}/plain'])
    assert 'activations recomputed' in a.stdout and 'activations recomputed' not in b.stdout
    assert 'kernel states recomputed' in a.stdout and 'kernel states recomputed' not in b.stdout
    la, lb = iter_losses(a.stdout), iter_losses(b.stdout)
    assert sorted(la) == [0, 1, 2] and all(abs(la[i] - lb[i]) < 1e-5 for i in la), (la, lb)
    wa, wb = (load_checkpoint(f'{tmp_path}/{d}/ckpt.pt')['model'] for d in ('ac', 'plain'))
    for k in wb:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-7)


def test_fsdp_two_processes_gloo_matches_one_and_resumes_across_rank_counts(pystdlib, tmp_path, torchrun_train):
    """--fsdp=True shards the model over 2 ranks (as one unit, and with --fsdp_per_block=True per block). 2 ranks × 2
    micro-steps with clipped gradients must give the weights and the optimizer state of 1 process × 4 micro-steps (the
    checkpoint is the full state, gathered on save; every rank starts from rank 0's init); that checkpoint resumes in
    1 process, a 1-process checkpoint resumes under FSDP, and both land where one uninterrupted run does."""
    import shutil
    from checkpoint import load_checkpoint
    args = TINY + ['--eval_interval=3', '--gradient_accumulation_steps=4', '--grad_clip=0.5']  # 2 micro-steps a rank; clipped
    p = run(args + ['--max_iters=3', '--fsdp=True', f'--out_dir={tmp_path}/fsdp'], cmd=torchrun_train)
    assert 'world size 2' in p.stdout
    run(args + ['--max_iters=3', '--fsdp=True', '--fsdp_per_block=True', f'--out_dir={tmp_path}/fsdp_blocks'],
        cmd=torchrun_train)
    run(args + ['--max_iters=3', f'--out_dir={tmp_path}/single'])
    single = load_checkpoint(f'{tmp_path}/single/ckpt.pt')
    for layout in ('fsdp', 'fsdp_blocks'):
        fsdp = load_checkpoint(f'{tmp_path}/{layout}/ckpt.pt')
        assert fsdp['model'].keys() == single['model'].keys()
        for k in single['model']:
            torch.testing.assert_close(fsdp['model'][k], single['model'][k], rtol=1e-4, atol=1e-6, msg=lambda m: f"{layout} {k}: {m}")
        assert [g['params'] for g in fsdp['optimizer']['param_groups']] == [g['params'] for g in single['optimizer']['param_groups']]
        for i, state in single['optimizer']['state'].items():
            for name in ('exp_avg', 'exp_avg_sq'):
                torch.testing.assert_close(fsdp['optimizer']['state'][i][name], state[name], rtol=1e-4, atol=1e-7)
    run(args + ['--max_iters=6', f'--out_dir={tmp_path}/straight'])
    shutil.copytree(f'{tmp_path}/fsdp', f'{tmp_path}/fsdp_then_one')
    run(args + ['--max_iters=6', '--init_from=resume', f'--out_dir={tmp_path}/fsdp_then_one'])
    shutil.copytree(f'{tmp_path}/single', f'{tmp_path}/one_then_fsdp')
    run(args + ['--max_iters=6', '--init_from=resume', '--fsdp=True', f'--out_dir={tmp_path}/one_then_fsdp'], cmd=torchrun_train)
    straight = load_checkpoint(f'{tmp_path}/straight/ckpt.pt')['model']
    for name in ('fsdp_then_one', 'one_then_fsdp'):
        resumed = load_checkpoint(f'{tmp_path}/{name}/ckpt.pt')
        assert resumed['iter_num'] == 6, name  # the end of a run to max_iters 6 (iters 0-5)
        for k in straight:
            torch.testing.assert_close(resumed['model'][k], straight[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} {k}: {m}")


def test_muon_under_fsdp_gathers_whole_matrices_matches_one_process_and_resumes(pystdlib, tmp_path, torchrun_train):
    """--optimizer=muon under FSDP over 2 gloo ranks: each rank holds half the rows of every matrix, so Muon gathers
    each whole to orthogonalise it; weights, momentum buffers and AdamW moments must equal one process's, and the
    FSDP checkpoint resumes in one process as one straight run ends. gdn,kda: conv kernels (marked for AdamW, on
    parameters fully_shard replaces) and matrices of different shapes whose shards have one shape ([1, 64], [2, 64]
    on rank 1: batched by the whole shape)."""
    import shutil
    from checkpoint import load_checkpoint
    # Newton–Schulz in fp32 here: in bf16 a last-bit difference in a gradient (the ranks sum in another order) can
    # round an update's element the other way, ~1e-4 after 3 steps, too close to the ~1e-3 that orthogonalising each
    # rank's half of the rows instead of the whole matrix gives
    patch = "import os, sys\nsys.path.insert(0, os.getcwd())\nimport torch, optim\noptim.NS_DTYPE = torch.float32\n"
    driver = tmp_path / 'fp32_ns_train.py'
    driver.write_text(patch + "import runpy\nsys.argv[0] = 'train.py'\nrunpy.run_path('train.py', run_name='__main__')\n")
    ddp_driver = open(torchrun_train[-1]).read()
    open(torchrun_train[-1], 'w').write(patch + ddp_driver)
    one = [sys.executable, str(driver)]
    args = TINY + ['--eval_interval=3', '--gradient_accumulation_steps=4', '--grad_clip=0.5', '--optimizer=muon',
                   '--mixer=gdn,kda', '--n_embd=64', '--head_dim=32']
    run(args + ['--max_iters=3', '--fsdp=True', f'--out_dir={tmp_path}/fsdp'], cmd=torchrun_train)
    run(args + ['--max_iters=3', f'--out_dir={tmp_path}/single'], cmd=one)
    single, fsdp = load_checkpoint(f'{tmp_path}/single/ckpt.pt'), load_checkpoint(f'{tmp_path}/fsdp/ckpt.pt')
    assert [g['muon'] for g in fsdp['optimizer']['param_groups']] == [True, False, False]
    for k in single['model']:
        torch.testing.assert_close(fsdp['model'][k], single['model'][k], rtol=1e-4, atol=1e-6, msg=lambda m: f"{k}: {m}")
    for i, state in single['optimizer']['state'].items():
        for name, value in state.items():
            torch.testing.assert_close(fsdp['optimizer']['state'][i][name], value, rtol=1e-4, atol=1e-6)
    run(args + ['--max_iters=6', f'--out_dir={tmp_path}/straight'], cmd=one)
    shutil.copytree(f'{tmp_path}/fsdp', f'{tmp_path}/fsdp_then_one')
    run(args + ['--max_iters=6', '--init_from=resume', f'--out_dir={tmp_path}/fsdp_then_one'], cmd=one)
    straight, resumed = (load_checkpoint(f'{tmp_path}/{n}/ckpt.pt') for n in ('straight', 'fsdp_then_one'))
    for k in straight['model']:
        torch.testing.assert_close(resumed['model'][k], straight['model'][k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")


# a model whose configure_optimizers returns another optimizer: SGD with momentum over three param groups of their own
# rates and weight decays (what a researcher changes in model.py); train.py and parallel.py must not replace it
SGD_PATCH = """\
import os, sys
sys.path.insert(0, os.getcwd())  # the repository (the runs start there)
import torch
import model


def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, optimizer='adamw'):
    named = dict(self.named_parameters())
    groups = [dict(params=[p for n, p in named.items() if p.dim() >= 2 and 'wte' not in n], weight_decay=weight_decay),
              dict(params=[named['transformer.wte.weight']], lr=learning_rate / 2, weight_decay=0.0),
              dict(params=[p for p in named.values() if p.dim() < 2], lr=learning_rate * 2, weight_decay=0.0)]
    return torch.optim.SGD(groups, lr=learning_rate, momentum=0.9)


model.GPT.configure_optimizers = configure_optimizers
"""


def test_any_optimizer_the_model_returns_trains_under_fsdp_as_in_one_process_and_resumes(pystdlib, tmp_path,
                                                                                     torchrun_train):
    """SGD with momentum in three param groups (model.configure_optimizers changed in one place): under FSDP over 2
    gloo ranks it stays SGD (its param groups, rates and momentum buffers sharded and gathered whole on save) and gives
    the weights and momentum of one process; its checkpoint resumes in one process as one straight run ends."""
    import shutil
    from checkpoint import load_checkpoint
    driver = tmp_path / 'sgd_train.py'
    driver.write_text(SGD_PATCH + "import runpy, sys\nsys.argv[0] = 'train.py'\nrunpy.run_path('train.py', run_name='__main__')\n")
    ddp_driver = open(torchrun_train[-1]).read()
    open(torchrun_train[-1], 'w').write(SGD_PATCH + ddp_driver)
    args = TINY + ['--eval_interval=3', '--gradient_accumulation_steps=4', '--grad_clip=0.5', '--learning_rate=0.05',
                   '--decay_lr=False']
    run(args + ['--max_iters=3', '--fsdp=True', f'--out_dir={tmp_path}/fsdp'], cmd=torchrun_train)
    run(args + ['--max_iters=3', f'--out_dir={tmp_path}/single'], cmd=[sys.executable, str(driver)])
    single, fsdp = load_checkpoint(f'{tmp_path}/single/ckpt.pt'), load_checkpoint(f'{tmp_path}/fsdp/ckpt.pt')
    groups = fsdp['optimizer']['param_groups']
    assert [(g['initial_lr'], g['momentum'], g['weight_decay']) for g in groups] == [
        (0.05, 0.9, 0.1), (0.025, 0.9, 0.0), (0.1, 0.9, 0.0)], groups  # the model's groups, each at its own rate
    assert [g['lr'] for g in groups] == pytest.approx([0.05, 0.025, 0.1])
    assert 'exp_avg' not in str(fsdp['optimizer']['state'])  # SGD's state, not AdamW's
    for k in single['model']:
        torch.testing.assert_close(fsdp['model'][k], single['model'][k], rtol=1e-4, atol=1e-6, msg=lambda m: f"{k}: {m}")
    for i, state in single['optimizer']['state'].items():
        torch.testing.assert_close(fsdp['optimizer']['state'][i]['momentum_buffer'], state['momentum_buffer'],
                                   rtol=1e-4, atol=1e-6)
    run(args + ['--max_iters=6', f'--out_dir={tmp_path}/straight'], cmd=[sys.executable, str(driver)])
    shutil.copytree(f'{tmp_path}/fsdp', f'{tmp_path}/fsdp_then_one')
    run(args + ['--max_iters=6', '--init_from=resume', f'--out_dir={tmp_path}/fsdp_then_one'],
        cmd=[sys.executable, str(driver)])
    straight, resumed = (load_checkpoint(f'{tmp_path}/{n}/ckpt.pt') for n in ('straight', 'fsdp_then_one'))
    for k in straight['model']:
        torch.testing.assert_close(resumed['model'][k], straight['model'][k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")


def test_interrupted_checkpoint_keeps_previous(tmp_path):
    """Kill a process in the middle of save_checkpoint: the old ckpt.pt must survive intact."""
    path = str(tmp_path / 'ckpt.pt')
    from checkpoint import save_checkpoint, load_checkpoint
    save_checkpoint({'iter_num': 1, 'w': torch.arange(10)}, path)
    writer = (
        "import sys, time, torch\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "from checkpoint import save_checkpoint\n"
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
    """An unknown dataset ('fineweb') lists what exists instead of naming a script that does not exist
    (a dataset with a prepare.py says to run it: test_data.py::test_loader_errors). One line, no traceback."""
    p = run(TINY + ['--dataset=fineweb', f'--out_dir={tmp_path}'], check=False)
    assert p.returncode == 1 and p.stderr.count('\n') == 1, p.stderr
    assert 'prepare.py' in p.stderr and 'data/fineweb/prepare.py' not in p.stderr and 'pystdlib' in p.stderr, p.stderr


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
    p = run([f'--out_dir={out}', '--start=def ', '--num_samples=2', '--max_new_tokens=40', '--device=cpu'],
            cmd=[sys.executable, 'sample.py'])
    assert p.stdout.count('---------------') == 2
    # the prompt and 40 new tokens run past the softmax model's block_size of 32: one line says so, and it samples on
    context = int(re.search(r'cache at (\d+) tokens of context', p.stdout).group(1))
    assert context > 32 and p.stdout.count(f'warning: {context} tokens of context > block_size 32') == 1, p.stdout[-2000:]
    assert p.stdout.count('warning') == 1
    assert re.search(r'prefill: \d+ tokens x 2 samples in [\d.]+ ms; decode \(eager, cpu\): [\d.]+ ms per token, [\d.]+ tokens/s', p.stdout)
    m = re.search(r'cache at (\d+) tokens of context: ([\d,]+) bytes', p.stdout)
    assert m and int(m.group(2).replace(',', '')) > 0
    assert p.stdout.count('def ') >= 2  # the prompt is echoed at the start of each sample
    p = run([f'--out_dir={out}', '--start=def ', '--num_samples=1', '--max_new_tokens=0', '--device=cpu'],
            cmd=[sys.executable, 'sample.py'])
    assert p.stdout.count('---------------') == 1 and 'decode (eager, cpu): 0.00 ms per token, 0.0 tokens/s' in p.stdout


def test_kernels_key_is_saved_and_used_on_resume_and_sampling(pystdlib, tmp_path):
    """--kernels is a config key: printed with the config, saved with the model args, used again on resume and by
    sample.py unless given anew; a checkpoint from before the key runs 'auto'; one trained with 'triton' samples on CPU
    only when told to."""
    from checkpoint import load_checkpoint, save_checkpoint
    out = str(tmp_path / 'out')
    ckpt = os.path.join(out, 'ckpt.pt')
    args = TINY + [f'--out_dir={out}', '--mixer=gdn', '--head_dim=16', '--eval_interval=2']
    p = run(args + ['--max_iters=2', '--kernels=recurrent'])
    assert "(kernels='recurrent')" in p.stdout, p.stdout[-2000:]
    with open(os.path.join(out, 'log.txt')) as f:
        assert "'kernels': 'recurrent'" in f.read()  # the config, in the log
    assert load_checkpoint(ckpt)['model_args']['kernels'] == 'recurrent'
    p = run(args + ['--max_iters=4', '--init_from=resume'])  # the checkpoint's
    assert "resume: kernels = 'recurrent' from the checkpoint" in p.stdout, p.stdout[-2000:]
    assert "kernels: delta_rule uses the recurrent torch path on cpu (kernels='recurrent')" in p.stdout
    p = run(args + ['--max_iters=6', '--init_from=resume', '--kernels=torch'])  # the command line's
    assert "resume: kernels" not in p.stdout and "(kernels='recurrent')" not in p.stdout
    assert "kernels: delta_rule uses the chunked torch path on cpu (kernels='torch')" in p.stdout, p.stdout[-2000:]
    c = load_checkpoint(ckpt)
    assert c['iter_num'] == 6 and c['model_args']['kernels'] == 'torch'  # the run's end: iters 0-5 done
    del c['model_args']['kernels']  # as written before the key existed
    save_checkpoint(c, ckpt)
    p = run(args + ['--max_iters=8', '--init_from=resume'])
    assert "resume: kernels" not in p.stdout and "kernels: delta_rule uses the chunked torch path on cpu\n" in p.stdout
    assert load_checkpoint(ckpt)['model_args']['kernels'] == 'auto'
    sample = [f'--out_dir={out}', '--start=def ', '--num_samples=1', '--max_new_tokens=3', '--device=cpu']
    c = load_checkpoint(ckpt)
    c['model_args']['kernels'] = 'recurrent'
    save_checkpoint(c, ckpt)
    p = run(sample, cmd=[sys.executable, 'sample.py'])
    assert "kernels: delta_rule_decode uses the torch step on cpu (kernels='recurrent')" in p.stdout, p.stdout[-2000:]
    p = run(sample + ['--kernels=auto'], cmd=[sys.executable, 'sample.py'])
    assert "kernels: delta_rule_decode uses the torch step on cpu\n" in p.stdout and "(kernels=" not in p.stdout
    c['model_args']['kernels'] = 'triton'
    save_checkpoint(c, ckpt)
    if not torch.cuda.is_available():
        assert "trained with kernels='triton', which needs CUDA: add --kernels=auto" in train_settings_error(
            tmp_path, *sample, script='sample.py')


@pytest.mark.parametrize('mixer', [m for m in MIXERS if m != 'softmax'] + ['kda*3,softmax'])
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
    params = re.search(r'^model: .*, ([\d.]+M) parameters$', p.stdout, re.M).group(1)
    md = table([out]).splitlines()
    assert len(md) == 3 and md[0].startswith('| run | mixer |')
    cells = [c.strip() for c in md[2].strip('|').split('|')]
    assert cells[:4] == ['kdax3+softmax', '`kda*3,softmax`', params, f"{4 * 2 * 32 / 1e6:.1f}M"]
    assert float(cells[4]) == val[-1] and float(cells[5]) == min(val)
    assert float(cells[6].replace(',', '')) > 0


# -----------------------------------------------------------------------------
# a failed run never destroys work, and every bad input gets a one-line named error

def train_settings_error(tmp_path, *args, script='train.py'):
    """Run train.py (or sample.py) in this process with args, which must stop at a setting check: the UserError.
    In-process (runpy) because the checks come before any work: no subprocess, no torch import per case."""
    import runpy
    from configurator import UserError
    argv = sys.argv
    sys.argv = [script] + list(args) + ([f'--out_dir={tmp_path}'] if not any(a.startswith('--out_dir') for a in args) else [])
    try:
        with pytest.raises(UserError) as e:
            runpy.run_path(os.path.join(ROOT, script), run_name='settings_check')  # not __main__: no excepthook
    finally:
        sys.argv = argv
    assert '\n' not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize('args,msg', [
    (['--n_layer=0'], 'n_layer=0 must be an integer >= 1'),
    (['--n_layer=-3'], 'n_layer=-3 must be an integer >= 1'),
    (['--n_embd=0'], 'n_embd=0 must be an integer >= 1'),
    (['--n_head=0'], 'n_head=0 must be an integer >= 1'),
    (['--head_dim=0', '--mixer=kda'], 'head_dim=0 must be an integer >= 1'),
    (['--batch_size=0'], 'batch_size=0 must be >= 1'),
    (['--batch_size=-4'], 'batch_size=-4 must be >= 1'),
    (['--block_size=0'], 'block_size=0 must be >= 1'),
    (['--eval_iters=0'], 'eval_iters=0 must be >= 1'),
    (['--eval_interval=0'], 'eval_interval=0 must be >= 1'),
    (['--gradient_accumulation_steps=0'], 'gradient_accumulation_steps=0 must be >= 1'),
    (['--learning_rate=0'], 'learning_rate=0.0 must be > 0'),
    (['--dropout=1.0'], r'dropout=1.0 must be in \[0, 1\)'),
    (['--init_from=resum'], "init_from must be 'scratch' or 'resume'"),
    (['--dtype=float64'], "dtype='float64' is not supported"),
    (['--n_embd=96', '--head_dim=64', '--mixer=kda'], r'head_dim=64 must be even and divide n_embd=96 \(mixers kda\)'),
    (['--n_embd=96', '--head_dim=64', '--mixer=gdn'], r'head_dim=64 must be even and divide n_embd=96 \(mixers gdn\)'),
    (['--n_embd=96', '--head_dim=64', '--mixer=retnet'], r'head_dim=64 must be even and divide n_embd=96 \(mixers retnet\)'),
    (['--n_embd=96', '--head_dim=64', '--mixer=mamba2'], r'head_dim=64 must be even and divide n_embd=96 \(mixers mamba2\)'),
    (['--n_embd=96', '--n_head=5'], 'n_embd=96 must split into n_head=5 softmax heads'),
    (['--mixer=kda*3,softmax', '--n_layer=6'], "does not tile n_layer=6"),
    (['--kernels=chunked'], "kernels='chunked' must be one of 'auto', 'torch', 'recurrent', 'triton'"),
    (['--stop_at_val_acc=1.5'], r'stop_at_val_acc=1.5 must be an accuracy in \[0, 1\]'),
    (['--compile_mode=fast'], "compile_mode='fast' is not one of torch.compile's modes: default, reduce-overhead"),
    (['--fsdp_per_block=True'], "fsdp_per_block=True shapes FSDP's units: it needs --fsdp=True"),
])
def test_settings_that_cannot_train_are_refused(tmp_path, args, msg):
    """Each used to train nonsense (0 layers, constant or nan loss, exit 0) or crash raw (NameError,
    ZeroDivisionError, KeyError, a torch error)."""
    assert re.search(msg, train_settings_error(tmp_path, *args))


@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a machine without CUDA')
def test_cuda_without_cuda_is_named(tmp_path):
    assert 'sees no CUDA GPU here: use --device=cpu' in train_settings_error(tmp_path, '--device=cuda')
    assert 'sees no CUDA GPU here' in train_settings_error(tmp_path, '--device=cuda', script='sample.py')  # not "cannot read checkpoint"


def test_user_error_is_one_line_and_exit_1(tmp_path):
    """Through the command line: exactly one line on stderr, no traceback, exit status 1."""
    p = run(['--n_layer=0', f'--out_dir={tmp_path}'], check=False)
    assert p.returncode == 1 and p.stderr == 'train.py: error: n_layer=0 must be an integer >= 1\n', p.stderr


def test_user_error_under_torchrun_prints_once(tmp_path):
    """Under torchrun the message used to repeat per rank inside a traceback each (233 lines at 8 ranks)."""
    p = run(['--n_layer=0', f'--out_dir={tmp_path}'], check=False,
            cmd=[sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py'])
    out = p.stdout + p.stderr
    assert p.returncode != 0 and out.count('n_layer=0 must be an integer >= 1') == 1, out[-3000:]
    assert 'train.py", line' not in out  # torchrun's own report remains, but no traceback from train.py


def test_help_lists_settings_with_defaults(tmp_path):
    p = run(['--help'], check=False)
    assert p.returncode == 0, p.stderr
    assert "learning_rate = 6e-4            # max learning rate" in p.stdout and 'torchrun' in p.stdout
    p = run(['--help'], check=False, cmd=[sys.executable, 'sample.py'])
    assert p.returncode == 0 and 'top_k = 200' in p.stdout and '(None = all)' in p.stdout, p.stderr


def test_sample_settings_are_checked(trained, tmp_path):
    out, _ = trained
    for args, msg in [(['--num_samples=0'], 'num_samples=0 must be >= 1'), (['--top_k=0'], 'top_k=0 must be >= 1'),
                      (['--temperature=-0.5'], 'temperature=-0.5 must be >= 0'),
                      (['--start='], "start is empty: give a prompt, or --start='<|endoftext|>'"),
                      (['--start=FILE:/no/such/prompt.txt'], 'no such file /no/such/prompt.txt'),
                      (['--ckpt=nope.pt'], 'no checkpoint at')]:
        assert msg in train_settings_error(tmp_path, f'--out_dir={out}', '--device=cpu', *args, script='sample.py'), args
    # --top_k=None is what the comment promises: all tokens (it used to be a type error)
    p = run([f'--out_dir={out}', '--top_k=None', '--num_samples=1', '--max_new_tokens=3', '--device=cpu',
             "--start=<|endoftext|>"], cmd=[sys.executable, 'sample.py'])
    assert p.stdout.count('---------------') == 1


def test_best_checkpoint_is_kept_apart(trained, tmp_path):
    """ckpt.pt is the latest (what resume continues), best.pt the lowest val loss; a later save never touches best.pt."""
    from checkpoint import load_checkpoint, save_checkpoint
    out, stdout = trained
    evals = [float(x) for x in re.findall(r'val loss ([\d.]+)', stdout)]
    best, last = load_checkpoint(os.path.join(out, 'best.pt')), load_checkpoint(os.path.join(out, 'ckpt.pt'))
    assert abs(best['val_loss'] - min(evals[1:])) < 1e-4 and last['iter_num'] == 20  # the run's end is saved too
    a, b = str(tmp_path / 'ckpt.pt'), str(tmp_path / 'best.pt')
    save_checkpoint({'model': {'w': torch.ones(3)}, 'val_loss': 1.0}, a, best=b)
    save_checkpoint({'model': {'w': torch.zeros(3)}, 'val_loss': 2.0}, a)  # worse: not kept as best
    assert load_checkpoint(b)['val_loss'] == 1.0 and load_checkpoint(a)['val_loss'] == 2.0


def test_nonfinite_weights_are_never_saved_or_loaded(tmp_path):
    from configurator import UserError
    from checkpoint import load_checkpoint, save_checkpoint
    path = str(tmp_path / 'ckpt.pt')
    save_checkpoint({'model': {'w': torch.ones(3)}, 'iter_num': 1}, path)
    with pytest.raises(UserError, match='not saving .*non-finite'):
        save_checkpoint({'model': {'w': torch.tensor([1.0, float('nan')])}, 'iter_num': 2}, path)
    assert load_checkpoint(path)['iter_num'] == 1
    torch.save({'model': {'w': torch.tensor([float('inf')])}}, path)  # as a diverged run wrote them before the fix
    with pytest.raises(UserError, match='holds non-finite weights'):
        load_checkpoint(path)


def test_divergence_stops_and_keeps_the_last_good_checkpoint(trained, tmp_path):
    """The case that was reported: resuming a good checkpoint with --learning_rate=1e4 --grad_clip=0 used to overwrite ckpt.pt
    with NaN weights and exit 0. Now: a named error, exit 1, ckpt.pt and best.pt untouched."""
    import shutil
    out = str(tmp_path / 'out')
    shutil.copytree(trained[0], out)
    before = {f: open(os.path.join(out, f), 'rb').read() for f in ('ckpt.pt', 'best.pt')}
    p = run(TINY + [f'--out_dir={out}', '--init_from=resume', '--learning_rate=1e4', '--grad_clip=0', '--decay_lr=False',
                    '--max_iters=60', '--eval_interval=10'], check=False)
    assert p.returncode == 1 and p.stderr.count('\n') == 1 and 'training diverged at iter' in p.stderr, p.stderr[-2000:]
    assert 'keeps the last good state' in p.stderr and 'saving checkpoint' not in p.stdout
    for f, data in before.items():
        assert open(os.path.join(out, f), 'rb').read() == data, f


def test_divergence_read_a_step_late_is_caught_before_the_next_eval_and_save(pystdlib, tmp_path):
    """The host reads each step's loss a step late (train.py's `lagged`): a step that goes non-finite just before an
    eval must stop the run at that eval, before it evaluates or saves: every step evaluates and saves here, so a
    late check would show as an eval line or a checkpoint past the step named in the error."""
    from checkpoint import load_checkpoint
    p = run(TINY + [f'--out_dir={tmp_path}', '--learning_rate=1e4', '--grad_clip=0', '--decay_lr=False',
                    '--max_iters=60', '--eval_interval=1', '--eval_iters=1', '--always_save_checkpoint=True'],
            check=False)
    m = re.search(r'training diverged at iter (\d+): loss (\S+), gradient norm (\S+);', p.stderr)
    assert p.returncode == 1 and m, p.stderr[-2000:]
    bad = int(m.group(1))
    assert not (math.isfinite(float(m.group(2))) and math.isfinite(float(m.group(3)))), m.group(0)
    evals = [int(n) for n in re.findall(r'^step (\d+): train loss', p.stdout, re.M)]
    assert evals and max(evals) == bad, (bad, evals)  # the eval of step `bad` ran (its weights were good), no later
    ckpt = load_checkpoint(str(tmp_path / 'ckpt.pt'))  # (refuses non-finite weights)
    assert ckpt['iter_num'] == bad, (ckpt['iter_num'], bad)


def test_fp16_grad_scaler_trains_with_the_check_before_each_step(pystdlib, tmp_path):
    """--dtype=float16 keeps the grad scaler's own skipping, so the finiteness check stays before each step (the
    synchronous path of train.py's loop): it trains and resumes exactly as the late-read path does."""
    args = TINY + ['--dtype=float16', '--eval_iters=1']
    a = run(args + [f'--out_dir={tmp_path / "a"}', '--max_iters=6', '--eval_interval=3'])
    run(args + [f'--out_dir={tmp_path / "b"}', '--max_iters=3', '--eval_interval=3'])
    b = run(args + [f'--out_dir={tmp_path / "b"}', '--max_iters=6', '--eval_interval=3', '--init_from=resume'])
    la, lb = iter_losses(a.stdout), iter_losses(b.stdout)
    assert sorted(la) == list(range(6)) and sorted(lb) == [3, 4, 5], (la, lb)
    assert all(math.isfinite(v) for v in la.values())
    assert [la[i] for i in (3, 4, 5)] == [lb[i] for i in (3, 4, 5)], (la, lb)


def test_growing_loss_is_warned_about(pystdlib, tmp_path):
    """--learning_rate=10 climbed to a loss of 1,676 without a word."""
    p = run(TINY + [f'--out_dir={tmp_path}', '--learning_rate=10', '--grad_clip=0', '--decay_lr=False', '--max_iters=3',
                    '--eval_interval=100', '--eval_iters=1'], check=False)
    assert re.search(r"warning: iter \d+: loss [\d.]+ is [\d.]+x this run's first", p.stdout), p.stdout[-2000:]


def test_cpu_dtype_is_honoured(trained, tmp_path):
    """--dtype=bfloat16 on CPU was logged but ignored (float32 ran): now it autocasts, so iter 0's loss differs."""
    p = run(TINY + [f'--out_dir={tmp_path}', '--dtype=bfloat16', '--max_iters=1', '--eval_interval=100', '--eval_iters=1'])
    assert 'dtype bfloat16' in p.stdout
    assert iter_losses(p.stdout)[0] != iter_losses(trained[1])[0]


def test_second_run_in_same_out_dir_stops_at_once(pystdlib, tmp_path):
    """Two runs in one out_dir used to interleave log.txt and race on ckpt.pt.tmp. The lock dies with its process
    (kill -9 included), so a stale one never blocks."""
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    env.pop('RANK', None)
    first = subprocess.Popen([sys.executable, 'train.py'] + TINY + [f'--out_dir={tmp_path}', '--max_iters=100000',
                             '--eval_interval=100000'], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in first.stdout:  # wait until it trains
            if line.startswith('iter 1/'):
                break
        second = run(TINY + [f'--out_dir={tmp_path}', '--max_iters=2'], check=False)
        assert second.returncode == 1 and second.stderr.count('\n') == 1, second.stderr
        assert f"out_dir '{tmp_path}' is in use by another run (pid {first.pid} on" in second.stderr, second.stderr
    finally:
        first.kill()  # SIGKILL: no clean-up runs
        first.wait()
    run(TINY + [f'--out_dir={tmp_path}', '--max_iters=1', '--eval_interval=100'])  # the stale lock does not block
    with open(os.path.join(tmp_path, 'log.txt')) as f:
        assert f.read().count('=== ') == 2  # the refused run wrote nothing to the log


def test_readme_setup_notes():
    """Next to the two set-up commands: the offline-tokenizer note and the CPU-threads note."""
    with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
        quick_start = f.read().split('## Quick start', 1)[1].split('\n## ', 1)[0]
    assert 'TIKTOKEN_CACHE_DIR' in quick_start and '--input' in quick_start
    assert 'OMP_NUM_THREADS=1 python train.py' in quick_start and 'per step' in quick_start
