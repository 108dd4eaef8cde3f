# The needle in a haystack (tasks.py's Needle; issue 44's long-context study): trained at 512 tokens, then scored by
# longctx.py at 1x .. 16x that (512 .. 8,192 tokens) and at five depths. One run per mixer and seed, e.g.
# $ python train.py config/needle.py --mixer=gdn && python longctx.py needle out-needle-gdn
# $ python grid.py --tasks needle --seeds 1337 1338 --jobs 16            # every mixer and the hybrid, two seeds
# $ python longctx.py needle out-grid/needle/* --by_depth --plot assets/needle.png
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
