"""
pytest setup for every test file (pytest imports this before any test module).

Without CUDA, the Triton kernels of kernels.py run through Triton's interpreter (test_kernels.py tests them on CPU
at small shapes). TRITON_INTERPRET must be set before triton is imported, and test modules import kernels.py,
which imports triton; hence here. With CUDA nothing changes: the kernels compile for the GPU.

The fixture torchrun_train gives the command that trains under torchrun (test_train.py, test_tasks.py).
"""
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest -n N (pytest-xdist, as CI runs): N worker processes share the cores, and torch's default of one thread per
# core in each gave N threads per core, whose OpenMP threads wait for descheduled siblings: on 2 cores under -n 2 an
# in-process training test took 220 s instead of 12 (test_tasks.py::test_tiny_softmax_model_learns_tiny_mqar). Each
# worker gets its share of the cores, and so does every process it starts that does not set OMP_NUM_THREADS itself
# (the training subprocesses of the tests set 1). A caller's OMP_NUM_THREADS wins.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cores // _WORKERS))
    torch.set_num_threads(max(1, _cores // _WORKERS))

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, 'tools'))  # the tests import the tools (bench, plot, grid, longctx) by name

# Runs train.py, then saves this rank's weights (under FSDP its shards) to out_dir/rank<RANK>.pt so that a test can check that DDP kept the
# replicas identical, then leaves without the interpreter's teardown: during it a C++ thread of gloo (CPU) aborted a
# rank now and then with "terminate called without an active exception" (a minimal DDP script: 3 of 40 runs; with
# os._exit: 0 of 45), which failed the DDP tests at random although the run had finished.
DDP_DRIVER = """\
import os, runpy, sys
import torch
train = {train!r}
sys.argv[0] = train
sys.path.insert(0, os.path.dirname(train))
g = runpy.run_path(train, run_name='__main__')
state = {{k: (v.to_local() if hasattr(v, 'to_local') else v) for k, v in g['raw_model'].state_dict().items()}}  # FSDP: the shard
torch.save(state, os.path.join(g['out_dir'], f"rank{{os.environ['RANK']}}.pt"))
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


@pytest.fixture(autouse=True)
def _same_random_inputs():
    """Every test starts from one RNG state, whichever tests ran before it in its worker (pytest -n 2 deals them out
    differently from run to run): a test's unseeded random inputs are the same on every run, so it passes or fails
    the same way every time."""
    import random
    import numpy as np
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def torchrun_train(tmp_path):
    """[python, -m, torch.distributed.run, --standalone, --nproc_per_node=2, <driver>]: append train.py's arguments.
    The driver runs train.py and writes each rank's final weights to out_dir/rank0.pt, rank1.pt."""
    driver = tmp_path / 'ddp_train.py'
    driver.write_text(DDP_DRIVER.format(train=os.path.join(ROOT, 'train.py')))
    return [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', str(driver)]


@pytest.fixture(scope='session')
def pystdlib():
    """The offline dataset's shards (data/pystdlib), prepared once if missing: the tests that run train.py on text."""
    if not os.path.exists(os.path.join(ROOT, 'data', 'pystdlib', 'pystdlib_val_000000.bin')):
        import subprocess
        subprocess.run([sys.executable, 'data/pystdlib/prepare.py'], cwd=ROOT, check=True, timeout=600)
