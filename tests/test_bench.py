"""
bench.py --train on CPU: the kernel-name categories (names as torch.profiler reported them on an H100, torch 2.11),
one training cell in this process, the cell's JSON line through `--train_cell`, and the parent's table and ratios
from given cells (the GPU-only columns cannot be measured here). bench.py --tiles: its candidates name settings
kernels.TUNING has, and its checks run through Triton's interpreter at CPU sizes; bench.py --ptxas compiles the
recorded launches for sm_90a offline.

$ python -m pytest test_bench.py -q
"""
import argparse
import json
import os
import subprocess
import sys
import types

import pytest
import torch

import bench
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
    assert bench.kernel_category(name, MIXER) == category


def test_mixer_kernels_are_collected_from_kernels_py():
    assert {'_grads_bwd_kernel', '_la_state_fwd_kernel'} <= bench.MIXER_KERNELS
    assert bench.kernel_category('_grams_block_kernel') == 'linear mixer'


def test_model_config_per_mixer():
    assert bench.train_model_config('kda', 4096).head_dim == 128  # config/owt.py's rule: KDA's heads are 128 wide
    assert bench.train_model_config('kda*3,softmax', 4096).head_dim == 128  # config/kda_hybrid.py
    assert bench.train_model_config('gdn', 4096).head_dim == 64
    cfg = bench.train_model_config('gdn*3,softmax', 1024)  # not in TRAIN_CONFIGS: config/owt.py, this mixer
    assert (cfg.mixer, cfg.block_size, cfg.n_layer, cfg.n_embd) == ('gdn*3,softmax', 1024, 12, 768)
    assert cfg.vocab_size == 50304


@pytest.mark.parametrize('mixer', ['softmax', 'kda*3,softmax'])
def test_train_cell_cpu(mixer):
    r = bench.train_cell(mixer, 32, 64, 2, 'cpu', tiny=True)
    assert (r['B'], r['device_name'], r['mfu']) == (2, 'cpu', None)
    assert r['ms'] > 0 and r['tokens_per_s'] == pytest.approx(64 / r['ms'] * 1000)
    assert 'warm_s' in bench.train_cell(mixer, 32, 64, 2, 'cpu', tiny=True, warm=True)


def test_train_cell_json_line(monkeypatch, capsys):
    """What the parent reads: one `CELL {json}` line; a cell that fails says why in it."""
    monkeypatch.setattr(sys, 'argv', ['bench.py', '--train_cell', 'nosuchmixer', '64', '--tokens', '128', '--device',
                                      'cpu', '--tiny'])
    bench.main()
    line = [s for s in capsys.readouterr().out.splitlines() if s.startswith('CELL ')]
    cell = json.loads(line[0][5:])
    assert (cell['mixer'], cell['T'], cell['B']) == ('nosuchmixer', 64, 2) and 'nosuchmixer' in cell['error']


def test_run_cell_subprocess():
    args = argparse.Namespace(tokens=64, steps=1, device='cpu', tiny=True)
    cell = bench.run_cell('kda', 32, args, warm=True)
    assert 'error' not in cell and cell['B'] == 2
    assert 'kernels: delta_rule uses the chunked torch path on cpu' in cell['paths']


def test_train_table_ratios(monkeypatch, capsys, tmp_path):
    """The parent's arithmetic on given cells: × softmax, and GPU time outside the mixer and attention kernels ÷
    softmax's at the same T; softmax is added first; a failed cell keeps its row."""
    cats = lambda lin, att, rest: dict(zip(bench.CATEGORIES, (lin, att, rest, 0.0, 0.0, 0.0, 0.0)))
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

    monkeypatch.setattr(bench, 'run_cell', fake_run_cell)
    args = argparse.Namespace(tokens=8192, steps=3, jobs=2, device='cuda', tiny=False, json=str(tmp_path / 'r.json'),
                              documents=False, compile_mode=['default'], tuning=['default'])
    bench.train_bench(args, ['kda'], [1024, 4096])
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

    monkeypatch.setattr(bench, 'run_cell', fake_run_cell)
    args = argparse.Namespace(tokens=8192, steps=3, jobs=1, device='cuda', tiny=False, json='', documents=True,
                              compile_mode=['default'], tuning=['default'])
    bench.train_bench(args, ['kda'], [1024])
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

    monkeypatch.setattr(bench, 'run_cell', fake_run_cell)
    args = argparse.Namespace(tokens=8192, steps=3, jobs=1, device='cuda', tiny=False, json='', documents=False,
                              compile_mode=['default', 'reduce-overhead'], tuning=['default'])
    bench.train_bench(args, ['kda'], [1024])
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
    calls, run_cell = [], bench.run_cell

    def fake_run_cell(mixer, T, args, warm, documents=False, mode='default', tuning='default'):
        calls.append((mixer, tuning))
        r = dict(mixer=mixer, T=T, B=args.tokens // T, documents=documents, paths=[], device_name='test GPU', mfu=None,
                 mode=mode, tuning=tuning)
        return dict(r, warm_s=1.0) if warm else dict(r, ms=10.0, tokens_per_s=300.0 if mixer == 'softmax'
                                                       else speed[mixer, tuning])

    monkeypatch.setattr(bench, 'run_cell', fake_run_cell)
    args = argparse.Namespace(tokens=8192, steps=3, jobs=1, device='cuda', tiny=False, json='', documents=False,
                              compile_mode=['default'], tuning=['default', 'recompute'])
    bench.train_bench(args, ['kda'], [1024])
    assert calls[3:] == [('softmax', 'default'), ('kda', 'default'), ('kda', 'recompute')]
    rows = [[c.strip() for c in s.strip('|').split('|')] for s in capsys.readouterr().out.splitlines()
            if s.startswith('|')]
    assert [r[0] for r in rows[2:]] == ['softmax', 'kda [default]', 'kda [recompute]']
    assert [r[3] for r in rows[2:]] == ['1.000', '0.550', '0.500']
    cmd = []
    monkeypatch.setattr(bench.subprocess, 'run', lambda c, **kw: cmd.append(c) or types.SimpleNamespace(
        stdout='CELL {"mixer": "kda"}', stderr='', returncode=0))
    run_cell('kda', 64, argparse.Namespace(tokens=128, steps=1, device='cpu', tiny=True), False, tuning='recompute')
    assert cmd[0][-2:] == ['--tuning', 'recompute']
    before = (kernels.TUNING['keep'], dict(kernels.TUNING['kda_grads']))
    assert before[0] is True  # the default
    with bench.tuned(bench.TUNING_PRESETS['recompute']), bench.tuned({'kda_grads': {'warps': 2}}):
        assert kernels.TUNING['keep'] is False and kernels.TUNING['kda_grads']['warps'] == 2
        assert kernels.TUNING['kda_grads']['k'] == before[1]['k']  # the entry's other keys kept
    assert (kernels.TUNING['keep'], kernels.TUNING['kda_grads']) == before
    with pytest.raises(KeyError, match='mid'):
        bench.tuned({'kda_grads': {'mid': True}}).__enter__()

# -----------------------------------------------------------------------------
# --tiles and --ptxas (kernels.TUNING's candidates; offline compiles)

INTERPRET = bool(os.environ.get('TRITON_INTERPRET')) or torch.cuda.is_available()


def test_tile_candidates_name_tuning_settings():
    """Every candidate changes settings kernels.TUNING has (a renamed setting fails here, not in a GPU call), and
    bench.tuned restores TUNING as it was."""
    before = repr(kernels.TUNING)
    for family, candidates in bench.TILE_CANDIDATES.items():
        assert 'default' in candidates and candidates['default'] == {}
        for name, overrides in candidates.items():
            for entry, kv in overrides.items():
                assert entry in kernels.TUNING and set(kv) <= set(kernels.TUNING[entry]), (family, name)
            with bench.tuned(overrides):
                for entry, kv in overrides.items():
                    assert all(kernels.TUNING[entry][k] == v for k, v in kv.items())
    assert repr(kernels.TUNING) == before
    with pytest.raises(KeyError, match='no_such_setting'):
        with bench.tuned({'state': {'no_such_setting': 1}}):
            pass
    assert repr(kernels.TUNING) == before


@pytest.mark.skipif(not INTERPRET, reason='needs CUDA or TRITON_INTERPRET=1 (conftest.py sets it without CUDA)')
def test_tiles_check_against_the_reference(monkeypatch):
    """One candidate per family through the checker at CPU sizes: within the bounds, the no-grad forward checked too,
    and a bound of 0 fails it."""
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    for family, name in (('delta', 'wy_grads warps 4'), ('scalar', 'fused none'),
                         ('conv', 'bwd L 64')):
        errs = bench.tiles_check(family, name, device, tiny=True)
        assert errs and all(0 <= e < 1e-3 for case in errs.values() for e in case.values()), (family, errs)
        assert all('o no grad' in case or 'y no grad' in case for case in errs.values()), errs
    monkeypatch.setattr(bench, 'TILE_TOL_GRAD', (0.0, 0.0))
    with pytest.raises(AssertionError, match='errors over the bounds'):
        bench.tiles_check('conv', 'default', device, tiny=True)


@pytest.mark.skipif(not INTERPRET, reason='needs CUDA or TRITON_INTERPRET=1 (conftest.py sets it without CUDA)')
def test_tiles_command_checks_each_candidate_in_its_own_process():
    p = subprocess.run([sys.executable, 'tools/bench.py', '--tiles', 'conv', '--tiny', '--only', 'fwd L', '--jobs', '2'],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    lines = p.stdout.splitlines()
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert [s.split()[2] for s in lines if s.startswith('check conv')] == ['default', 'fwd'], lines
    assert all(s.endswith(' ok') for s in lines if s.startswith('check conv'))


def test_ptxas_reports_every_launch_offline():
    """--ptxas records the launches of the public calls (interpreter) and compiles those asked for, for sm_90a."""
    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'ptxas')
    if not os.path.exists(ptxas):
        pytest.skip("this triton has no bundled ptxas")
    p = subprocess.run([sys.executable, 'tools/bench.py', '--ptxas', '--only', '_step_kernel', '--shape', '1,65,4,16',
                        '--dtypes', 'fp32'], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    rows = [s.split() for s in p.stdout.splitlines() if s.strip().startswith('_step_kernel')]
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert sorted(r[2] for r in rows) == ['GATE=0', 'GATE=1', 'GATE=2'], p.stdout  # DeltaNet, GDN, KDA
    assert all('regs' in r and 'FAILED' not in r for r in rows), p.stdout


def test_multi_gpu_tables_from_given_runs(monkeypatch, capsys):
    """bench.py --multi_gpu (GPU only) from given train.py runs: every row's ratios as computed here, a run that failed
    shown with its error, the longest context that fit one GPU taken as the CP runs' base, and their losses compared."""
    runs = {}

    def train_run(nproc, overrides, steps, tag, gpus=None):
        T = int(next(o for o in overrides if o.startswith('--block_size=')).split('=')[1])
        fsdp = '--fsdp=True' in overrides
        if nproc == 1 and T == 8192 + 16384:
            return dict(tag=tag, nproc=1, T=T, losses={}, error='CUDA out of memory')
        tokens = {(1, False): 200.0, (2, False): 380.0, (1, True): 180.0, (2, True): 300.0}.get((nproc, fsdp), 150.0 * nproc)
        r = dict(tag=tag, nproc=nproc, T=T, overrides=overrides, tokens_s=tokens, quartiles=(tokens - 5, tokens + 5),
                 peak_gib=(12.0 if fsdp else 10.0) / nproc, losses={i: 5.0 - 0.01 * i + 0.003 * (nproc > 1) for i in range(9)})
        runs[tag] = dict(r, gpus=gpus)
        return r

    monkeypatch.setattr(bench, 'train_run', train_run)
    monkeypatch.setattr(bench, 'long_rows_dataset', lambda: 'pystdlib_long')
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'test GPU')
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    res = bench.multi_gpu_bench(['dp', 'cp'], [2], 8192, steps=9, cp_multiples=['1', 'n', '4'], dp_batch=24)
    out = capsys.readouterr().out
    for t in ('DDP-1', 'FSDP-1', 'DDP-2', 'FSDP-2'):  # the micro-batch given, 2 micro-steps per GPU
        assert '--batch_size=24' in runs[t]['overrides'] and f"--gradient_accumulation_steps={2 * runs[t]['nproc']}" in runs[t]['overrides']
    assert 'T = 1,024, 24 sequences x 2 micro-steps per GPU' in out
    rows = {tuple(c.strip() for c in line.strip('|').split('|')[:3]): [c.strip() for c in line.strip('|').split('|')]
            for line in out.splitlines() if line.startswith('| ') and 'layout' not in line}
    fsdp2 = rows[('FSDP', '2', '300 (295–305)')]
    assert fsdp2[3:7] == ['150', f"{150 / 180:.2f}", f"{300 / 380:.2f}", '6.0']  # per GPU, ÷ 1 GPU, ÷ DDP, peak
    assert rows[('DDP', '2', '380 (375–385)')][4] == f"{190 / 200:.2f}"
    assert rows[('1 GPU', '1', '24,576')][3] == 'CUDA out of memory'
    cp = rows[('CP over 2', '2', '8,192')]
    assert cp[3:7] == ['380', f"{380 / 200:.2f}", '5.0', f"{5.0 / 10.0:.2f}"]  # against one GPU at 8,192
    assert ('CP over 2, recompute', '2', '16,384') in rows  # twice the longest context that fit one GPU
    assert 'largest difference 0.0030' in out
    assert [r['T'] for r in res['cp']['cp']] == [8192, 16384, 32768]
    # 2 GPUs here: DDP and FSDP on 1 GPU ran side by side, on 2 one after the other
    assert [runs[t]['gpus'] for t in ('DDP-1', 'FSDP-1', 'DDP-2', 'FSDP-2')] == ['0', '1', None, None]
    assert ('CP over 2, recompute', '2', '32,768') in rows  # n times or more: with activation checkpointing
    assert [('--activation_checkpointing=True' in r['overrides']) for r in res['cp']['cp']] == [False, True, True]


def test_multi_gpu_cp_steps_down_where_the_expected_context_does_not_fit(monkeypatch, capsys):
    """bench.py --multi_gpu cp on a smaller card (GPU only; train.py runs given): where neither --cp_context nor one
    step more fits one GPU, the two contexts below are tried side by side, and the CP runs take the longest that fit."""
    tried = []

    def train_run(nproc, overrides, steps, tag, gpus=None):
        T = int(next(o for o in overrides if o.startswith('--block_size=')).split('=')[1])
        tried.append((nproc, T, gpus))
        if nproc == 1 and T > 24576:
            return dict(tag=tag, nproc=1, T=T, losses={}, error='CUDA out of memory')
        return dict(tag=tag, nproc=nproc, T=T, overrides=overrides, tokens_s=100.0 * nproc, quartiles=(1, 2),
                    peak_gib=10.0 / nproc, losses={i: 5.0 for i in range(3)})

    monkeypatch.setattr(bench, 'train_run', train_run)
    monkeypatch.setattr(bench, 'long_rows_dataset', lambda: 'pystdlib_long')
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda *a: 'test GPU')
    res = bench.multi_gpu_bench(['cp'], [2], 40960, steps=3, cp_multiples=['1'])
    assert sorted(tried[:2]) == [(1, 40960, '0'), (1, 57344, '1')] and sorted(tried[2:4]) == [(1, 8192, '0'), (1, 24576, '1')]
    assert tried[4:] == [(2, 24576, None)]  # CP at the longest that fit
    assert [r['T'] for r in res['cp']['single']] == [8192, 24576, 40960, 57344]
    assert 'CUDA out of memory' in capsys.readouterr().out


def test_kernel_table_warm_phase_runs_every_unit_in_its_own_process(monkeypatch, capsys):
    """The kernel table's warm phase (GPU only) with subprocess.run replaced: one bench.py --warm_kernels process per
    delta-rule variant and shape and per scalar-decay variant, carrying the run's gate, preset and timing; a unit
    that fails is reported by its last line and the phase goes on; under WARM bench_ms calls fn once, untimed."""
    calls = []

    def fake_run(cmd, capture_output, text):
        calls.append(cmd)
        failed = '--variants' in cmd and cmd[cmd.index('--variants') + 1] == 'gdn' and '8,4096,16,64' in cmd
        return types.SimpleNamespace(returncode=1 if failed else 0, stdout='', stderr='x\nRuntimeError: boom' if failed else '')

    monkeypatch.setattr(bench.subprocess, 'run', fake_run)
    args = argparse.Namespace(jobs=3, kda_gate='safe', tuning=['recompute'], timing='eager', quick=False)
    bench.warm_kernel_table(args, ['kda', 'gdn'], ['retnet'], bench.SHAPES)
    units = {(c[c.index('--variants') + 1], c[c.index('--shape') + 1] if '--shape' in c else None) for c in calls}
    assert units == {(v, ','.join(map(str, s))) for v in ('kda', 'gdn') for s in bench.SHAPES} | {('retnet', None)}
    assert len(calls) == len(units) == 7
    for c in calls:
        assert c[1].endswith('bench.py') and '--warm_kernels' in c
        assert c[c.index('--kda_gate') + 1] == 'safe' and c[c.index('--tuning') + 1] == 'recompute'
        assert c[c.index('--timing') + 1] == 'eager' and '--quick' not in c
    out = capsys.readouterr().out
    assert 'warm gdn 8,4096,16,64: 0 s FAILED: RuntimeError: boom' in out and 'warm phase:' in out
    assert out.count('FAILED') == 1

    monkeypatch.setattr(torch.cuda, 'synchronize', lambda: None)
    monkeypatch.setattr(bench, 'WARM', True)
    n = []
    assert bench.bench_ms(lambda: n.append(1)) == 1.0 and n == [1]
