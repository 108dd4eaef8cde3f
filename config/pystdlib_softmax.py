# Small softmax-attention GPT on the offline default dataset (Python's standard library source).
# Hardware: any CPU (2 cores: about 5 minutes); a GPU takes seconds.
# Expected: val loss ≈ see README (measured there), and samples that look like Python.
# $ python data/pystdlib/prepare.py && python train.py config/pystdlib_softmax.py
out_dir = 'out-pystdlib-softmax'
dataset = 'pystdlib'
mixer = 'softmax'

# model: 4 layers × 128 wide; the 50304×128 tied embedding (6.4M) is most of the 7.2M parameters
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
dropout = 0.0

# 16 × 128 = 2,048 tokens per step; 400 steps ≈ 0.8M tokens (~1/6 of an epoch of the 5.1M train tokens)
batch_size = 16
gradient_accumulation_steps = 1
max_iters = 400
lr_decay_iters = 400
warmup_iters = 40
learning_rate = 2e-3   # small models tolerate a high LR
min_lr = 2e-4
weight_decay = 0.1

eval_interval = 100
eval_iters = 20        # 20 × 2,048 = 41k tokens of the 157k val tokens
log_interval = 20
