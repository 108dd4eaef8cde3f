# The text comparison: every mixer, and the 3:1 KDA:softmax hybrid, at the same shape (8 layers x 384, 32.7-34.3M
# parameters, of which the tied 50304 x 384 embedding is 19.3M) and the same tokens, on the offline default dataset
# (Python standard library source, 5.1M train tokens). The mixer is an override; one run per mixer, then the table
# and the picture:
# $ for m in softmax retnet mamba2 gla deltanet gdn kda 'kda*3,softmax'; do python train.py config/text.py --mixer=$m; done
# $ python tools/plot.py out-text/* --table
# $ python tools/plot.py out-text/* --out=assets/text_val_loss.png --title="pystdlib, 8 x 384"
# Hardware: one GPU (bf16): alone on an H100, 109k (kda) to 256k (softmax) tokens/s, so 1-2 min a run with the evals
# (notes/results.md §9); on 2 CPU cores a run would take hours.
# Expected val loss per mixer, mean of seeds 1337 and 1338 (README "Results", notes/results.md §9.1 and §9.0): softmax
# 2.553, retnet 2.564, mamba2 2.297, gla 2.621, deltanet 2.493, gdn 2.264, kda 2.422, kda*3,softmax 2.434.
dataset = 'pystdlib'
# mixer: train.py's default, softmax, unless given (--mixer=retnet|mamba2|gla|deltanet|gdn|kda|'kda*3,softmax')
out_dir = 'out-text/' + mixer.replace('*', 'x').replace(',', '+')  # one folder per mixer: tools/plot.py out-text/*
compile = False        # equal conditions for every mixer, and no compile time in a short run

# model: 8 layers (so 'kda*3,softmax' is two kda kda kda softmax blocks), 64-wide heads for every mixer
n_layer = 8
n_head = 6             # softmax heads (64 wide)
n_embd = 384
head_dim = 64          # linear mixers: per-head key dim (Mamba2: headdim)
d_state = 64           # Mamba2 state size N per head
block_size = 256
dropout = 0.0

# 32 sequences x 256 tokens = 8,192 tokens per step; 1,200 steps = 9.8M tokens (about 1.9 passes over the train split)
batch_size = 32
gradient_accumulation_steps = 1
max_iters = 1200
lr_decay_iters = 1200
warmup_iters = 100
learning_rate = 1.5e-3
min_lr = 1.5e-4
weight_decay = 0.1

eval_interval = 100    # and the last step, max_iters, is always evaluated
eval_iters = 20        # 20 x 8,192 = 164k tokens: the whole val split (157k) about once
log_interval = 50
always_save_checkpoint = False
