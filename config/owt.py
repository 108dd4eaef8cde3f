# GPT-2-small-class model on OpenWebText, as nanoGPT's GPT-2 (124M) reproduction, with any mixer or pattern: each
# mixer layer has within 20% of a softmax layer's parameters (model.py's sizing rule), so the models compare.
# Hardware: 8 GPUs of the A100/H100 class; nanoGPT reports about 4 days on 8xA100 for its softmax run (not measured
# here). Needs the OpenWebText shards (~18 GB): python data/openwebtext/prepare.py
# Expected: not trained here yet (README, "Training on OpenWebText", has nanoGPT's softmax baseline).
# $ python train.py config/owt.py                                                 # softmax (GPT-2), one GPU
# $ torchrun --standalone --nproc_per_node=8 train.py config/owt.py --mixer=gdn   # -> out-openwebtext-gdn
# The headline run, the 3:1 KDA:softmax hybrid, is config/kda_hybrid.py.
dataset = 'openwebtext'
# mixer: train.py's default, softmax, unless given (--mixer=kda, --mixer='kda*3,softmax', ...)

# model: 12 layers x 768, GPT-2 small's shape
n_layer = 12
n_head = 12            # softmax heads (64 wide)
n_embd = 768
head_dim = 128 if 'kda' in mixer else 64  # linear mixers' per-head key dim: KDA's 128 as in Kimi Linear, else 64
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
