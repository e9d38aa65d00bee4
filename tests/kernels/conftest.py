"""Kernel tests run Triton kernels on the CPU through Triton's interpreter when no GPU is present.

The interpreter is chosen when triton's ``jit`` decorator runs, so the variable is set here, before
any test module imports :mod:`quartet.kernels`.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(1)
