"""What a replica counts of a workload request: its prompt's token ids, and how many of them
its shared leading segments (system prompt, document, earlier turns) take.

Two kinds of replica:

* ``WorkloadIds``: the workload's own ids, segment by segment, a tokenizer unlike the
  gateway's (the simulator's default). Segment lengths are exact.
* ``RenderedPrompts``: a replica that renders the chat (messages and ``tools``) and
  tokenizes it, as a real engine does and as ``loadtests.run``'s engines do. A document's
  token count then depends on its text (a 1,500-token segment takes 1,360 to 1,700), and
  the question that follows it takes more than its nominal length (its key and the chat
  template's tokens). Its shared length is where the prompt's ids leave those of the same
  chat rendered with its shared segments alone: the boundary token that the text after the
  document merges with is not shared.
"""

from __future__ import annotations

import functools
import random
from array import array
from collections.abc import Sequence
from typing import Protocol

from kvwire.tokenizer import PromptTokenizer
from loadtests.workloads import TEXT_TOKENS_PER_WORD, Segment, WorkloadRequest


@functools.cache
def replica_tokens_per_word(tokenizer_path: str | None) -> float:
    """Tokens per word of the workload's text as the replicas count them: measured on
    ``tokenizer_path``, or the gateway's own rate when the replicas share its tokenizer.
    Text drawn at this rate (``SegmentContent(seed, rate)``) gives each segment about its
    nominal length in the replicas' tokens, as ``loadtests.run``'s clients draw it."""
    if tokenizer_path is None:
        return TEXT_TOKENS_PER_WORD
    from kvwire.tokenizer import load_tokenizer
    from kvwire.tokenizer_build import sample_text

    text = sample_text(random.Random(11), 4000)
    return len(load_tokenizer(tokenizer_path).encode(text)) / len(text.split())


class ReplicaPrompts(Protocol):
    def ids(self, req: WorkloadRequest) -> list[int]:
        """The prompt's token ids, as the replica computes them."""
        ...

    def prompt_len(self, req: WorkloadRequest) -> int:
        """``len(ids(req))``."""
        ...

    def shared_len(self, req: WorkloadRequest) -> int:
        """How many of ``ids(req)`` lead the shared segments (the same for every request
        with the same shared segments)."""
        ...


class WorkloadIds:
    """The workload's own ids (``WorkloadRequest.token_ids``)."""

    def ids(self, req: WorkloadRequest) -> list[int]:
        return req.token_ids()

    def prompt_len(self, req: WorkloadRequest) -> int:
        return req.prompt_tokens

    def shared_len(self, req: WorkloadRequest) -> int:
        return sum(seg.length for seg in req.shared_segments())


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class RenderedPrompts:
    """A replica with ``tokenizer`` that renders each request's chat and tokenizes it.

    Each request is encoded once: its ids are kept by its index as 4 bytes a token (the
    oracles read every prompt, then each policy's run again; 3,900 prompts of ~1,600 tokens
    keep 25 MB), the shared length by its shared segments' keys."""

    def __init__(self, tokenizer: PromptTokenizer) -> None:
        self.tokenizer = tokenizer
        self._ids: dict[int, array[int]] = {}
        self._shared: dict[tuple[str, ...], int] = {}

    def _encode(self, req: WorkloadRequest, segments: Sequence[Segment]) -> list[int]:
        tok, content = self.tokenizer, req.content
        return tok.encode(tok.render_chat(content.messages(segments),
                                          tools=content.tools(segments)))

    def _kept(self, req: WorkloadRequest) -> array[int]:
        got = self._ids.get(req.index)
        if got is None:
            got = self._ids[req.index] = array("I", self._encode(req, req.segments))
        return got

    def ids(self, req: WorkloadRequest) -> list[int]:
        return self._kept(req).tolist()

    def prompt_len(self, req: WorkloadRequest) -> int:
        return len(self._kept(req))

    def shared_len(self, req: WorkloadRequest) -> int:
        segments = req.shared_segments()
        if not segments:
            return 0
        key = tuple(seg.key for seg in segments)
        got = self._shared.get(key)
        if got is None:
            alone = self._encode(req, segments)
            got = self._shared[key] = _common_prefix(self._kept(req), alone)
        return got
