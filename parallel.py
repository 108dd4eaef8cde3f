"""
Training on several processes (torchrun): who is who, how the model is wrapped, and an optimizer over FSDP's shards.

    par = Parallel(device, backend, context_parallel)     # ranks, groups, this process's device
    model = par.wrap(model, compile, compile_mode, fsdp, fsdp_per_block)   # compile, then FSDP or DDP: one order
    optimizer = par.shard(raw_model.configure_optimizers(...))            # any torch.optim.Optimizer
    ... par.sync_gradients(model, last_micro_step); loss.backward() ...; par.to_shards(model)
    norm = par.clip(model, grad_clip)                                     # the shards under FSDP
    model_sd, optim_sd = par.full_state(raw_model, optimizer)             # checkpoints hold whole tensors
    par.load_optimizer(optimizer, optim_sd)                               # any number of ranks, any layout

The ranks: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE. With context parallelism over N ranks, ranks g·N .. g·N+N−1
share the rows of data-parallel rank g (consecutive ranks: one node), and each holds two pieces of every sequence
(section 2 below); the others read different rows. The wrapping order is torchtitan's: the forward is compiled first,
then FSDP's gather and free hooks are put around the compiled code (or DDP around the compiled model), so that the
hooks are not traced into the graph.

FSDP (FSDP2's fully_shard) keeps each parameter as a DTensor whose local part is this rank's shard. The optimizer the
model returned is rebuilt, same class, same param groups and hyperparameters, over those local parts as plain
tensors: stepping DTensors costs the host several times more per op and tensor, and a plain optimizer of any class
steps a shard exactly as it would the whole tensor for the element-wise optimizers (SGD, Adam, AdamW, ...). An
optimizer that needs each whole matrix (orthogonalising ones such as Muon) must gather it itself. Checkpoints gather
every parameter-shaped state tensor whole onto rank 0, so a run resumes on any number of ranks, sharded or not.
"""
import inspect
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.distributed._functional_collectives as fc
from torch.nn.parallel import DistributedDataParallel as DDP

import kernels
from configurator import UserError


class Parallel:
    """This process's place among the ranks (one process: rank 0 of 1) and what the wrapping chose.
    rank, local_rank, world: torchrun's; dp_rank, dp_world: which rows this rank reads and of how many; cp: its
    ContextParallel group (None without context parallelism); master: rank 0 (logs, checkpoints)."""

    def __init__(self, device, backend='', context_parallel=1):
        self.ddp = int(os.environ.get('RANK', -1)) != -1
        self.rank = int(os.environ['RANK']) if self.ddp else 0
        self.local_rank = int(os.environ['LOCAL_RANK']) if self.ddp else 0
        self.world = int(os.environ['WORLD_SIZE']) if self.ddp else 1
        self.master = self.rank == 0
        self.device = device
        self.cp = None
        self.sharded = False  # FSDP (set by wrap)
        if not self.ddp:
            if context_parallel > 1:
                raise UserError(f"context_parallel={context_parallel} needs torchrun: torchrun --standalone "
                                f"--nproc_per_node={context_parallel} train.py ...")
            if device.startswith('cuda:'):  # CUDA events, pinned copies and Triton's launches go to the current
                torch.cuda.set_device(device)  # device, which must be this one
            self.dp_rank, self.dp_world = 0, 1
            return
        if device.startswith('cuda'):
            self.device = f'cuda:{self.local_rank}'
            torch.cuda.set_device(self.device)
        dist.init_process_group(backend=backend or ('nccl' if device.startswith('cuda') else 'gloo'))
        if self.world % context_parallel:
            raise UserError(f"context_parallel={context_parallel} does not divide the {self.world} ranks: run "
                            f"--nproc_per_node a multiple of it")
        self.dp_rank, self.dp_world = self.rank // context_parallel, self.world // context_parallel
        if context_parallel > 1:
            for g in range(self.dp_world):  # every rank creates every group, in the same order
                group = dist.new_group(list(range(g * context_parallel, (g + 1) * context_parallel)))
                if g == self.dp_rank:
                    self.cp = ContextParallel(group, self.rank % context_parallel, context_parallel)

    # -- collectives (no-ops on one process) --------------------------------------------------------------------------
    def mean(self, x):
        """x averaged over every rank (SUM, then divided: gloo has no AVG)."""
        if self.ddp:
            dist.all_reduce(x)
            x = x / self.world
        return x

    def sum(self, x):
        if self.ddp:
            dist.all_reduce(x)
        return x

    def max(self, x):
        if self.ddp:
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x

    def gather(self, obj):
        """[obj of every rank] (picklable objects: data positions, RNG states)."""
        if not self.ddp:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def step_numbers(self, step_loss, grad_norm, signal):
        """[mean loss, gradient norm, stop signal, peak GiB, non-finite] of a step as one tensor on the device, without
        a sync. The last three are the largest over the ranks: every rank stops at the same step (the ranks get a
        signal at different moments) and skips the same non-finite steps; the peak is the most any rank's GPU has
        held so far. Under context parallelism each rank's loss is its share (loss, below): their mean is the step's."""
        if self.cp is not None:
            step_loss = self.mean(step_loss)
        stats = torch.stack([step_loss.float(), grad_norm.float()])
        peak = torch.cuda.max_memory_allocated(self.device) / 2**30 if 'cuda' in self.device else 0.0
        flags = torch.stack([torch.full((), float(signal), device=self.device), torch.full((), peak, device=self.device),
                             (~torch.isfinite(stats)).any().float()])  # (torch.full: a device fill, no host copy)
        return torch.cat([stats, self.max(flags)])

    def micro_steps(self, total):
        """This rank's share of the global micro-steps per optimizer step."""
        if total % self.dp_world:
            raise UserError(f"gradient_accumulation_steps={total} is not divisible by the {self.dp_world} data-parallel "
                            f"ranks: it is the global number of micro-steps, e.g. {self.dp_world * max(1, total // self.dp_world)}")
        return total // self.dp_world

    def fetch(self, loader):
        """The loader's next batch on this rank's device; under context parallelism its two pieces of each row."""
        X, Y = loader.next_batch()
        if self.cp is not None:
            X, Y = self.cp.take(X), self.cp.take(Y)
        if 'cuda' in self.device:  # pinned, so that the copy waits for nothing (from pageable memory it may wait for
            X, Y = X.pin_memory(), Y.pin_memory()  # the GPU's queue, which the host is ahead of)
        return X.to(self.device, non_blocking=True), Y.to(self.device, non_blocking=True)

    def close(self):
        if self.ddp:
            dist.destroy_process_group()

    # -- the model ----------------------------------------------------------------------------------------------------
    def wrap(self, model, compile=False, compile_mode='default', fsdp=False, fsdp_per_block=False):
        """The model to call in the loop, in one order: context parallel set on the model; then compiled; then FSDP
        (each rank a shard) or DDP (each rank a replica) around it. The unwrapped model stays `model` (checkpoints,
        eval settings); under FSDP it is the same object, its parameters now DTensors."""
        if self.cp is not None:
            model.set_context_parallel(self.cp)
        cuda_graphs = compile and 'cuda' in self.device and compile_mode in ('reduce-overhead', 'max-autotune')
        if cuda_graphs and not (self.ddp and fsdp):
            # a graph's outputs live in memory its next replay overwrites: a gradient autograd stored as .grad (what it
            # does when .grad is None) would be overwritten by the next micro-step's backward. Gradients that exist
            # before the first backward are added into in place, and zero_grad(set_to_none=False) keeps them.
            for p in model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        self.keep_grads = cuda_graphs
        if self.ddp and fsdp:
            return self._fsdp(model, compile, compile_mode, fsdp_per_block)
        wrapped = torch.compile(model, mode=compile_mode) if compile else model
        if self.ddp:
            wrapped = DDP(wrapped, device_ids=[self.local_rank] if 'cuda' in self.device else None)
        return wrapped

    def _fsdp(self, model, compile, compile_mode, per_block):
        from torch.distributed.fsdp import fully_shard
        self.sharded, self.per_block = True, per_block
        marks = {name: {k: v for k, v in vars(p).items() if k.startswith('_no_')}
                 for name, p in model.named_parameters()}
        # every rank starts from rank 0's weights, as DDP makes sure on wrapping (each rank seeds its RNG with
        # seed + rank, so their inits differ, and a shard of each would make a model nobody initialised)
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(t, src=0)
        # Weights and gradients stay fp32 (autocast casts per use, as under DDP: a bf16 MixedPrecisionPolicy hands the
        # kernels bf16 decay rates and conv weights, which the short conv's Triton backward does not take).
        if per_block:  # one graph per block, FSDP's gathers between them; the output layer and the loss on their own
            for block in model.transformer.h:
                if compile:
                    block.forward = torch.compile(block.forward, mode=compile_mode)
                fully_shard(block)
            if compile:
                model.loss_head = torch.compile(model.loss_head, mode=compile_mode)
        elif compile:  # the whole model one unit and one graph, as under DDP (per-block hooks cost the host 2x)
            model.forward = torch.compile(model.forward, mode=compile_mode)
        fully_shard(model)  # the rest (embedding tied to lm_head, final norm), or everything
        for name, p in model.named_parameters():  # fully_shard made new Parameters: the marks mixers set on theirs
            p.__dict__.update(marks[name])         # (_no_muon, _no_weight_decay: configure_optimizers' split) carried
        return model

    def sync_gradients(self, model, last):
        """Before a micro-step's backward: DDP and FSDP reduce gradients on the last micro-step only; FSDP (one unit)
        keeps the gathered weights between micro-steps, so that a step gathers them once."""
        if self.sharded:
            model.set_requires_gradient_sync(last)
            if not self.per_block:
                model.set_reshard_after_backward(last)
        elif self.ddp:
            model.require_backward_grad_sync = last

    # -- the optimizer over shards -------------------------------------------------------------------------------------
    def shard(self, optimizer, compile=False):
        """The optimizer to step. Under FSDP: a new optimizer of the same class and param groups (every
        hyperparameter kept) over each parameter's local shard, a plain tensor on the DTensor's own memory; its
        class must take (param_groups, **defaults), as the torch.optim optimizers do. Else: optimizer itself, its
        update compiled if compile and it offers that (optim.Muon.compile_update)."""
        self.params = [p for g in optimizer.param_groups for p in g['params']]  # the model's, in the optimizer's order
        if not self.sharded:
            if compile and hasattr(optimizer, 'compile_update'):
                optimizer.compile_update()
            return optimizer
        with torch.no_grad():  # to_local() without autograd: a leaf on the DTensor's own memory
            groups = [dict(g, params=[p.to_local() for p in g['params']]) for g in optimizer.param_groups]
        accepted = inspect.signature(type(optimizer)).parameters  # (AdamW's defaults hold a key its __init__ lacks)
        local = type(optimizer)(groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})
        self.shards = [p for g in local.param_groups for p in g['params']]
        if hasattr(local, 'whole'):  # an optimizer of whole matrices (optim.Muon): every rank gathers each matrix,
            local.whole, local.part = self._whole, self._part  # orthogonalises it and keeps its own rows: the same
            local.whole_shape = lambda i: tuple(self.params[i].shape)  # numbers as one process, an all-gather each
        return local

    def _whole(self, i, t):
        """The whole tensor of parameter i (in the optimizer's order) whose local shard-shaped part is t."""
        from torch.distributed.tensor import DTensor
        p = self.params[i]
        return DTensor.from_local(t, p.device_mesh, p.placements, shape=p.shape, stride=p.stride(),
                                  run_check=False).full_tensor()

    def _part(self, i, t):
        """This rank's shard of parameter i's whole-shaped tensor t (a slice: no communication)."""
        from torch.distributed.tensor import distribute_tensor
        p = self.params[i]
        return distribute_tensor(t, p.device_mesh, p.placements, src_data_rank=None).to_local()

    def to_shards(self, model):
        """After the backward: each shard's gradient is its DTensor gradient's local part."""
        if self.sharded:
            with torch.no_grad():
                for p, sh in zip(self.params, self.shards):
                    sh.grad = None if p.grad is None else p.grad.to_local()

    def zero_grad(self, model, optimizer):
        optimizer.zero_grad(set_to_none=not self.keep_grads)  # under CUDA graphs the gradients stay allocated
        if self.sharded:
            model.zero_grad(set_to_none=True)  # the DTensors' gradients (the shards' were their local parts)
            if not self.per_block:  # gather the new weights now, queued behind the optimizer step on every rank,
                model.unshard(async_op=True)  # not at the next forward, where each rank's host arrives when it does

    def clip(self, model, max_norm):
        """Clip the model's gradients to max_norm (0: measure only) -> the norm before clipping (a tensor). Under FSDP
        the norm is the root of the sum over ranks of each rank's squared norm of its shards'."""
        if not self.sharded:  # (in the model's order: the norm's sum is rounded as it always was)
            return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or math.inf)
        with torch.no_grad():
            grads = [sh.grad for sh in self.shards if sh.grad is not None]
            norm = self.sum(torch.nn.utils.get_total_norm(grads).float() ** 2).sqrt()
            if max_norm:
                torch.nn.utils.clip_grads_with_norm_(self.shards, max_norm, norm)
            return norm

    # -- checkpoints: whole tensors ------------------------------------------------------------------------------------
    def full_state(self, model, optimizer):
        """(model state dict, optimizer state dict) as one process holds them; under FSDP gathered from every rank
        onto rank 0's CPU (a collective: every rank calls it; the other ranks get empty dicts)."""
        if not self.sharded:
            return model.state_dict(), optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.tensor import DTensor
        model_sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        osd = optimizer.state_dict()  # one process's indices; the shard-shaped state gathered whole

        def whole(v, p):
            if not (torch.is_tensor(v) and v.shape == p.to_local().shape and v.dim() > 0):
                return v.cpu() if torch.is_tensor(v) else v  # step counts and other non-shard-shaped state
            return DTensor.from_local(v, p.device_mesh, p.placements, shape=p.shape, stride=p.stride(),
                                      run_check=False).full_tensor().cpu()
        osd['state'] = {i: {k: whole(v, self.params[i]) for k, v in st.items()} for i, st in osd['state'].items()}
        return (model_sd, osd) if self.master else ({}, {})

    def load_optimizer(self, optimizer, state):
        """Load a full optimizer state dict (full_state's) into this run's optimizer: under FSDP each rank keeps its
        shard of every parameter-shaped tensor. The param groups' hyperparameters are this run's (its config wins:
        weight decay, betas, fused or not), only the state (moments, step counts) comes from the checkpoint."""
        saved, now = state['param_groups'], optimizer.param_groups
        if [len(g['params']) for g in saved] != [len(g['params']) for g in now]:
            raise UserError(f"the checkpoint's optimizer has {len(saved)} param groups of "
                            f"{[len(g['params']) for g in saved]} parameters, this run's {len(now)} of "
                            f"{[len(g['params']) for g in now]}: resume with the optimizer that wrote it")
        groups = [dict({k: v for k, v in g.items() if k != 'params'}, params=s['params']) for g, s in zip(now, saved)]
        st = state['state']
        if self.sharded:
            from torch.distributed.tensor import distribute_tensor

            def part(v, p):
                if not (torch.is_tensor(v) and v.shape == p.shape and v.dim() > 0):
                    return v
                return distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None).to_local()
            st = {i: {k: part(v, self.params[i]) for k, v in s.items()} for i, s in st.items()}
        optimizer.load_state_dict({'state': st, 'param_groups': groups})  # (moves the state to each parameter)


# =====================================================================================================================
# 2. Context parallelism: one sequence split over N ranks (train.py --context_parallel=N)
#
#
# Each row's T tokens are cut into 2N pieces of l = T / 2N; rank r holds pieces r and 2N − 1 − r, side by side (the
# load-balanced layout of ring attention: under a causal mask every rank then has the same share of the query-key
# pairs, where with one piece each the last rank would do 2N − 1 times the first's). `ContextParallel.take` cuts a
# rank's [B, 2l] out of the rows; the rest of the model (embeddings, MLPs, norms, the projections) is per token and
# needs nothing from other pieces. What crosses a piece boundary, and how (each piece as its own row: `split`):
#
#   linear mixers   every recurrence here is affine in its state: over a piece S_end = M·S_0 + S_local, where
#                   S_local is the end state from S_0 = 0 and M (d_k × d_k) the product of the per-token maps
#                   A_t = (I − β_t k_t k_tᵀ)·Diag(exp g_t) (the delta rule) or exp(g_t) (scalar / per-channel decay).
#                   Each rank computes its pieces' (S_local, M), ONE all-gather gives every rank all of them, and each
#                   folds them in piece order in fp32 (h ← M_p·h + S_p) into its pieces' true initial states h. The
#                   outputs are those from a zero start plus h's part, o_t += (P_tᵀ q_t)ᵀ h with P_t = A_t ⋯ A_1: for the
#                   delta rule P_tᵀ q_t (and M = P_l) come from the same kernel run with v = 0 and S_0 = I; for the decays
#                   P_t = exp(Σ_{s≤t} g_s) is a cumulative sum. (fla's fla/ops/cp and LASP-2 pass states the same way.)
#   short convs     the last W − 1 = 3 raw inputs of the previous piece (a halo), passed as the conv's `initial`
#   softmax         K and V of every piece (all-gathered); piece p's queries see every key of pieces < p and their own
#                   causally (PrefixCausalAttention)
#   RoPE, documents global positions; document starts seen across the boundaries (GPT.documents)
#   the loss        N × (this rank's summed token losses) / (the group's token count): averaged over the ranks,
#                   which is what DDP does to gradients and train.py's eval to losses, it is the mean over every
#                   token, exactly as one process computes it
#
# Every exchange is an all-gather from torch.distributed's functional collectives, which autograd differentiates (its
# backward is a reduce-scatter: each rank gets the gradients of the copies of its tensor). All ranks must therefore run
# the same collectives in the same order in the forward AND the backward: every rank takes what it needs from the
# gathered tensors, even where that is zeros (piece 0's initial state and halo), so its backward meets the others'.

# differentiable all-gather along dim 0 (its backward a reduce-scatter); renamed in torch 2.13, the old name kept for 2.11
_all_gather = getattr(fc, 'all_gather_single_autograd', None) or fc.all_gather_tensor_autograd


class ContextParallel:
    """The N ranks that share each row's sequence: `group` (a torch.distributed process group of N ranks, in rank
    order) and this rank's place in it; it holds pieces `pieces` = (r, 2N − 1 − r) of the 2N."""

    def __init__(self, group, rank, size):
        if size < 2:
            raise ValueError(f"context parallelism needs at least 2 ranks in its group, got {size}")
        self.group, self.rank, self.size = group, rank, size
        self.pieces = (rank, 2 * size - 1 - rank)

    def __repr__(self):
        return f"ContextParallel(rank {self.rank} of {self.size}, pieces {self.pieces})"

    def take(self, x):
        """This rank's two pieces of whole rows x [B, T] (T divisible by 2N) -> [B, 2l]."""
        l = x.size(1) // (2 * self.size)
        return torch.cat([x[:, p * l:(p + 1) * l] for p in self.pieces], dim=1)

    def positions(self, l):
        """Global positions [2, l] of this rank's two pieces of l tokens."""
        return torch.stack([torch.arange(p * l, (p + 1) * l) for p in self.pieces])

    @staticmethod
    def split(x, dim=1):
        """[B, 2l, ...] (this rank's tokens along `dim`) -> [2B, l, ...] (the token dim in dim's place): each piece its
        own row, row 2b + j = piece j of row b."""
        return x.unflatten(dim, (2, -1)).movedim(dim, 1).flatten(0, 1)

    @staticmethod
    def merge(x):
        """split's inverse: [2B, l, ...] -> [B, 2l, ...]."""
        return x.unflatten(0, (-1, 2)).flatten(1, 2)

    def gather(self, x):
        """[N, *x.shape]: x of every rank of the group, in rank order; differentiable."""
        return _all_gather(x.contiguous(), 0, self.group).view(self.size, *x.shape)

    def gather_pieces(self, x):
        """x [2B, ...] with one entry per piece row (split's order) -> [2N, B, ...]: every piece's, in piece order."""
        xs = self.gather(x.unflatten(0, (-1, 2)).movedim(1, 0))      # [N, 2, B, ...]: rank r's pieces r, 2N-1-r
        return torch.cat([xs[:, 0], xs[:, 1].flip(0)])

    def own(self, xs):
        """[2N, B, ...] in piece order -> this rank's pieces as rows [2B, ...] (split's order)."""
        return torch.stack([xs[p] for p in self.pieces], dim=1).flatten(0, 1)

    def previous(self, x):
        """x [2B, ...] per piece row -> the previous piece's x for each of this rank's pieces (zeros for piece 0)."""
        xs = self.gather_pieces(x)
        return self.own(torch.cat([torch.zeros_like(xs[:1]), xs[:-1]]))

    def initial_state(self, S, M, apply):
        """The initial state (fp32) of each of this rank's pieces [2B, H, d_k, d_v]: Σ_{q<p} M_{p−1}⋯M_{q+1}·S_q, from
        every piece's end state from zero S [2B, H, d_k, d_v] and transition M; apply(M_q, h) = M_q·h. All 2N starts
        are formed on every rank and this rank's picked, so that each rank's backward reaches the all-gather."""
        Ss, Ms = self.gather_pieces(S.float()), self.gather_pieces(M.float())
        h = torch.zeros_like(Ss[0])
        starts = [h]
        for p in range(2 * self.size - 1):
            h = apply(Ms[p], h) + Ss[p]
            starts.append(h)
        return self.own(torch.stack(starts))

    def total(self, x):
        """x summed over the group (no gradient): token counts."""
        return fc.all_reduce(x.detach(), 'sum', self.group)

    def rope(self, rotary, x):
        """model.Rotary applied to x [B, 2l, nh, hs] at this rank's pieces' global positions."""
        l = x.size(1) // 2
        return torch.cat([rotary(x[:, j * l:(j + 1) * l], p * l) for j, p in enumerate(self.pieces)], dim=1)


# ---------------------------------------------------------------------------------------------------------------------
# The linear mixers' recurrences (model.scan's calls, split over the group)

def delta_rule(cp, q, k, v, beta, g=None, scale=None, path='auto', **gate):
    """kernels.delta_rule over this rank's two pieces [B, 2l, ...] of sequences split over cp's group (g per token,
    or the gate's input with `gate`) -> o [B, 2l, H, d_v]."""
    q, k, v, beta = (cp.split(t) for t in (q, k, v, beta))
    g = None if g is None else cp.split(g)
    o, S = kernels.delta_rule(q, k, v, beta, g, scale=scale, output_final_state=True, path=path, **gate)
    B, l, H, dk = k.shape
    eye = torch.eye(dk, device=k.device, dtype=torch.float32).expand(B, H, dk, dk).contiguous()
    # the same recurrence with v = 0 from S_0 = I: its outputs are P_tᵀ q_t, its end state M = P_l. Its backward
    # recomputes its chunk states (keep=False): kept, they doubled what each rank holds for the backward, so that a
    # rank with 1/N of the tokens kept 2/N of one GPU's kernel states
    qP, M = kernels.delta_rule(q, k, torch.zeros_like(k), beta, g, scale=scale, initial_state=eye,
                               output_final_state=True, path=path, keep=False, **gate)
    h0 = cp.initial_state(S, M, lambda M, h: M @ h)
    return cp.merge((o.float() + torch.einsum('bthk,bhkv->bthv', qP.float(), h0)).to(o.dtype))


def linear_attn(cp, q, k, v, g=None, scale=None, path='auto', dt=None, D=None):
    """kernels.linear_attn (scalar decay g [H] or [B, T, H]; per-channel [B, T, H, d_k]) over this rank's two pieces
    [B, 2l, ...] of sequences split over cp's group -> o [B, 2l, H, d_v]. q, k may have one head shared by all
    (Mamba2)."""
    q, k, v = (cp.split(t) for t in (q, k, v))
    g = g if g is None or g.dim() == 1 else cp.split(g)
    ssd = {} if dt is None else dict(dt=cp.split(dt), D=D)
    o, S = kernels.linear_attn(q, k, v, g, scale=scale, output_final_state=True, path=path, **ssd)
    B, l, H = v.shape[:3]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if g is None:
        g = q.new_zeros(H, dtype=torch.float32)
    if g.dim() == 1:  # a constant per head (RetNet): Σ_{s≤t} g_s = (t + 1)·g
        G = torch.arange(1, l + 1, device=q.device, dtype=torch.float32)[:, None] * g.float()   # [l, H]
        G = G.expand(B, l, H)
    else:
        G = g.float().cumsum(dim=1)                                  # [B, l, H] or [B, l, H, d_k]
    decay = G.exp() if G.dim() == 4 else G.exp()[..., None]          # P_t, as a factor of q's channels
    M = decay[:, -1]                                                 # [B, H, 1] or [B, H, d_k]
    qP = scale * q.float() * decay                                   # [B, l, H, d_k]
    h0 = cp.initial_state(S, M, lambda M, h: M[..., None] * h)
    return cp.merge((o.float() + torch.einsum('bthk,bhkv->bthv', qP, h0)).to(o.dtype))


def short_conv(cp, x, weight, bias=None, norm=0, path='auto', doc_pos=None, split=None):
    """kernels.short_conv over this rank's two pieces x [B, 2l, D], each starting from its previous piece's last W − 1
    inputs (zeros before piece 0) -> y [B, 2l, D] (or one per part of split)."""
    xs = cp.split(x)
    halo = cp.previous(xs[:, -(weight.size(1) - 1):])
    ys = kernels.short_conv(xs, weight, bias, initial=halo, norm=norm, path=path,
                            doc_pos=None if doc_pos is None else cp.split(doc_pos), split=split)
    return cp.merge(ys) if split is None else [cp.merge(y) for y in ys]


# ---------------------------------------------------------------------------------------------------------------------
# Softmax attention over the whole sequence's keys

# On CUDA the two parts run on cuDNN's attention: the kernel F.scaled_dot_product_attention picks for the one-GPU
# model's causal softmax on Hopper; PyTorch's FA2 runs the same blocks markedly slower.
CUDNN = True


def _flash(q, k, v, causal):
    """(o, lse, state for _flash_bwd): cuDNN's or PyTorch's flash attention (bf16/fp16 on CUDA), or its CPU kernel."""
    if q.is_cuda and CUDNN:
        o, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal)
        return o, lse, ('cudnn', cq, ck, mq, mk, seed, offset)
    if q.is_cuda:
        o, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        return o, lse, ('flash', cq, ck, mq, mk, seed, offset)
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return o, lse, ('cpu',)


def _flash_bwd(do, q, k, v, o, lse, causal, state):
    kind, *st = state
    if kind == 'cudnn':
        cq, ck, mq, mk, seed, offset = st
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            do, q, k, v, o, lse, seed, offset, None, cq, ck, mq, mk, 0.0, causal)   # None: no attn_bias
    if kind == 'flash':
        cq, ck, mq, mk, seed, offset = st
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(do, q, k, v, o, lse, cq, ck, mq, mk, 0.0,
                                                                           causal, seed, offset)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, causal)


class PrefixCausalAttention(torch.autograd.Function):
    """Attention of queries q [B, h, L, d] over every key of the earlier pieces (k_pre, v_pre [B, h, P, d], no mask)
    and causally over their own piece's (k, v [B, h, L, d]): two flash calls merged by their log-sum-exps,
    o = Σ_j exp(lse_j − lse)·o_j, lse = log Σ_j exp(lse_j). The backward runs flash's backward on each part with the
    MERGED o and lse (its softmax weights exp(s − lse) and rowsum(dO ∘ O) are then the whole row's), as ring
    attention does; dq is the sum of the parts'. Less memory than one SDPA call with a lower-right causal mask over
    P + L keys, and on cuDNN faster than it (that mask runs on FA2)."""

    @staticmethod
    def forward(ctx, q, k_pre, v_pre, k, v):
        o1, lse1, st1 = _flash(q, k_pre, v_pre, False)
        o2, lse2, st2 = _flash(q, k, v, True)
        lse = torch.logaddexp(lse1, lse2)                  # [B, h, L] (flash) or [B, h, L, 1] (cuDNN)
        B, h, L, _ = q.shape
        w1, w2 = ((l - lse).reshape(B, h, L, 1).exp() for l in (lse1, lse2))
        o = (o1.float() * w1 + o2.float() * w2).to(q.dtype)
        ctx.save_for_backward(q, k_pre, v_pre, k, v, o, lse)
        ctx.states = (st1, st2)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k_pre, v_pre, k, v, o, lse = ctx.saved_tensors
        do = do.contiguous()
        dq1, dk_pre, dv_pre = _flash_bwd(do, q, k_pre, v_pre, o, lse, False, ctx.states[0])
        dq2, dk, dv = _flash_bwd(do, q, k, v, o, lse, True, ctx.states[1])
        return dq1 + dq2, dk_pre, dv_pre, dk, dv


def attention(cp, q, k, v, enable_gqa=False, docs=None):
    """Causal attention of this rank's queries q [B, h, 2l, hs] (two pieces) over the keys and values of every piece
    up to each one's (k, v [B, h_kv, 2l, hs], gathered): piece p's queries see all of pieces < p and their own
    causally. docs: GPT.documents' dict under context parallelism ('cp_mask': per own piece [B, 1, l, (p+1)·l] bool,
    or 'cp_block_mask')."""
    l = q.size(2) // 2
    Ks, Vs = (cp.gather_pieces(cp.split(t, dim=2)) for t in (k, v))   # [2N, B, h_kv, l, hs] in piece order
    if enable_gqa:
        Ks, Vs = (t.repeat_interleave(q.size(1) // t.size(2), dim=2) for t in (Ks, Vs))
    flash = (q.dtype in (torch.float16, torch.bfloat16)) if q.is_cuda else q.dtype == torch.float32
    ys = []
    for j, p in enumerate(cp.pieces):
        qj = q[:, :, j * l:(j + 1) * l]
        if docs is not None:
            K, V = (t[:p + 1].movedim(0, 2).flatten(2, 3) for t in (Ks, Vs))   # [B, h, (p+1)·l, hs]
            if 'cp_block_mask' in docs:
                from torch.nn.attention.flex_attention import flex_attention
                ys.append(flex_attention(qj, K, V, block_mask=docs['cp_block_mask'][j]))
            else:
                ys.append(F.scaled_dot_product_attention(qj, K, V, attn_mask=docs['cp_mask'][j]))
        elif p == 0:
            ys.append(F.scaled_dot_product_attention(qj, Ks[0], Vs[0], is_causal=True))
        elif flash:  # the earlier pieces' keys with no mask, the own piece's causally (PrefixCausalAttention)
            K, V = (t[:p].movedim(0, 2).flatten(2, 3) for t in (Ks, Vs))
            ys.append(PrefixCausalAttention.apply(qj.contiguous(), K.contiguous(), V.contiguous(),
                                                  Ks[p].contiguous(), Vs[p].contiguous()))
        else:  # fp32 on CUDA: one call, the causal mask aligned to the last key
            from torch.nn.attention.bias import causal_lower_right
            K, V = (t[:p + 1].movedim(0, 2).flatten(2, 3) for t in (Ks, Vs))
            ys.append(F.scaled_dot_product_attention(qj, K, V, attn_mask=causal_lower_right(l, K.size(2))))
    return torch.cat(ys, dim=2)


# ---------------------------------------------------------------------------------------------------------------------
# Documents and the loss

def documents(cp, idx, eot_token):
    """GPT.documents for this rank's two pieces idx [B, 2l] of rows split over cp's group: document starts (the row's
    first token, and every EOT) at GLOBAL positions, seen across the piece boundaries. -> (reset [B, 2l], conv_pos
    [B, 2l], and per own piece j: its queries' document ids [B, l], the document ids of the keys of every piece up to
    it [B, (p_j+1)·l], its queries' global positions [l]) — see GPT.documents."""
    xs = cp.split(idx)                                               # [2B, l]: the pieces as rows
    B2, l = xs.shape
    if l < 3:
        raise ValueError(f"documents under context parallelism need pieces of at least 3 tokens, got {l}")
    t = cp.positions(l).to(idx.device).repeat(B2 // 2, 1)            # [2B, l] global positions
    start = (xs == eot_token) | (t == 0)
    # the conv's window reaches 3 tokens back: the previous piece's last 3 starts decide the first tokens' positions
    ext = torch.cat([cp.previous(start[:, -3:].to(torch.uint8)).bool(), start], dim=1)   # [2B, 3 + l]
    te = torch.arange(-3, l, device=idx.device)
    first = torch.where(ext, te, -4).cummax(dim=1).values[:, 3:]     # local position of each token's document start
    conv_pos = (torch.arange(l, device=idx.device) - first).clamp(max=3).to(torch.uint8)
    # document ids: starts counted from the row's beginning, over every piece in order
    counts = cp.gather_pieces(start.sum(dim=1, dtype=torch.int32))   # [2N, B]
    before = torch.cat([torch.zeros_like(counts[:1]), counts.cumsum(0, dtype=torch.int32)[:-1]])   # [2N, B]
    doc = start.cumsum(dim=1, dtype=torch.int32) + cp.own(before)[:, None]                         # [2B, l]
    docs_all = cp.gather_pieces(doc)                                 # [2N, B, l]
    pieces = []
    for j, p in enumerate(cp.pieces):
        keys = docs_all[:p + 1].movedim(0, 1).flatten(1, 2)          # [B, (p+1)·l]
        pieces.append((doc[j::2], keys, t[j]))
    return cp.merge(start & (t > 0)), cp.merge(conv_pos), pieces


def loss(cp, logits, targets):
    """Cross-entropy of this rank's pieces (targets −1 ignored), as its share of the group's mean times N (see top)."""
    total = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                            ignore_index=-1, reduction='sum')
    count = cp.total((targets != -1).sum().float())
    return total * cp.size / count
