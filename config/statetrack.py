# State tracking (tasks.py): 16 variables re-assigned at random, 16 interleaved queries for a variable's latest value,
# in 256 tokens; 4 layers x 128. The mixer is an override, so every mixer and the 3:1 hybrid train at the same size:
# $ python train.py config/statetrack.py --mixer=gdn                              # -> out-statetrack-gdn
# $ python train.py config/statetrack.py --mixer=retnet --statetrack_num_assignments=96
# tools/grid.py runs every mixer x assignments x width from this file and writes the results table.
# Hardware: one GPU (a run of 4,000 steps takes minutes); on 2 CPU cores use tools/grid.py --quick's tiny sizes.
# Expected val accuracy per mixer: README "Results", notes/results.md §8.1.
dataset = 'statetrack'
mixer = 'softmax'      # override with --mixer=retnet|mamba2|gla|deltanet|gdn|kda|'kda*3,softmax'
compile = None         # on for CUDA (off on CPU): a step of these small models is bound by kernel launches,
compile_mode = 'reduce-overhead'  # so CUDA graphs make it several times faster (notes/perf.md, 2026-11-24 (r))

# task: 2 x 64 assignment tokens + 3 x 16 query tokens = 176 of the 257; each variable is assigned ~4 times
task_vocab_size = 256  # PAD, '?', 16 variables, 238 values
block_size = 256
statetrack_num_vars = 16
statetrack_num_assignments = 64   # up to (257 - 3 x 16) // 2 = 104; grid.py: 32, 64, 96
statetrack_num_queries = 16

# model: as config/mqar.py (4 layers, 32-wide heads, state ~32 x n_embd per layer for every linear mixer)
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

eval_interval = 500    # and the last step, max_iters, is always evaluated
eval_iters = 16        # 16 x 64 = 1,024 fixed val sequences = 16,384 answers
log_interval = 100
