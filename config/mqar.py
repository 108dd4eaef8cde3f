# MQAR (multi-query associative recall, as in Zoology/Based; tasks.py) for one mixer: 4 layers x 128, 16 pairs in 128 tokens.
# The mixer is an override, so every mixer and the 3:1 hybrid train at the same width and layer count:
# $ python train.py config/mqar.py --mixer=kda                                    # -> out-mqar-kda
# $ python train.py config/mqar.py --mixer='kda*3,softmax' --mqar_num_pairs=24 --n_embd=256 --n_head=8
# tools/grid.py runs every mixer x pairs x width from this file and writes the results table.
# Hardware: one GPU (a run of 4,000 steps takes minutes); on 2 CPU cores use tools/grid.py --quick's tiny sizes.
# Expected val accuracy per mixer: README "Results", notes/results.md §8.1 (its w=128, 16-pair cell);
# the sizing runs that chose these settings: notes/results.md §8.6.
dataset = 'mqar'
mixer = 'softmax'      # override with --mixer=retnet|mamba2|gla|deltanet|gdn|kda|'kda*3,softmax'
compile = None         # on for CUDA (off on CPU): a step of these small models is bound by kernel launches,
compile_mode = 'reduce-overhead'  # so CUDA graphs make it several times faster (notes/perf.md, 2026-11-24 (r))

# task: each sequence holds 16 pairs, then 16 queries of random stored keys (loss on the 16 answers only).
# Vocabulary 64 (31 keys, 32 values), not Zoology's 8192: in 4,000 steps of fresh sequences each of 8192 embeddings is
# seen too rarely to train, and 256 trained slowly (the sizing runs, notes/results.md §8.6)
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

eval_interval = 500    # and the last step, max_iters, is always evaluated
eval_iters = 16        # 16 x 64 = 1,024 fixed val sequences = 16,384 answers
log_interval = 100
