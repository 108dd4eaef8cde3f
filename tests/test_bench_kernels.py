"""
tools/bench_kernels.py (GPU only) on CPU: the kernel table's warm phase, each unit in its own process (subprocess.run
replaced), and tools/benchlib.py's bench_ms under the warm phase.

$ python -m pytest tests/test_bench_kernels.py -q
"""
import argparse
import os
import subprocess
import sys
import types

import torch

import bench_kernels
import benchlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def test_kernel_table_warm_phase_runs_every_unit_in_its_own_process(monkeypatch, capsys):
    """The kernel table's warm phase (GPU only) with subprocess.run replaced: one bench_kernels.py --warm_kernels
    process per delta-rule variant and shape and per scalar-decay variant, carrying the run's gate, preset and timing;
    a unit that fails is reported by its last line and the phase goes on; under WARM bench_ms calls fn once, untimed."""
    calls = []

    def fake_run(cmd, capture_output, text):
        calls.append(cmd)
        failed = '--variants' in cmd and cmd[cmd.index('--variants') + 1] == 'gdn' and '8,4096,16,64' in cmd
        return types.SimpleNamespace(returncode=1 if failed else 0, stdout='', stderr='x\nRuntimeError: boom' if failed else '')

    monkeypatch.setattr(bench_kernels.subprocess, 'run', fake_run)
    args = argparse.Namespace(jobs=3, kda_gate='safe', tuning='recompute', timing='eager', quick=False)
    bench_kernels.warm_kernel_table(args, ['kda', 'gdn'], ['retnet'], benchlib.SHAPES)
    units = {(c[c.index('--variants') + 1], c[c.index('--shape') + 1] if '--shape' in c else None) for c in calls}
    assert units == {(v, ','.join(map(str, s))) for v in ('kda', 'gdn') for s in benchlib.SHAPES} | {('retnet', None)}
    assert len(calls) == len(units) == 7
    for c in calls:
        assert c[1].endswith('bench_kernels.py') and '--warm_kernels' in c
        assert c[c.index('--kda_gate') + 1] == 'safe' and c[c.index('--tuning') + 1] == 'recompute'
        assert c[c.index('--timing') + 1] == 'eager' and '--quick' not in c
    out = capsys.readouterr().out
    assert 'warm gdn 8,4096,16,64: 0 s FAILED: RuntimeError: boom' in out and 'warm phase:' in out
    assert out.count('FAILED') == 1

    monkeypatch.setattr(torch.cuda, 'synchronize', lambda: None)
    monkeypatch.setattr(benchlib, 'WARM', True)
    n = []
    assert benchlib.bench_ms(lambda: n.append(1)) == 1.0 and n == [1]


def test_help_and_no_gpu():
    """The tool parses its own options; without CUDA it says so and stops."""
    p = subprocess.run([sys.executable, 'tools/bench_kernels.py', '--help'], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and '--kda_gate' in p.stdout and '--train' not in p.stdout, p.stderr[-2000:]
    if not torch.cuda.is_available():
        p = subprocess.run([sys.executable, 'tools/bench_kernels.py', '--quick'], capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 1 and 'needs a CUDA GPU' in p.stderr
