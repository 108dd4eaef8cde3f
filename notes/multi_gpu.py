"""
Issue 21's checks in one command, for a machine with several GPUs: train.py under torchrun on 1, 2, ... GPUs at the
same per-GPU micro-batch (each rank runs `--micro_steps` micro-steps of batch_size per step), then

  - tokens/s per GPU and the scaling efficiency (per GPU at N ÷ per GPU at 1), from train.py's own iter lines
    (tok/s there counts every rank's tokens; the median over the steps after `--skip`, so compilation is left out);
  - that the replicas are identical at the end (each rank's final weights, compared here);
  - that the eval is the mean over ranks (train.py all-reduces it; the line is shown);
  - that the largest run's checkpoint resumes on one GPU (2 more steps) and samples there.

$ NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
  python notes/multi_gpu.py --gpus 1 2 --steps 40 config/kda_hybrid.py --dataset=pystdlib --block_size=1024
$ python notes/multi_gpu.py --gpus 1 2 --steps 4 --skip 1 --device=cpu --compile=False --dataset=pystdlib \\
  --n_layer=4 --n_embd=32 --n_head=2 --block_size=32 --batch_size=4     # the same on CPU (gloo), seconds

Arguments not listed here go to every train.py run (a config file first, then --key=value overrides). NVLink
multicast stays off in every run's environment (the three variables above are set unless given).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_MULTICAST = {'NCCL_NVLS_ENABLE': '0', 'TORCH_SYMM_MEM_DISABLE_MULTICAST': '1', 'NVSHMEM_DISABLE_NVLS': '1'}
# runs train.py in this rank, then saves the rank's final weights (under --fsdp=True its shards, which differ by
# design: the replica check is for DDP) and leaves without the interpreter's teardown (gloo's aborts now and then)
DRIVER = """\
import os, runpy, sys
import torch
train = {train!r}
sys.argv[0] = train
sys.path.insert(0, os.path.dirname(train))
g = runpy.run_path(train, run_name='__main__')
state = {{k: v.to_local() if hasattr(v, 'to_local') else v for k, v in g['raw_model'].state_dict().items()}}
torch.save(state, os.path.join(g['out_dir'], f"rank{{os.environ['RANK']}}.pt"))
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


def run(cmd, env, log):
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    with open(log, 'w') as f:
        f.write(' '.join(cmd) + '\n' + p.stdout + p.stderr)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}), see {log}:\n{(p.stdout + p.stderr)[-2000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--gpus', nargs='+', type=int, default=[1, 2])
    ap.add_argument('--steps', type=int, default=40)
    ap.add_argument('--skip', type=int, default=10, help="steps left out of the median (compilation)")
    ap.add_argument('--micro_steps', type=int, default=2, help="micro-steps per rank per step")
    ap.add_argument('--out_root', default='/tmp/multi_gpu')
    args, train_args = ap.parse_known_args()
    env = {**NO_MULTICAST, **os.environ, 'PYTHONUNBUFFERED': '1'}  # the caller's values win
    os.makedirs(args.out_root, exist_ok=True)
    driver = os.path.join(args.out_root, 'driver.py')
    with open(driver, 'w') as f:
        f.write(DRIVER.format(train=os.path.join(ROOT, 'train.py')))
    device = 'GPU' if torch.cuda.is_available() and '--device=cpu' not in train_args else 'CPU rank'

    rates = {}
    for n in args.gpus:
        out = os.path.join(args.out_root, f'n{n}')
        subprocess.run(['rm', '-rf', out])
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={n}', driver] + \
            train_args + [f'--gradient_accumulation_steps={args.micro_steps * n}', f'--max_iters={args.steps}',
                          f'--eval_interval={args.steps}', '--log_interval=1', f'--out_dir={out}']
        stdout = run(cmd, env, os.path.join(args.out_root, f'n{n}.log'))
        tok_s = [float(m.group(2).replace(',', '')) for m in re.finditer(r'^iter (\d+): .*tok/s ([\d,]+)', stdout, re.M)
                 if int(m.group(1)) >= args.skip]
        rates[n] = statistics.median(tok_s)
        ranks = [torch.load(os.path.join(out, f'rank{r}.pt'), map_location='cpu') for r in range(n)]
        diff = max(((ranks[r][k].float() - ranks[0][k].float()).abs().max().item() for r in range(1, n) for k in ranks[0]),
                   default=0.0)
        eval_line = re.findall(r'^step \d+: .*$', stdout, re.M)[-1]
        print(f"{n} × {device}: {rates[n]:,.0f} tokens/s, {rates[n] / n:,.0f} per {device}; replicas' largest weight "
              f"difference {diff:.3g}; last eval (mean over ranks): {eval_line}", flush=True)

    print(f"\n| {device}s | tokens/s | per {device} | scaling efficiency (per {device} ÷ at {min(args.gpus)}) |\n|---|---|---|---|")
    for n in args.gpus:
        print(f"| {n} | {rates[n]:,.0f} | {rates[n] / n:,.0f} | {rates[n] / n / (rates[min(args.gpus)] / min(args.gpus)):.3f} |")

    # the largest run's checkpoint: resume on one process for 2 more steps, then sample there
    n = max(args.gpus)
    out = os.path.join(args.out_root, f'n{n}')
    stdout = run([sys.executable, 'train.py'] + train_args + [
        f'--gradient_accumulation_steps={args.micro_steps}', f'--max_iters={args.steps + 2}', '--eval_interval=1000000',
        '--log_interval=1', '--init_from=resume', f'--out_dir={out}'], env, os.path.join(args.out_root, 'resume.log'))
    resumed = re.findall(r'^iter (\d+):', stdout, re.M)
    print(f"\nthe {n}-rank checkpoint resumed on one process: iters {resumed[0]}..{resumed[-1]}")
    device_arg = [a for a in train_args if a.startswith('--device=')]
    stdout = run([sys.executable, 'sample.py', f'--out_dir={out}', '--num_samples=1', '--max_new_tokens=32',
                  '--start=def '] + device_arg, env, os.path.join(args.out_root, 'sample.log'))
    print(f"and sampled on one (sample.py's output in {args.out_root}/sample.log, {len(stdout):,} characters)")


if __name__ == '__main__':
    main()
