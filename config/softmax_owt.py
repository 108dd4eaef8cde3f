# GPT-2-small-class model (~124M) with softmax attention (causal, RoPE),
# trained on OpenWebText like nanoGPT's GPT-2 reproduction.
# Hardware: 8 GPUs of the A100/H100 class; nanoGPT reports about 4 days on 8xA100 for its softmax
# run (not measured here). Needs the OpenWebText shards (~18 GB): python data/openwebtext/prepare.py
# Expected: nanoGPT's softmax baseline reaches val loss ~2.85 on OWT; this file's result is not measured yet.
# $ torchrun --standalone --nproc_per_node=8 train.py config/softmax_owt.py
out_dir = 'out-owt-softmax'
dataset = 'openwebtext'
mixer = 'softmax'

# model: 12 layers x 768, GPT-2 small's shape
n_layer = 12
n_head = 12            # softmax heads (64 wide)
n_embd = 768
head_dim = 64         # linear mixers: per-head key dim
d_state = 128          # Mamba2 state size N per head
block_size = 1024
dropout = 0.0

# 12 batch x 1024 tokens x 40 grad accum = 491,520 tokens per step (divided among the DDP ranks)
batch_size = 12
gradient_accumulation_steps = 40
max_iters = 600000
lr_decay_iters = 600000
warmup_iters = 2000
learning_rate = 6e-4
min_lr = 6e-5
weight_decay = 0.1

eval_interval = 1000
eval_iters = 200
log_interval = 10
