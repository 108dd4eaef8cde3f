"""What autograd holds for the backward of one KDA layer's scan (session 48, issue 43): one process with all of a
sequence's tokens (kernels.delta_rule) against one rank of context parallelism over N holding 1/N of them
(context_parallel.delta_rule: the output scan and the transition scan), with the transition scan keeping its chunk
states (as before) or recomputing them (keep=False, now). Bytes of the distinct tensors saved for the backward,
counted by torch.autograd.graph.saved_tensors_hooks; the Triton kernels through the interpreter on CPU, fp32, at the
hybrid's head shape d_k = d_v = 128 (the counts scale with tokens, so a short sequence gives the ratios).
Run: TRITON_INTERPRET=1 python notes/runs/cp-keep-2026-11-26-48/cp_saved_bytes.py"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import context_parallel  # noqa: E402
import kernels  # noqa: E402
from context_parallel import ContextParallel  # noqa: E402


class OneRank:
    """The part of ContextParallel that context_parallel.delta_rule uses, for one rank's pieces without a group: the
    pieces' starts are formed from their own end states (the saved tensors do not depend on where S_0 comes from)."""
    split, merge = staticmethod(ContextParallel.split), staticmethod(ContextParallel.merge)

    def initial_state(self, S, M, apply):
        return apply(M.float(), S.float())


def saved_bytes(fn):
    seen = {}
    def pack(t):
        seen[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def inputs(T, H=1, D=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    x = dict(q=F.normalize(r(1, T, H, D), dim=-1), k=F.normalize(r(1, T, H, D), dim=-1), v=r(1, T, H, D),
             beta=torch.sigmoid(r(1, T, H)), g=F.logsigmoid(r(1, T, H, D)) / 16)
    return {n: t.requires_grad_() for n, t in x.items()}


T, N = 256, 2  # one process: T tokens; a rank of CP over N: T / N tokens in its two pieces
one = saved_bytes(lambda: kernels.delta_rule(**inputs(T), path="triton"))
rank = {}
for keep in (None, False):
    real = kernels.delta_rule
    def patched(*a, **kw):  # the transition scan is the call with an initial state (the identity)
        if kw.get("initial_state") is not None:
            kw["keep"] = keep
        return real(*a, **kw)
    kernels.delta_rule = patched
    rank[keep] = saved_bytes(lambda: context_parallel.delta_rule(OneRank(), **inputs(T // N), path="triton"))
    kernels.delta_rule = real
print(f"one process, {T} tokens: {one:,} bytes saved")
print(f"one rank of CP over {N} ({T // N} tokens), transition scan keeping its states: {rank[None]:,} "
      f"({rank[None] / one:.2f} of one process)")
print(f"the same, transition scan recomputing them (keep=False): {rank[False]:,} ({rank[False] / one:.2f})")
