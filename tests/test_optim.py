"""
optim.py against references written here from the algorithms: Newton–Schulz in fp64, Muon's update rule step by
step, torch's own AdamW for the rest, the schedules' shapes; and model.configure_optimizers' parameter split.
CPU, seconds. (Training with Muon, resume, DDP and FSDP: tests/test_train.py.)

$ python -m pytest tests/test_optim.py -q
"""
import math

import pytest
import torch

import optim
from model import GPT, GPTConfig, MIXERS
from optim import Muon, lr_at, newton_schulz


def ns_reference(G, steps=5):
    """Newton–Schulz written out in fp64 for one matrix: X ← aX + b(XXᵀ)X + c(XXᵀ)²X from X = G/‖G‖_F (on the
    wide orientation)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.double()
    if X.shape[0] > X.shape[1]:
        return ns_reference(X.T, steps).T
    X = X / (torch.linalg.matrix_norm(X) + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        X = a * X + b * A @ X + c * A @ A @ X
    return X


@pytest.fixture
def fp64_ns(monkeypatch):
    monkeypatch.setattr(optim, 'NS_DTYPE', torch.float64)


def test_newton_schulz_matches_the_fp64_reference_batched_and_in_bf16(fp64_ns):
    g = torch.Generator().manual_seed(0)
    for shape in ((24, 40), (40, 24), (32, 32)):
        G = torch.randn(3, *shape, generator=g, dtype=torch.float64)
        O = newton_schulz(G)  # a batch of three, each orthogonalised on its own
        for k in range(3):
            torch.testing.assert_close(O[k], ns_reference(G[k]), rtol=1e-10, atol=1e-12)
        s = torch.linalg.svdvals(O)  # ≈ orthogonal: every singular value near 1 (Keller's coefficients: ~0.7..1.2)
        assert s.min() > 0.5 and s.max() < 1.3, s
    optim.NS_DTYPE = torch.bfloat16  # (the monkeypatch restores fp64's opposite after the test)
    G = torch.randn(48, 80, generator=g)
    err = (newton_schulz(G).double() - ns_reference(G)).norm() / ns_reference(G).norm()
    assert err < 0.05, err  # bf16's rounding, far below what separates the result from the true polar factor


def muon_reference(W, grads, lr, wd, mu=0.95):
    """Muon's rule step by step in fp64: M ← μM + G; U = G + μM; W ← W − lr·(wd·W + 0.2·√max(m, n)·NS(U))."""
    W, M = W.double().clone(), torch.zeros_like(W, dtype=torch.float64)
    for G in grads:
        M = mu * M + G.double()
        U = G.double() + mu * M
        W = W - lr * (wd * W + 0.2 * math.sqrt(max(W.shape)) * ns_reference(U))
    return W, M


def test_muon_update_rule_matches_the_algorithm(fp64_ns):
    """Three matrices, two of one shape (orthogonalised as one batch) and one of another, three steps."""
    g = torch.Generator().manual_seed(1)
    Ws = [torch.randn(16, 24, generator=g, dtype=torch.float64) for _ in range(2)] + [
        torch.randn(40, 16, generator=g, dtype=torch.float64)]
    params = [torch.nn.Parameter(W.clone()) for W in Ws]
    grads = [[torch.randn(W.shape, generator=g, dtype=torch.float64) for _ in range(3)] for W in Ws]
    opt = Muon([{'params': params, 'muon': True, 'weight_decay': 0.1}], lr=0.02)
    for step in range(3):
        for p, gs in zip(params, grads):
            p.grad = gs[step].clone()
        opt.step()
    for p, W, gs in zip(params, Ws, grads):
        W_ref, M_ref = muon_reference(W, gs, lr=0.02, wd=0.1)
        torch.testing.assert_close(p.detach(), W_ref, rtol=1e-6, atol=1e-7)  # (M, U in fp32)
        torch.testing.assert_close(opt.state[p]['momentum_buffer'].double(), M_ref, rtol=1e-6, atol=1e-6)


def test_the_adamw_groups_step_as_torchs_adamw():
    g = torch.Generator().manual_seed(2)
    shapes = [(8, 6), (6,), (3,)]
    init = [torch.randn(s, generator=g) for s in shapes]
    a = [torch.nn.Parameter(t.clone()) for t in init]
    b = [torch.nn.Parameter(t.clone()) for t in init]
    ours = Muon([{'params': a[:1], 'weight_decay': 0.1}, {'params': a[1:], 'weight_decay': 0.0, 'lr': 2e-3}], lr=1e-3,
                betas=(0.9, 0.95))
    ref = torch.optim.AdamW([{'params': b[:1], 'weight_decay': 0.1}, {'params': b[1:], 'weight_decay': 0.0, 'lr': 2e-3}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(4):
        grads = [torch.randn(s, generator=g) for s in shapes]
        for p, q, gr in zip(a, b, grads):
            p.grad, q.grad = gr.clone(), gr.clone()
        ours.step()
        ref.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        for k in ('exp_avg', 'exp_avg_sq', 'step'):
            torch.testing.assert_close(ours.state[p][k], ref.state[q][k].to(ours.state[p][k].dtype))


def test_found_inf_skips_the_step_on_the_device():
    """found_inf = 1 (a non-finite gradient somewhere): nothing changes, weights nor state; found_inf = 0: the same
    step as with no found_inf at all."""
    def make():
        torch.manual_seed(3)
        ps = [torch.nn.Parameter(torch.randn(12, 20)), torch.nn.Parameter(torch.randn(20))]
        return ps, Muon([{'params': ps[:1], 'muon': True, 'weight_decay': 0.1}, {'params': ps[1:]}], lr=0.01)
    (a, opt_a), (b, opt_b) = make(), make()
    for step in range(3):
        torch.manual_seed(10 + step)
        grads = [torch.randn(12, 20), torch.randn(20)]
        for p, q, gr in zip(a, b, grads):
            p.grad, q.grad = gr.clone(), gr.clone()
        opt_a.step()
        opt_b.found_inf = torch.zeros(())
        opt_b.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    before = [p.detach().clone() for p in b], {k: {n: v.clone() for n, v in s.items()} for k, s in enumerate(opt_b.state.values())}
    for q in b:
        q.grad = torch.full_like(q, float('nan'))
    opt_b.found_inf = torch.ones(())
    opt_b.step()
    for q, w in zip(b, before[0]):
        assert torch.equal(q.detach(), w)
    for k, s in enumerate(opt_b.state.values()):
        for n, v in s.items():
            assert torch.equal(v, before[1][k][n]), n


def test_a_resumed_state_follows_its_parameters_to_their_device():
    """train.py loads a checkpoint onto the CPU, then the optimizer's state; every state tensor, the AdamW groups'
    step counts included (torch's fused kernel needs them on the parameters' device), must land where its parameter
    is. 'meta' stands in for CUDA."""
    def make(device):
        torch.manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(s, device=device)) for s in ((8, 8), (8,))]
        return ps, Muon([{'params': ps[:1], 'muon': True, 'weight_decay': 0.1}, {'params': ps[1:]}], lr=1e-3)
    ps, opt = make('cpu')
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    meta, resumed = make('meta')
    resumed.load_state_dict(opt.state_dict())
    for p in meta:
        for name, value in resumed.state[p].items():
            assert value.device == p.device, (name, value.device)


def test_the_compiled_update_is_the_eager_one(fp64_ns):
    """Muon.compile_update() (torch.compile(optim.muon_update): one graph per shape, lr as a tensor) steps as the
    eager rule: three shapes, a learning rate that changes every step, a skipped step (found_inf) in the middle."""
    def make():
        torch.manual_seed(4)
        ps = [torch.nn.Parameter(torch.randn(s, dtype=torch.float64)) for s in ((16, 8), (16, 8), (8, 24), (5, 5), (7,))]
        return ps, Muon([{'params': ps[:4], 'muon': True, 'weight_decay': 0.1}, {'params': ps[4:]}], lr=0.02)
    (a, opt_a), (b, opt_b) = make(), make()
    opt_b.compile_update()
    for step in range(4):
        torch.manual_seed(20 + step)
        grads = [torch.randn_like(p) for p in a]
        for opt, ps in ((opt_a, a), (opt_b, b)):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.found_inf = torch.tensor(float(step == 2))
            for group in opt.param_groups:
                group['lr'] = 0.01 * (step + 1)
            opt.step()
    for p, q in zip(a, b):  # (the compiled rule's lr is an fp32 tensor: 1e-8 relative of the fp64 steps)
        torch.testing.assert_close(q, p, rtol=0, atol=1e-7)


@pytest.mark.parametrize('mixer', list(MIXERS))
def test_every_parameter_is_in_exactly_one_group_by_name(mixer):
    """Muon: the blocks' 2-D weights except conv kernels and the decay parameters a mixer marks; AdamW: the rest."""
    config = GPTConfig(n_layer=2, n_head=2, n_embd=64, head_dim=32, d_state=16, block_size=32, vocab_size=128,
                       mixer=f'{mixer},softmax')
    model = GPT(config)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu', optimizer='muon')
    names = {id(p): n for n, p in model.named_parameters()}
    seen = [names[id(p)] for group in opt.param_groups for p in group['params']]
    assert sorted(seen) == sorted(n for n, p in model.named_parameters() if p.requires_grad)  # each once
    muon = {names[id(p)] for p in opt.param_groups[0]['params']}
    assert opt.param_groups[0]['muon'] and not any(g['muon'] for g in opt.param_groups[1:])
    expect = {n for n, p in model.named_parameters() if n.startswith('transformer.h.') and n.endswith('.weight')
              and p.dim() == 2 and 'conv' not in n}
    assert muon == expect, muon ^ expect
    assert 'transformer.wte.weight' not in muon
    adamw = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    assert isinstance(adamw, torch.optim.AdamW) and len(adamw.param_groups) == 2  # the default stays AdamW


def test_schedules_warm_up_then_cosine_or_stable_then_linear_decay():
    lr, low, warm, total = 1e-3, 1e-4, 10, 100
    cos = [lr_at(it, 'cosine', lr, low, warm, total, total, 0.2) for it in range(120)]
    for it in range(warm):
        assert cos[it] == pytest.approx(lr * (it + 1) / (warm + 1))
    for it in range(warm, total):  # nanoGPT's cosine, written out
        assert cos[it] == pytest.approx(low + 0.5 * (1 + math.cos(math.pi * (it - warm) / (total - warm))) * (lr - low))
    assert cos[100:] == [low] * 20
    wsd = [lr_at(it, 'wsd', lr, low, warm, 10**6, total, 0.2) for it in range(total)]  # (lr_decay_iters: cosine's)
    assert wsd[:warm] == cos[:warm]
    assert wsd[warm:80] == [lr] * 70  # stable until the last 20% of max_iters
    decay = wsd[80:]
    assert all(x > y for x, y in zip(decay, decay[1:])) and decay[-1] == pytest.approx(low)  # min_lr at the last step
    steps = [x - y for x, y in zip(decay, decay[1:])]
    assert max(steps) - min(steps) < 1e-12  # linear
    # edges: a decay of whole steps (0.2 x 4 = 0.8 rounds to the last step), none, all of the run, a run of no steps
    assert [lr_at(it, 'wsd', lr, low, 0, 4, 4, 0.2) for it in range(4)] == pytest.approx([lr, lr, lr, low])
    assert [lr_at(it, 'wsd', lr, low, 0, 4, 4, 0.0) for it in range(4)] == [lr] * 4
    assert [lr_at(it, 'wsd', lr, low, 0, 4, 4, 1.0) for it in range(4)] == pytest.approx(
        [lr + (low - lr) * k / 4 for k in (1, 2, 3, 4)])
    assert lr_at(0, 'wsd', lr, low, 0, 0, 0, 0.2) == pytest.approx(low)  # past the end, as cosine: min_lr
