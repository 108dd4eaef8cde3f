# The needle in a haystack (tasks.py's Needle): is a key's value still found past the trained context? Trained at
# 512 tokens, then scored by tools/longctx.py at 1x .. 16x that (512 .. 8,192 tokens) and at five depths. E.g.
# $ python train.py config/needle.py --mixer=gdn && python tools/longctx.py needle out-needle-gdn
# $ python tools/grid.py --tasks needle --seeds 1337 1338 --jobs 16      # every mixer and the hybrid, two seeds
# $ python tools/longctx.py needle out-grid/needle/* --by_depth --plot assets/needle.png
# Hardware: one GPU; 3,000 steps took 264-319 s a run, 16 runs sharing one H200 (notes/runs/longctx-2026-11-26-z2/).
# Expected accuracy at 512 / 8,192 tokens, two seeds, each mixer at its best of LR 1e-3, 3e-4 and 256 sequences a step
# (notes/results.md §11): gdn 0.997 / 0.988, kda*3,softmax 0.996 / 0.984, deltanet 0.988 / 0.966, kda 0.982 / 0.814,
# gla 0.988 / 0.689, retnet 0.990 / 0.221, mamba2 0.269 / 0.239, softmax 0.554 / 0.044 (untied embeddings: 0.932 / 0.709).
dataset = 'needle'
mixer = 'softmax'      # override with --mixer=retnet|mamba2|gla|deltanet|gdn|kda|'kda*3,softmax'
out_dir = 'out-needle-' + mixer.replace('*', 'x').replace(',', '+')
compile = None         # on for CUDA (off on CPU); CUDA graphs, as for the recall grid's small models
compile_mode = 'reduce-overhead'

task_vocab_size = 128  # 31 keys, 31 values, 65 haystack tokens, the query '?'
block_size = 512
needle_num_needles = 4 # the one asked for and three distractors
needle_value_len = 2   # two value tokens: chance is 1/31 per token

n_layer = 4
n_embd = 128
n_head = 4             # softmax heads (32 wide); keep n_embd / n_head = 32 when changing n_embd
head_dim = 32
d_state = 32
dropout = 0.0

batch_size = 64
gradient_accumulation_steps = 1
max_iters = 3000
lr_decay_iters = 3000
warmup_iters = 200
learning_rate = 1e-3
min_lr = 1e-4
weight_decay = 0.1

eval_interval = 500    # and the last step, max_iters, is always evaluated
eval_iters = 8         # 8 x 64 = 512 fixed val sequences = 1,024 answers
log_interval = 100
