"""
Generation speed of the 124M models from short to very long contexts, through model.Decoder as sample.py runs it:
time to first token, peak memory, ms per generated token at batch 1, and the largest batch that fits with its
tokens/s.

    python tools/bench_decode.py --mixers softmax 'kda*3,softmax' kda gdn --contexts 4096 32768 131072 524288 1048576
    python tools/bench_decode.py --mixers kda --contexts 256 1024 --batches 1 4   # CPU: eager steps

Each (mixer, context T) cell: the model of tools/bench_train.py's configs (config/owt.py with the mixer,
config/kda_hybrid.py for 'kda*3,softmax'; trained length 4,096, random weights: speed does not depend on them), a
Decoder for T + steps + 8 tokens (static caches; on CUDA the one-token step torch.compile'd and captured as a CUDA
graph, sampling at temperature 1 with top_k 200 inside it), then
- batch 1: a prompt of T random tokens prefilled in pieces of Decoder.PIECE tokens (time to first token: the prefill
  and the first draw, after an untimed prefill of one or two pieces of the same shapes: the kernels compiled first), then `steps` decode steps timed between CUDA events (ms/token); peak = max_memory_allocated
  over the cell, weights included;
- the largest batch: from the batch-1 Decoder's own bytes (caches at T + steps + 8 tokens, the token buffers),
  as many sequences as the free memory holds less a margin, fewer on an out-of-memory until one fits; its caches
  are set to position T without a prefill (the step's cost depends on the position, not on the caches' values: an
  untrained model's prompt says nothing the zeros do not), then `steps` steps timed: ms/token, tokens/s = batch / it.
A cell that does not fit at batch 1 is one line that says so and how many tokens would. Output: one markdown
table; --json PATH writes the cells.
"""
import argparse
import json
from contextlib import nullcontext
import os
import sys
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)  # its modules
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tools/
import configurator
configurator.main_script(__name__)  # first: a Ctrl-C while torch loads is one line, not a traceback
from configurator import device_and_dtype, free_memory, make_current, out_of_memory
import time

import torch

from bench_train import train_model_config

MARGIN = 2 * 2**30  # bytes kept free at the largest batch: the prefill's pieces, the graph's workspace, the allocator's slack


def sync(device):
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def timed_steps(dec, steps, device):
    """ms per token over `steps` decode steps, after 4 untimed ones."""
    dec.decode(4)
    if device.startswith('cuda'):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        dec.decode(steps)
        ev[1].record()
        torch.cuda.synchronize()
        return ev[0].elapsed_time(ev[1]) / steps
    t0 = time.perf_counter()
    dec.decode(steps)
    return (time.perf_counter() - t0) * 1000 / steps


def at_batch(model, B, T, max_len, steps, device, dtype, compile):
    """ms per token of B sequences whose caches are set to position T (no prefill: see the module docstring)."""
    from model import Decoder
    dec = Decoder(model, B, max_len, temperature=1.0, top_k=200, n_vocab=50257, dtype=dtype, compile=compile)
    dec.seek(T)
    return timed_steps(dec, steps, device)


def cell(model, mixer, T, steps, device, dtype, compile, batches):
    """One (mixer, T) cell: the batch-1 numbers, then those of the other batches ('max': the largest that fits). -> dict"""
    from model import Decoder
    cuda = device.startswith('cuda')
    max_len = T + steps + 8
    out = dict(mixer=mixer, T=T)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    dec = Decoder(model, 1, max_len, temperature=1.0, top_k=200, n_vocab=50257, dtype=dtype, compile=compile)
    idx = torch.randint(0, 50257, (1, T), device=device)
    piece = Decoder.PIECE
    dec.prefill(idx[:, :T if T <= piece else piece + (T % piece or piece)])  # untimed: the kernels' first calls (JIT,
    sync(device)                                   # autotune) at the pieces' shapes, a first and a carried-state one
    t0 = time.perf_counter()
    dec.prefill(idx)
    sync(device)
    out['ttft_s'] = time.perf_counter() - t0
    out['ms'] = timed_steps(dec, steps, device)
    fixed, growing = model.cache_bytes(dec.caches)
    out['cache_mib'] = (fixed + growing) / 2**20
    if cuda:
        out['peak_gib'] = torch.cuda.max_memory_allocated() / 2**30
    per_sequence = fixed + growing + dec.out.numel() * 8 + 16 * 50304  # caches, tokens, the step's logits
    del dec, idx
    for B in batches:
        if B not in ('1', 'max'):
            try:
                out[f'ms_{B}'] = at_batch(model, int(B), T, max_len, steps, device, dtype, compile)
            except Exception as e:
                if not out_of_memory(e):
                    raise
                out[f'ms_{B}'] = 'OOM'
            empty_cache(device)  # (after the except block: its traceback held the failed try's Decoder)
    if not (cuda and 'max' in batches):
        return out
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info()[0] - sum(p.numel() * 2 for p in model.parameters())  # the Decoder's bf16 copy
    B = max(1, int((free - MARGIN) // per_sequence))
    while B >= 1:
        try:
            out.update(max_batch=B, max_batch_ms=at_batch(model, B, T, max_len, steps, device, dtype, compile))
            out['tokens_s'] = B / out['max_batch_ms'] * 1000
            return out
        except Exception as e:
            if not out_of_memory(e):
                raise
        empty_cache(device)
        B = int(B * 0.85) if B > 1 else 0
    return out


def empty_cache(device):
    if device.startswith('cuda'):
        torch.cuda.empty_cache()


def tokens_that_fit(model, device, dtype):
    """How many tokens of context one sequence could reach in the memory free now, or None if its caches do not grow
    with the context."""
    with torch.autocast('cuda', dtype) if device.startswith('cuda') else nullcontext():  # (the decode's dtype)
        (fixed, _), (one, _) = (model.generation_bytes(1, 0, n, device) for n in (0, 1))  # at 0 and 1 positions
    if one - fixed <= 8:  # only the token buffer grows (an int64 per position)
        return None
    return max(0, (free_memory(device) or 0) - MARGIN - fixed) // (one - fixed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mixers", nargs="+", default=["softmax", "kda*3,softmax", "kda", "gdn"])
    ap.add_argument("--contexts", nargs="+", type=int, default=[4096, 32768, 131072, 524288, 1048576])
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps per cell")
    ap.add_argument("--device", default="", help="'' = cuda if available, else cpu")
    ap.add_argument("--no_compile", action="store_true", help="capture the step without torch.compile")
    ap.add_argument("--batches", nargs="+", default=["1", "max"],
                    help="batch sizes after batch 1 (always run, with the prefill): numbers, or max (CUDA): the largest that fits")
    ap.add_argument("--json", default="", help="also write the cells to this file")
    args = ap.parse_args()
    from model import GPT, parse_mixer_pattern
    for m in args.mixers:
        try:
            parse_mixer_pattern(m, 12)
        except ValueError as e:
            ap.error(str(e))
    if min(args.contexts) < 1 or args.steps < 1:
        ap.error(f"--contexts and --steps must be >= 1, got {args.contexts} and {args.steps}")
    if not all(b == 'max' or b.isdigit() and int(b) >= 1 for b in args.batches):
        ap.error(f"--batches takes numbers >= 1 and max, got {' '.join(args.batches)}")
    device, _ = device_and_dtype(args.device, '')  # a device this machine lacks: one line
    cuda = device.startswith("cuda")
    make_current(device)
    dtype = torch.bfloat16 if cuda else torch.float32
    torch._dynamo.config.recompile_limit = 64  # one compiled step per batch size and model
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"{name}, torch {torch.__version__}; decode: {'CUDA graph of the ' + ('' if args.no_compile else 'compiled ') + 'step' if cuda else 'eager steps'}"
          f", {args.steps} steps timed; prefill in pieces of {__import__('model').Decoder.PIECE:,} tokens")
    cells = []
    extra = [b for b in args.batches if b not in ('1', 'max')]
    big = 'max' in args.batches and cuda
    head = (["mixer", "context", "time to first token s", "peak GiB", "ms/token (batch 1)", "cache MiB (batch 1)"]
            + [f"ms/token (batch {b})" for b in extra] + (["max batch", "ms/token at it", "tokens/s at it"] if big else []))
    print("\n| " + " | ".join(head) + " |\n" + "|---" * len(head) + "|")
    for mixer in args.mixers:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = GPT(train_model_config(mixer, 4096)).to(device).eval()
        for T in args.contexts:
            c = None
            try:
                c = cell(model, mixer, T, args.steps, device, dtype, not args.no_compile and cuda, args.batches)
            except Exception as e:
                if not out_of_memory(e):
                    raise
            if c is None:  # out of memory at batch 1 (measured here, after the except block freed the failed cell)
                empty_cache(device)
                fits = tokens_that_fit(model, device, dtype)
                what = f"about {fits:,} tokens would" if fits is not None else "its caches do not grow with the context"
                print(f"| {mixer} | {T:,} | out of memory at batch 1 on this {'GPU' if cuda else 'machine'}: {what} |"
                      + " |" * (len(head) - 3), flush=True)
                cells.append(dict(mixer=mixer, T=T, error="out of memory at batch 1", tokens_that_fit=fits))
                continue
            cells.append(c)
            f = lambda k, fmt: format(c[k], fmt) if isinstance(c.get(k), (int, float)) else c.get(k, "-")
            cols = [mixer, f"{T:,}", f('ttft_s', '.2f'), f('peak_gib', '.1f'), f('ms', '.3f'), f('cache_mib', ',.1f')]
            cols += [f(f'ms_{b}', '.3f') for b in extra]
            cols += [f('max_batch', ','), f('max_batch_ms', '.3f'), f('tokens_s', ',.0f')] if big else []
            print("| " + " | ".join(cols) + " |", flush=True)
        del model
        if cuda:
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=name, torch=torch.__version__, command=sys.argv, cells=cells), fh, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
