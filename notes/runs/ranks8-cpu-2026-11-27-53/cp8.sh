#!/bin/bash
# Issue 45 point 2's code path on the CPU: one sequence of 256 tokens split over 8 ranks (--context_parallel=8: 16
# pieces of 16 tokens, gloo), the tiny hybrid, against one process on the same rows. Run from the repository root.
set -e
o=${OUT_DIR:-/tmp/cp8}; rm -rf $o; mkdir -p $o
A="--dataset=pystdlib --n_layer=2 --n_head=2 --n_embd=32 --block_size=256 --batch_size=1 --eval_iters=2 --log_interval=1
   --learning_rate=3e-3 --warmup_iters=2 --lr_decay_iters=20 --min_lr=3e-4 --device=cpu --compile=False
   --mixer=kda,softmax --head_dim=16 --eval_interval=6 --gradient_accumulation_steps=1 --max_iters=6"
export OMP_NUM_THREADS=1
python -m torch.distributed.run --standalone --nproc_per_node=8 train.py $A --context_parallel=8 --out_dir=$o/cp8 2>&1 |
  grep -E "world size|context|^iter|val loss|Error" | head -12
python train.py $A --out_dir=$o/one 2>&1 | grep -E "^iter|val loss|Error" | head -8
python - "$o" <<'PY'
import sys
sys.path.insert(0, ".")
from checkpoint import load_checkpoint
o = sys.argv[1]
a, b = load_checkpoint(f"{o}/cp8/ckpt.pt"), load_checkpoint(f"{o}/one/ckpt.pt")
d = max((a["model"][k].float() - b["model"][k].float()).abs().max().item() for k in b["model"])
print(f"largest weight difference after 6 steps, context parallel over 8 ranks against one process: {d:.2e}")
PY
