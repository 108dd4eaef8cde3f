"""
tools/tune.py: its tile candidates name settings kernels.TUNING has, its checks run through Triton's interpreter at
CPU sizes (in this process and as the command, each candidate in its own process), and --ptxas compiles the launches
tools/launches.py records for sm_90a offline.

$ python -m pytest tests/test_bench_tune.py -q
"""
import os
import subprocess
import sys

import pytest
import torch

import benchlib
import kernels
import tune

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INTERPRET = bool(os.environ.get('TRITON_INTERPRET')) or torch.cuda.is_available()


def test_tile_candidates_name_tuning_settings():
    """Every candidate changes settings kernels.TUNING has (a renamed setting fails here, not in a GPU call), and
    benchlib.tuned restores TUNING as it was."""
    before = repr(kernels.TUNING)
    for family, candidates in tune.TILE_CANDIDATES.items():
        assert 'default' in candidates and candidates['default'] == {}
        for name, overrides in candidates.items():
            for entry, kv in overrides.items():
                assert entry in kernels.TUNING and set(kv) <= set(kernels.TUNING[entry]), (family, name)
            with benchlib.tuned(overrides):
                for entry, kv in overrides.items():
                    assert all(kernels.TUNING[entry][k] == v for k, v in kv.items())
    assert repr(kernels.TUNING) == before
    with pytest.raises(KeyError, match='no_such_setting'):
        with benchlib.tuned({'state': {'no_such_setting': 1}}):
            pass
    assert repr(kernels.TUNING) == before


@pytest.mark.skipif(not INTERPRET, reason='needs CUDA or TRITON_INTERPRET=1 (conftest.py sets it without CUDA)')
def test_tiles_check_against_the_reference(monkeypatch):
    """One candidate per family through the checker at CPU sizes: within the bounds, the no-grad forward checked too,
    and a bound of 0 fails it."""
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    for family, name in (('delta', 'wy_grads warps 4'), ('scalar', 'fused none'),
                         ('conv', 'bwd L 64')):
        errs = tune.tiles_check(family, name, device, tiny=True)
        assert errs and all(0 <= e < 1e-3 for case in errs.values() for e in case.values()), (family, errs)
        assert all('o no grad' in case or 'y no grad' in case for case in errs.values()), errs
    monkeypatch.setattr(tune, 'TILE_TOL_GRAD', (0.0, 0.0))
    with pytest.raises(AssertionError, match='errors over the bounds'):
        tune.tiles_check('conv', 'default', device, tiny=True)


@pytest.mark.skipif(not INTERPRET, reason='needs CUDA or TRITON_INTERPRET=1 (conftest.py sets it without CUDA)')
def test_tiles_command_checks_each_candidate_in_its_own_process():
    p = subprocess.run([sys.executable, 'tools/tune.py', '--tiles', 'conv', '--tiny', '--only', 'fwd L', '--jobs', '2'],
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
    p = subprocess.run([sys.executable, 'tools/tune.py', '--ptxas', '--only', '_step_kernel', '--shape', '1,65,4,16',
                        '--dtypes', 'fp32'], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    rows = [s.split() for s in p.stdout.splitlines() if s.strip().startswith('_step_kernel')]
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert sorted(r[2] for r in rows) == ['GATE=0', 'GATE=1', 'GATE=2'], p.stdout  # DeltaNet, GDN, KDA
    assert all('regs' in r and 'FAILED' not in r for r in rows), p.stdout


def test_help_and_launches_usage():
    """tune.py parses its own options and wants --tiles or --ptxas; launches.py without its two arguments shows its
    docstring."""
    p = subprocess.run([sys.executable, 'tools/tune.py', '--help'], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and '--ptxas' in p.stdout and '--train' not in p.stdout, p.stderr[-2000:]
    p = subprocess.run([sys.executable, 'tools/tune.py'], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and '--tiles FAMILY or --ptxas' in p.stderr
    p = subprocess.run([sys.executable, 'tools/launches.py'], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1 and 'python tools/launches.py 128 bf16,fp32' in p.stderr
