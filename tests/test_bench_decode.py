"""
tools/bench_decode.py on CPU: the table's rows, the caches' growth by mixer, bad arguments as one line.

$ python -m pytest tests/test_bench_decode.py -q
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args):
    return subprocess.run([sys.executable, 'tools/bench_decode.py', *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_table_rows_and_cache_growth():
    """One row per (mixer, context) with a ms/token per batch; softmax's K/V grow with the context (12 layers x 2 x
    768 x 2 bytes per token, fp32 on CPU: x 2), kda's state does not."""
    p = run('--mixers', 'kda', 'softmax', '--contexts', '8', '520', '--steps', '2', '--batches', '1', '2')
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [r.split('|')[1:-1] for r in p.stdout.splitlines() if r.startswith('| ') and '---' not in r][1:]
    cells = {(r[0].strip(), int(r[1].replace(',', ''))): r for r in rows}
    assert sorted(cells) == [('kda', 8), ('kda', 520), ('softmax', 8), ('softmax', 520)]
    assert all(float(r[4]) > 0 and float(r[6]) > 0 for r in rows)  # ms/token at batch 1 and 2
    mib = {k: float(r[5]) for k, r in cells.items()}
    assert mib[('kda', 8)] == mib[('kda', 520)]
    growth = (mib[('softmax', 520)] - mib[('softmax', 8)]) * 2**20 / 512  # bytes per token of context
    assert abs(growth / (12 * 2 * 768 * 4) - 1) < 0.002, growth  # (the MiB are rounded)


def test_bad_arguments_are_one_line(monkeypatch, capsys):
    sys.path.insert(0, os.path.join(ROOT, 'tools'))
    import bench_decode
    for args, msg in ((['--batches', '0'], '--batches takes numbers'), (['--contexts', '0'], 'must be >= 1'),
                      (['--mixers', 'nosuch'], 'nosuch')):
        monkeypatch.setattr(sys, 'argv', ['bench_decode.py'] + args)
        with pytest.raises(SystemExit) as e:
            bench_decode.main()
        err = capsys.readouterr().err
        assert e.value.code == 2 and msg in err and 'Traceback' not in err, err


def test_out_of_memory_at_batch_1_is_one_row_measured_after_the_failed_cell_is_freed(monkeypatch, capsys):
    """A cell that runs out of memory (the CPU allocator's RuntimeError, or one inside the error torch.compile raises)
    is a row saying how many tokens would fit, or that the caches do not grow (kda); what the failed cell held is
    freed before the free memory is read; any other error still raises."""
    import gc
    import weakref
    sys.path.insert(0, os.path.join(ROOT, 'tools'))
    import bench_decode
    held = []

    class Caches:  # what a failed cell's frame holds (its Decoder, caches)
        pass

    def failing_cell(model, mixer, T, *args):
        caches = Caches()
        held.append(weakref.ref(caches))
        oom = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
        if mixer == 'kda':
            try:
                raise oom
            except RuntimeError as e:
                raise RuntimeError("backend='inductor' raised: ...") from e  # (as BackendCompilerFailed wraps it)
        raise oom

    fits = bench_decode.tokens_that_fit
    def checked_fits(*args):
        gc.collect()
        assert all(ref() is None for ref in held), "the failed cell's objects are still alive"
        return fits(*args)
    monkeypatch.setattr(bench_decode, 'cell', failing_cell)
    monkeypatch.setattr(bench_decode, 'tokens_that_fit', checked_fits)
    monkeypatch.setattr(sys, 'argv', ['bench_decode.py', '--mixers', 'softmax', 'kda', '--contexts', '64',
                                      '--device', 'cpu', '--steps', '1', '--batches', '1'])
    bench_decode.main()
    rows = [r for r in capsys.readouterr().out.splitlines() if 'out of memory at batch 1' in r]
    assert len(rows) == 2 and 'tokens would' in rows[0] and 'do not grow' in rows[1], rows
    monkeypatch.setattr(bench_decode, 'cell', lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        bench_decode.main()


def test_a_device_this_machine_lacks_is_one_line():
    p = run('--device', 'bogus')
    assert p.returncode != 0 and 'not a device name' in p.stderr and 'Traceback' not in p.stderr, p.stderr
