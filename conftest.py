"""
pytest setup for every test file (pytest imports this before any test module).

Without CUDA, the Triton kernels of kernels.py run through Triton's interpreter (test_kernels.py tests them on CPU
at small shapes). TRITON_INTERPRET must be set before triton is imported, and test modules import kernels.py,
which imports triton; hence here. With CUDA nothing changes: the kernels compile for the GPU.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
