"""
Train a GPT whose token mixer is chosen per layer, on one process or several (torchrun: DDP, FSDP, context parallel).

$ python train.py config/pystdlib.py [--mixer=gdn]         # CPU, a few minutes: the 3:1 KDA:softmax hybrid, 4 x 128
$ python train.py config/mqar.py --mixer=kda               # a synthetic recall task (tasks.py): loss and accuracy
$ python train.py config/owt.py --mixer=kda                # GPT-2 small class on OpenWebText, one GPU
$ torchrun --standalone --nproc_per_node=8 train.py config/kda_hybrid.py [--fsdp=True]

Every setting below can be overridden (`--batch_size=8`; `--help` lists them). The loss is the mean next-token
cross-entropy in nats (tasks: of the answers only). The run makes max_iters steps; its end is always evaluated and
saved. Safety lives in checkpoint.py: one run per out_dir; a run from scratch never replaces an earlier run's
checkpoints; SIGTERM or Ctrl-C saves and exits; nothing non-finite reaches the weights or a checkpoint.
"""
import io
import math
import os
import random
import shutil
import subprocess
import sys
import time
from contextlib import nullcontext, redirect_stdout
from dataclasses import fields

import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback
import numpy as np
import torch

import optim
from kernels import TUNING
from model import GPTConfig, GPT, gpu_peak_flops
from checkpoint import (Divergence, OutDir, StopSignals, build_model, load_checkpoint, model_settings, rng_state,
                        save_checkpoint, set_rng_state)
from configurator import check_training, configure, device_and_dtype
from dataloader import ShardLoader
from parallel import Parallel
from tasks import TaskLoader, count_correct, from_settings

# -----------------------------------------------------------------------------
# I/O
out_dir = ''                    # ckpt.pt (latest), best.pt (lowest val loss), log.txt; '' = out-<dataset>-<mixer>
eval_interval = 2000            # evaluate (and checkpoint) every this many iterations, and at max_iters
log_interval = 1                # an iter line every this many iterations
eval_iters = 200                # batches per split in an eval
eval_only = False               # evaluate once and exit
always_save_checkpoint = True   # save ckpt.pt at every eval, not only when val loss improves (best.pt: only then)
save_interval = 0               # 0: those saves at every eval; N: only at the evals of steps divisible by N, and the last
stop_at_val_acc = 0.0           # tasks: stop after the first eval whose val accuracy reaches this (0: never)
init_from = 'scratch'           # 'scratch' or 'resume' (continue from out_dir/ckpt.pt)
overwrite = False               # scratch over an earlier run's ckpt.pt/best.pt: True deletes them and its log.txt
wandb_log = False               # log to wandb; the three below: '' = $WANDB_PROJECT, $WANDB_NAME, $WANDB_MODE
wandb_project = ''              # else 'linear-gpt'
wandb_run_name = ''             # else out_dir's name
wandb_mode = ''                 # else 'online'; 'offline' writes runs locally for `wandb sync` later
# data
dataset = 'openwebtext'         # data/<dataset>/ holding <dataset>_{train,val}_*.bin shards, or a task: mqar, statetrack, needle
gradient_accumulation_steps = 5 * 8  # GLOBAL micro-steps per optimizer step, divided among the data-parallel ranks
batch_size = 12                 # micro-batch size per rank
block_size = 1024               # training context length
# synthetic tasks (tasks.py): block_size is the sequence length
task_vocab_size = 8192          # tokens of the task; the model's vocab_size is set to it (Zoology's MQAR: 8192)
mqar_num_pairs = 16             # MQAR key-value pairs per sequence, then as many queries (needs 4x <= block_size+1)
statetrack_num_vars = 16        # state tracking: distinct variables
statetrack_num_assignments = 64 # assignments per sequence
statetrack_num_queries = 16     # queries per sequence, interleaved (2*assignments + 3*queries <= block_size+1)
needle_num_needles = 4          # needle: needles in the haystack, one asked for and the rest distractors
needle_value_len = 2            # needle: value tokens per needle
# model (model.GPTConfig's fields: what a checkpoint records and a resume takes from it)
n_layer = 12
n_head = 12
n_embd = 768
n_kv_head = 0                   # softmax GQA K/V heads; 0 = n_head
mixer = 'softmax'               # per-layer pattern: 'kda' | 'kda*3,softmax' | one name per layer ...
head_dim = 64                   # linear mixers' per-head key dim (Mamba2: headdim); 128 for KDA at GPT-2 size
d_state = 128                   # Mamba2 state size N per head
rope_base = 10000.0             # rotary base of softmax and RetNet
tie_embeddings = True           # input embedding = output layer's weight
dropout = 0.0                   # 0 for pretraining, 0.1+ for finetuning
bias = False                    # bias in Linear layers
vocab_size = 50304              # GPT-2 BPE 50257 padded to a multiple of 64
kernels = ''                    # kernels.py's path: auto (Triton on CUDA), torch, recurrent, triton; '' = auto or the resumed
documents = False               # each EOT-separated document of a row is its own sequence (model.GPT.documents)
eot_token = 50256               # with documents: the token that starts a document (GPT-2's <|endoftext|>)
kda_gate_bound = 0.0            # KDA's gate: 0 = the released one; in [-5, 0): bounded at that value (fla's safe gate)
# optimizer (model.GPT.configure_optimizers, optim.py)
optimizer = 'adamw'             # 'adamw', or 'muon': Muon for the blocks' weight matrices, AdamW for the rest, one lr
learning_rate = 6e-4            # max learning rate
max_iters = 600000              # total optimizer steps
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0                 # clip gradients at this norm, or 0.0 to disable
# learning rate schedule: linear warmup, then cosine decay to min_lr (or wsd: constant, then a linear decay)
decay_lr = True
lr_schedule = 'cosine'          # 'cosine' (to min_lr at lr_decay_iters) or 'wsd' (warmup-stable-decay)
warmup_iters = 2000
lr_decay_iters = 600000         # ~= max_iters per Chinchilla (cosine)
decay_fraction = 0.2            # wsd: the last this fraction of max_iters decays linearly to min_lr
min_lr = 6e-5                   # ~= learning_rate / 10
# distributed (parallel.py)
backend = ''                    # '' = nccl on CUDA, gloo on CPU
fsdp = False                    # under torchrun: shard weights, gradients and optimizer state (FSDP2), not DDP replicas
fsdp_per_block = False          # with fsdp: each block its own unit (for weights that do not fit one GPU; slower)
context_parallel = 1            # under torchrun: split each row's sequence over this many consecutive ranks
activation_checkpointing = False  # recompute each block's activations in the backward: far less memory, ~1/3 more compute
kernel_states = True            # the Triton forward hands its chunk states to the backward: faster, ~9 KB/token per KDA layer
# system
device = ''                     # '' = cuda if available, else cpu; or 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = ''                      # '' = bfloat16 on CUDA if supported (else float16), float32 elsewhere
compile = None                  # torch.compile the model; None = on for CUDA, off elsewhere
compile_mode = 'default'        # torch.compile's mode; 'reduce-overhead' adds CUDA graphs
seed = 1337
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))]
# the configurator echoes each config file and override: to log.txt (below); the terminal gets a short header
with redirect_stdout(io.StringIO()) if not {'-h', '--help'} & set(sys.argv[1:]) else nullcontext() as _echo:
    configure(globals(), sys.argv[1:])
out_dir = out_dir or f"out-{dataset}-{mixer.replace(' ', '').replace('*', 'x').replace(',', '+')}"
model_keys = [f.name for f in fields(GPTConfig)]  # the settings that are the model's shape
check_training({k: globals()[k] for k in config_keys})  # one line naming any setting that cannot train
GPTConfig(**dict({k: globals()[k] for k in model_keys}, kernels=kernels or 'auto'))  # the model's own checks
device, dtype = device_and_dtype(device, dtype)  # a device this machine lacks stops here, not deep in torch

# -----------------------------------------------------------------------------
# set-up: ranks, resume, data, then out_dir (a run refused for its checkpoint or its data leaves no trace)
par = Parallel(device, backend, context_parallel)
device, master = par.device, par.master
device_type = 'cuda' if device.startswith('cuda') else ('mps' if device.startswith('mps') else 'cpu')
ckpt_path, checkpoint, notices = os.path.join(out_dir, 'ckpt.pt'), None, []
if init_from == 'resume' or (eval_only and os.path.exists(ckpt_path)):  # eval_only: the run's weights, if any
    checkpoint = load_checkpoint(ckpt_path, map_location='cpu', need='resume')  # CPU: RNG states must stay there
    globals().update(model_settings(checkpoint, ckpt_path, {k: globals()[k] for k in model_keys}, notices))
task = from_settings({k: globals()[k] for k in config_keys})
vocab_size = task.vocab_size if task else vocab_size  # a task's vocabulary is the model's
config = {k: globals()[k] for k in config_keys}  # the values in use: to the log, the checkpoint and wandb
model_args = dict({k: config[k] for k in model_keys}, kernels=kernels or 'auto')
grad_accum = par.micro_steps(gradient_accumulation_steps)  # this rank's share of the micro-steps
compile = (device_type == 'cuda') if compile is None else compile
TUNING['keep'] = bool(kernel_states)
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
splits = ('train', 'val', 'train')  # the training stream, and the two that evals read; each rank its own slice
if task is not None:
    loaders = [TaskLoader(task, split, batch_size, seed, par.dp_rank, par.dp_world) for split in splits]
else:
    data_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', dataset)
    loaders = [ShardLoader(data_dir, s, batch_size, block_size, par.dp_rank, par.dp_world, vocab_size) for s in splits]
train_loader, val_loader, eval_train_loader = loaders
out = OutDir(out_dir, par.master, init_from, overwrite, eval_only)  # made and locked
print0 = out.log

print0(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}")
if _echo is not None and _echo.getvalue().strip():
    print0(_echo.getvalue().rstrip('\n'), terminal=False)
notices += ["fsdp=True without torchrun: one process holds the whole model, nothing to shard"] if fsdp and not par.ddp else []
for line in out.notices + notices:
    print0(line)
print0(f"config: {config}", terminal=False)
print0(f"torch {torch.__version__}, device {device}, dtype {dtype}, compile {compile}, world size {par.world}")
if master and device_type == 'cuda' and shutil.which('nvidia-smi'):  # modded-nanogpt's habit: the hardware, logged
    print0(subprocess.run(['nvidia-smi'], capture_output=True, text=True).stdout, terminal=False)
signals = StopSignals(out)

for set_seed in (torch.manual_seed, random.seed, np.random.seed):
    set_seed(seed + par.rank)
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
ctx = nullcontext() if dtype == 'float32' else torch.amp.autocast(device_type=device_type, dtype=getattr(torch, dtype))


# -----------------------------------------------------------------------------
# the model and its optimizer: built, or resumed
iter_num, best_val_loss, evaluated_at = 0, 1e9, -1  # evaluated_at: the iteration of the last eval
if checkpoint is not None:
    print0(f"{'Evaluating' if eval_only else 'Resuming training from'} {out.ckpt} (iter {checkpoint['iter_num']})")
    raw_model = build_model(checkpoint, out.ckpt, model_args)
    iter_num, best_val_loss = checkpoint['iter_num'], checkpoint['best_val_loss']
    evaluated_at = iter_num if checkpoint.get('evaluated', True) else -1  # a stop before its eval: evaluated now
else:
    raw_model = GPT(GPTConfig(**model_args))
print0(raw_model.describe(), terminal=False)  # per mixer; the header below says the total
raw_model.to(device)
raw_model.recompute = activation_checkpointing
raw_model.loss_only = task is None  # the eval's loss without the whole [tokens, vocab] logits (they count for a task)
if compile:
    print0(f"compiling the model{'' if compile_mode == 'default' else f' ({compile_mode})'}... (takes a minute)")
model = par.wrap(raw_model, compile, compile_mode, fsdp, fsdp_per_block)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
with redirect_stdout(io.StringIO()) as _echo:  # its parameter counts: to log.txt
    opt = par.shard(raw_model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type,
                                                   optimizer), compile)  # optimizer: the setting, opt: the object
    for group in opt.param_groups:
        group.setdefault('initial_lr', group['lr'])  # the rate the schedule scales (torch's schedulers' key)
print0(_echo.getvalue().rstrip('\n'), terminal=False)
wandb = out.wandb(wandb_project, wandb_run_name, wandb_mode, config) if wandb_log else None
if checkpoint is not None:
    par.load_optimizer(opt, checkpoint['optimizer'])
    if 'scaler' in checkpoint:
        scaler.load_state_dict(checkpoint['scaler'])
    positions = checkpoint['train_loader']
    train_loader.load_state_dict(positions[par.rank] if par.rank < len(positions) else positions[0])
    if 'rng' in checkpoint:  # last: building the model consumed random numbers
        set_rng_state(checkpoint['rng'][min(par.rank, len(checkpoint['rng']) - 1)], device_type)
    if iter_num >= max_iters and not eval_only:
        print0(f"nothing to train: {out.ckpt} is at iter {iter_num}, max_iters={max_iters} (the run ended there): "
               f"raise --max_iters to train further")
        sys.exit(0)
checkpoint = None  # free memory
peak_flops = gpu_peak_flops(torch.cuda.get_device_name(device)) if device_type == 'cuda' else None
flops_per_iter = raw_model.flops_per_token(block_size) * tokens_per_iter

@torch.no_grad()
def estimate_loss():
    """Mean loss over the same first eval_iters batches of each split, averaged over ranks; for a task also the
    answer accuracy (train_acc, val_acc): the fraction of answers whose argmax is right."""
    result = {}
    model.eval()
    bar = out.progress(2 * eval_iters, f"eval at step {iter_num}")
    for split, loader in (('train', eval_train_loader), ('val', val_loader)):
        loader.reset()
        losses = torch.zeros(eval_iters, device=device)
        answers = torch.zeros(2, device=device)  # correct, total
        for k in range(eval_iters):
            bar.update()
            X, Y = par.fetch(loader)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
            if task is not None:
                answers += torch.stack(count_correct(logits, Y))
        result[split] = par.mean(losses.mean()).item()
        if task is not None:
            answers = par.sum(answers)
            result[f'{split}_acc'] = (answers[0] / answers[1]).item()
    bar.close()
    model.train()
    return result


def get_lr(it):
    """The schedule's rate at step it (optim.lr_at: warmup, then cosine or wsd), or learning_rate with decay_lr off."""
    return optim.lr_at(it, lr_schedule, learning_rate, min_lr, warmup_iters, lr_decay_iters, max_iters,
                       decay_fraction) if decay_lr else learning_rate


def save(val_loss, improved=False, why=''):
    """Write ckpt.pt (and best.pt when improved) of the state at the top of iteration iter_num: the weights after
    iter_num steps, every rank's data position and RNG states, so that a resume continues exactly. A collective:
    every rank calls it. -> the iteration saved."""
    loader_states, rng_states = par.gather(train_loader_state), par.gather(rng_state(device_type, device))
    model_sd, optimizer_sd = par.full_state(raw_model, opt)
    if master:
        ckpt = {'model': model_sd, 'optimizer': optimizer_sd, 'model_args': model_args, 'iter_num': iter_num,
                'evaluated': evaluated_at == iter_num, 'val_loss': val_loss, 'best_val_loss': best_val_loss,
                'config': config, 'train_loader': loader_states, 'rng': rng_states, 'scaler': scaler.state_dict()}
        print0(f"saving checkpoint to {out_dir}{why}" + (" (best so far, also best.pt)" if improved else ""))
        save_checkpoint(ckpt, out.ckpt, best=out.best if improved else None)
    return iter_num


class StepClock:
    """What a step leaves for the next: its numbers (Parallel.step_numbers) on their way to the host, and its time.
    Lagged (an optimizer that skips a non-finite step by itself on the GPU: fused AdamW), the host reads step N after
    queuing step N + 1, so that the GPU does not idle while the host launches the next step; a diverged run stops when
    its step is read, before any eval or save. On CUDA a step's time is read off the GPU's timeline, from the end of
    the step before it (or its own start, after an eval) to its end; elsewhere from its start to its end."""

    def __init__(self, lagged, cuda):
        self.lagged, self.cuda = lagged, cuda
        self.pending = None   # (n, its numbers on the host, its end: an event or a time, t0, its start event)
        self.last_end = None  # CUDA: the event that ended the last step read (None after an eval, or at the start)

    def event(self):  # a CUDA event recorded now, in the GPU's queue (None off CUDA)
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e

    def start(self):
        self.t0, self.start_event = time.time(), self.event()

    def end(self, n, numbers):
        """Step n is queued -> the steps read now, [(n, values, seconds)] (lagged: the one before it, if any)."""
        host = numbers.to('cpu', non_blocking=True) if self.cuda else numbers  # (non-blocking: into pinned memory)
        ready = self.settle()  # lagged: the step before this one, which the GPU has finished or nearly
        self.pending = (n, host, self.event() or time.time(), self.t0, self.start_event)
        return ready if self.lagged else ready + self.settle()

    def settle(self):
        """Wait for the pending step -> [(n, values, seconds)], or [] when none is pending."""
        if self.pending is None:
            return []
        n, host, done, t0, start = self.pending
        self.pending = None
        if isinstance(done, float):
            return [(n, host.tolist(), done - t0)]
        done.synchronize()
        dt = (self.last_end if self.last_end is not None else start).elapsed_time(done) / 1000
        self.last_end = done
        return [(n, host.tolist(), dt)]


class Meter:
    """The iter lines (loss, its moving average, time, tokens/s, lr, MFU, peak memory, ETA) every log_interval steps,
    a progress bar between them on a terminal. The ETA: the steps left at this run's mean step time after its first,
    plus the evals left at the last one's time."""

    def __init__(self):
        self.n, self.smooth, self.time_sum, self.mfu, self.eval_time, self.bar = 0, 0.0, 0.0, -1.0, 0.0, None
        self.elapsed = 0.0  # seconds of all the steps this process made, evals and saves not counted: tools/ttl.py

    def report(self, n, loss, peak, dt):
        self.time_sum, self.n, self.elapsed = self.time_sum + dt if self.n else 0.0, self.n + 1, self.elapsed + dt
        self.smooth = 0.9 * self.smooth + 0.1 * loss
        if n % log_interval and n != max_iters - 1:  # no line for this step: a bar up to the next one
            next_line = min((n // log_interval + 1) * log_interval, max_iters - 1)
            self.bar = self.bar or out.progress(next_line - n, f"steps to iter {next_line}")
            return self.bar.update()
        self.close_bar()
        if peak_flops and self.n > 5:  # let the first (compiling) iterations pass
            mfu = flops_per_iter / dt / (peak_flops * par.world)
            self.mfu = mfu if self.mfu == -1.0 else 0.9 * self.mfu + 0.1 * mfu
        evals_left = (max_iters - 1) // eval_interval - n // eval_interval + 1  # multiples, then the last step
        eta = round((max_iters - n - 1) * (self.time_sum / (self.n - 1) if self.n > 1 else dt) + evals_left * self.eval_time)
        print0(f"iter {n}/{max_iters}: loss {loss:.4f}, smooth {self.smooth / (1 - 0.9 ** self.n):.4f}, time "
               f"{dt * 1000:.2f}ms, tok/s {tokens_per_iter / dt:,.0f}, lr {get_lr(n):.2e}" +
               (f", mfu {self.mfu * 100:.2f}%" if self.mfu > 0 else "") +
               (f", peak {peak:.1f} GiB" if device_type == 'cuda' else "") + ", eta " +
               (f"{eta // 3600}h{eta % 3600 // 60:02d}m" if eta >= 3600 else
                f"{eta // 60}m{eta % 60:02d}s" if eta >= 60 else f"{eta}s"))

    def close_bar(self):
        self.bar = self.bar and self.bar.close()  # (None)


# -----------------------------------------------------------------------------
print0(f"model: {' '.join(raw_model.mixers)} ({n_layer} layers × {n_embd}), {raw_model.get_num_params() / 1e6:.2f}M "
       f"parameters")
print0(f"data: {dataset}" + (f" (a task: vocab_size {vocab_size}, loss and accuracy on the answers only)" if task else "") +
       f", {grad_accum} grad accum × {par.dp_world} ranks × {batch_size} batch × {block_size} context "
       f"= {tokens_per_iter:,} tokens per step, " + (f"each sequence split over {context_parallel} ranks, " if
       context_parallel > 1 else "") + ("activations recomputed, " if activation_checkpointing else "") +
       ("kernel states recomputed, " if not kernel_states else "") +
       (f"steps {iter_num:,} to {max_iters:,}" if iter_num else f"{max_iters:,} steps"))
print0(f"out_dir: {out_dir} (its log.txt has the full config)")
if decay_lr and max_iters < lr_decay_iters and not eval_only:  # a short run that would end at a high learning rate
    print0(f"notice: max_iters={max_iters} < lr_decay_iters={lr_decay_iters}: the run ends at lr "
           f"{get_lr(max(max_iters - 1, 0)):.2e}, not min_lr {min_lr:.2e} (--lr_decay_iters={max_iters} decays it fully)")
if max_iters < eval_interval and iter_num == 0 and not eval_only:
    print0(f"notice: max_iters={max_iters} < eval_interval={eval_interval}: evaluated only at step 0 and the end, "
           f"step {max_iters}")

# the training loop. Iteration iter_num evaluates (every eval_interval steps, and at max_iters: the weights the run
# ends with), then makes optimizer step iter_num; the run makes max_iters steps and ends at the eval of step max_iters
guard = Divergence(out.ckpt, learning_rate, grad_clip, fp16=scaler.is_enabled(), warn=print0)
lagged = getattr(opt, 'skips_on_device', bool(opt.defaults.get('fused')))  # fused AdamW and Muon skip on the device
clock = StepClock(lagged=lagged and not scaler.is_enabled(), cuda=device_type == 'cuda')
meter = Meter()
train_loader_state = train_loader.state_dict()  # the position of the batch about to be fetched
X, Y = par.fetch(train_loader)
stop_signal, last_val = 0, None
saved_iter = iter_num if init_from == 'resume' else None  # the iteration ckpt.pt holds, once saved or resumed


def read(steps):
    """Steps the host has read: checked (if lagged) and reported -> the stop signal the ranks agreed on."""
    stop = 0
    for n, (loss, norm, stop, peak, bad), dt in steps:
        if clock.lagged:
            guard.check(n, loss, norm, bad)
        meter.report(n, loss, peak, dt)
    return int(stop)


while True:
    last_step = iter_num >= max_iters
    evaluating = ((iter_num % eval_interval == 0 or last_step or eval_only)
                  and (iter_num != evaluated_at or eval_only))
    if stop_signal or evaluating or last_step:
        stop_signal = read(clock.settle()) or stop_signal  # the last step's numbers before any eval or save
    if stop_signal and iter_num < max_iters:  # every rank sees the same value (agreed over the ranks)
        name = __import__('signal').Signals(stop_signal).name  # (at max_iters: the final eval and save, as usual)
        meter.close_bar()
        if saved_iter != iter_num:
            saved_iter = save(last_val, why=f" ({name})")
        print0(f"stopped by {name} at iter {iter_num}; resume with --init_from=resume")
        if wandb:
            wandb.finish()
        par.close()
        sys.exit(128 + stop_signal)
    lr = get_lr(iter_num)
    for group in opt.param_groups:  # the schedule scales each group's own rate, as the model set it
        group['lr'] = lr * (group['initial_lr'] / learning_rate)  # (x 1.0 exactly for the groups at learning_rate)

    if evaluating:
        clock.last_end = None  # the next step's time starts at its own start, not at the end of the one before the eval
        meter.close_bar()
        t_eval = time.time()
        losses = estimate_loss()
        meter.eval_time = time.time() - t_eval
        print0(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}" +
               (f", train acc {losses['train_acc']:.4f}, val acc {losses['val_acc']:.4f}" if task else "") +
               f" (eval {meter.eval_time:.2f}s, train clock {meter.elapsed:.3f}s)")
        if not all(map(math.isfinite, losses.values())):
            raise guard.error('a non-finite eval loss', iter_num)
        if wandb:  # losses and accuracies as train/loss, val/acc...; mfu once measured (CUDA, after the first steps)
            wandb.log(dict({k.replace('_', '/') if '_' in k else f'{k}/loss': v for k, v in losses.items()}, iter=iter_num,
                           lr=lr, **({'mfu': meter.mfu * 100} if meter.mfu > 0 else {})))
        due = last_step or not iter_num % (save_interval or 1)  # an eval that may save (best.pt: the best of these)
        improved = due and losses['val'] < best_val_loss
        best_val_loss, last_val, evaluated_at = losses['val'] if improved else best_val_loss, losses['val'], iter_num
        if iter_num > 0 and not eval_only and due and (improved or always_save_checkpoint):
            saved_iter = save(losses['val'], improved)  # every rank takes this branch (the losses are averaged)
        if task is not None and stop_at_val_acc > 0 and iter_num > 0 and losses['val_acc'] >= stop_at_val_acc:
            print0(f"stopping at step {iter_num}: val acc {losses['val_acc']:.4f} >= stop_at_val_acc {stop_at_val_acc}")
            break
    if eval_only or last_step:
        break

    # forward and backward with gradient accumulation; DDP and FSDP reduce gradients on the last micro-step only
    clock.start()
    step_loss = torch.zeros((), device=device)  # the mean loss over the micro-steps
    for micro_step in range(grad_accum):
        par.sync_gradients(model, last=micro_step == grad_accum - 1)
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / grad_accum  # the gradient is a mean over micro-steps
        train_loader_state = train_loader.state_dict()
        X, Y = par.fetch(train_loader)  # the next batch while the GPU works on this one
        scaler.scale(loss).backward()
        step_loss += loss.detach()
    par.to_shards(model)
    scaler.unscale_(opt)  # a no-op without the fp16 scaler
    numbers = par.step_numbers(step_loss, par.clip(model, grad_clip), signals.requested)
    if clock.lagged:  # the optimizer skips a non-finite step by itself, on the GPU; the host reads it a step late
        opt.found_inf = numbers[4]
    else:  # the check before the weights change: one CPU-GPU sync a step
        loss_f, norm_f, _, _, bad = numbers.tolist()
        guard.check(iter_num, loss_f, norm_f, bad)
    scaler.step(opt)
    scaler.update()
    par.zero_grad(model, opt)
    stop_signal = read(clock.end(iter_num, numbers))  # lagged: the step before, read while the GPU works on this one
    signals.started = True
    iter_num += 1

if not eval_only and saved_iter != iter_num:
    save(last_val, why=f" (end of run, iter {iter_num})")  # the steps since the last eval are not lost
if wandb:
    wandb.finish()
par.close()
