"""
The optimizers and learning-rate schedules of train.py (model.GPT.configure_optimizers picks the optimizer's groups).

AdamW is torch's. Muon, below, is one torch.optim.Optimizer whose param groups say which rule updates them: the
blocks' weight matrices by Muon, everything else (embedding, head, norms, gains, biases, decay rates, conv kernels)
by AdamW, so that train.py and parallel.py handle it as any optimizer (one state dict, one step, sharded by FSDP).

Muon (Keller Jordan, 2024, kellerjordan.github.io/posts/muon; Moonshot's "Muon is Scalable for LLM Training",
arXiv 2502.16982), for a weight matrix W [m, n] with gradient G:

    M ← μ·M + G                       momentum (μ = 0.95)
    U ← G + μ·M                       Nesterov's look-ahead
    O ← NewtonSchulz5(U)              ≈ the orthogonal factor of U's polar decomposition (U = O·P)
    W ← W − lr·(wd·W + 0.2·√max(m, n)·O)

The orthogonal factor has every singular value ≈ 1, so its RMS is 1/√max(m, n); the scale 0.2·√max(m, n) (Moonlight's)
gives the update AdamW's typical RMS of about 0.2, so the two rules share one learning rate and weight decay.
"""
import math

import torch
from torch.optim.adamw import adamw  # the functional form of torch.optim.AdamW's update

# Newton–Schulz: X ← a·X + b·(XXᵀ)X + c·(XXᵀ)²X pushes every singular value of X (normalised to norm ≤ 1) towards ~1
# in five steps; coefficients from Keller Jordan's Muon (tuned for the largest slope at 0, not exact convergence:
# singular values end in about [0.7, 1.2], which works as well in training)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_DTYPE = torch.bfloat16  # tensor cores; its rounding is far below what the iteration's approximation leaves


def newton_schulz(G, steps=5):
    """≈ the orthogonal polar factor of each matrix in G [..., m, n], computed in NS_DTYPE."""
    a, b, c = NS_COEFFICIENTS
    X = G.to(NS_DTYPE).reshape(-1, *G.shape[-2:])  # a batch of matrices
    tall = G.size(-2) > G.size(-1)
    if tall:  # iterate on the wide orientation: XXᵀ is the smaller square
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)  # Frobenius norm ≥ spectral norm: singular values ≤ 1
    for _ in range(steps):  # three kernels a step: baddbmm(M, P, Q, beta, alpha) = beta·M + alpha·P@Q
        A = X @ X.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b·A + c·A²
        X = torch.baddbmm(X, B, X, beta=a, alpha=1)  # a·X + B·X
    return (X.mT if tall else X).reshape(G.shape)


def muon_update(ps, grads, ms, keep, lr, wd, mu, ns_steps, whole=None, part=None):
    """Muon's rule (the module docstring) on matrices of one shape, stacked: ps the parameters, grads their
    gradients, ms their momentum buffers (fp32), keep None or a 0-dim tensor (1: apply, 0: skip the step).
    whole, part: under FSDP, each matrix gathered whole from the ranks' rows, and this rank's rows taken back."""
    step = lr if keep is None else lr * keep  # a skipped step: a rate of 0 (and M kept as it was, below)
    G, M = torch.stack(grads).float(), torch.stack(ms)
    if keep is not None:  # a non-finite G never reaches M; a skipped step leaves M as it was
        G = G.nan_to_num_(0.0, 0.0, 0.0)
        M = torch.where(keep.bool(), M * mu + G, M)
    else:
        M = M.mul_(mu).add_(G)
    torch._foreach_copy_(ms, M.unbind(0))
    U = G.add_(M, alpha=mu)  # Nesterov's G + μM
    if whole is not None:
        U = whole(U)
    O = newton_schulz(U, ns_steps).float().mul_(0.2 * math.sqrt(max(U.shape[1:])))  # one batch
    if part is not None:
        O = part(O)
    torch._foreach_mul_(ps, 1 - step * wd)
    torch._foreach_sub_(ps, O.mul_(step).to(ps[0].dtype).unbind(0))


class Muon(torch.optim.Optimizer):
    """Muon for the groups with muon=True (2-D parameters), AdamW (torch's rule) for the others; lr, weight_decay
    and AdamW's betas and eps per group. found_inf (a 0-dim tensor, set by train.py before step) skips a step on the
    device, with no host sync, as fused AdamW does. Matrices of one shape are orthogonalised together, as a batch.
    whole, part: under FSDP (parallel.Parallel.shard sets them) a parameter here is one rank's rows of the matrix;
    whole(i, t) gathers the whole matrix of parameter i's tensor t, part(i, t) takes this rank's rows back, and
    whole_shape(i) is that matrix's shape."""
    skips_on_device = True

    def __init__(self, param_groups, lr=1e-3, weight_decay=0.0, momentum=0.95, betas=(0.9, 0.95), eps=1e-8,
                 ns_steps=5):
        # fused: the AdamW groups step by torch's fused kernel, and torch's load_state_dict then puts their step
        # counts on the parameters' device, where that kernel needs them (a resumed run's state comes from the CPU)
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, betas=betas, eps=eps, ns_steps=ns_steps,
                        muon=False, fused=True)
        super().__init__(param_groups, defaults)
        self.found_inf = None  # train.py's lagged read relies on the skip below (skips_on_device)
        self.whole = self.part = self.whole_shape = None
        self.compiled = None  # compile_update()

    def compile_update(self):
        """Run each shape's update through torch.compile: its elementwise passes fused around the Newton–Schulz
        matmuls (train.py's compile=True, except under FSDP, whose gathers run eagerly). One graph per shape."""
        shapes = {tuple(p.shape) for g in self.param_groups if g['muon'] for p in g['params']}
        limit = torch._dynamo.config.recompile_limit  # a graph per shape: dynamo must not fall back to eager code
        torch._dynamo.config.recompile_limit = max(limit, len(shapes) + 1)
        self.compiled = torch.compile(muon_update)

    @torch.no_grad()
    def step(self):
        keep = None if self.found_inf is None else (self.found_inf == 0).float()  # 1: apply the step, 0: skip it
        index = 0  # a parameter's place in the optimizer's order (whole/part's i)
        for group in self.param_groups:
            params = [(index + k, p) for k, p in enumerate(group['params'])]
            index += len(params)
            params = [(i, p) for i, p in params if p.grad is not None]
            if group['muon']:
                self._muon(group, params, keep)
            elif params:
                self._adamw(group, params)

    def _muon(self, group, params, keep):
        """The rule of the module docstring, on the matrices of one shape at a time as one stacked tensor: a few
        kernels per shape rather than a dozen per matrix, so that the time goes to the Newton–Schulz matmuls."""
        lr, wd, mu = group['lr'], group['weight_decay'], group['momentum']
        by_shape = {}  # (under FSDP by the whole matrix's shape: shards of two different matrices may match)
        for i, p in params:
            by_shape.setdefault(tuple(p.shape) if self.whole is None else self.whole_shape(i), []).append((i, p))
        for shape, items in by_shape.items():
            ps = [p for _, p in items]
            for p in ps:
                if 'momentum_buffer' not in self.state[p]:
                    self.state[p]['momentum_buffer'] = torch.zeros_like(p, dtype=torch.float32)
            ms = [self.state[p]['momentum_buffer'] for p in ps]
            if self.whole is None and self.compiled:  # the lr as a tensor: one compiled graph for every step
                self.compiled(ps, [p.grad for p in ps], ms, keep, torch.full((), lr, device=ps[0].device), wd, mu,
                              group['ns_steps'])
            else:
                whole = part = None
                if self.whole is not None:
                    whole = lambda U: torch.stack([self.whole(i, u) for (i, _), u in zip(items, U.unbind(0))])
                    part = lambda O: torch.stack([self.part(i, o) for (i, _), o in zip(items, O.unbind(0))])
                muon_update(ps, [p.grad for p in ps], ms, keep, lr, wd, mu, group['ns_steps'], whole, part)

    def _adamw(self, group, params):
        """torch's fused AdamW kernel on these parameters (its state: step, exp_avg, exp_avg_sq, as torch.optim.AdamW)."""
        for _, p in params:
            if not self.state[p]:
                self.state[p].update(step=torch.zeros((), dtype=torch.float32, device=p.device),
                                     exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        ps = [p for _, p in params]
        states = [self.state[p] for p in ps]
        adamw(ps, [p.grad for p in ps], [s['exp_avg'] for s in states], [s['exp_avg_sq'] for s in states], [],
              [s['step'] for s in states], fused=True, found_inf=self.found_inf, amsgrad=False, beta1=group['betas'][0],
              beta2=group['betas'][1], lr=group['lr'], weight_decay=group['weight_decay'], eps=group['eps'],
              maximize=False)


def lr_at(it, schedule, learning_rate, min_lr, warmup_iters, lr_decay_iters, max_iters, decay_fraction):
    """The learning rate of step it. Both schedules warm up linearly for warmup_iters steps. cosine (nanoGPT's): then
    a cosine from learning_rate to min_lr at lr_decay_iters, then min_lr. wsd (warmup-stable-decay): then
    learning_rate until the last decay_fraction of max_iters, over which it falls linearly to min_lr."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if schedule == 'wsd':
        decay_iters = round(decay_fraction * max_iters)  # whole steps; 0: no decay
        done = it - (max_iters - decay_iters) + 1  # decay steps taken, counting this one
        if done <= 0:
            return learning_rate
        return learning_rate + (min_lr - learning_rate) * min(1.0, done / max(decay_iters, 1))
    if it >= lr_decay_iters:  # (>=: no division by zero when lr_decay_iters == warmup_iters)
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)  # cosine: 1 -> 0
