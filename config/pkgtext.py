# The time-to-loss runs: GPT-2 small's shape (config/owt.py: 12 layers x 768, 124M parameters with softmax) at
# T = 4,096 on one GPU, on data/pkgtext (documentation and source code of pinned PyPI and Debian packages). Every
# mixer reads the same batches in the same order (tools/ttl.py run gives each its mixer, learning rate and seed).
# The learning rates on a fifth of the tokens, two runs sharing the GPU (their losses, not their clocks), then each
# mixer at its best rate, each run alone:
# $ python tools/ttl.py run out-sweep --mixers softmax 'kda*3,softmax' gdn kda --lrs 6e-4 1.2e-3 --per_gpu 2 \
#       -- config/pkgtext.py --max_iters=610 --lr_decay_iters=610
# $ python tools/ttl.py run out-ttl --mixers softmax 'kda*3,softmax' gdn kda --lrs_from out-sweep --seeds 1337 1338 \
#       -- config/pkgtext.py
# $ python tools/ttl.py report out-ttl
# Hardware: one H100 class GPU (bf16, compiled); a run of 100M tokens is about 4-5 minutes at the speeds of
# README "Speed" (not counting compile and evals). Needs the shards: python data/pkgtext/prepare.py
from pathlib import Path

exec(Path(__file__).with_name('owt.py').read_text())  # the model: owt.py's (its head_dim rule reads mixer)
dataset = 'pkgtext'
block_size = 4096
# 8 x 4,096 = 32,768 tokens a step; 3,052 steps = 100.0M tokens
batch_size = 8
gradient_accumulation_steps = 1
max_iters = 3052
lr_decay_iters = 3052  # (a shorter run, e.g. the learning-rate sweep above, sets both)
warmup_iters = 100
eval_interval = 100    # 3.3M tokens between evals: the curves' resolution
eval_iters = 16        # 16 x 8 x 4,096 = 524k val tokens, the same ones at every eval
save_interval = 1000   # checkpoints (1.5 GB with AdamW's moments) at steps 1000, 2000, 3000 and the end only
log_interval = 1       # every step's time and loss in log.txt: ttl.py's compile time and training-loss curve
