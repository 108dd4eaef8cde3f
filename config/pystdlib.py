# A small model on the offline default dataset (the Python standard library's source in GPT-2 BPE, data/pystdlib/),
# sized for a CPU: 4 layers x 128, ~7.3M parameters, of which the 50304 x 128 tied embedding is 6.4M.
# Any mixer or pattern as an override; the default is the 3:1 KDA:softmax hybrid of Kimi Linear.
# Hardware: 2 CPU cores: 300 steps of 1,024 tokens, about 1 s each, so 5-6 min with the evals; a GPU is used when there is one.
# Expected val loss at step 300 (one seed, 2026-11-26; README "What you get", notes/results.md §1): softmax 3.836,
# retnet 3.932, mamba2 3.815, gla 3.954, deltanet 3.883, gdn 3.724, kda 3.867, kda*3,softmax 3.901 (3.877 alone).
# $ python data/pystdlib/prepare.py && python train.py config/pystdlib.py     # -> out-pystdlib-kdax3+softmax
# $ python train.py config/pystdlib.py --mixer=gdn                            # -> out-pystdlib-gdn
dataset = 'pystdlib'
mixer = 'kda*3,softmax'  # or softmax | retnet | mamba2 | gla | deltanet | gdn | kda | any pattern tiling 4 layers

# model: 4 layers x 128 wide, 32-wide heads for every mixer
n_layer = 4
n_head = 4             # softmax heads (32 wide)
n_embd = 128
head_dim = 32          # linear mixers: per-head key dim (KDA/DeltaNet: 4 heads, GDN: 2 heads x 32/64)
d_state = 32           # Mamba2 state size N per head
block_size = 128
dropout = 0.0

# 8 x 128 = 1,024 tokens per step; 300 steps = 307k tokens (about 1/16 of the 5.1M train tokens).
# On a CPU the 50304-way softmax of the output layer is most of the cost, so tokens, not layers, set the time.
batch_size = 8
gradient_accumulation_steps = 1
max_iters = 300
lr_decay_iters = 300
warmup_iters = 30
learning_rate = 3e-3   # small models tolerate a high LR
min_lr = 3e-4
weight_decay = 0.1

eval_interval = 150
eval_iters = 16        # 16 x 1,024 = 16k of the 157k val tokens
log_interval = 10
