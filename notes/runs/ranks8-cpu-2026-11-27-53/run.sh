#!/bin/bash
# Issue 45 point 3 on what this machine allows (no 8-GPU kind is lent): the same checkpoint chain over 8 ranks as
# processes on the CPU (gloo), the tiny hybrid: DDP over 8 ranks -> FSDP over 8 -> one process -> sample.py, beside one
# uninterrupted process with the same tokens a step (8 micro-steps). Run from the repository root.
set -e
o=${OUT_DIR:-/tmp/ranks8}; rm -rf $o; mkdir -p $o
A="--dataset=pystdlib --n_layer=2 --n_head=2 --n_embd=32 --block_size=32 --batch_size=4 --eval_iters=2 --log_interval=1
   --learning_rate=3e-3 --warmup_iters=2 --lr_decay_iters=20 --min_lr=3e-4 --device=cpu --compile=False
   --mixer=kda,softmax --head_dim=16 --eval_interval=4 --gradient_accumulation_steps=8 --grad_clip=1.0"
tr="python -m torch.distributed.run --standalone --nproc_per_node=8 train.py"
export OMP_NUM_THREADS=1
$tr $A --max_iters=4 --out_dir=$o/chain 2>&1 | grep -E "world size|^iter (0|3)/|val loss|saving|Error" | head
$tr $A --max_iters=8 --init_from=resume --fsdp=True --out_dir=$o/chain 2>&1 | grep -E "world size|resum|^iter (4|7)/|val loss|saving|Error" | head
python train.py $A --max_iters=12 --init_from=resume --out_dir=$o/chain 2>&1 | grep -E "resum|^iter (8|11)/|val loss|saving|Error" | head
python train.py $A --max_iters=12 --out_dir=$o/straight 2>&1 | grep -E "^iter (0|3|4|7|8|11)/|Error" | head
python sample.py --out_dir=$o/chain --num_samples=1 --max_new_tokens=48 --device=cpu --start="def main():" 2>&1 | tail -6
python - "$o" <<'PY'
import sys, torch
sys.path.insert(0, ".")
from checkpoint import load_checkpoint
o = sys.argv[1]
a, b = load_checkpoint(f"{o}/chain/ckpt.pt"), load_checkpoint(f"{o}/straight/ckpt.pt")
d = max((a["model"][k].float() - b["model"][k].float()).abs().max().item() for k in b["model"])
print(f"iter_num chain {a['iter_num']} straight {b['iter_num']}; largest weight difference, 8 ranks (DDP, FSDP) -> 1 "
      f"process against 1 process throughout: {d:.2e}")
PY
