# A trained KDA model's gates against init's: how often KDA's kernels take their slower forms, and what that costs.
# usage: python .gpu/gatetime.py RUN_DIR  (a train.py out_dir with kda layers; one val batch of B x block_size)
# Per KDA layer: the gate g = -exp(A_log) softplus(u + dt_bias) of the batch, then per 64-token chunk (EXP_SPAN = 60)
#  fwd: the share of rows formed by the whole-chunk Gram kernel (two halves about their first row; the rest by 16 x 16
#       blocks), as _grams_chunk_kernel decides; bwd: the share of (chunk, key tile) programs in each group size (64:
#       one level, 16: the groups, 1: six dyadic levels), as _grads_bwd_kernel decides (about midpoints)
#  time: delta_rule fwd+bwd (Triton) on the layer's own q, k, v, beta with its trained gate, and with init's gate
#       (u = 0.5 randn, A_log and dt_bias drawn by init_decay_rates, as kdatime.py and the speed benches)
#  fla: where fla imports (FLA=DIR: fla-core's and einops' wheels, installed into /tmp/site), fla's chunk_kda with the
#       gate formed in its kernel on the same inputs, trained and init, and the relative RMS difference of the outputs
import os, sys
sys.path[:0] = ['.', 'tools']
import numpy as np, torch
import kernels
from checkpoint import load_checkpoint, build_model
from dataloader import read_shard, shard_paths
from model import init_decay_rates
run = sys.argv[1]
dev = 'cuda' if torch.cuda.is_available() else 'cpu'
path = 'triton' if dev == 'cuda' else 'torch'
ck = load_checkpoint(os.path.join(run, 'ckpt.pt'), map_location='cpu', need='model')
model = build_model(ck, run, dict(ck['model_args'])).to(dev).eval()
T = ck['model_args']['block_size']
B = int(os.environ.get('B', 8 if dev == 'cuda' else 1))
tok = np.concatenate([read_shard(p) for p in shard_paths(os.path.join('data', ck['config']['dataset']), 'val')])
x = torch.from_numpy(tok[:B * T].astype(np.int64)).view(B, T).to(dev)
seen = []
real = kernels.delta_rule
def record(q, k, v, beta, g=None, *a, **kw):
    if kw.get('A_log') is not None and g is not None and g.dim() == 4:
        seen.append(dict(q=q.detach(), k=k.detach(), v=v.detach(), beta=beta.detach(), u=g.detach(),
                         A_log=kw['A_log'].detach(), dt_bias=kw['dt_bias'].detach(), lb=kw.get('lower_bound')))
    return real(q, k, v, beta, g, *a, **kw)
kernels.delta_rule = record
with torch.no_grad(), torch.autocast(dev, torch.bfloat16, enabled=dev == 'cuda'):
    model(x)
kernels.delta_rule = real
if not seen or any(s['lb'] is not None for s in seen):  # (documents=True forms g itself; the bounded gate has no S=1)
    sys.exit(f"{run}: {'no KDA layer with its gate formed in the kernels' if not seen else 'a bounded gate'}: "
             "gatetime models the unbounded gate formed in the kernels only")
print(f"{run}: {len(seen)} KDA layers, batch {B} x {T}, {torch.cuda.get_device_name() if dev == 'cuda' else 'CPU'}")

EXP_SPAN = 60.0  # kernels.EXP_SPAN

def forms(g, span=EXP_SPAN, C=64):
    """(fwd: share of rows formed whole-chunk, bwd: shares of chunks at S = 64, 16, 1) for g [B, T, H, D]"""
    Bq, Tq, H, D = g.shape
    n = Tq // C
    G = g[:, :n * C].float().view(Bq, n, C, H, D).cumsum(2)          # within each chunk
    h1, h2 = G[:, :, :32], G[:, :, 32:]
    out1 = (h1 - h1[:, :, :1]).abs().amax(-1)                          # [B, n, 32, H]
    out2 = (h2 - h2[:, :, :1]).abs().amax(-1)
    cross = (h2[:, :, :1] - h1).amax(-1).amax(2, keepdim=True)          # nu2 - G_i for i < 32, over the half
    out2 = torch.maximum(out2, cross)
    bad = torch.cat([out1, out2], 2) > span                            # [B, n, 64, H]
    first = torch.where(bad.any(2), bad.float().argmax(2), torch.full_like(bad[:, :, 0], C, dtype=torch.float))
    fwd = (first / C).mean().item()
    # the backward decides per key tile of BK channels (one program each: _grads_bwd_kernel), about midpoints
    BK = min(D, kernels.TUNING['kda_grads']['k'])
    Gt = G.view(Bq, n, C, H, D // BK, BK)
    mid = (Gt[:, :, :1] + Gt[:, :, -1:]) / 2
    whole = ((Gt - mid).abs().amax((2, 5)) <= span)                    # [B, n, H, tiles]
    g16 = Gt.view(Bq, n, 4, 16, H, D // BK, BK)
    m16 = (g16[:, :, :, :1] + g16[:, :, :, -1:]) / 2
    by16 = ((g16 - m16).abs().amax((3, 6)) <= span).all(2)
    def by(S):  # every S-row group of the tile within span of its midpoint (a smaller group size the kernel could add)
        gs = Gt.view(Bq, n, C // S, S, H, D // BK, BK)
        return ((gs - (gs[:, :, :, :1] + gs[:, :, :, -1:]) / 2).abs().amax((3, 6)) <= span).all(2)
    one = ~whole & ~by16
    smaller = [(one & by(S)).float().mean().item() for S in (8, 4, 2)]  # cumulative: 4 passes where 8 does
    return (fwd, whole.float().mean().item(), (~whole & by16).float().mean().item(), one.float().mean().item(),
            smaller)

chunk_kda = None
def load_fla():  # FLA=DIR: fla-core's and einops' wheels (offline), installed into /tmp/site, ahead of any other fla
    global chunk_kda
    try:
        import subprocess
        subprocess.run(f"{sys.executable} -m pip install -q --no-deps --no-index --disable-pip-version-check "
                       f"--target /tmp/site {os.environ['FLA']}/*.whl", shell=True, check=True)
        sys.path.insert(0, '/tmp/site')
        import fla
        from fla.ops.kda import chunk_kda
        print(f"fla {fla.__version__}: chunk_kda timed beside ours")
    except Exception as e:  # noqa: BLE001
        print(f"fla: not timed ({type(e).__name__}: {e})")

def call(impl, q, k, v, beta, u, A_log, dt_bias, lb):
    if impl == 'ours':
        return kernels.delta_rule(q, k, v, beta, u, A_log=A_log, dt_bias=dt_bias, lower_bound=lb, path=path)[0]
    return chunk_kda(q, k, v, u, beta, A_log=A_log, dt_bias=dt_bias.reshape(-1), use_gate_in_kernel=True,
                     safe_gate=lb is not None, lower_bound=lb)[0]

def timed(s, u, A_log, dt_bias, reps=10, impl='ours', fwd_only=False):
    # fwd_only: the training forward (inputs needing grad: what it stores for the backward is written) without the
    # backward; the gradients come back from autograd.grad, never summed into .grad (that would add its own traffic)
    leaves = [t.clone().requires_grad_() for t in (s['q'], s['k'], s['v'], s['beta'], u)]
    do = torch.randn_like(s['v'])
    def step():
        o = call(impl, *leaves, A_log, dt_bias, s['lb'])
        if not fwd_only:
            torch.autograd.grad(o, leaves, do)
    for _ in range(3):
        step()
    if dev != 'cuda':
        return float('nan')
    ms = []
    for _ in range(5):
        e = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        torch.cuda.synchronize(); e[0].record()
        for _ in range(reps):
            step()
        e[1].record(); torch.cuda.synchronize()
        ms.append(e[0].elapsed_time(e[1]) / reps)
    return min(ms)

torch.manual_seed(0)
print("| layer | fwd rows whole-chunk (trained / init) | bwd programs S=64 / 16 / 1 (trained) | (init) | fwd+bwd ms trained | init | ratio | fwd ms trained / init |")
print("|---|---|---|---|---|---|---|---|")
tot, fla_tot, inits = [0.0] * 4, [0.0] * 4, []  # fla: its trained, init; ours on its layers
for i, s in enumerate(seen):
    H, D = s['u'].shape[2:]
    A0, _ = init_decay_rates(H); _, d0 = init_decay_rates(H * D)
    A0, d0 = A0.detach().to(dev), d0.detach().view(H, D).to(dev)
    u0 = (0.5 * torch.randn_like(s['u'].float())).to(s['u'].dtype)
    gt = kernels.decay_gate(s['u'], s['A_log'], s['dt_bias'], s['lb'])
    gi = kernels.decay_gate(u0, A0, d0, None)
    ft, fi = forms(gt), forms(gi)
    lg = gt.float().flatten()  # the trained per-token log-decays: how many channels forget within a few tokens
    # an S-row group fails the midpoint test when its mean log-decay is below -2 EXP_SPAN / (S - 1)
    cuts = [2 * EXP_SPAN / (S - 1) for S in (16, 8, 4, 2)]
    shares = [(lg < -x).float().mean().item() for x in cuts]
    note = (f"layer {i}: of all tiles, those at S=1 that 8 / 4 / 2-row groups would take: {ft[4][0]:.2f} / {ft[4][1]:.2f} / "
                 f"{ft[4][2]:.2f}; log-decays below {' / '.join(f'-{x:.1f}' for x in cuts)}: "
                 f"{' / '.join(f'{x:.3f}' for x in shares)}, median {lg.median().item():.3f}")
    mt, mi = timed(s, s['u'], s['A_log'], s['dt_bias']), timed(s, u0, A0, d0)
    pt, pi = timed(s, s['u'], s['A_log'], s['dt_bias'], fwd_only=True), timed(s, u0, A0, d0, fwd_only=True)
    tot[0] += mt; tot[1] += mi; tot[2] += pt; tot[3] += pi
    print(f"| {i} | {ft[0]:.3f} / {fi[0]:.3f} | {ft[1]:.2f} / {ft[2]:.2f} / {ft[3]:.2f} | {fi[1]:.2f} / {fi[2]:.2f} / {fi[3]:.2f} "
          f"| {mt:.3f} | {mi:.3f} | {mt / mi:.3f} | {pt:.3f} / {pi:.3f} |\n{note}", flush=True)
    inits.append((u0, A0, d0, mt, mi))
print(f"all KDA layers: trained {tot[0]:.3f} ms, init {tot[1]:.3f} ms, ratio {tot[0] / max(tot[1], 1e-9):.3f}; "
      f"forward alone {tot[2]:.3f} / {tot[3]:.3f} ms, backward (the rest) {tot[0] - tot[2]:.3f} / {tot[1] - tot[3]:.3f} ms")
if dev == 'cuda' and os.environ.get('FLA'):
    load_fla()
# fla after ours (a cut call keeps ours' table), on a few layers (its first call autotunes: minutes when cold)
for i in [int(x) for x in os.environ.get('FLA_LAYERS', '0 3 6 9 11').split()] if chunk_kda is not None else []:
    if i >= len(seen):
        continue
    s, (u0, A0, d0, mt, mi) = seen[i], inits[i]
    try:
        with torch.no_grad():
            o = [call(m, s['q'], s['k'], s['v'], s['beta'], s['u'], s['A_log'], s['dt_bias'], s['lb']).float()
                 for m in ('ours', 'fla')]
        diff = ((o[0] - o[1]).norm() / o[1].norm()).item()
        ft_, fi_ = timed(s, s['u'], s['A_log'], s['dt_bias'], impl='fla'), timed(s, u0, A0, d0, impl='fla')
        fla_tot[0] += ft_; fla_tot[1] += fi_; fla_tot[2] += mt; fla_tot[3] += mi
        print(f"fla layer {i}: chunk_kda fwd+bwd trained {ft_:.3f} ms, init {fi_:.3f} ms ({ft_ / fi_:.3f}); ours/fla "
              f"trained {mt / ft_:.3f}, init {mi / fi_:.3f}; o vs ours {diff:.1e}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"fla layer {i}: failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
if fla_tot[0]:
    print(f"fla's chunk_kda: trained {fla_tot[0]:.3f} ms, init {fla_tot[1]:.3f} ms; ours/fla trained "
          f"{fla_tot[2] / fla_tot[0]:.3f}, init {fla_tot[3] / fla_tot[1]:.3f} (over the layers fla ran)")
