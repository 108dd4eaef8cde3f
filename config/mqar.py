# MQAR (multi-query associative recall, as in Zoology/Based; tasks.py) for one mixer: 4 layers x 128, 16 pairs in 128 tokens.
# The mixer is an override, so every mixer and the 3:1 hybrid train at the same width and layer count:
# $ python train.py config/mqar.py --mixer=kda --out_dir=out-mqar-kda
# $ python train.py config/mqar.py --mixer='kda*3,softmax' --mqar_num_pairs=24 --n_embd=256 --n_head=8
# grid.py runs every mixer x pairs x width from this file and writes the results table (README, "What the mixers can and cannot do").
# Hardware: one GPU. Measured while sizing this file (H100, torch 2.11, 12 runs sharing the GPU, 4,000 steps, eval every 1,000,
# the committed kernels of 6b6d714, the earlier layout with every key queried once): kda reached val acc 1.000 at 8 and 16 pairs (0.999 by step 1,000); softmax 0.51 (8 pairs)
# and 0.21 (16), which is the elimination shortcut of that layout (README); retnet 0.12 (8) and 0.03 (16); mamba2 0.09 (16).
# One seed, one LR. The grid's results: see the README section.
out_dir = 'out-mqar'
dataset = 'mqar'
mixer = 'softmax'      # override with --mixer=retnet|mamba2|deltanet|gdn|kda|'kda*3,softmax'
compile = False        # many short runs: compiling each would cost more than it saves

# task: each sequence holds 16 pairs, then 16 queries of random stored keys (loss on the 16 answers only). Measured while sizing:
# Zoology's vocabulary of 8192 did not train in 4,000 steps (softmax 0.02 at 32 pairs, 256 tokens: each embedding is
# seen too rarely); 256 tokens trained slowly (kda 0.58 at 16 pairs); 64 tokens (31 keys, 32 values) trained
task_vocab_size = 64
block_size = 128
mqar_num_pairs = 16    # up to 31 (the keys) and (block_size + 1) // 4 = 32

# model: 4 layers (so 'kda*3,softmax' is kda kda kda softmax); every linear mixer keeps 32-wide heads,
# so the recurrent state per layer is about 32 x n_embd numbers for each of them (d_state = head_dim for Mamba2)
n_layer = 4
n_embd = 128
n_head = 4             # softmax heads (32 wide); keep n_embd / n_head = 32 when changing n_embd
head_dim = 32
d_state = 32
dropout = 0.0

# 64 sequences x 128 tokens = 8,192 tokens per step; 4,000 steps = 256,000 sequences, each seen once
batch_size = 64
gradient_accumulation_steps = 1
max_iters = 4000
lr_decay_iters = 4000
warmup_iters = 200
learning_rate = 1e-3   # one LR for every mixer (grid.py --learning_rates sweeps several and keeps the best)
min_lr = 1e-4
weight_decay = 0.1

eval_interval = 500    # must divide max_iters so the last eval is at max_iters
eval_iters = 16        # 16 x 64 = 1,024 fixed val sequences = 16,384 answers
log_interval = 100
