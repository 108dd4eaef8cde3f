"""
Sample from a trained model (model.Decoder): prefill the prompt in pieces, then decode token by token
through static per-layer caches (fixed-size state for the linear mixers, K/V for softmax, preallocated for the
whole context). The samples decode together as one batch; on CUDA the one-token step is replayed as a CUDA graph
(--cuda_graph=False: one eager forward per token).

$ python sample.py --out_dir=out-pystdlib-kdax3+softmax --start="def main():" --num_samples=2 --max_new_tokens=200
$ python sample.py --out_dir=out-pystdlib-gdn --start=FILE:prompt.txt --temperature=0.8 --top_k=200 --device=cpu
$ python sample.py --out_dir=out-mqar-kda --start="3 40 7 35 0 0 7" --max_new_tokens=1 --temperature=0   # a task model
$ python sample.py --help      # every setting, its default and what it does

A model trained on a task (dataset 'mqar', 'statetrack' or 'needle') has no text tokenizer: its prompt is token ids separated
by spaces (the layouts are in tasks.py) and the samples print as ids.

At the end it prints the prefill time, the decode latency per token and tokens/s, and the bytes held by
the caches, split into the fixed part (linear mixers) and the part that grows with the context (softmax K/V).
"""
import os
import sys
import time
from contextlib import nullcontext

import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback
import torch
from model import Decoder
from checkpoint import load_checkpoint, build_model
from dataloader import gpt2_encoding
from tasks import NAMES as TASK_NAMES

# -----------------------------------------------------------------------------
out_dir = 'out-pystdlib-kdax3+softmax'  # train.py's out_dir (out-<dataset>-<mixer>); the default: the quick start's
ckpt = 'ckpt.pt'          # ckpt.pt = the latest (what a resume continues), best.pt = the lowest val loss
start = "\n"              # prompt text, or FILE:path to read it from a file; "<|endoftext|>" = a document start
num_samples = 3           # number of samples to draw (>= 1)
max_new_tokens = 200      # tokens generated per sample
temperature = 0.8         # 1.0 = unchanged, < 1.0 = less random, 0 = greedy
top_k = 200               # keep only the top_k most likely tokens (None = all)
seed = 1337
cuda_graph = True         # CUDA: the one-token step replayed as a CUDA graph; False: one eager forward per token
                          # (always so on CPU and MPS)
compile = False           # with cuda_graph: torch.compile the one-token step first: fewer, fused kernels, about half
                          # the ms per token on an H100, for a compile of about a minute (worth it for long samples)
device = ''               # '' = cuda if available, else cpu; or 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = ''                # '' = bfloat16 on CUDA if supported, float32 elsewhere; or 'float32', 'bfloat16', 'float16'
kernels = ''              # '' = the checkpoint's (train.py's kernels); or 'auto' | 'torch' | 'recurrent' | 'triton':
                          # 'auto' samples on CPU a model trained with kernels='triton'
# -----------------------------------------------------------------------------
from configurator import configure, device_and_dtype, free_memory, make_current, out_of_memory, UserError
configure(globals(), sys.argv[1:], nullable={'top_k'})
# -----------------------------------------------------------------------------
for k, least in (('num_samples', 1), ('max_new_tokens', 0), ('top_k', 1)):
    if globals()[k] is not None and globals()[k] < least:
        raise UserError(f"{k}={globals()[k]} must be >= {least}" + (" (or None for all tokens)" if k == 'top_k' else ''))
if temperature < 0:
    raise UserError(f"temperature={temperature} must be >= 0 (0 = greedy, 1 = the model's distribution)")
device, dtype = device_and_dtype(device, dtype)
make_current(device)  # cuda:N: the decode's CUDA graph and stream are made on the current device
device_type = 'cuda' if device.startswith('cuda') else ('mps' if device.startswith('mps') else 'cpu')
torch.manual_seed(seed)
torch.cuda.manual_seed(seed) if device_type == 'cuda' else None
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
ctx = nullcontext() if ptdtype == torch.float32 else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

if start.startswith('FILE:'):  # before the checkpoint loads: a bad prompt file costs no wait
    if not os.path.isfile(start[5:]):
        raise UserError(f"start={start!r}: no such file {start[5:]}")
    try:
        with open(start[5:], 'r', encoding='utf-8') as f:
            start = f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"start={start!r}: {start[5:]} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                        f"{e.start}): save the prompt as UTF-8") from None

ckpt_path = os.path.join(out_dir, ckpt)
checkpoint = load_checkpoint(ckpt_path, map_location=device, need='model')  # data only: a checkpoint never runs code
model_args = dict(checkpoint['model_args'], **({'kernels': kernels} if kernels else {}))  # old checkpoints: 'auto'
if not kernels and model_args.get('kernels') == 'triton' and device_type != 'cuda':
    raise UserError(f"{out_dir} was trained with kernels='triton', which needs CUDA: add --kernels=auto to sample on {device}")
model = build_model(checkpoint, ckpt_path, model_args)
model.eval().to(device)
print(model.describe())
task = checkpoint.get('config', {}).get('dataset') in TASK_NAMES
if task:  # synthetic task: token ids in, token ids out
    vocab = checkpoint['model_args']['vocab_size']
    try:
        start_ids = [int(t) for t in start.split()]
    except ValueError:
        raise UserError(f"{out_dir} holds a {checkpoint['config']['dataset']} model, whose prompt is token ids "
                        f"separated by spaces (0..{vocab - 1}, layouts in tasks.py), e.g. --start=\"3 40 7 35 0 7\"; got {start!r}") from None
    if not start_ids or not all(0 <= t < vocab for t in start_ids):
        raise UserError(f"the prompt's token ids must be 0..{vocab - 1} for this {checkpoint['config']['dataset']} "
                        f"model, and at least one; got {start!r}")
    n_vocab, decode = vocab, lambda ids: ' '.join(map(str, ids))
else:
    enc = gpt2_encoding()  # every text dataset here is GPT-2 BPE
    start_ids = enc.encode(start, allowed_special={'<|endoftext|>'})
    if not start_ids:
        raise UserError("start is empty: give a prompt, or --start='<|endoftext|>' for samples from a document start")
    n_vocab, decode = enc.n_vocab, enc.decode
x = torch.tensor(start_ids, dtype=torch.long, device=device)[None, ...]

x = x.expand(num_samples, -1)  # the samples decode together, as one batch
context = x.size(1) + max_new_tokens
warning = model.length_warning(context)  # softmax layers past block_size: one line, then sample anyway
if warning:
    print(warning)


def generate():
    """(tokens [num_samples, context], caches, decode steps timed, how)."""
    graph = device_type == 'cuda' and cuda_graph
    t0 = time.perf_counter()
    decoder = Decoder(model, num_samples, context, temperature, top_k, n_vocab, ptdtype, graph=graph,
                      compile=compile and graph)
    if graph:
        print(f"decode step {'compiled and ' if compile else ''}captured as a CUDA graph in {time.perf_counter() - t0:.1f} s")
    y = decoder.generate(x, max_new_tokens, timings=times)
    return y, decoder.caches, max(max_new_tokens - 1, 0), "CUDA graph" if graph else "eager"


with ctx:
    need, per_sample = model.generation_bytes(num_samples, x.size(1), context, device)
free = free_memory(device)
if free is not None and need > free:  # on CPU the kernel would kill the process with no word said
    raise UserError(f"num_samples={num_samples} at {context:,} tokens need at least {need / 2**30:,.1f} GiB ("
                    f"{per_sample / 2**20:,.1f} MiB per sample: caches, prompt, logits) but {device} has "
                    f"{free / 2**30:,.1f} GiB free: " + (f"at most {free // per_sample:,} samples fit; use fewer --num_samples, "
                    f"a shorter prompt or --max_new_tokens" if free >= per_sample else
                    "not one sample fits; use a shorter prompt or --max_new_tokens"))
times = {}
try:
    y, caches, steps, how = generate()
except Exception as e:
    if not out_of_memory(e):
        raise
    raise UserError(f"out of memory on {device} generating {num_samples} samples of {context:,} tokens: use fewer "
                    f"--num_samples, a shorter prompt or --max_new_tokens") from None
for k in range(num_samples):
    print(decode(y[k].tolist()))
    print('---------------')

fixed, growing = model.cache_bytes(caches)
per_token = times['decode'] / max(steps, 1)
print(f"prefill: {x.size(1)} tokens x {num_samples} samples in {times['prefill'] * 1000:.1f} ms; decode ({how}, {device}): "
      f"{per_token * 1000:.2f} ms per token, {num_samples * steps / max(times['decode'], 1e-9):.1f} tokens/s over "
      f"{num_samples} samples")
print(f"cache at {context} tokens of context: {fixed + growing:,} bytes = {fixed:,} fixed (linear-mixer state) "
      f"+ {growing:,} growing (softmax K/V)")
