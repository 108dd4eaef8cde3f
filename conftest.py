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

ROOT = os.path.dirname(os.path.abspath(__file__))

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


@pytest.fixture
def torchrun_train(tmp_path):
    """[python, -m, torch.distributed.run, --standalone, --nproc_per_node=2, <driver>]: append train.py's arguments.
    The driver runs train.py and writes each rank's final weights to out_dir/rank0.pt, rank1.pt."""
    driver = tmp_path / 'ddp_train.py'
    driver.write_text(DDP_DRIVER.format(train=os.path.join(ROOT, 'train.py')))
    return [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', str(driver)]
