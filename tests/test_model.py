"""
Model tests (CPU; the CUDA-graph decode on a GPU): shapes, loss at init, decode == full forward, the static-cache
decoder == generate, causality, the mixer pattern.

$ python -m pytest tests/test_model.py -q
"""
import contextlib
import functools
import math

import pytest
import torch

import model
from model import GPT, GPTConfig, MIXERS, Decoder, parse_mixer_pattern, sample_next, argmax_rows, decode_copy, StepLinear
from checkpoint import save_checkpoint, load_checkpoint
from configurator import UserError

# every mixer alone, and the 3:1 hybrid of the Kimi Linear recipe
PATTERNS = list(MIXERS) + ['kda*3,softmax']


def tiny(mixer='softmax', **kw):
    args = dict(n_layer=4, n_head=4, n_embd=64, block_size=64, vocab_size=97, mixer=mixer, head_dim=16, d_state=16)
    args.update(kw)
    return GPTConfig(**args)


def make(mixer, **kw):
    torch.manual_seed(0)
    return GPT(tiny(mixer, **kw)).eval()


@pytest.mark.parametrize('mixer', PATTERNS)
def test_forward_shapes_and_loss_at_init(mixer):
    model = make(mixer)
    idx, targets = torch.randint(0, 97, (2, 37)), torch.randint(0, 97, (2, 37))
    logits, loss = model(idx, targets)  # (targets = idx would be easier: tied embeddings favour the input token)
    assert logits.shape == (2, 37, 97)
    # at init the prediction is nearly uniform, so the loss is close to ln(vocab)
    assert abs(loss.item() - math.log(97)) < 0.1, loss.item()
    logits, loss = model(idx)
    assert logits.shape == (2, 37, 97) and loss is None


@pytest.mark.parametrize('mixer, documents', [('kda*3,softmax', False), ('kda,softmax', True),
                                              ('mamba2,gdn,retnet,gla,deltanet,softmax,kda,kda', False)])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(mixer, documents):
    """model.recompute (train.py's activation_checkpointing): blocks recomputed in the backward, the output layer and
    loss made LOSS_CHUNK tokens at a time (here 16 of the 2 × 37 tokens, the last piece short, some targets ignored):
    the same loss and gradients as the plain forward, in fp32."""
    model = make(mixer, n_layer=8, documents=documents, eot_token=3).train()
    idx, targets = torch.randint(0, 97, (2, 37)), torch.randint(0, 97, (2, 37))
    idx[:, [5, 20]] = 3  # documents start there
    targets[0, :3] = -1
    grads = []
    for recompute in (False, True):
        model.recompute, model.LOSS_CHUNK = recompute, 16
        model.zero_grad()
        logits, loss = model(idx, targets)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        assert (logits is None) == recompute
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-6, atol=0)
    for a, b in zip(grads[1][1], grads[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_loss_only_eval_gives_the_same_loss_without_the_logits():
    """model.loss_only (train.py's eval without a task): without gradients the loss is made LOSS_CHUNK tokens at a time
    (16 of 2 × 37, the last piece short, some targets ignored) and equals the plain forward's, the logits None; with
    gradients (training without recompute) it changes nothing."""
    model = make('kda*3,softmax', n_layer=4).eval()
    idx, targets = torch.randint(0, 97, (2, 37)), torch.randint(0, 97, (2, 37))
    targets[1, 30:] = -1
    with torch.no_grad():
        logits, plain = model(idx, targets)
        model.loss_only, model.LOSS_CHUNK = True, 16
        none, pieces = model(idx, targets)
    assert none is None and logits.shape == (2, 37, 97)
    torch.testing.assert_close(pieces, plain, rtol=1e-6, atol=0)
    logits, loss = model(idx, targets)  # with gradients: the plain head
    assert logits is not None and loss.requires_grad
    torch.testing.assert_close(loss.detach(), plain, rtol=1e-6, atol=0)


@pytest.mark.parametrize('mixer', PATTERNS)
@pytest.mark.parametrize('prefix', [1, 5, 20])
def test_prefill_then_decode_equals_full_forward(mixer, prefix):
    """Logits of one full forward == prefill of the first `prefix` tokens + token-by-token decode."""
    model = make(mixer)
    torch.manual_seed(1)
    idx = torch.randint(0, 97, (2, 29))
    with torch.no_grad():
        full, _ = model(idx)
        caches = model.new_caches()
        step_logits = [model(idx[:, :prefix], caches=caches)[0]]
        for t in range(prefix, idx.size(1)):
            step_logits.append(model(idx[:, t:t + 1], caches=caches)[0])
    step_logits = torch.cat(step_logits, dim=1)  # positions prefix-1 .. T-1
    torch.testing.assert_close(step_logits, full[:, prefix - 1:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('mixer', PATTERNS)
def test_chunked_prefill_in_two_parts(mixer):
    """Prefill in two multi-token calls (continuing from a non-empty cache) equals one forward."""
    model = make(mixer)
    idx = torch.randint(0, 97, (1, 40))
    with torch.no_grad():
        full, _ = model(idx)
        caches = model.new_caches()
        model(idx[:, :23], caches=caches)
        last, _ = model(idx[:, 23:], caches=caches)
    torch.testing.assert_close(last[:, 0], full[:, -1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('mixer', PATTERNS)
def test_causality(mixer):
    """Changing tokens at positions >= P never changes the outputs before P."""
    model = make(mixer)
    idx = torch.randint(0, 97, (2, 70))
    P = 33
    idx2 = idx.clone()
    idx2[:, P:] = torch.randint(0, 97, (2, 70 - P))
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(idx2)
    assert torch.equal(a[:, :P], b[:, :P])
    assert not torch.equal(a[:, P:], b[:, P:])


@pytest.mark.parametrize('mixer', PATTERNS)
def test_cache_size(mixer):
    """Linear mixers hold a fixed-size state; only softmax K/V grows with the context."""
    model = make(mixer)
    sizes = []
    for T in (8, 40):
        caches = model.new_caches()
        with torch.no_grad():
            model(torch.randint(0, 97, (1, T)), caches=caches)
        sizes.append(model.cache_bytes(caches))
    (fixed_a, grow_a), (fixed_b, grow_b) = sizes
    assert fixed_a == fixed_b
    n_soft = parse_mixer_pattern(mixer, 4).count('softmax')
    assert (grow_b > grow_a) == (n_soft > 0)
    assert (fixed_a > 0) == (n_soft < 4)


def test_generate_length_and_seed():
    model = make('softmax')
    idx = torch.randint(0, 97, (2, 5))
    torch.manual_seed(3)
    a, _ = model.generate(idx, 11, temperature=1.0, top_k=10)
    torch.manual_seed(3)
    b, _ = model.generate(idx, 11, temperature=1.0, top_k=10)
    assert a.shape == (2, 16) and torch.equal(a, b) and torch.equal(a[:, :5], idx)


@pytest.mark.parametrize('mixer', PATTERNS)
def test_static_decoder_equals_generate(mixer):
    """Decoder (static caches, the one-token step eagerly on CPU) == GPT.generate, greedy, token for token; the
    prompt plus the new tokens pass block_size (RoPE positions past the table); a second call reuses the caches."""
    model = make(mixer, block_size=16, **({'n_kv_head': 2} if mixer == 'softmax' else {}))
    idx = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    ref, _ = model.generate(idx, 15, temperature=0)
    dec = Decoder(model, batch=2, max_len=30, temperature=0)
    assert torch.equal(dec.generate(idx, 15), ref)
    assert torch.equal(dec.generate(idx[:, :4], 15), model.generate(idx[:, :4], 15, temperature=0)[0])


CUDA_BF16 = pytest.param('cuda', torch.bfloat16, marks=pytest.mark.skipif(not torch.cuda.is_available(), reason='GPU'))


@pytest.mark.parametrize('device,dtype', [('cpu', torch.float32), CUDA_BF16])
@pytest.mark.parametrize('mixer', PATTERNS)
def test_prefill_in_pieces_equals_one_forward(mixer, device, dtype):
    """Decoder.prefill in pieces (linear states carried from piece to piece; softmax's K/V written into their slots
    and attended with the causal mask aligned bottom-right, GQA included) leaves the caches that one forward over the
    whole prompt leaves in GPT's growing caches, for pieces of 1, 4 and 7 tokens of a 23-token prompt past
    block_size; the greedy continuation is GPT.generate's. On the GPU in bf16 (flash attention's bottom-right mask,
    the Triton kernels): the caches to bf16's tolerance."""
    model = make(mixer, block_size=16, **({'n_kv_head': 2} if mixer == 'softmax' else {})).to(device)
    idx = torch.randint(0, 97, (2, 23), generator=torch.Generator().manual_seed(6)).to(device)
    low = dtype != torch.float32
    autocast = torch.autocast(device, dtype) if low else contextlib.nullcontext()
    with torch.no_grad(), autocast:
        ref_caches = model.new_caches()
        model(idx, caches=ref_caches)
    ref, _ = model.generate(idx, 6, temperature=0)
    tol = dict(atol=3e-2, rtol=3e-2) if low else dict(atol=1e-5, rtol=1e-5)
    for piece in (1, 4, 7):
        dec = Decoder(model, batch=2, max_len=40, temperature=0, dtype=dtype, compile=False)
        dec.prefill(idx, piece=piece)
        assert dec.pos.item() == 23
        for block, got, want in zip(model.transformer.h, dec.caches, ref_caches):
            for key, t in want.items():
                if torch.is_tensor(t):
                    g = got[key][:, :, :23] if block.mixer.cache_grows else got[key]
                    torch.testing.assert_close(g.float(), t.float(), **tol, msg=lambda m: f"{piece=} {key}: {m}")
        if not low:
            dec.decode(5)
            assert torch.equal(dec.out[:, :29], ref)


@pytest.mark.parametrize('mixer', ['deltanet', 'gdn', 'kda', 'kda*3,softmax'])
def test_decoder_steps_give_the_models_logits(mixer):
    """The Decoder's copy of the model (decode_copy: KDA's low-rank gate pairs multiplied into one matrix each, the
    projections stacked) and its one-token step (kernels.delta_rule_decode for the delta-rule mixers) give the
    logits of the model's own forward over the whole sequence."""
    model = make(mixer)
    with torch.no_grad():  # biases start at 0: give them values, so that a bias lost in the folding shows
        for name, p in model.named_parameters():
            if name.endswith('.bias'):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        want = model(idx)[0]
    dec = Decoder(model, batch=2, max_len=20, temperature=0, compile=False)
    dec.prefill(idx[:, :5])
    got = []
    for t in range(5, 12):
        dec.tok.copy_(idx[:, t:t + 1])
        got.append(Decoder._forward(dec))
    torch.testing.assert_close(torch.stack(got, 1), want[:, 5:], atol=1e-5, rtol=1e-5)
    if 'kda' in mixer:  # (the folding happened: no second matmul per gate)
        assert isinstance(dec.model.transformer.h[0].mixer.f_up, torch.nn.Identity)


def test_compiled_decode_steps_of_two_models_in_one_process():
    """Decoder._forward compiled for kda, then for gdn (other head counts: dynamo recompiles the one code object
    with symbolic sizes, as bench_decode.py's mixers in turn on CUDA): each step's logits are its model's forward."""
    import io
    for mixer in ('kda', 'gdn'):
        model = GPT(GPTConfig(block_size=64, vocab_size=97, n_layer=1, n_embd=128, head_dim=16, mixer=mixer,
                              kernels='torch')).eval()
        idx = torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(2))
        step = torch.compile(Decoder._forward, fullgraph=True, backend='aot_eager')
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            want = model(idx)[0][:, 5:]
            dec = Decoder(model, batch=2, max_len=16, temperature=0, compile=False)
            dec.prefill(idx[:, :5])
            got = []
            for t in range(5, 8):
                dec.tok.copy_(idx[:, t:t + 1])
                got.append(step(dec))
        torch.testing.assert_close(torch.stack(got, 1), want, atol=1e-5, rtol=1e-5, msg=mixer)


def test_a_dropped_decoder_frees_its_caches_at_once():
    """No reference cycle keeps a Decoder (and its caches: GBs at long contexts) alive after its last reference goes:
    freed without a gc pass, so that the memory a caller sees free next is free."""
    import gc
    import weakref
    model = make('kda*3,softmax')
    dec = Decoder(model, batch=2, max_len=20, temperature=0)
    dec.generate(torch.randint(0, 97, (2, 5)), 4)
    refs = [weakref.ref(t) for c in dec.caches for t in c.values()]
    gc.disable()
    try:
        del dec
        assert all(r() is None for r in refs)
    finally:
        gc.enable()


def test_decoder_reallocates_or_refuses_what_does_not_fit():
    """generate with a larger batch or more tokens than the caches hold reallocates them (same tokens as
    GPT.generate); prefill and decode, which continue a sequence, refuse by name instead of writing past them."""
    model = make('kda*3,softmax')
    dec = Decoder(model, batch=2, max_len=20, temperature=0)
    idx = torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(2))
    assert torch.equal(dec.generate(idx, 12), model.generate(idx, 12, temperature=0)[0])  # exactly full
    assert torch.equal(dec.generate(idx, 25), model.generate(idx, 25, temperature=0)[0]) and dec.max_len == 33
    idx3 = torch.randint(0, 97, (3, 8), generator=torch.Generator().manual_seed(3))
    assert torch.equal(dec.generate(idx3, 4), model.generate(idx3, 4, temperature=0)[0]) and dec.batch == 3
    with pytest.raises(ValueError, match=r'holds 3 sequences of up to 12 tokens; 10 are there, 3 more do not fit'):
        dec.prefill(idx3[:, :5])
        dec.decode(4)
        dec.decode(3)
    with pytest.raises(ValueError, match=r'got a prompt of 2 x 8: build a Decoder with batch=2'):
        dec.prefill(idx)
    with pytest.raises(ValueError, match='the prompt is empty'):
        dec.prefill(idx3[:, :0])


def test_static_caches_serve_any_mixer_whose_cache_grows():
    """The Decoder's static caches ask a mixer's cache_grows, not its name: softmax attention under another name (a
    new mixer whose cache grows) decodes through them, in a hybrid, as GPT.generate does, token for token."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(MIXERS, 'attn', type('Attention', (model.CausalSelfAttention,), {}))
        m = make('kda,attn', n_kv_head=2)
        idx = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(4))
        ref, _ = m.generate(idx, 12, temperature=0)
        assert torch.equal(Decoder(m, batch=2, max_len=24, temperature=0).generate(idx, 12), ref)


def test_sample_next_draws_from_the_distribution():
    """The exponential race used inside the CUDA graph draws from softmax(logits / T), top_k and n_vocab respected."""
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 5.0, 9.0]]).expand(40000, -1)
    draws = sample_next(logits, temperature=2.0, top_k=3, n_vocab=5).squeeze(1)  # ids 4 (5.0), 0 (2.0), 1 (1.0)
    p = torch.softmax(torch.tensor([2.0, 1.0, 5.0]) / 2.0, 0)
    freq = torch.stack([(draws == i).float().mean() for i in (0, 1, 4)])
    assert set(draws.unique().tolist()) == {0, 1, 4}
    assert (freq - p).abs().max() < 0.01, (freq, p)  # 5 standard errors at 40,000 draws
    assert torch.equal(sample_next(logits[:2], temperature=0, n_vocab=5), torch.tensor([[4], [4]]))


def test_sample_next_over_a_wide_vocabulary_in_bf16():
    """The same law where the race's argmax runs by chunks (V past argmax_rows' chunk) and top_k's threshold is found
    in bf16: the top 3 of 3,000 logits sit in different chunks, the fourth largest (0.5) is never drawn; ties at the
    threshold are all kept."""
    torch.manual_seed(1)
    logits = torch.full((5000, 3000), -20.0, dtype=torch.bfloat16)
    logits[:, [5, 1500, 2999, 2000]] = torch.tensor([2.0, 1.0, 3.0, 0.5], dtype=torch.bfloat16)
    draws = torch.cat([sample_next(logits, temperature=1.0, top_k=3).squeeze(1) for _ in range(6)])
    p = torch.softmax(torch.tensor([2.0, 1.0, 3.0]), 0)
    freq = torch.stack([(draws == i).float().mean() for i in (5, 1500, 2999)])
    assert set(draws.unique().tolist()) == {5, 1500, 2999}
    assert (freq - p).abs().max() < 0.015, (freq, p)  # 5 standard errors at 30,000 draws
    tied = logits.clone()
    tied[:, 7] = 1.0  # a fourth logit equal to the third largest: kept, as nanoGPT's mask keeps it
    assert set(sample_next(tied, 1.0, top_k=3).unique().tolist()) == {5, 7, 1500, 2999}
    assert torch.equal(sample_next(logits[:2], temperature=0), torch.tensor([[2999], [2999]]))


def test_argmax_rows_is_argmax():
    """The two-step argmax (chunks, then the chunks' maxima) against torch's: the first of equal maxima, -inf rows,
    widths below, at and past a chunk."""
    torch.manual_seed(2)
    for V in (5, 1024, 1025, 3000, 50257):
        y = torch.randint(-3, 4, (6, V)).float()  # many ties
        y[0] = -float('inf')
        y[1, -1] = 9.0
        y[2, 1023:1025] = 9.0  # equal maxima on both sides of a chunk boundary
        assert torch.equal(argmax_rows(y), y.argmax(-1, keepdim=True)), V
        assert torch.equal(argmax_rows(y, chunk=64), y.argmax(-1, keepdim=True)), V


def test_decode_copy_runs_its_linear_layers_through_linear_step(monkeypatch):
    """A Decoder's copy: every Linear a StepLinear, whose one-token steps take the GEMV on the Triton path (on CPU:
    kernels='triton', the interpreter) and F.linear with kernels='torch'; the same logits either way."""
    import kernels
    if not kernels.HAVE_TRITON or not (torch.cuda.is_available() or kernels._INTERPRETING):
        pytest.skip("needs Triton: a GPU or the interpreter")
    calls = []
    real = kernels._gemv_op
    monkeypatch.setattr(kernels, "_gemv_op", lambda *a: calls.append(a[1].shape) or real(*a))
    dev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, mixer='kda,softmax', head_dim=16)
    plain = GPT(GPTConfig(**cfg, kernels='torch')).to(dev)
    fast = GPT(GPTConfig(**cfg, kernels='triton')).to(dev)
    fast.load_state_dict(plain.state_dict())
    plain, fast = decode_copy(plain), decode_copy(fast)
    assert {type(x) for x in fast.modules() if isinstance(x, torch.nn.Linear)} == {StepLinear}
    idx = torch.randint(0, 64, (2, 1), device=dev)
    logits = [m(idx, caches=m.static_caches(2, 16, dev))[0] for m in (plain, fast)]
    assert calls, "the Triton path never reached the GEMV"
    assert torch.allclose(*logits, atol=1e-4), (logits[0] - logits[1]).abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA graphs need a GPU')
@pytest.mark.parametrize('pdl', [False, True])
@pytest.mark.parametrize('compile', [False, True])
@pytest.mark.parametrize('mixer', PATTERNS)
def test_cuda_graph_decode_equals_eager(mixer, compile, pdl, monkeypatch):
    """On the GPU: the step replayed as a CUDA graph (compiled or not; with programmatic dependent launch or not, on
    Hopper) == eager GPT.generate, greedy, fp32, token for token; and sampling inside the graph is seeded and varies
    from token to token."""
    import kernels
    monkeypatch.setitem(kernels.TUNING['step'], 'pdl', pdl)
    torch._dynamo.reset()  # each test compiles its own model's step
    model = make(mixer, head_dim=32).cuda()
    idx = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1)).cuda()
    ref, _ = model.generate(idx, 24, temperature=0)
    assert torch.equal(Decoder(model, 2, 40, temperature=0, compile=compile).generate(idx, 24), ref)
    dec = Decoder(model, 2, 40, temperature=1.0, top_k=50, compile=compile)
    torch.manual_seed(5)
    a = dec.generate(idx, 24)
    torch.manual_seed(5)
    b = dec.generate(idx, 24)
    assert torch.equal(a, b) and len(a[0, 9:].unique()) > 5


def test_gqa():
    model = make('softmax', n_kv_head=2)
    idx = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        full, _ = model(idx)
        caches = model.new_caches()
        model(idx[:, :6], caches=caches)
        outs = [model(idx[:, t:t + 1], caches=caches)[0] for t in range(6, 12)]
    torch.testing.assert_close(torch.cat(outs, 1), full[:, 6:], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match='n_kv_head'):
        GPT(tiny('softmax', n_kv_head=3))


def test_pattern_parsing():
    assert parse_mixer_pattern('softmax', 3) == ['softmax'] * 3
    assert parse_mixer_pattern('kda,kda,kda,softmax', 8) == ['kda', 'kda', 'kda', 'softmax'] * 2
    assert parse_mixer_pattern('kda*3,softmax', 4) == ['kda', 'kda', 'kda', 'softmax']
    assert parse_mixer_pattern(' retnet, mamba2 ', 2) == ['retnet', 'mamba2']
    assert parse_mixer_pattern('gdn*2,softmax*2', 4) == ['gdn', 'gdn', 'softmax', 'softmax']


def test_pattern_errors():
    with pytest.raises(ValueError, match="unknown mixer 'flash'.*valid mixers: softmax"):
        parse_mixer_pattern('kda,flash', 2)
    with pytest.raises(ValueError, match='does not tile n_layer=6'):
        parse_mixer_pattern('kda*3,softmax', 6)
    with pytest.raises(ValueError, match='cannot parse'):
        parse_mixer_pattern('kda**3', 3)
    with pytest.raises(ValueError, match='non-empty'):
        parse_mixer_pattern('', 3)
    with pytest.raises(ValueError, match="unknown mixer 'attention'"):
        GPT(tiny('attention'))


def test_optimizer_groups():
    model = make('softmax')
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    decay, no_decay = opt.param_groups
    assert all(p.dim() >= 2 for p in decay['params']) and all(p.dim() < 2 for p in no_decay['params'])
    n = sum(p.numel() for g in opt.param_groups for p in g['params'])
    assert n == model.get_num_params()



def test_untied_embeddings_are_a_second_matrix_that_trains_and_round_trips(tmp_path):
    tied, untied = make('softmax'), make('softmax', tie_embeddings=False)
    assert tied.transformer.wte.weight is tied.lm_head.weight
    assert untied.transformer.wte.weight is not untied.lm_head.weight
    V, C = untied.lm_head.weight.shape
    assert untied.get_num_params() == tied.get_num_params() + V * C
    opt = untied.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    assert sum(p.numel() for g in opt.param_groups for p in g['params']) == untied.get_num_params()
    # a token never seen as input gets no gradient in the input embedding, only in the output layer's row
    idx = torch.randint(1, V, (2, 16))
    untied(idx, idx)[1].backward()
    assert untied.transformer.wte.weight.grad[0].abs().sum() == 0 and untied.lm_head.weight.grad[0].abs().sum() > 0
    path = str(tmp_path / 'ckpt.pt')
    save_checkpoint({'model': untied.state_dict()}, path)
    again = make('softmax', tie_embeddings=False)
    again.load_state_dict(load_checkpoint(path)['model'])
    assert torch.equal(again.transformer.wte.weight, untied.transformer.wte.weight)
    with pytest.raises(UserError, match='tie_embeddings=1 must be True or False'):
        make('softmax', tie_embeddings=1)

def test_checkpoint_roundtrip_and_missing(tmp_path):
    model = make('softmax')
    path = str(tmp_path / 'ckpt.pt')
    save_checkpoint({'model': model.state_dict()}, path)
    sd = load_checkpoint(path)['model']
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())
    with pytest.raises(FileNotFoundError, match='no checkpoint at'):
        load_checkpoint(str(tmp_path / 'nope' / 'ckpt.pt'))
    (tmp_path / 'bad.pt').write_bytes(b'not a checkpoint')
    with pytest.raises(RuntimeError, match='bad.pt'):
        load_checkpoint(str(tmp_path / 'bad.pt'))


def test_checkpoint_with_old_attn_keys_loads(tmp_path):
    """Checkpoints written while the per-layer mixer was called `attn` (transformer.h.N.attn.*) still load: the
    keys are mapped to `mixer` on load, and the model built from them gives the same logits."""
    model = make('kda*3,softmax')
    old = {k.replace('.mixer.', '.attn.'): v for k, v in model.state_dict().items()}
    assert sum('.attn.' in k for k in old) > 0 and not any('.mixer.' in k for k in old)
    path = str(tmp_path / 'old.pt')
    save_checkpoint({'model': old, 'model_args': dict(model.config.__dict__)}, path)
    ckpt = load_checkpoint(path)
    loaded = GPT(GPTConfig(**ckpt['model_args']))
    loaded.load_state_dict(ckpt['model'])  # strict: every key must match
    idx = torch.randint(0, loaded.config.vocab_size, (2, 16))
    torch.testing.assert_close(loaded(idx)[0], model(idx)[0], rtol=0, atol=0)


# the kernels.py functions each linear mixer calls (forward, prefill, decode)
@pytest.mark.parametrize('path', ['torch', 'recurrent'])
@pytest.mark.parametrize('mixer', [p for p in PATTERNS if p != 'softmax'])
def test_kernels_key_reaches_every_kernel_call(mixer, path, monkeypatch, capsys):
    """A model built with kernels=path gives the logits of the same model built with 'auto' (the chunked torch path on
    CPU), in one full forward and in prefill + decode, and every kernels.py call it makes takes that path: each says
    so in its log line (a call left on 'auto' would print no note on CPU)."""
    import kernels
    auto, model = make(mixer), make(mixer, kernels=path)
    torch.manual_seed(1)
    idx = torch.randint(0, 97, (2, 29))
    with torch.no_grad():
        want = auto(idx)[0]
        capsys.readouterr()
        monkeypatch.setattr(kernels, '_logged', set())
        called = set()  # the public kernels.py calls the model makes (each must log the path it took)
        for name in ('linear_attn', 'linear_attn_step', 'delta_rule', 'delta_rule_step', 'delta_rule_decode',
                     'short_conv', 'short_conv_step'):
            monkeypatch.setattr(kernels, name, functools.partial(
                lambda fn, name, *a, **kw: called.add(name) or fn(*a, **kw), getattr(kernels, name), name))
        full = model(idx)[0]
        caches = model.new_caches()
        steps = [model(idx[:, :5], caches=caches)[0]] + [model(idx[:, t:t + 1], caches=caches)[0] for t in range(5, 29)]
    if path == 'torch':
        assert torch.equal(full, want)
    torch.testing.assert_close(full, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.cat(steps, dim=1), want[:, 4:], rtol=1e-4, atol=1e-4)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('kernels:')]
    assert lines and all(line.endswith(f"on cpu (kernels='{path}')") for line in lines), lines
    assert called and {line.split()[1] for line in lines} == called, (called, lines)


def test_kernels_key_is_checked():
    with pytest.raises(ValueError, match=r"^kernels='cuda' must be one of 'auto', 'torch', 'recurrent', 'triton'$"):
        tiny('kda', kernels='cuda')
    with pytest.raises(ValueError, match=r"^kernels=None must be one of"):
        tiny('kda', kernels=None)


def test_kda_gate_bound_key_is_checked_and_round_trips(tmp_path):
    """kda_gate_bound: 0 (off, the default) or in [-5, 0), else one line naming it; with it on KDA's A_log starts at
    0 (fla's safe gate); saved with the model args, and a checkpoint from before the key loads with it off."""
    for bad in (0.5, -5.5, -1e9, True, '-5', float('nan'), None):
        with pytest.raises(ValueError, match=r"^kda_gate_bound=.* must be 0 \(KDA's softplus gate\) or in \[-5, 0\)"):
            tiny('kda', kda_gate_bound=bad)
    assert tiny('kda').kda_gate_bound == 0.0 and make('kda').transformer.h[0].mixer.gate_bound is None
    model = make('kda', kda_gate_bound=-5)
    mixer = model.transformer.h[0].mixer
    assert mixer.gate_bound == -5.0 and torch.equal(mixer.A_log, torch.zeros_like(mixer.A_log))
    path = str(tmp_path / 'ckpt.pt')
    save_checkpoint({'model': model.state_dict(), 'model_args': dict(model.config.__dict__)}, path)
    args = load_checkpoint(path)['model_args']
    assert args['kda_gate_bound'] == -5 and GPT(GPTConfig(**args)).transformer.h[0].mixer.gate_bound == -5.0
    old = {k: v for k, v in args.items() if k != 'kda_gate_bound'}
    assert GPT(GPTConfig(**old)).transformer.h[0].mixer.gate_bound is None


def test_kda_gate_bound_with_documents_changes_nothing_within_one_document():
    """With the bounded gate, documents=True (the gate formed in torch by kernels.decay_gate, then reset) gives the
    logits of documents=False (formed by the delta-rule call) on rows that are one document each."""
    on = make('kda*3,softmax', documents=True, eot_token=DOC_EOT, kda_gate_bound=-5.0)
    off = make('kda*3,softmax', kda_gate_bound=-5.0)
    idx = torch.randint(1, 97, (2, 50), generator=torch.Generator().manual_seed(3))
    idx[:, 0] = DOC_EOT
    with torch.no_grad():
        torch.testing.assert_close(on(idx)[0], off(idx)[0], rtol=1e-4, atol=1e-5)


def test_kernels_key_round_trips_through_a_checkpoint(tmp_path):
    """kernels is saved with the model args and comes back; a checkpoint from before the key loads as 'auto'."""
    model = make('gdn', kernels='recurrent')
    path = str(tmp_path / 'ckpt.pt')
    save_checkpoint({'model': model.state_dict(), 'model_args': dict(model.config.__dict__)}, path)
    ckpt = load_checkpoint(path)
    assert ckpt['model_args']['kernels'] == 'recurrent'
    assert GPT(GPTConfig(**ckpt['model_args'])).transformer.h[0].mixer.kernels == 'recurrent'
    old = {k: v for k, v in ckpt['model_args'].items() if k != 'kernels'}
    save_checkpoint({'model': model.state_dict(), 'model_args': old}, path)
    ckpt = load_checkpoint(path)
    loaded = GPT(GPTConfig(**ckpt['model_args']))
    loaded.load_state_dict(ckpt['model'])
    assert loaded.config.kernels == 'auto'
    assert {m.path for m in loaded.modules() if hasattr(m, 'path')} == {'auto'}  # the short convs
    idx = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx)[0], model(idx)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('mixer', list(MIXERS))
@pytest.mark.parametrize('n_embd,head_dim', [(768, 64), (768, 128), (256, 32)])
def test_param_budget(mixer, n_embd, head_dim):
    """Every mixer's parameters per layer are within 20% of the softmax layer's 4·C² (the sizing rule in model.py, above RetNet)."""
    layer = MIXERS[mixer](GPTConfig(n_embd=n_embd, n_head=n_embd // 64, head_dim=head_dim, mixer=mixer))
    n = sum(p.numel() for p in layer.parameters())
    assert 0.8 <= n / (4 * n_embd ** 2) <= 1.2, \
        (f"mixer {mixer!r} has {n:,} parameters per layer at n_embd={n_embd}, head_dim={head_dim}: "
         f"{n / (4 * n_embd ** 2):.2f}x a softmax layer's 4*n_embd^2; size its heads so that it is within 0.8-1.2x "
         f"(model.py, above MIXERS), so that models with different mixers compare")


# ------------------------------------------------------------------------------------------------
# documents (GPTConfig.documents): each document of a packed row is its own sequence. On CPU the chunked torch paths
# and SDPA with a dense mask; with CUDA the Triton kernels and FlexAttention (the kernels alone: test_kernels.py).

DEV = 'cuda' if torch.cuda.is_available() else 'cpu'
DOC_EOT = 0  # the tiny models' end-of-text token (GPT-2's 50256 is past their vocabulary)
# where documents start in two rows of 100 tokens. Row 0 begins inside a document (no EOT at 0); EOTs at 64 and 65
# make an empty document (its EOT alone) at the chunk edge 64, 65..66 a document of one token (EOT, token), 5 and 67
# start inside a chunk, 80 at an edge of KDA's torch chunk of 16; row 1 begins with an EOT, another empty one at 40.
DOC_ROWS = ([5, 64, 65, 67, 80], [0, 40, 41])


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()  # tiny tensors: a second OpenMP thread only adds overhead on a busy CI core
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def packed_rows(T=100, seed=1):
    """(idx [2, T] with DOC_EOT at DOC_ROWS and no other, [(row, first, end)] of every document)."""
    idx = torch.randint(1, 97, (len(DOC_ROWS), T), generator=torch.Generator().manual_seed(seed))
    segments = []
    for r, starts in enumerate(DOC_ROWS):
        idx[r, starts] = DOC_EOT
        bounds = sorted({0, *starts, T})
        segments += [(r, a, e) for a, e in zip(bounds[:-1], bounds[1:])]
    return idx, segments


def rms_err(a, ref):
    return ((a.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


@pytest.mark.usefixtures('one_thread')
@pytest.mark.parametrize('mixer', PATTERNS)
def test_documents_packed_row_equals_documents_run_alone(mixer):
    """documents=True: the logits of two packed rows, and the gradients of every parameter for a loss over them, equal
    those of each document run alone (one right-padded batch row per document, documents=False)."""
    on = make(mixer, documents=True, eot_token=DOC_EOT, block_size=128).to(DEV)
    off = make(mixer, block_size=128).to(DEV)
    idx, segments = packed_rows()
    cot = torch.randn(*idx.shape, 97, generator=torch.Generator().manual_seed(2))  # d loss / d logits
    L = max(e - a for _, a, e in segments)
    alone, alone_cot = torch.ones(len(segments), L, dtype=torch.long), torch.zeros(len(segments), L, 97)
    for i, (r, a, e) in enumerate(segments):  # padded after each document with token 1: no earlier output sees it
        alone[i, :e - a], alone_cot[i, :e - a] = idx[r, a:e], cot[r, a:e]
    logits, _ = on(idx.to(DEV))
    (logits * cot.to(DEV)).sum().backward()
    ref, _ = off(alone.to(DEV))
    (ref * alone_cot.to(DEV)).sum().backward()
    ref_packed = torch.zeros_like(logits)
    for i, (r, a, e) in enumerate(segments):
        ref_packed[r, a:e] = ref[i, :e - a]
    tol = 1e-5 if DEV == 'cpu' else 2e-3  # CUDA: Triton's and flex's own rounding
    assert rms_err(logits, ref_packed) < tol, rms_err(logits, ref_packed)
    errs = {n: rms_err(p.grad, q.grad) for (n, p), q in zip(on.named_parameters(), off.parameters())}
    assert all(e < tol for e in errs.values()), {n: e for n, e in errs.items() if not e < tol}


@pytest.mark.usefixtures('one_thread')
@pytest.mark.parametrize('mixer', ['softmax', 'mamba2', 'kda*3,softmax'])
def test_documents_switch_changes_nothing_within_one_document(mixer):
    """Rows holding no EOT but at position 0 are one document each: documents=True gives documents=False's logits
    (to rounding: other kernels, a per-token gate, masked convs, a mask), and generation ignores the switch (a
    prompt and what follows it is one document: token for token the same, EOTs in the prompt included)."""
    on, off = make(mixer, documents=True, eot_token=DOC_EOT), make(mixer)
    idx = torch.randint(1, 97, (2, 50), generator=torch.Generator().manual_seed(3))
    idx[:, 0] = DOC_EOT
    with torch.no_grad():
        torch.testing.assert_close(on(idx)[0], off(idx)[0], rtol=1e-4, atol=1e-5)
    idx[:, 20] = DOC_EOT
    assert torch.equal(on.generate(idx[:, :30], 8, temperature=0)[0], off.generate(idx[:, :30], 8, temperature=0)[0])


@pytest.mark.usefixtures('one_thread')
def test_documents_off_builds_nothing(monkeypatch):
    """documents=False (the default) is today's model: GPT.documents is never called, so every mixer gets docs=None
    and runs the code it ran before the switch existed (training forward and backward, and generation)."""
    def refuse(self, idx):
        raise AssertionError('GPT.documents called with documents=False')
    monkeypatch.setattr(GPT, 'documents', refuse)
    model = make('kda*3,softmax')
    assert model.config.documents is False
    idx = torch.randint(0, 97, (2, 20))
    idx[:, 7] = DOC_EOT
    model(idx, idx)[1].backward()
    model.generate(idx[:, :5], 3)


def test_reset_gate_takes_a_gate_per_head_per_token_or_per_key_channel():
    """reset_gate (README, "How to add a mixer"): RESET_GATE at the document starts after position 0, the gate's own
    value elsewhere, for a gate per token [B, T, H] or per key channel [B, T, H, Dk]; a constant per head [H] (as
    RetNet's) becomes a gate per token. Against an element-by-element expectation; without documents, g as it is."""
    from model import RESET_GATE, reset_gate
    B, T, H, Dk = 2, 7, 3, 4
    reset = torch.zeros(B, T, dtype=torch.bool)
    reset[0, [2, 5]] = True
    reset[1, 1] = True
    g = -torch.rand(H)
    want = [[[RESET_GATE if reset[b, t] else g[h].item() for h in range(H)] for t in range(T)] for b in range(B)]
    assert torch.equal(reset_gate(g, dict(reset=reset)), torch.tensor(want))
    for shape in [(B, T, H), (B, T, H, Dk)]:
        g = -torch.rand(shape)
        got = reset_gate(g, dict(reset=reset))
        assert got.shape == shape
        for b in range(B):
            for t in range(T):
                assert torch.equal(got[b, t], torch.full_like(g[b, t], RESET_GATE) if reset[b, t] else g[b, t])
        assert reset_gate(g, None) is g


def test_documents_masks_and_checks():
    """GPT.documents: starts at position 0 and at every EOT; the conv positions restart there and stop at 3; the
    softmax mask (CPU: dense) is causal within each document; the gate resets leave position 0 alone. Switch and
    token are checked."""
    model = make('kda*3,softmax', documents=True, eot_token=DOC_EOT)
    idx = torch.tensor([[5, 6, DOC_EOT, DOC_EOT, 7, 8, 9, 10, 11]])
    docs = model.documents(idx)
    assert docs['reset'].tolist() == [[False, False, True, True, False, False, False, False, False]]
    assert docs['conv_pos'].tolist() == [[0, 1, 0, 0, 1, 2, 3, 3, 3]] and docs['conv_pos'].dtype == torch.uint8
    doc = torch.tensor([0, 0, 1, 2, 2, 2, 2, 2, 2])
    want = (doc[:, None] == doc[None, :]) & torch.ones(9, 9, dtype=torch.bool).tril()
    assert torch.equal(docs['mask'], want[None, None])
    with pytest.raises(ValueError, match=r'eot_token=50256 must be a token id below vocab_size=97'):
        tiny('kda', documents=True)
    with pytest.raises(ValueError, match=r"documents='yes' must be True or False"):
        tiny('kda', documents='yes')


@pytest.mark.filterwarnings('ignore:flex_attention called without torch.compile')
def test_documents_block_mask_and_flex_equal_the_dense_mask(monkeypatch):
    """The FlexAttention path (CUDA): softmax attention through document_block_mask (3 blocks of 128 with a padded
    last one, starts at and next to block edges) gives the SDPA-with-dense-mask path's output and gradients (GQA; on
    CPU flex_attention eager, its unfused reference, and the output only: it has no backward on CPU)."""
    from model import CausalSelfAttention, document_block_mask, flex_attention
    if flex_attention is None:
        pytest.skip('torch < 2.5: no flex_attention')
    T = 300
    start = torch.zeros(2, T, dtype=torch.bool)
    start[:, 0] = True
    start[0, [127, 128, 129, 255, 256]] = True
    start[1, [200]] = True
    doc = start.cumsum(1, dtype=torch.int32).to(DEV)
    bm = document_block_mask(doc)
    if DEV == 'cpu':  # eager flex_attention (its unfused reference): no C++ compile on CPU
        monkeypatch.setattr('model.compiled_flex_attention', lambda: flex_attention)
    torch.manual_seed(0)
    attn = CausalSelfAttention(tiny('softmax', n_kv_head=2, block_size=T)).to(DEV)
    x = torch.randn(2, T, 64, device=DEV)
    t = torch.arange(T, device=DEV)
    masks = [{'block_mask': bm}, {'mask': ((doc[:, :, None] == doc[:, None, :]) & (t[:, None] >= t[None, :]))[:, None]}]
    outs = []
    for docs in masks:
        if DEV == 'cpu':
            with torch.no_grad():
                outs.append([attn(x, docs=docs)])
            continue
        xx = x.clone().requires_grad_()
        y = attn(xx, docs=docs)
        grads = torch.autograd.grad((y * x).sum(), [xx] + list(attn.parameters()))
        outs.append([y] + list(grads))
    for a, b in zip(*outs):
        assert rms_err(a, b) < 1e-5, rms_err(a, b)


@pytest.mark.skipif(DEV == 'cpu', reason='torch.compile with flex_attention: CUDA only')
def test_documents_compiled_model_equals_dense_mask():
    """documents=True in a torch.compile'd model (flex_attention traced with the block mask built inside the graph)
    gives the eager dense-mask model's loss and gradients: a mask built through BlockMask.from_kv_blocks passed the
    eager test above and gave gradients 300x too large here."""
    import model as M
    T = 512
    idx = torch.randint(1, 97, (2, T + 1), generator=torch.Generator().manual_seed(0))
    idx[:, [1, 130, 131, 300]] = 0
    x, y = idx[:, :-1].to(DEV), idx[:, 1:].to(DEV)
    out = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = GPT(tiny('softmax', block_size=T, documents=True, eot_token=0)).to(DEV)
        saved = M.flex_attention
        if not compiled:
            M.flex_attention = None  # the dense [B, 1, T, T] mask through SDPA
        try:
            _, loss = (torch.compile(m) if compiled else m)(x, y)
            loss.backward()
        finally:
            M.flex_attention = saved
        out.append([loss.detach()] + [p.grad for p in m.parameters()])
    for a, b in zip(*out):
        assert rms_err(a, b) < 1e-4, rms_err(a, b)


def test_documents_key_round_trips_through_a_checkpoint(tmp_path):
    """documents and eot_token are saved with the model args and come back; a checkpoint from before them loads off."""
    model = make('gdn', documents=True, eot_token=DOC_EOT)
    path = str(tmp_path / 'ckpt.pt')
    save_checkpoint({'model': model.state_dict(), 'model_args': dict(model.config.__dict__)}, path)
    args = load_checkpoint(path)['model_args']
    assert args['documents'] is True and args['eot_token'] == DOC_EOT and GPT(GPTConfig(**args)).config.documents
    old = {k: v for k, v in args.items() if k not in ('documents', 'eot_token')}
    assert GPT(GPTConfig(**old)).config.documents is False


@pytest.mark.parametrize("layout", ["stacked", "lone"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_stacked_linears_equal_separate_layers(autocast, layout, monkeypatch):
    # model.linears (the narrow layers as one matmul on their stacked weights, StackedLinear's one-op backward) against
    # the Linear layers called one by one: outputs and the gradients of x, every weight and bias (one layer without a bias), also
    # under torch.compile (aot_eager: the custom op's fake function and the autograd formula traced)
    from model import NARROW, linears
    torch.manual_seed(0)
    mod = torch.nn.Module()
    if layout == "stacked":
        # b, c, d narrow (stacked, with 3 zero rows of padding, in the order d, b, c; d at the NARROW bound), a wide
        mod.a, mod.b, mod.c = torch.nn.Linear(24, NARROW + 1), torch.nn.Linear(24, 5, bias=False), torch.nn.Linear(24, 8)
        mod.d = torch.nn.Linear(24, NARROW)
        names = ('a', 'b', 'c', 'd')
    else:  # one narrow layer of a width that is not a multiple of 8: padded through the same op
        mod.a, mod.b = torch.nn.Linear(24, NARROW + 8), torch.nn.Linear(24, 6, bias=False)
        names = ('a', 'b')
    x0 = torch.randn(2, 7, 24)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()

    def grads(fn):
        x = x0.clone().requires_grad_()
        mod.zero_grad(set_to_none=True)
        with ctx:
            outs = fn(x)
        loss = sum((o.float() * torch.cos(torch.arange(o.numel()).view(o.shape) + i)).sum() for i, o in enumerate(outs))
        loss.backward()
        return [o.float() for o in outs] + [x.grad] + [p.grad.clone() for p in mod.parameters()]

    ref = grads(lambda x: [getattr(mod, n)(x) for n in names])
    calls = []  # the narrow layers did go through StackedLinear, once
    monkeypatch.setattr(model.StackedLinear, "apply", lambda *a, f=model.StackedLinear.apply: calls.append(1) or f(*a))
    linears(mod, x0, names)
    assert len(calls) == 1
    tol = 2e-2 if autocast else 1e-6
    for fn in (lambda x: linears(mod, x, names), torch.compile(lambda x: linears(mod, x, names), backend="aot_eager")):
        for a, b in zip(grads(fn), ref):
            assert a.dtype == b.dtype and ((a - b).norm() / b.norm()).item() < tol


def test_a_mixer_missing_part_of_its_interface_is_named_at_build():
    """What a mixer must provide beyond forward (model.py, above MIXERS) is checked when the model is built, with a
    message that says what to add."""
    base = MIXERS['retnet']
    cases = [(type('NoFlops', (base,), {'core_flops_per_token': None}), r"add core_flops_per_token\(self, T\)"),
             (type('NoCacheKind', (base,), {'cache_grows': None}), r"add the class attribute cache_grows = False"),
             (type('BadProjection', (base,), {'projections': base.projections + ('o_norm',)}),
              r"projections names 'o_norm', which is not an nn.Linear attribute reading x")]
    for cls, message in cases:
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(MIXERS, 'new', cls)
            with pytest.raises(TypeError, match=rf"^mixer 'new' \({cls.__name__}\): {message}"):
                GPT(tiny('new'))


def test_a_new_mixer_is_one_class_and_one_line(tmp_path):
    """README "How to add a mixer": a copy of the project whose model.py gains fixtures/new_mixer.py's class above
    MIXERS and one MIXERS line, nothing else, runs that mixer through the per-mixer tests of test_model.py,
    test_mixers.py, test_context_parallel.py and test_train.py (shapes, loss at init, decode == forward, causality,
    the kernels key, split sequences over 2 ranks, training on pystdlib); it has no reference in test_mixers.py
    (optional, step 3) and needs none. The copy is made by walking the files, as from a release tarball (no git)."""
    import os
    import re
    import shutil
    import subprocess
    import sys
    from dataloader import shared_tiktoken_cache
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    copy = tmp_path / 'repo'

    def left_out(folder, names):  # git, caches and run outputs; of the data, only the tokenized pystdlib if prepared
        data = os.path.relpath(folder, root).split(os.sep)[0] == 'data'
        return [n for n in names if n in ('.git', '__pycache__', '.pytest_cache', 'wandb')
                or (n.startswith('out') and os.path.isdir(os.path.join(folder, n)))
                or (folder == root and n == 'shared')
                or (data and (n == 'cache' or n.endswith('.bin') and os.path.basename(folder) != 'pystdlib'))]

    shutil.copytree(root, copy, ignore=left_out)
    src = (copy / 'model.py').read_text()
    cls = (copy / 'tests' / 'fixtures' / 'new_mixer.py').read_text()
    cls = cls[cls.index('class GatedRetention'):]
    marker = '# ------------------------------------------------------------------------------------------------\n' \
             '# The one place mixers are named.'
    assert src.count(marker) == 1 and src.count("    'softmax': CausalSelfAttention,\n") == 1
    src = src.replace(marker, cls + '\n\n' + marker)
    src = src.replace("    'softmax': CausalSelfAttention,\n", "    'softmax': CausalSelfAttention,\n    'gret': GatedRetention,\n")
    (copy / 'model.py').write_text(src)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE='1')
    env.pop('PYTEST_XDIST_WORKER', None)
    if 'TIKTOKEN_CACHE_DIR' not in env and shared_tiktoken_cache(root):  # (the copy has no shared/ beside it)
        env['TIKTOKEN_CACHE_DIR'] = shared_tiktoken_cache(root)
    # the README's command after adding a mixer
    p = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-rA', '-p', 'no:cacheprovider', '-k', 'gret',
                        'tests/test_model.py', 'tests/test_mixers.py', 'tests/test_context_parallel.py',
                        'tests/test_train.py'], cwd=copy, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    passed = int(re.search(r'(\d+) passed', p.stdout).group(1))
    assert passed >= 13 and 'PASSED tests/test_train.py::test_every_mixer_trains[gret]' in p.stdout, p.stdout[-3000:]
    assert 'PASSED tests/test_context_parallel.py::test_split_sequences_match_one_process[2-gret]' in p.stdout, \
        p.stdout[-3000:]
