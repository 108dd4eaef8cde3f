"""
tools/bench_train.py on CPU: the kernel-name categories (names as torch.profiler reported them on an H100, torch 2.11),
the model config per mixer, one training cell in this process, the cell's JSON line through `--train_cell`, the
parent's table and ratios from given cells (the GPU-only columns cannot be measured here), the kernels.TUNING presets,
and the small defaults on CPU.

$ python -m pytest tests/test_bench_train.py -q
"""
import argparse
import json
import os
import subprocess
import sys
import types

import pytest

import bench_train
import benchlib
import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MIXER = frozenset({'_grads_bwd_kernel', '_grams_block_kernel', '_la_state_fwd_kernel', '_st', '_short_conv_bwd_kernel'})


@pytest.mark.parametrize('name,category', [
    ('_grads_bwd_kernel', 'linear mixer'),
    ('_la_state_fwd_kernel', 'linear mixer'),
    ('_short_conv_bwd_kernel', 'conv'),  # a kernels.py function, but the short conv has its own column
    ('triton_poi_fused__to_copy_add_expand_mul_pow_short_conv_bwd_view_22', 'fused elem'),  # Inductor, around it
    ('triton_red_fused__log_softmax__log_softmax_backward_data__to_copy_add_arange_eq_expand_nll_loss', 'fused elem'),
    ('triton_per_fused__fused_rms_norm_backward__to_copy_add_view_5', 'fused elem'),
    ('cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0',
     'attention'),
    ('cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*, void*, void*)', 'attention'),
    ('cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int, unsigned int)', 'attention'),
    ('void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false>>', 'attention'),
    ('fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)', 'attention'),
    ('void conv_depthwise2d_grad_weight_kernel<c10::BFloat16, float>(at::GenericPackedTensorAccessor)', 'conv'),
    ('nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT', 'matmul'),
    ('void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_256x64_32x4_nt_align2>(Params)', 'matmul'),
    ('void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false>', 'matmul'),
    ('sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off', 'matmul'),
    ('void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::'
     'FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>',
     'optimizer'),
    ('void at::native::lpnorm_cleanup<float, (at::native::NormType)1, float, true, float>(float const*)', 'optimizer'),
    ('void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1>>',
     'unfused'),
    ('void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_'
     'cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>>', 'unfused'),
    ('void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float, float>>>',
     'unfused'),
    ('Memcpy DtoH (Device -> Pageable)', 'unfused'),
    ('Memset (Device)', 'unfused'),
])
def test_kernel_category(name, category):
    assert bench_train.kernel_category(name, MIXER) == category


def test_mixer_kernels_are_collected_from_kernels_py():
    assert {'_grads_bwd_kernel', '_la_state_fwd_kernel'} <= bench_train.MIXER_KERNELS
    assert bench_train.kernel_category('_grams_block_kernel') == 'linear mixer'


def test_model_config_per_mixer():
    assert bench_train.train_model_config('kda', 4096).head_dim == 128  # config/owt.py's rule: KDA's heads are 128 wide
    assert bench_train.train_model_config('kda*3,softmax', 4096).head_dim == 128  # config/kda_hybrid.py
    assert bench_train.train_model_config('gdn', 4096).head_dim == 64
    cfg = bench_train.train_model_config('gdn*3,softmax', 1024)  # not in TRAIN_CONFIGS: config/owt.py, this mixer
    assert (cfg.mixer, cfg.block_size, cfg.n_layer, cfg.n_embd) == ('gdn*3,softmax', 1024, 12, 768)
    assert cfg.vocab_size == 50304


@pytest.mark.parametrize('mixer', ['softmax', 'kda*3,softmax'])
def test_train_cell_cpu(mixer):
    r = bench_train.train_cell(mixer, 32, 64, 2, 'cpu', tiny=True)
    assert (r['B'], r['device_name'], r['mfu']) == (2, 'cpu', None)
    assert r['ms'] > 0 and r['tokens_per_s'] == pytest.approx(64 / r['ms'] * 1000)
    assert 'warm_s' in bench_train.train_cell(mixer, 32, 64, 2, 'cpu', tiny=True, warm=True)


def test_train_cell_json_line(monkeypatch, capsys):
    """What the parent reads: one `CELL {json}` line; a cell that fails says why in it."""
    monkeypatch.setattr(sys, 'argv', ['bench_train.py', '--train_cell', 'nosuchmixer', '64', '--tokens', '128',
                                      '--device', 'cpu', '--tiny'])
    bench_train.main()
    line = [s for s in capsys.readouterr().out.splitlines() if s.startswith('CELL ')]
    cell = json.loads(line[0][5:])
    assert (cell['mixer'], cell['T'], cell['B']) == ('nosuchmixer', 64, 2) and 'nosuchmixer' in cell['error']


def test_run_cell_subprocess():
    args = argparse.Namespace(tokens=64, steps=1, device='cpu', tiny=True)
    cell = bench_train.run_cell('kda', 32, args, warm=True)
    assert 'error' not in cell and cell['B'] == 2
    assert 'kernels: delta_rule uses the chunked torch path on cpu' in cell['paths']


def test_train_table_ratios(monkeypatch, capsys, tmp_path):
    """The parent's arithmetic on given cells: × softmax, and GPU time outside the mixer and attention kernels ÷
    softmax's at the same T; softmax is added first; a failed cell keeps its row."""
    cats = lambda lin, att, rest: dict(zip(bench_train.CATEGORIES, (lin, att, rest, 0.0, 0.0, 0.0, 0.0)))
    given = {('softmax', 1024): dict(ms=100.0, tokens_per_s=300.0, gpu_ms=90.0, categories=cats(0.0, 30.0, 60.0)),
             ('kda', 1024): dict(ms=150.0, tokens_per_s=200.0, gpu_ms=140.0, categories=cats(71.0, 0.0, 69.0)),
             ('kda', 4096): dict(error='OutOfMemoryError: CUDA out of memory.'),
             ('softmax', 4096): dict(ms=100.0, tokens_per_s=300.0, gpu_ms=90.0, categories=cats(0.0, 30.0, 60.0))}
    calls = []

    def fake_run_cell(mixer, T, args, warm, documents=False, mode='default', tuning='default'):
        calls.append((mixer, T, warm))
        r = dict(mixer=mixer, T=T, B=args.tokens // T, paths=[], device_name='test GPU', mfu=None, peak_mib=1.0,
                 mode=mode)
        return dict(r, warm_s=1.0) if warm else dict(r, **given[mixer, T])

    monkeypatch.setattr(bench_train, 'run_cell', fake_run_cell)
    args = argparse.Namespace(tokens=8192, steps=3, jobs=2, device='cuda', tiny=False, json=str(tmp_path / 'r.json'),
                              documents=False, compile_mode=['default'], tuning=['default'])
    bench_train.train_bench(args, ['kda'], [1024, 4096])
    assert [c for c in calls if not c[2]] == [('softmax', 1024, False), ('kda', 1024, False), ('softmax', 4096, False),
                                             ('kda', 4096, False)]
    rows = [s for s in capsys.readouterr().out.splitlines() if s.startswith('|')]
    assert len({s.count('|') for s in rows}) == 1  # every row has the header's columns
    kda = [c.strip() for c in rows[3].strip('|').split('|')]
    assert kda[:3] == ['kda', '1024 (8)', '200'] and kda[3] == '0.667'
    assert kda[-2:] == ['69.00', '1.15']  # (140 - 71) / (90 - 30)
    assert 'OutOfMemoryError' in rows[5]
    saved = json.load(open(tmp_path / 'r.json'))
    assert saved['cells'][1]['outside_vs_softmax'] == pytest.approx(1.15)


def test_train_table_documents_column(monkeypatch, capsys):
    """--documents: every mixer twice, off then on ('<mixer> +docs'); '÷ off' = on's tokens/s over off's, × softmax
    against softmax with documents off."""
    speed = {('softmax', False): 300.0, ('softmax', True): 240.0, ('kda', False): 200.0, ('kda', True): 190.0}
    calls = []

    def fake_run_cell(mixer, T, args, warm, documents=False, mode='default', tuning='default'):
        calls.append((mixer, documents))
        r = dict(mixer=mixer, T=T, B=args.tokens // T, documents=documents, paths=[], device_name='test GPU', mfu=None,
                 mode=mode)
        return dict(r, warm_s=1.0) if warm else dict(r, ms=1.0, tokens_per_s=speed[mixer, documents])

    monkeypatch.setattr(bench_train, 'run_cell', fake_run_cell)
    args = argparse.Namespace(tokens=8192, steps=3, jobs=1, device='cuda', tiny=False, json='', documents=True,
                              compile_mode=['default'], tuning=['default'])
    bench_train.train_bench(args, ['kda'], [1024])
    assert calls[4:] == [('softmax', False), ('softmax', True), ('kda', False), ('kda', True)]
    rows = [[c.strip() for c in s.strip('|').split('|')] for s in capsys.readouterr().out.splitlines()
            if s.startswith('|')]
    assert rows[0][3:5] == ['× softmax', '÷ off'] and len({len(r) for r in rows}) == 1
    assert [r[0] for r in rows[2:]] == ['softmax', 'softmax +docs', 'kda', 'kda +docs']
    assert rows[3][3:5] == ['0.800', '0.80'] and rows[4][3:5] == ['0.667', ''] and rows[5][3:5] == ['0.633', '0.95']


def test_train_table_compile_modes_and_idle(monkeypatch, capsys):
    """--compile_mode with two modes: each mode's rows are labelled and divided by softmax of the same mode; the idle
    columns show a cell's profiled idle ms and its share of the profiled step, the timed idle and its share of the
    timed step."""
    speed = {('softmax', 'default'): 300.0, ('kda', 'default'): 150.0, ('softmax', 'reduce-overhead'): 400.0,
             ('kda', 'reduce-overhead'): 300.0}

    def fake_run_cell(mixer, T, args, warm, documents=False, mode='default', tuning='default'):
        r = dict(mixer=mixer, T=T, B=args.tokens // T, documents=documents, paths=[], device_name='test GPU', mfu=None,
                 mode=mode)
        return dict(r, warm_s=1.0) if warm else dict(r, ms=10.0, tokens_per_s=speed[mixer, mode], idle_ms=0.5,
                                                       profiled_ms=20.0, idle_timed_ms=0.3)

    monkeypatch.setattr(bench_train, 'run_cell', fake_run_cell)
    args = argparse.Namespace(tokens=8192, steps=3, jobs=1, device='cuda', tiny=False, json='', documents=False,
                              compile_mode=['default', 'reduce-overhead'], tuning=['default'])
    bench_train.train_bench(args, ['kda'], [1024])
    rows = [[c.strip() for c in s.strip('|').split('|')] for s in capsys.readouterr().out.splitlines()
            if s.startswith('|')]
    head = rows[0]
    assert [r[0] for r in rows[2:]] == ['softmax [default]', 'kda [default]', 'softmax [reduce-overhead]',
                                        'kda [reduce-overhead]']
    assert [r[3] for r in rows[2:]] == ['1.000', '0.500', '1.000', '0.750']
    assert rows[3][head.index('profiled idle ms')] == '0.50' and rows[3][head.index('profiled idle %')] == '2.5'
    assert rows[3][head.index('idle ms (timed)')] == '0.30' and rows[3][head.index('idle % (timed)')] == '3.0'



def test_train_table_tuning_presets(monkeypatch, capsys):
    """--tuning default recompute: each linear mixer's rows under both presets of kernels.TUNING (labelled), softmax once
    (its model has no linear-mixer kernels); every row divided by that softmax row; each cell's process gets its
    preset, and a preset applies its settings to kernels.TUNING (and restores them)."""
    speed = {('kda', 'default'): 165.0, ('kda', 'recompute'): 150.0}
    calls, run_cell = [], bench_train.run_cell

    def fake_run_cell(mixer, T, args, warm, documents=False, mode='default', tuning='default'):
        calls.append((mixer, tuning))
        r = dict(mixer=mixer, T=T, B=args.tokens // T, documents=documents, paths=[], device_name='test GPU', mfu=None,
                 mode=mode, tuning=tuning)
        return dict(r, warm_s=1.0) if warm else dict(r, ms=10.0, tokens_per_s=300.0 if mixer == 'softmax'
                                                       else speed[mixer, tuning])

    monkeypatch.setattr(bench_train, 'run_cell', fake_run_cell)
    args = argparse.Namespace(tokens=8192, steps=3, jobs=1, device='cuda', tiny=False, json='', documents=False,
                              compile_mode=['default'], tuning=['default', 'recompute'])
    bench_train.train_bench(args, ['kda'], [1024])
    assert calls[3:] == [('softmax', 'default'), ('kda', 'default'), ('kda', 'recompute')]
    rows = [[c.strip() for c in s.strip('|').split('|')] for s in capsys.readouterr().out.splitlines()
            if s.startswith('|')]
    assert [r[0] for r in rows[2:]] == ['softmax', 'kda [default]', 'kda [recompute]']
    assert [r[3] for r in rows[2:]] == ['1.000', '0.550', '0.500']
    cmd = []
    monkeypatch.setattr(bench_train.subprocess, 'run', lambda c, **kw: cmd.append(c) or types.SimpleNamespace(
        stdout='CELL {"mixer": "kda"}', stderr='', returncode=0))
    run_cell('kda', 64, argparse.Namespace(tokens=128, steps=1, device='cpu', tiny=True), False, tuning='recompute')
    assert cmd[0][-2:] == ['--tuning', 'recompute']
    before = (kernels.TUNING['keep'], dict(kernels.TUNING['kda_grads']))
    assert before[0] is True  # the default
    with benchlib.tuned(benchlib.TUNING_PRESETS['recompute']), benchlib.tuned({'kda_grads': {'warps': 2}}):
        assert kernels.TUNING['keep'] is False and kernels.TUNING['kda_grads']['warps'] == 2
        assert kernels.TUNING['kda_grads']['k'] == before[1]['k']  # the entry's other keys kept
    assert (kernels.TUNING['keep'], kernels.TUNING['kda_grads']) == before
    with pytest.raises(KeyError, match='mid'):
        benchlib.tuned({'kda_grads': {'mid': True}}).__enter__()


def test_cpu_defaults_are_a_smoke_run(monkeypatch, capsys):
    """With --tiny or on CPU the defaults are small (contexts 64 and 128, 256 tokens per step: the run takes seconds,
    not the 124M model's contexts up to 16k); on CUDA they are the full ones. On CPU there is no warm phase (the
    model runs eager: nothing compiles), and the cells run --jobs at a time, in the table in their order."""
    got, train_bench = {}, bench_train.train_bench
    monkeypatch.setattr(bench_train, 'train_bench', lambda args, mixers, contexts: got.update(
        args=args, mixers=mixers, contexts=contexts))
    for argv, contexts, tokens in ((['--tiny', '--device', 'cpu'], [64, 128], 256),
                                   (['--tiny', '--device', 'cuda'], [64, 128], 256),
                                   (['--device', 'cpu'], [64, 128], 256),
                                   (['--device', 'cuda'], [1024, 4096, 8192, 16384], 32768),
                                   (['--device', 'cpu', '--contexts', '32', '--tokens', '64'], [32], 64)):
        monkeypatch.setattr(sys, 'argv', ['bench_train.py'] + argv)
        bench_train.main()
        assert (got['contexts'], got['args'].tokens) == (contexts, tokens), argv
    assert got['args'].device == 'cpu' and got['mixers'][-1] == 'kda*3,softmax' and 'softmax' in got['mixers']
    calls = []

    def fake_run_cell(mixer, T, args, warm, documents=False, mode='default', tuning='default'):
        calls.append((mixer, warm))
        return dict(mixer=mixer, T=T, B=args.tokens // T, paths=[], device_name='cpu', mfu=None, mode=mode, ms=1.0,
                    tokens_per_s=1.0)

    monkeypatch.setattr(bench_train, 'run_cell', fake_run_cell)
    args = argparse.Namespace(tokens=256, steps=3, jobs=2, device='cpu', tiny=True, json='', documents=False,
                              compile_mode=['default'], tuning=['default'])
    train_bench(args, ['kda', 'gdn'], [64])
    assert sorted(calls) == [('gdn', False), ('kda', False), ('softmax', False)]
    rows = [s for s in capsys.readouterr().out.splitlines() if s.startswith('| ')]
    assert [r.split('|')[1].strip() for r in rows[1:]] == ['softmax', 'kda', 'gdn']


def test_help():
    p = subprocess.run([sys.executable, 'tools/bench_train.py', '--help'], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and '--documents' in p.stdout and '--tiles' not in p.stdout, p.stderr[-2000:]


def test_bad_patterns_and_counts_are_one_line_before_any_cell():
    """--mixers nosuch ran every cell and reported the error in a table row with exit 0; --contexts 0 was a
    ZeroDivisionError traceback."""
    for args, says in ((['--mixers', 'nosuch'], "unknown mixer 'nosuch'"),
                       (['--contexts', '0'], '--contexts, --tokens and --steps must be >= 1')):
        p = subprocess.run([sys.executable, 'tools/bench_train.py', '--tiny'] + args, cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2 and says in p.stderr and 'Traceback' not in p.stderr and 'CELL' not in p.stdout, p.stderr
