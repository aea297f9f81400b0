"""Triton kernels run on CPU only through the interpreter, which must be chosen before
triton is first imported; this conftest loads before any test module of this folder."""

import os
import sys

if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError(
        "triton was imported before tests/engine_torch/conftest.py could set "
        "TRITON_INTERPRET=1 (a module collected earlier imports triton or transformers); "
        "set it in tests/conftest.py or export TRITON_INTERPRET=1")
os.environ["TRITON_INTERPRET"] = "1"
