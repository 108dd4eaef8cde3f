# FSDP over 8 gloo ranks = one process (CPU, fp32): the test_train FSDP comparison at 8 ranks, both unit layouts.
# Usage (repo root): python notes/runs/multi-gpu-2026-11-26/s45-fsdp8_check.py
import os, subprocess, sys, tempfile, torch
sys.path.insert(0, '.')
from checkpoint import load_checkpoint
TINY = ['--dataset=pystdlib', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4',
        '--eval_iters=2', '--log_interval=1', '--learning_rate=3e-3', '--warmup_iters=2', '--lr_decay_iters=20',
        '--min_lr=3e-4', '--device=cpu', '--compile=False', '--mixer=kda,softmax', '--head_dim=16']
args = TINY + ['--eval_interval=3', '--gradient_accumulation_steps=16', '--grad_clip=0.5', '--max_iters=3']  # 2 a rank
env = dict(os.environ, OMP_NUM_THREADS='1')
tr = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=8', 'train.py']
with tempfile.TemporaryDirectory() as d:
    for name, cmd, extra in (('single', [sys.executable, 'train.py'], []), ('fsdp', tr, ['--fsdp=True']),
                             ('fsdp_blocks', tr, ['--fsdp=True', '--fsdp_per_block=True'])):
        p = subprocess.run(cmd + args + extra + [f'--out_dir={d}/{name}'], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    one = load_checkpoint(f'{d}/single/ckpt.pt')
    for name in ('fsdp', 'fsdp_blocks'):
        c = load_checkpoint(f'{d}/{name}/ckpt.pt')
        w = max(((c['model'][k] - v).abs().max() / v.abs().max().clamp_min(1e-12)).item() for k, v in one['model'].items())
        s = max(((c['optimizer']['state'][i][n] - st[n]).abs().max() / st[n].abs().max().clamp_min(1e-12)).item()
                for i, st in one['optimizer']['state'].items() for n in ('exp_avg', 'exp_avg_sq'))
        print(f"{name} over 8 ranks vs one process after 3 steps (16 micro-steps each, clipped): weights {w:.2e}, "
              f"AdamW state {s:.2e} (largest relative difference)")
