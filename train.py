"""
Train a GPT whose token mixer is chosen per layer. One process, or several through torchrun (DDP, or FSDP2 with
--fsdp=True for models that do not fit one GPU).

CPU, a few minutes (the offline default dataset; run `python data/pystdlib/prepare.py` once):
$ python train.py config/pystdlib.py                       # the 3:1 KDA:softmax hybrid, 4 layers x 128
$ python train.py config/pystdlib.py --mixer=gdn           # any mixer or pattern

Synthetic recall tasks, generated on the fly (tasks.py; eval also prints answer accuracy):
$ python train.py config/mqar.py --mixer=kda
$ python train.py config/statetrack.py --mixer='kda*3,softmax'

GPT-2-small-class model on OpenWebText, one GPU, or DDP on 8 GPUs of one node (NCCL; gloo on CPU):
$ python train.py config/owt.py --mixer=kda
$ torchrun --standalone --nproc_per_node=8 train.py config/kda_hybrid.py
$ torchrun --standalone --nproc_per_node=8 train.py config/kda_hybrid.py --fsdp=True   # sharded, same checkpoints

Any global below can be overridden: `python train.py config/x.py --batch_size=8 --compile=False`;
`python train.py --help` lists them with their defaults. The loss is the mean cross-entropy of the next token in
nats (on the recall tasks: of the answers only). out_dir, unless given, is out-<dataset>-<mixer>.

Output: a short header (model, parameters, tokens per step, data, out_dir), then `iter N/max_iters` lines (the step's
loss, an exponential moving average of it, the step's time without any eval, the ETA) and `step N:` eval lines with
the eval's own time; out_dir/log.txt gets the same lines plus the config files and overrides as given, the full
config and the model per mixer. On a terminal, an eval or a stretch of steps without a line shows a progress bar
(on stderr) once it has taken a second. The run makes max_iters optimizer steps; step max_iters, the end, is always
evaluated and saved. wandb (--wandb_log=True) takes WANDB_MODE, WANDB_PROJECT, WANDB_NAME unless the config sets them.

Safety: a setting that cannot train stops at once with one line naming it; a second run in the same out_dir
stops at once (its lock, .<out_dir>.lock beside it); a run from scratch never replaces an earlier run's ckpt.pt or
best.pt (--init_from=resume continues it, --overwrite=True starts over); SIGTERM or Ctrl-C finishes the step, saves
ckpt.pt and exits (a second Ctrl-C exits at once), and the run's end is saved too; a non-finite loss or gradient norm
never reaches the weights (fused AdamW skips that step on the GPU; the host, which reads each step's numbers a step
late, stops the run before its next eval or save), so ckpt.pt stays the last good state; best.pt holds the lowest
val loss of the run; a loss past 2x the run's first is warned about. Checkpoints are read as data (checkpoint.py):
never code.
"""
import io
import os
import sys
import time
import math
import random
import signal
import subprocess
from contextlib import nullcontext, redirect_stdout

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.tensor import DTensor

import kernels as kernel_lib  # (`kernels` below is the setting of which path its calls take)
from model import GPTConfig, GPT, gpu_peak_flops
from checkpoint import save_checkpoint, load_checkpoint, build_model, lock_out_dir, rng_state, set_rng_state
from dataloader import ShardLoader
from tasks import MQAR, StateTracking, Needle, TaskLoader, count_correct

# -----------------------------------------------------------------------------
# I/O
out_dir = ''                    # ckpt.pt (latest), best.pt (lowest val loss), log.txt; '' = out-<dataset>-<mixer>
eval_interval = 2000            # evaluate (and maybe checkpoint) every this many iterations, and at max_iters
log_interval = 1                # print a log line every this many iterations
eval_iters = 200                # batches per split in estimate_loss
eval_only = False               # if True, evaluate once and exit
always_save_checkpoint = True   # save ckpt.pt at every eval, not only when val loss improves (best.pt: only then)
stop_at_val_acc = 0.0           # tasks (mqar, statetrack, needle): stop after the first eval whose val accuracy reaches this
                                # (0: never); grid.py's runs train to convergence this way
init_from = 'scratch'           # 'scratch' or 'resume' (continue from out_dir/ckpt.pt)
overwrite = False               # scratch in an out_dir holding an earlier run's ckpt.pt/best.pt: True deletes them (and
                                # its log.txt) and starts over; False stops with a line saying so
# wandb logging (off by default; imported only when on). '' = wandb's environment variable (WANDB_PROJECT, WANDB_NAME,
# WANDB_MODE; the other WANDB_* ones, e.g. WANDB_DIR, WANDB_ENTITY, are wandb's own), else the default in the comment
wandb_log = False
wandb_project = ''              # '' = $WANDB_PROJECT, else 'linear-gpt'
wandb_run_name = ''             # '' = $WANDB_NAME, else out_dir's name
wandb_mode = ''                 # '' = $WANDB_MODE, else 'online'; 'offline' writes runs locally for `wandb sync` later
# data
dataset = 'openwebtext'         # folder under data/ holding <dataset>_{train,val}_*.bin shards, or a task: 'mqar', 'statetrack', 'needle'
gradient_accumulation_steps = 5 * 8  # GLOBAL micro-steps per optimizer step, divided among DDP ranks
batch_size = 12                 # micro-batch size per rank
block_size = 1024               # training context length
# synthetic tasks (tasks.py), used when dataset is 'mqar', 'statetrack' or 'needle'; block_size is the sequence length
task_vocab_size = 8192          # tokens of the task; the model's vocab_size is set to it (Zoology's MQAR: 8192)
mqar_num_pairs = 16             # MQAR key-value pairs per sequence, then as many queries of random stored keys (needs 4x <= block_size+1)
statetrack_num_vars = 16        # state tracking: distinct variables
statetrack_num_assignments = 64 # assignments per sequence: each variable is re-assigned ~ this / num_vars times
statetrack_num_queries = 16     # queries per sequence, interleaved with the assignments (2*assignments + 3*queries <= block_size+1)
needle_num_needles = 4          # needle: needles in the haystack, one asked for and the rest distractors (longctx.py scores depths)
needle_value_len = 2            # needle: value tokens per needle, all answered after the query's key
# model
n_layer = 12
n_head = 12
n_embd = 768
n_kv_head = 0                   # softmax GQA K/V heads; 0 = n_head (plain multi-head attention)
mixer = 'softmax'               # per-layer pattern: 'kda' | 'kda*3,softmax' | one name per layer ...
head_dim = 64                   # linear mixers' per-head key dim (Mamba2: headdim); 128 for KDA at GPT-2 size
d_state = 128                   # Mamba2 state size N per head
rope_base = 10000.0             # rotary base of softmax and RetNet: larger turns the slow pairs slower (long-context work)
tie_embeddings = True           # input embedding = output layer's weight; False: separate (tokens never predicted keep their own)
dropout = 0.0                   # 0 for pretraining, 0.1+ for finetuning
bias = False                    # bias in Linear layers
vocab_size = 50304              # GPT-2 BPE 50257 padded to a multiple of 64
kernels = ''                    # path of the linear mixers' kernels.py calls: 'auto' (Triton on CUDA, chunked torch elsewhere),
                                # 'torch', 'recurrent' (the slow reference) or 'triton'; '' = 'auto' (on resume: the checkpoint's)
documents = False               # each EOT-separated document of a row is its own sequence (no state, conv or attention
                                # across a document start; model.GPT.documents); off = nanoGPT's way, a little faster
eot_token = 50256               # with documents: the token that starts a document (GPT-2's <|endoftext|>)
kda_gate_bound = 0.0            # KDA's gate: 0 = the released one, -exp(A) softplus(.); in [-5, 0): bounded at that value,
                                # bound * sigmoid(exp(A) (.)) (fla's safe gate; model.GPTConfig)
# AdamW optimizer
learning_rate = 6e-4            # max learning rate
max_iters = 600000              # total optimizer steps
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0                 # clip gradients at this norm, or 0.0 to disable
# learning rate schedule: linear warmup then cosine decay to min_lr
decay_lr = True
warmup_iters = 2000
lr_decay_iters = 600000         # ~= max_iters per Chinchilla
min_lr = 6e-5                   # ~= learning_rate / 10
# DDP
backend = ''                    # '' = nccl on CUDA, gloo on CPU
fsdp = False                    # under torchrun: shard weights, gradients and optimizer state over the ranks (FSDP2)
                                # instead of a full replica per rank (DDP), for models that do not fit one GPU;
                                # checkpoints stay full state dicts, gathered on save, so they resume on any number of ranks
fsdp_per_block = False          # with fsdp: each block its own unit, its weights gathered just before its forward and
                                # backward and freed after (held at once: one block's full weights), for models whose
                                # full weights do not fit one GPU; slower (FSDP's hooks run per block). False: the whole
                                # model one unit (its weights gathered once a step; gradients and optimizer state sharded)
context_parallel = 1            # under torchrun: split each row's sequence over this many consecutive ranks (2 pieces of
                                # block_size / 2N tokens each: context_parallel.py), for contexts one GPU cannot hold;
                                # data parallel (DDP) over the world_size / N groups. Same losses, same checkpoints
activation_checkpointing = False  # keep each block's input only and recompute its activations in the backward, and
                                # make the output layer + loss 8,192 tokens at a time (GPT.loss_head): far less memory
                                # at long contexts (with context_parallel: longer sequences), for about a third more
                                # compute
kernel_states = True            # the linear mixers' Triton forward hands its chunk states (W, h, Delta) to the backward
                                # instead of the backward recomputing them (kernels.TUNING['keep']): faster, for about
                                # 9 KB a token in each KDA layer at head_dim 128; False saves that memory
# system
device = ''                     # '' = cuda if available, else cpu; or 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = ''                      # '' = bfloat16 on CUDA if supported (else float16), float32 on CPU; or 'float32', 'bfloat16', 'float16' (autocast, CPU too)
compile = None                  # torch.compile the model; None = on for CUDA, off elsewhere
compile_mode = 'default'        # torch.compile's mode; 'reduce-overhead' adds CUDA graphs (small, launch-bound models)
seed = 1337
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))]
from configurator import configure, device_and_dtype, UserError
# the configurator echoes each config file and override: that goes to log.txt (below), the terminal gets a short header
with redirect_stdout(io.StringIO()) if not {'-h', '--help'} & set(sys.argv[1:]) else nullcontext() as _echo:
    configure(globals(), sys.argv[1:])
# one folder per dataset and mixer unless given: 'kda*3,softmax' -> out-pystdlib-kdax3+softmax
out_dir = out_dir or f"out-{dataset}-{mixer.replace(' ', '').replace('*', 'x').replace(',', '+')}"
# -----------------------------------------------------------------------------


COMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')


def check_settings():
    """Stop, with one line naming the setting, on anything that cannot train (GPTConfig checks the model's own)."""
    for k in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_interval', 'eval_iters', 'log_interval'):
        if globals()[k] < 1:
            raise UserError(f"{k}={globals()[k]} must be >= 1")
    for k in ('max_iters', 'warmup_iters', 'lr_decay_iters', 'min_lr', 'weight_decay', 'grad_clip'):
        if globals()[k] < 0:
            raise UserError(f"{k}={globals()[k]} must be >= 0")
    if not learning_rate > 0:
        raise UserError(f"learning_rate={learning_rate} must be > 0")
    if not 0 <= stop_at_val_acc <= 1:
        raise UserError(f"stop_at_val_acc={stop_at_val_acc} must be an accuracy in [0, 1] (0: never stop early)")
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
        raise UserError(f"beta1={beta1} and beta2={beta2} must be in [0, 1)")
    if init_from not in ('scratch', 'resume'):
        raise UserError(f"init_from must be 'scratch' or 'resume', got {init_from!r}")
    if compile not in (None, True, False):
        raise UserError(f"compile must be None (auto), True or False, got {compile!r}")
    if isinstance(context_parallel, bool) or not isinstance(context_parallel, int) or context_parallel < 1:
        raise UserError(f"context_parallel={context_parallel!r} must be an int >= 1 (the ranks that share a sequence)")
    if context_parallel > 1:
        if block_size % (2 * context_parallel) or block_size // (2 * context_parallel) < 4:
            raise UserError(f"context_parallel={context_parallel}: block_size={block_size} must split into 2 × "
                            f"{context_parallel} pieces of >= 4 tokens (a multiple of {2 * context_parallel})")
        if fsdp:
            raise UserError("context_parallel > 1 runs under DDP (each rank a full replica), not with fsdp=True")
    if fsdp_per_block and not fsdp:
        raise UserError("fsdp_per_block=True shapes FSDP's units: it needs --fsdp=True")
    if compile_mode not in COMPILE_MODES:
        raise UserError(f"compile_mode={compile_mode!r} is not one of torch.compile's modes: {', '.join(COMPILE_MODES)}")
    GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=bias, vocab_size=vocab_size,
              dropout=dropout, mixer=mixer, n_kv_head=n_kv_head, head_dim=head_dim, d_state=d_state,
              kernels=kernels or 'auto', documents=documents, eot_token=eot_token,
              kda_gate_bound=kda_gate_bound, rope_base=rope_base, tie_embeddings=tie_embeddings)  # its own checks


check_settings()
device, dtype = device_and_dtype(device, dtype)  # a device this machine lacks stops here, not deep in torch

# DDP: torchrun sets RANK, LOCAL_RANK, WORLD_SIZE
ddp = int(os.environ.get('RANK', -1)) != -1
ddp_rank = int(os.environ['RANK']) if ddp else 0
master_process = ddp_rank == 0


def prepare_out_dir():
    """Make out_dir and hold its lock (rank 0); refuse to start from scratch over an earlier run's checkpoints.
    Returns the lock file (None on the other ranks) and the lines to log once the log is open."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"out_dir {out_dir!r} is a file, not a folder: pass another --out_dir")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create out_dir {out_dir!r}: {os.strerror(e.errno).lower() if e.errno else e}: "
                        f"pass another --out_dir") from None
    if not master_process:
        return None, []
    if not os.access(out_dir, os.W_OK):
        raise UserError(f"out_dir {out_dir!r} is not writable (read-only file system or permissions): pass another --out_dir")
    lock = lock_out_dir(out_dir)  # before looking at its files: a live run there may be writing them
    earlier = [n for n in ('ckpt.pt', 'best.pt') if os.path.exists(os.path.join(out_dir, n))]
    if init_from != 'scratch' or eval_only or not earlier:
        return lock, []
    if not overwrite:
        raise UserError(f"out_dir {out_dir!r} holds an earlier run's {' and '.join(earlier)}: continue that run with "
                        f"--init_from=resume, start over with --overwrite=True (deletes it), or pass another --out_dir")
    gone = earlier + [n for n in ('log.txt',) if os.path.exists(os.path.join(out_dir, n))]
    for n in gone:
        os.remove(os.path.join(out_dir, n))
    return lock, [f"overwrite=True: deleted the earlier run's {', '.join(gone)} in {out_dir}"]


out_dir_lock, notices = prepare_out_dir()
log_path = os.path.join(out_dir, 'log.txt')

# resume: the architecture comes from the checkpoint (dropout may be changed, and kernels when given; checkpoints
# older than the kernels key run 'auto'): its values replace the config's before anything uses them
checkpoint = None
if init_from == 'resume':
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    # onto the CPU: the RNG states must stay CPU tensors (torch.set_rng_state refuses CUDA ones, so a resume on CUDA
    # failed), the model is moved below and the optimizer's state goes to its parameters' device on loading
    checkpoint = load_checkpoint(ckpt_path, map_location='cpu', need='resume')
    for k, v in checkpoint['model_args'].items():
        asked = (kernels or 'auto') if k == 'kernels' else globals().get(k)
        if k in config_keys and k != 'dropout' and not (k == 'kernels' and kernels) and asked != v:
            notices.append(f"resume: {k} = {v!r} from the checkpoint (the config asked for {asked!r})")
            globals()[k] = v
config = {k: globals()[k] for k in config_keys}  # the values in use: to the log, the checkpoint and wandb

if ddp:
    ddp_local_rank, ddp_world_size = int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE'])
    if device.startswith('cuda'):
        device = f'cuda:{ddp_local_rank}'
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend or ('nccl' if device.startswith('cuda') else 'gloo'))
    if ddp_world_size % context_parallel:
        raise UserError(f"context_parallel={context_parallel} does not divide the {ddp_world_size} ranks: run "
                        f"--nproc_per_node a multiple of it")
    # context parallelism: ranks g·N .. g·N + N − 1 share the rows of data-parallel rank g (consecutive ranks: one node)
    dp_rank, dp_world = ddp_rank // context_parallel, ddp_world_size // context_parallel
    cp = None  # this rank's place in its group (context_parallel.ContextParallel)
    if context_parallel > 1:
        from context_parallel import ContextParallel
        for g in range(dp_world):  # every rank creates every group, in the same order
            group = dist.new_group(list(range(g * context_parallel, (g + 1) * context_parallel)))
            if g == dp_rank:
                cp = ContextParallel(group, ddp_rank % context_parallel, context_parallel)
    if gradient_accumulation_steps % dp_world != 0:
        raise UserError(f"gradient_accumulation_steps={gradient_accumulation_steps} is not divisible by the {dp_world} "
                        f"data-parallel ranks: it is the global number of micro-steps, e.g. {dp_world * max(1, gradient_accumulation_steps // dp_world)}")
    gradient_accumulation_steps //= dp_world
else:
    if context_parallel > 1:
        raise UserError(f"context_parallel={context_parallel} needs torchrun: torchrun --standalone "
                        f"--nproc_per_node={context_parallel} train.py ...")
    ddp_local_rank, ddp_world_size, dp_rank, dp_world, cp = 0, 1, 0, 1, None
device_type = 'cuda' if device.startswith('cuda') else ('mps' if device.startswith('mps') else 'cpu')
if device_type == 'cuda' and ':' in device:  # e.g. --device=cuda:1 without torchrun: CUDA events, pinned copies and
    torch.cuda.set_device(device)             # Triton's launches go to the current device, which must be this one
compile = (device_type == 'cuda') if compile is None else compile
kernel_lib.TUNING['keep'] = bool(kernel_states)
# CUDA graphs (torch.compile's 'reduce-overhead' and 'max-autotune'): the compiled forward and backward replay as a few
# graph launches, so that the GPU does not wait for Python between kernels
cuda_graphs = compile and device_type == 'cuda' and compile_mode in ('reduce-overhead', 'max-autotune')


def print0(*args, terminal=True):
    """Print on rank 0 only, and append the same line to out_dir/log.txt (terminal=False: to log.txt only). The log
    first: a line seen on the terminal is in log.txt already."""
    if master_process:
        line = ' '.join(str(a) for a in args)
        try:
            with open(log_path, 'a') as f:
                f.write(line + '\n')
        except OSError as e:  # a full disk or a quota: say so, not a traceback; the checkpoints are not touched here
            raise UserError(f"cannot write {log_path}: {os.strerror(e.errno).lower() if e.errno else e}: free space "
                            f"or pass another --out_dir (the checkpoints there are as they were)") from None
        if terminal:
            print(line, flush=True)


def progress(total, desc):
    """A progress bar on stderr for work that takes a while between two log lines (an eval, the steps up to the next
    iter line): rank 0 only, only on a terminal, shown once it has run for a second, erased when done."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, leave=False, delay=1.0, dynamic_ncols=True,
                disable=not (master_process and sys.stderr.isatty()))


def duration(seconds):
    """4s, 3m05s, 2h07m: an ETA."""
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


tokens_per_iter = gradient_accumulation_steps * dp_world * batch_size * block_size
# the terminal gets a short header (model, data, out_dir, device: below, once the model exists); log.txt also gets the
# command's config files and overrides as echoed, and the full config: what reproduces the run
print0(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}")
if _echo is not None and _echo.getvalue().strip():
    print0(_echo.getvalue().rstrip('\n'), terminal=False)
for line in notices:
    print0(line)
print0(f"config: {config}", terminal=False)
print0(f"torch {torch.__version__}, device {device}, dtype {dtype}, compile {compile}, world size {ddp_world_size}")
if master_process and device_type == 'cuda':
    try:  # modded-nanogpt's habit: the hardware goes into the log
        print0(subprocess.run(['nvidia-smi'], capture_output=True, text=True).stdout, terminal=False)
    except FileNotFoundError:
        pass
print0(f"tokens per iteration: {gradient_accumulation_steps} grad accum × {dp_world} data-parallel ranks × "
       f"{batch_size} batch × {block_size} context = {tokens_per_iter:,}", terminal=False)

# SIGTERM (preemption, a scheduler's stop) and SIGINT (Ctrl-C): the step under way finishes, the ranks agree on the
# stop at the step's end (see the loop), ckpt.pt is saved and the run exits with 128 + the signal's number. A second
# signal, or one before the first step has finished (nothing to save), exits at once.
stop_requested = 0  # the signal this process got (set by on_signal)
stop_signal = 0     # the one the ranks agreed on in the last step read (the largest over ranks)


def on_signal(signum, frame):
    global stop_requested
    if stop_requested or local_iter_num == 0:
        name = signal.Signals(signum).name
        what = "again" if stop_requested else "before the first step"
        # os.write, not print: a print here could land inside one the loop is making and raise
        os.write(2, f"{os.path.basename(sys.argv[0])}: {name} {what}: exiting now without saving\n".encode())
        for n in ('ckpt.pt.tmp', 'best.pt.tmp') if master_process else ():  # a save under way: the previous
            try:                                                                 # files stay, the temp goes
                os.remove(os.path.join(out_dir, n))
            except OSError:
                pass
        os._exit(128 + signum)
    stop_requested = signum
    if master_process:
        os.write(2, f"{os.path.basename(sys.argv[0])}: {signal.Signals(signum).name}: finishing this step, then saving "
                    f"(again: exit at once)\n".encode())


local_iter_num = 0
signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)

torch.manual_seed(seed + ddp_rank)
random.seed(seed + ddp_rank)
np.random.seed(seed + ddp_rank)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
ctx = nullcontext() if ptdtype == torch.float32 else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

# data: each rank reads its own slice of the same sequential stream (shards), or of the task's generated sequences
task = None
try:
    if dataset == 'mqar':
        task = MQAR(task_vocab_size, block_size, mqar_num_pairs)
    elif dataset == 'statetrack':
        task = StateTracking(task_vocab_size, block_size, statetrack_num_vars, statetrack_num_assignments, statetrack_num_queries)
    elif dataset == 'needle':
        task = Needle(task_vocab_size, block_size, needle_num_needles, needle_value_len)
except ValueError as e:  # the task's own check of its settings
    raise UserError(f"dataset={dataset!r}: {e}") from None
if task is not None:
    vocab_size = task.vocab_size  # the model's vocabulary is the task's
    print0(f"task {dataset}: vocab_size {vocab_size}, sequences of {block_size} tokens, loss and accuracy on answers only")
data_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', dataset)


def make_loader(split):
    if task is not None:
        return TaskLoader(task, split, batch_size, seed, dp_rank, dp_world)
    return ShardLoader(data_dir, split, batch_size, block_size, dp_rank, dp_world, vocab_size=model_args['vocab_size'])


def fetch(loader):
    """The loader's next batch on the device; under context parallelism this rank's two pieces of each row."""
    X, Y = loader.next_batch()
    if cp is not None:
        X, Y = cp.take(X), cp.take(Y)
    if device_type == 'cuda':  # pinned, so that the copy waits for nothing (from pageable memory it may wait for the
        X, Y = X.pin_memory(), Y.pin_memory()  # GPU's queue, which the host is ahead of)
    return X.to(device, non_blocking=True), Y.to(device, non_blocking=True)


# model
iter_num = 0
best_val_loss = 1e9
model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=bias,
                  vocab_size=vocab_size, dropout=dropout, mixer=mixer, n_kv_head=n_kv_head,
                  head_dim=head_dim, d_state=d_state, kernels=kernels or 'auto', documents=documents, eot_token=eot_token,
                  kda_gate_bound=kda_gate_bound, rope_base=rope_base, tie_embeddings=tie_embeddings)
if checkpoint is not None:
    print0(f"Resuming training from {ckpt_path} (iter {checkpoint['iter_num']})")
    model = build_model(checkpoint, ckpt_path, model_args)
    iter_num = checkpoint['iter_num']
    best_val_loss = checkpoint['best_val_loss']
else:
    model = GPT(GPTConfig(**model_args))
print0(model.describe(), terminal=False)  # per mixer; the header below says the total
n_params, mixers = model.get_num_params(), model.mixers
model.to(device)
if cp is not None:
    model.set_context_parallel(cp)
model.recompute = activation_checkpointing
model.loss_only = task is None  # the eval's loss without its whole [tokens, vocab] logits (they count only for a task)
sharded = ddp and fsdp
if fsdp and not ddp:
    print0("fsdp=True without torchrun: one process holds the whole model, nothing to shard")
if sharded:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import distribute_tensor
    # every rank starts from rank 0's weights, as DDP makes sure on wrapping (each rank seeds its RNG with seed + rank,
    # so their inits differ, and a shard of each would make a model nobody initialised)
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t, src=0)
    # Weights and gradients stay fp32 (autocast casts per use, as under DDP: a bf16 MixedPrecisionPolicy hands the
    # kernels bf16 decay rates and conv weights, which the short conv's Triton backward does not take: notes/perf.md,
    # issue 43). Forwards are compiled before they are wrapped (torchtitan's order), so FSDP's gather and free hooks
    # run around the compiled code, not inside it.
    if fsdp_per_block:  # one graph per block, FSDP's gathers between them; the output layer and the loss on their own
        for block in model.transformer.h:
            if compile:
                block.forward = torch.compile(block.forward, mode=compile_mode)
            fully_shard(block)
        if compile:
            model.loss_head = torch.compile(model.loss_head, mode=compile_mode)
    elif compile:  # the whole model one unit: one graph, as under DDP (per block, FSDP's hooks on every block's forward
        model.forward = torch.compile(model.forward, mode=compile_mode)  # and backward cost the host 2x: perf.md, 43)
    fully_shard(model)  # the rest (embedding tied to lm_head, final norm), or everything
train_loader, val_loader, eval_train_loader = make_loader('train'), make_loader('val'), make_loader('train')

scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
with redirect_stdout(io.StringIO()) as _echo:  # its parameter counts: to log.txt
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
print0(_echo.getvalue().rstrip('\n'), terminal=False)
# the optimizer's parameters by name, in its order: a checkpoint's optimizer state is plain optimizer.state_dict()'s
# (parameter i = the i-th of these)
param_names = [{p: n for n, p in model.named_parameters()}[p] for g in optimizer.param_groups for p in g['params']]
if sharded:
    # AdamW steps each rank's shards as plain tensors (the DTensors' local parts, the same memory): stepping the
    # DTensors themselves cost the host ~5x DDP's optimizer step, per op and tensor (notes/perf.md, issue 43). Each
    # step hands the local gradients over; checkpoints gather and split the state (full_state, below).
    dtensors = [p for g in optimizer.param_groups for p in g['params']]
    with torch.no_grad():  # to_local() without autograd: a leaf on the DTensor's own memory
        optimizer = torch.optim.AdamW([dict(g, params=[p.to_local() for p in g['params']]) for g in optimizer.param_groups],
                                      fused=optimizer.defaults.get('fused'))
    shards = [p for g in optimizer.param_groups for p in g['params']]


def clip_shards():
    """FSDP: the norm of all gradients is the root of the sum over ranks of each rank's squared norm of its shards'.
    Clips them to grad_clip (if set) -> the norm before clipping (a tensor)."""
    with torch.no_grad():
        grads = [sh.grad for sh in shards if sh.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads).float() ** 2
        dist.all_reduce(norm)
        norm = norm.sqrt()
        if grad_clip:
            torch.nn.utils.clip_grads_with_norm_(shards, grad_clip, norm)  # scales each shard's .grad
        return norm


def full_state():
    """(model state dict, optimizer state dict) as one process holds them; under FSDP gathered from every rank onto
    rank 0's CPU (a collective: every rank calls it; the other ranks get empty dicts)."""
    if not sharded:
        return raw_model.state_dict(), optimizer.state_dict()
    model_sd = get_model_state_dict(raw_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    osd = optimizer.state_dict()  # one process's indices; the parameter-shaped state (exp_avg, ...) gathered whole
    whole = lambda v, p: (DTensor.from_local(v, p.device_mesh, p.placements, shape=p.shape, stride=p.stride(),
                                             run_check=False).full_tensor().cpu() if v.dim() > 0 else v.cpu())
    osd['state'] = {i: {k: whole(v, dtensors[i]) for k, v in st.items()} for i, st in osd['state'].items()}
    return (model_sd, osd) if master_process else ({}, {})


if checkpoint is not None:
    if sharded:  # every rank has the full state; each keeps its shard of the parameter-shaped tensors
        osd = checkpoint['optimizer']
        part = lambda v, p: (distribute_tensor(v.to(device), p.device_mesh, p.placements, src_data_rank=None).to_local()
                             if v.dim() > 0 else v)
        optimizer.load_state_dict(dict(osd, state={i: {k: part(v, dtensors[i]) for k, v in st.items()}
                                                   for i, st in osd['state'].items()}))
    else:
        optimizer.load_state_dict(checkpoint['optimizer'])
    # the loaded param groups carry the old hyperparameters; this run's config wins (lr is set every step)
    for group, wd in zip(optimizer.param_groups, (weight_decay, 0.0)):
        group['weight_decay'], group['betas'] = wd, (beta1, beta2)
        # and this machine's AdamW (fused on CUDA and CPU: `lagged` below needs it), not the one that saved it
        group['fused'], group['foreach'] = optimizer.defaults.get('fused'), optimizer.defaults.get('foreach')
        for p in group['params'] if group['fused'] else ():  # fused AdamW counts its steps on the parameter's device
            if 'step' in optimizer.state.get(p, {}):
                optimizer.state[p]['step'] = torch.as_tensor(optimizer.state[p]['step'], dtype=torch.float32,
                                                             device=p.device)
    if 'scaler' in checkpoint:
        scaler.load_state_dict(checkpoint['scaler'])
    train_loader.load_state_dict(checkpoint['train_loader'][ddp_rank] if ddp_rank < len(checkpoint['train_loader']) else checkpoint['train_loader'][0])

raw_model = model
if cuda_graphs and not sharded:
    # a graph's outputs live in memory that its next replay overwrites: a gradient autograd stored as .grad (what it
    # does when .grad is None) would be overwritten by the next micro-step's backward. Gradients that exist before the
    # first backward are added into in place, and zero_grad(set_to_none=False) keeps them.
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
if compile:
    print0(f"compiling the model{'' if compile_mode == 'default' else f' ({compile_mode})'}... (takes a minute)")
    if not sharded:  # (FSDP: each block, above)
        model = torch.compile(model, mode=compile_mode)
if ddp and not sharded:
    model = DDP(model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None)


@torch.no_grad()
def estimate_loss():
    """Mean loss over the same first eval_iters batches of each split, averaged over ranks; for a task
    also the answer accuracy (out['train_acc'], out['val_acc']): the fraction of answers whose argmax is right."""
    out = {}
    model.eval()
    bar = progress(2 * eval_iters, f"eval at step {iter_num}")
    for split, loader in (('train', eval_train_loader), ('val', val_loader)):
        loader.reset()
        losses = torch.zeros(eval_iters, device=device)
        answers = torch.zeros(2, device=device)  # correct, total
        for k in range(eval_iters):
            bar.update()
            X, Y = fetch(loader)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
            if task is not None:
                answers += torch.stack(count_correct(logits, Y))
        mean = losses.mean()
        if ddp:
            dist.all_reduce(mean, op=dist.ReduceOp.SUM)  # SUM then divide: gloo has no AVG
            mean = mean / ddp_world_size
            dist.all_reduce(answers, op=dist.ReduceOp.SUM)
        out[split] = mean.item()
        if task is not None:
            out[f'{split}_acc'] = (answers[0] / answers[1]).item()
    bar.close()
    model.train()
    return out


def get_lr(it):
    """Linear warmup for warmup_iters steps, cosine decay to min_lr at lr_decay_iters, then min_lr."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:  # (>=: no division by zero when lr_decay_iters == warmup_iters)
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 → 0
    return min_lr + coeff * (learning_rate - min_lr)


def diverged(what, at=None):
    """The error that stops a diverged run (at step `at`, default iter_num), raised before anything non-finite
    reaches a checkpoint (the weights: see `lagged` below)."""
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    kept = f"{ckpt_path} keeps the last good state" if os.path.exists(ckpt_path) else "no checkpoint was written"
    clip = f"lower grad_clip (now {grad_clip:g})" if grad_clip > 0 else "set grad_clip > 0 (now 0: off), e.g. 1.0"
    at = iter_num if at is None else at
    return UserError(f"training diverged at iter {at}: {what}; nothing was saved ({kept}): lower learning_rate "
                     f"(now {learning_rate:g}) or {clip}")


def save(val_loss, improved=False, why=''):
    """Write ckpt.pt (and best.pt when improved) of the state at the top of iteration iter_num: the weights after
    iter_num steps, every rank's data position and RNG states, so that a resume continues exactly. A collective:
    every rank calls it."""
    global saved_iter
    loader_states, rng_states = [train_loader_state], [rng_state(device_type, device)]
    if ddp:
        loader_states, rng_states = [None] * ddp_world_size, [None] * ddp_world_size
        dist.all_gather_object(loader_states, train_loader_state)
        dist.all_gather_object(rng_states, rng_state(device_type, device))
    model_sd, optimizer_sd = full_state()
    if master_process:
        ckpt = {'model': model_sd, 'optimizer': optimizer_sd, 'model_args': model_args,
                'iter_num': iter_num, 'val_loss': val_loss, 'best_val_loss': best_val_loss, 'config': config,
                'train_loader': loader_states, 'rng': rng_states, 'scaler': scaler.state_dict()}
        print0(f"saving checkpoint to {out_dir}{why}" + (" (best so far, also best.pt)" if improved else ""))
        save_checkpoint(ckpt, os.path.join(out_dir, 'ckpt.pt'), best=os.path.join(out_dir, 'best.pt') if improved else None)
    saved_iter = iter_num


if wandb_log and master_process:
    try:
        import wandb  # lazily: only users who log need it installed
    except ImportError:
        raise UserError("wandb_log=True but wandb is not installed: pip install wandb, or --wandb_log=False") from None
    # a setting given in the config wins; else wandb's environment variable (WANDB_MODE=offline needs no API key)
    try:
        wandb.init(project=wandb_project or os.environ.get('WANDB_PROJECT') or 'linear-gpt',
                   name=wandb_run_name or os.environ.get('WANDB_NAME') or os.path.basename(os.path.abspath(out_dir)),
                   mode=wandb_mode or os.environ.get('WANDB_MODE') or 'online', config=config)
    except Exception as e:  # no API key, no network, a bad mode: one line, not wandb's traceback
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"wandb.init failed: {why} (or log offline: WANDB_MODE=offline or --wandb_mode=offline; "
                        f"or --wandb_log=False)") from None

peak_flops = gpu_peak_flops(torch.cuda.get_device_name(device)) if device_type == 'cuda' else None
flops_per_iter = raw_model.flops_per_token(block_size) * tokens_per_iter
# restore the RNG last: model construction above consumed random numbers on both paths
if checkpoint is not None and 'rng' in checkpoint:
    set_rng_state(checkpoint['rng'][min(ddp_rank, len(checkpoint['rng']) - 1)], device_type)
if checkpoint is not None and iter_num >= max_iters and not eval_only:
    print0(f"nothing to train: {ckpt_path} is at iter {iter_num}, max_iters={max_iters} (the run ended there): "
           f"raise --max_iters to train further")
    sys.exit(0)
checkpoint = None  # free memory

# the header: what trains on what, and where it goes (log.txt also has the full config and the model per mixer)
print0(f"model: {' '.join(mixers)} ({n_layer} layers × {n_embd}), {n_params / 1e6:.2f}M parameters")
print0(f"data: {dataset}, {gradient_accumulation_steps} grad accum × {dp_world} ranks × {batch_size} batch × "
       f"{block_size} context = {tokens_per_iter:,} tokens per step, " +
       (f"each sequence split over {context_parallel} ranks, " if context_parallel > 1 else "") +
       ("activations recomputed, " if raw_model.recompute else "") +
       ("kernel states recomputed, " if not kernel_states else "") +
       (f"steps {iter_num:,} to {max_iters:,}" if iter_num else f"{max_iters:,} steps"))
print0(f"out_dir: {out_dir} (its log.txt has the full config)")
if decay_lr and max_iters < lr_decay_iters and not eval_only:  # a short run that would end at a high learning rate
    print0(f"notice: max_iters={max_iters} < lr_decay_iters={lr_decay_iters}: the run ends at lr "
           f"{get_lr(max(max_iters - 1, 0)):.2e}, not min_lr {min_lr:.2e} (--lr_decay_iters={max_iters} decays it fully)")
if max_iters < eval_interval and iter_num == 0 and not eval_only:
    print0(f"notice: max_iters={max_iters} < eval_interval={eval_interval}: evaluated only at step 0 and the end, "
           f"step {max_iters}")

# training loop. Iteration iter_num evaluates (every eval_interval steps, and at max_iters: the weights the run ends
# with), then makes optimizer step iter_num; the run makes max_iters steps (0 .. max_iters - 1) and ends at the eval
# of step max_iters, saved in ckpt.pt
train_loader_state = train_loader.state_dict()  # position of the batch about to be fetched
X, Y = fetch(train_loader)
running_mfu = -1.0
start_iter = iter_num
saved_iter = iter_num if init_from == 'resume' else None  # the iteration ckpt.pt holds, once this run saved or resumed it
last_val = None                   # the last eval's val loss
first_loss, warn_at = None, None  # a loss past warn_at (2x the run's first, then 2x the last warned) is warned about
skipped = 0                       # consecutive steps the fp16 grad scaler skipped (inf/nan gradients)
smooth = 0.0                      # exponential moving average of the step loss (debiased when printed: / (1 - 0.9^n))
time_sum, time_n = 0.0, 0         # this run's step times after its first (which may compile), evals excluded: the ETA
eval_time = 0.0                   # the last eval's time (s): the ETA counts the evals to come too
bar = None                        # the progress bar of the steps up to the next iter line (log_interval > 1, terminal)
# The host reads each step's numbers (loss, gradient norm, stop signal) one step late: it queues step N + 1's kernels
# before it waits for step N's numbers, so the GPU does not idle at every step's boundary while the host launches
# the optimizer and the next forward (what a sync there cost: notes/perf.md 2026-11-27 (51)). Nothing
# non-finite reaches the weights meanwhile: fused AdamW skips, on the GPU, a step whose loss or gradient norm is
# not finite (found_inf); the host stops the run when it reads that step, before any eval or save. With the fp16
# grad scaler (its own skipping) or an optimizer that cannot skip, the check stays before each step (one sync).
lagged = bool(optimizer.defaults.get('fused')) and not scaler.is_enabled()
pending = None                    # lagged: (iter, (numbers on their way, its end), t0, start event) of the last step
last_end = None                   # lagged on CUDA: the GPU event that ended the last reported step (None after an eval)


def step_numbers(step_loss, grad_norm):
    """[mean loss, gradient norm, stop signal, peak GiB, non-finite] of a step as one tensor on the device, without a
    sync. The last three are the largest over the ranks: every rank stops at the same step (under torchrun the ranks
    get a signal at different moments) and skips the same non-finite steps; the peak is the most any rank's GPU has
    held so far (allocated tensors, not the cache)."""
    if context_parallel > 1:  # each rank's loss is its share (context_parallel.loss): their mean is the step's loss
        dist.all_reduce(step_loss)
        step_loss = step_loss / ddp_world_size
    stats = torch.stack([step_loss.float(), grad_norm.float()])
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device_type == 'cuda' else 0.0
    flags = torch.stack([torch.full((), float(stop_requested), device=device), torch.full((), peak, device=device),
                         (~torch.isfinite(stats)).any().float()])  # (torch.full: a device fill, no host copy)
    if ddp:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return torch.cat([stats, flags])


def to_host(numbers):
    """Start the copy of a step's numbers to the host -> (host tensor, the step's end: on CUDA an event to wait on,
    nothing waits now; elsewhere the step ran as it was called, and its end is now)."""
    if device_type != 'cuda':
        return numbers, time.time()
    host = torch.empty(numbers.shape, dtype=numbers.dtype, pin_memory=True)
    host.copy_(numbers, non_blocking=True)
    done = torch.cuda.Event(enable_timing=True)  # also the step's end on the GPU's timeline (settle)
    done.record()
    return host, done


def settle():
    """Lagged: wait for the pending step's numbers, check and report them. On CUDA the step's time is read off the
    GPU's timeline, from the end of the step before it (or, after an eval or at the start, from this step's start) to
    its end: the host sees a step end late whenever it is busy queuing the next one, so its own clock gave each step
    roughly the right time but the last one too little. Elsewhere (a CPU runs each step as it is called) from the
    step's start to its end."""
    global pending, last_end
    n, (host, done), t0, start = pending
    pending = None
    if isinstance(done, float):
        step_dt = done - t0
    else:
        done.synchronize()
        step_dt = (last_end if last_end is not None else start).elapsed_time(done) / 1000
        last_end = done
    values = host.tolist()
    check(n, values)
    report(n, values, t0, step_dt)


def check(n, values):
    """Step n's numbers: stop a diverged run (a non-finite loss or gradient norm on any rank; under fp16, 16 skipped
    steps in a row: the scale / 65536), warn about a growing loss."""
    global skipped, first_loss, warn_at
    lossf, normf, _, _, bad = values
    skipped = skipped + 1 if scaler.is_enabled() and not math.isfinite(normf) else 0
    if not math.isfinite(lossf) or (bad and not scaler.is_enabled()) or (not math.isfinite(normf) and skipped > 16):
        raise diverged(f"loss {lossf:.4g}, gradient norm {normf:.4g}", n)
    if first_loss is None:
        first_loss, warn_at = lossf, 2 * lossf
    elif lossf > warn_at > 0:
        print0(f"warning: iter {n}: loss {lossf:.4f} is {lossf / first_loss:.1f}x this run's first ({first_loss:.4f}): "
               f"the run may be diverging (lower learning_rate, or set grad_clip)")
        warn_at = 2 * lossf  # the next warning when it doubles again


def report(n, values, t0, step_dt=None):
    """Step n's iter line (every log_interval steps; a progress bar between them) and the stop signal the ranks
    agreed on. Its time: step_dt where given (settle), else from its start to when the host saw it end."""
    global time_sum, time_n, local_iter_num, smooth, running_mfu, bar, stop_signal
    lossf, _, stopf, peak, _ = values
    now = time.time()
    dt = now - t0 if step_dt is None else step_dt
    time_sum, time_n = (time_sum + dt, time_n + 1) if local_iter_num > 0 else (0.0, 0)
    local_iter_num += 1
    smooth = 0.9 * smooth + 0.1 * lossf
    if n % log_interval == 0 or n == max_iters - 1:
        if bar is not None:
            bar.close()
            bar = None
        # ETA: the steps left at this run's mean step time and the evals left at the last one's time
        mean_dt = time_sum / time_n if time_n else dt
        evals_left = (max_iters - 1) // eval_interval - n // eval_interval + 1  # multiples, then the last step
        eta = (max_iters - n - 1) * mean_dt + evals_left * eval_time
        line = (f"iter {n}/{max_iters}: loss {lossf:.4f}, smooth {smooth / (1 - 0.9 ** local_iter_num):.4f}, "
                f"time {dt * 1000:.2f}ms, tok/s {tokens_per_iter / dt:,.0f}, "
                f"lr {get_lr(n) if decay_lr else learning_rate:.2e}")
        if peak_flops and local_iter_num > 5:  # let the first (compiling) iterations pass
            mfu = flops_per_iter / dt / (peak_flops * ddp_world_size)
            running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
            line += f", mfu {running_mfu * 100:.2f}%"
        if device_type == 'cuda':
            line += f", peak {peak:.1f} GiB"
        print0(line + f", eta {duration(eta)}")
    else:  # no iter line for this step: a bar up to the next one (on a terminal, once it has taken a second)
        if bar is None:
            next_line = min((n // log_interval + 1) * log_interval, max_iters - 1)
            bar = progress(next_line - n, f"steps to iter {next_line}")
        bar.update()
    stop_signal = int(stopf)

while True:
    last_step = iter_num >= max_iters
    evaluating = ((iter_num % eval_interval == 0 or last_step or eval_only)
                  and (iter_num > start_iter or iter_num == 0 or eval_only))
    if pending is not None and (stop_signal or evaluating or last_step):
        settle()  # the last step's numbers before anything is evaluated or saved (a diverged run stops here)
    if stop_signal and iter_num < max_iters:  # every rank sees the same value (agreed in the last step read)
        name = signal.Signals(stop_signal).name  # (at max_iters: the final eval and save below, as usual)
        if bar is not None:
            bar.close()
        if saved_iter != iter_num:
            save(last_val, why=f" ({name})")
        print0(f"stopped by {name} at iter {iter_num}; resume with --init_from=resume")
        if wandb_log and master_process:
            wandb.finish()
        if ddp:
            dist.destroy_process_group()
        sys.exit(128 + stop_signal)
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr

    if evaluating:
        last_end = None  # the next step's time starts at its own start, not at the end of the step before the eval
        if bar is not None:
            bar.close()
            bar = None
        t_eval = time.time()
        losses = estimate_loss()
        eval_time = time.time() - t_eval
        line = f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
        metrics = {'iter': iter_num, 'train/loss': losses['train'], 'val/loss': losses['val'], 'lr': lr}
        if running_mfu > 0:  # measured (CUDA, after the first steps): no placeholder value otherwise
            metrics['mfu'] = running_mfu * 100
        if task is not None:
            line += f", train acc {losses['train_acc']:.4f}, val acc {losses['val_acc']:.4f}"
            metrics.update({'train/acc': losses['train_acc'], 'val/acc': losses['val_acc']})
        print0(line + f" (eval {eval_time:.2f}s)")
        if not (math.isfinite(losses['train']) and math.isfinite(losses['val'])):
            raise diverged('a non-finite eval loss')
        if wandb_log and master_process:
            wandb.log(metrics)
        improved = losses['val'] < best_val_loss
        best_val_loss, last_val = min(best_val_loss, losses['val']), losses['val']
        if iter_num > 0 and not eval_only and (improved or always_save_checkpoint):
            save(losses['val'], improved)  # every rank takes this branch (the losses are averaged over ranks)
        if task is not None and stop_at_val_acc > 0 and iter_num > 0 and losses['val_acc'] >= stop_at_val_acc:
            # every rank sees the same val accuracy (summed over ranks above), so all stop here together
            print0(f"stopping at step {iter_num}: val acc {losses['val_acc']:.4f} >= stop_at_val_acc {stop_at_val_acc}")
            break
    if eval_only or last_step:
        break

    # forward/backward with gradient accumulation; DDP and FSDP sync gradients on the last micro-step only
    t0 = time.time()  # the step's time, without the eval above
    start = None
    if lagged and device_type == 'cuda':
        start = torch.cuda.Event(enable_timing=True)  # where this step begins on the GPU's timeline (settle)
        start.record()
    step_loss = torch.zeros((), device=device)  # the mean loss over the micro-steps
    for micro_step in range(gradient_accumulation_steps):
        if sharded:
            raw_model.set_requires_gradient_sync(micro_step == gradient_accumulation_steps - 1)
            if not fsdp_per_block:  # keep the gathered weights between micro-steps: one all-gather a step
                raw_model.set_reshard_after_backward(micro_step == gradient_accumulation_steps - 1)
        elif ddp:
            model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps  # the gradient is a mean over micro-steps
        # prefetch the next batch while the GPU works on this one
        train_loader_state = train_loader.state_dict()
        X, Y = fetch(train_loader)
        scaler.scale(loss).backward()
        step_loss += loss.detach()
    if sharded:  # each shard's gradient is its DTensor gradient's local part
        with torch.no_grad():
            for p, sh in zip(dtensors, shards):
                sh.grad = None if p.grad is None else p.grad.to_local()
    scaler.unscale_(optimizer)  # a no-op without the fp16 scaler
    if sharded:
        grad_norm = clip_shards()
    else:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf)  # inf: measure, not clip
    # the step's numbers for the host: mean loss, gradient norm, and over the ranks the stop signal, the peak memory
    # and whether any rank's loss or gradient norm is non-finite (step_numbers)
    numbers = step_numbers(step_loss, grad_norm)
    if lagged:  # the optimizer skips a non-finite step by itself, on the GPU; the host reads the numbers a step late
        optimizer.found_inf = numbers[4]
    else:  # every step, before the weights change: one CPU-GPU sync
        values = numbers.tolist()
        check(iter_num, values)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=not cuda_graphs)  # under CUDA graphs the gradients stay allocated (above)
    if sharded:
        raw_model.zero_grad(set_to_none=True)  # the DTensors' gradients (the shards' were their local parts)
        if not fsdp_per_block:  # gather the new weights now, queued behind the optimizer step on every rank, not at
            raw_model.unshard(async_op=True)  # the next forward, where each rank's host arrives when it does
    if lagged:  # the previous step's numbers now, while the GPU works through this step's queued kernels
        if pending is not None:
            settle()
        pending = (iter_num, to_host(numbers), t0, start)
    else:
        report(iter_num, values, t0)
    iter_num += 1

if not eval_only and saved_iter != iter_num:
    save(last_val, why=f" (end of run, iter {iter_num})")  # the last steps since the last eval are not lost
if wandb_log and master_process:
    wandb.finish()
if ddp:
    dist.destroy_process_group()
