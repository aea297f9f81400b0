"""Triton kernels run on CPU only through the interpreter, which must be chosen before
triton is first imported; this conftest loads before any test module."""

import os

os.environ["TRITON_INTERPRET"] = "1"
