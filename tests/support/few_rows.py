"""An executor of fewer embedding rows than the tokenizer has ids: a model whose
vocabulary a text can encode past (a tokenizer with more ids than the checkpoint's
embedding rows)."""

from __future__ import annotations

from typing import Any

from engine.executor import Executor

ROWS = 200  # the model's embedding rows: "hello" encodes to [263, 1357]


class FewRows:
    """``inner`` (the sim executor), as a model of ``ROWS`` embedding rows."""

    vocab_size = ROWS

    def __init__(self, inner: Executor) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
