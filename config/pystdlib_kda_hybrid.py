# Small 3:1 KDA:softmax hybrid (the Kimi Linear recipe) on the offline default dataset (Python stdlib source).
# Hardware: 2 CPU cores: ~993 tokens/s, so 300 steps take ~5-6 min plus evals; an H200 (eager): ~58k tokens/s.
# Expected: val loss 3.494 at step 300 (H200, bf16, one seed) (CPU, 2 cores: 3.41 in the README's quick start); see the README's table.
# $ python data/pystdlib/prepare.py && python train.py config/pystdlib_kda_hybrid.py
out_dir = 'out-pystdlib-kda_hybrid'
dataset = 'pystdlib'
mixer = 'kda*3,softmax'

# model: 4 layers x 128 wide; the 50304x128 tied embedding (6.4M) is most of the ~7.3M parameters
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
