# MQAR (multi-query associative recall, as in Zoology/Based; tasks.py) for one mixer: 4 layers x 128, 32 pairs in 256 tokens.
# The mixer is an override, so every mixer and the 3:1 hybrid train at the same width and layer count:
# $ python train.py config/mqar.py --mixer=kda --out_dir=out-mqar-kda
# $ python train.py config/mqar.py --mixer='kda*3,softmax' --mqar_num_pairs=64 --n_embd=256 --n_head=8
# grid.py runs every mixer x pairs x width from this file and writes the results table (README, "What the mixers can and cannot do").
# Hardware: one GPU. Time and accuracy per mixer: not measured yet (see the README section).
out_dir = 'out-mqar'
dataset = 'mqar'
mixer = 'softmax'      # override with --mixer=retnet|mamba2|deltanet|gdn|kda|'kda*3,softmax'
compile = False        # many short runs: compiling each would cost more than it saves

# task: Zoology's vocabulary; each sequence holds 32 pairs, then the 32 keys again (loss on the 32 answers only)
task_vocab_size = 8192
block_size = 256
mqar_num_pairs = 32    # up to (block_size + 1) // 4 = 64

# model: 4 layers (so 'kda*3,softmax' is kda kda kda softmax); every linear mixer keeps 32-wide heads,
# so the recurrent state per layer is about 32 x n_embd numbers for each of them (d_state = head_dim for Mamba2)
n_layer = 4
n_embd = 128
n_head = 4             # softmax heads (32 wide); keep n_embd / n_head = 32 when changing n_embd
head_dim = 32
d_state = 32
dropout = 0.0

# 64 sequences x 256 tokens = 16,384 tokens per step; 4,000 steps = 256,000 sequences, each seen once
batch_size = 64
gradient_accumulation_steps = 1
max_iters = 4000
lr_decay_iters = 4000
warmup_iters = 200
learning_rate = 1e-3   # one LR for every mixer (grid.py --learning_rates sweeps several and keeps the best)
min_lr = 1e-4
weight_decay = 0.1

eval_interval = 500    # must divide max_iters so the last eval is at max_iters
eval_iters = 16        # 16 x 64 = 1,024 fixed val sequences = 32,768 answers
log_interval = 100
