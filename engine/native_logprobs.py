"""Log probabilities on SGLang's native ``/generate`` (:mod:`engine.native_schema`):
what a request asks for, and the ``meta_info`` fields that answer it.

Asked with ``return_logprob`` (per prompt in a batch), an answer's ``meta_info`` carries,
as SGLang's tokenizer manager builds them::

    "input_token_logprobs":  []   (prompt positions: never computed here)
    "output_token_logprobs": [[logprob, token_id, text or null], ...]   one per output id
    "input_top_logprobs":    []                          } only when top_logprobs_num > 0
    "output_top_logprobs":   [[[logprob, id, text], ...top_logprobs_num], ...]  }

``text`` is the token's own text (special tokens kept) when ``return_text_in_logprobs``.
``top_logprobs_num`` is at most :data:`~engine.openai_logprobs.MAX_LOGPROBS` (20), as
the OpenAI routes' ``logprobs`` are: SGLang sets no bound, and a token's alternatives
over the whole vocabulary are a list that long per output token, in memory and in every
streamed event.
A stream's every event carries the whole lists so far, as its text (SGLang's default,
not its incremental mode). The values are the executor's: the torch executor's are the
model's log-probabilities of the distribution it sampled from (after temperature, before
top-k/top-p); the sim executor's are a documented stand-in (``engine.sim_executor``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.openai_logprobs import MAX_LOGPROBS
from engine.request import TokenLogprob
from engine.text_stream import Decoder
from kvwire.openai_schema import BadRequest, optional


@dataclass(frozen=True, slots=True)
class LogprobAsk:
    """What ``return_logprob`` asks for one prompt: ``start_len`` (``logprob_start_len``,
    -1: output tokens only), ``top`` alternatives per token (``top_logprobs_num``), and
    each token's text beside its id (``return_text_in_logprobs``)."""

    start_len: int
    top: int
    with_text: bool


def check_logprob_start(ask: LogprobAsk | None, num_prompt: int) -> None:
    """Refuse a ``logprob_start_len`` that asks for prompt positions (this engine
    computes log probabilities of output tokens only) or lies past the prompt (SGLang
    refuses that too); -1 or the prompt's length ask for none."""
    if ask is None or ask.start_len in (-1, num_prompt):
        return
    if ask.start_len > num_prompt:
        raise BadRequest(f"'logprob_start_len' ({ask.start_len}) is higher than the number "
                         f"of input tokens ({num_prompt})", param="logprob_start_len")
    raise BadRequest(f"'logprob_start_len' {ask.start_len} asks for the log probabilities "
                     f"of prompt tokens, which this engine does not compute; use -1 (or "
                     f"{num_prompt}, the prompt's length) for output tokens only",
                     param="logprob_start_len")


def logprob_asks(body: dict[str, Any], n: int, batch: bool, vocab_size: int
                 ) -> list[LogprobAsk | None]:
    """Each prompt's ``return_logprob`` ask (None where false); ``logprob_start_len`` and
    ``top_logprobs_num`` are read only where it is true, as SGLang does."""
    wanted = _per_prompt(body, "return_logprob", n, batch, bool, False)
    if not any(wanted):
        return [None] * n
    starts = _per_prompt(body, "logprob_start_len", n, batch, int, -1)
    tops = _per_prompt(body, "top_logprobs_num", n, batch, int, 0)
    with_text = bool(optional(body, "return_text_in_logprobs", bool, False))
    for start, top in zip(starts, tops, strict=True):
        if start < -1:
            raise BadRequest(f"'logprob_start_len' must be -1 or at least 0, got {start}",
                             param="logprob_start_len")
        if not 0 <= top <= min(MAX_LOGPROBS, vocab_size):
            raise BadRequest(f"'top_logprobs_num' must be in [0, "
                             f"{min(MAX_LOGPROBS, vocab_size)}], got {top}",
                             param="top_logprobs_num")
    return [LogprobAsk(start, top, with_text) if want else None
            for want, start, top in zip(wanted, starts, tops, strict=True)]


def _per_prompt(body: dict[str, Any], name: str, n: int, batch: bool, kind: type,
                default: Any) -> list[Any]:
    """``name``'s value for each of ``n`` prompts: one value for all, or (a batch) a list
    of one per prompt; null is ``default``."""
    value = body.get(name)
    values = value if batch and isinstance(value, list) else [value] * n
    if len(values) != n:
        raise BadRequest(f"'{name}' has {len(values)} entries for {n} prompts", param=name)
    out = []
    for v in values:
        if v is None:
            v = default
        elif type(v) is not kind:
            shape = f"a {kind.__name__}" + (f" or a list of {n}, one per prompt" if batch
                                            else "")
            raise BadRequest(f"'{name}' must be {shape}, got {value!r:.40}", param=name)
        out.append(v)
    return out


class LogprobFields:
    """The log-probability fields of one answer, built up as its tokens arrive (each
    token rendered once, however many events carry it)."""

    def __init__(self, ask: LogprobAsk, decoder: Decoder) -> None:
        self.ask = ask
        self._decoder = decoder
        self.output: list[tuple[float, int, str | None]] = []
        self.top: list[list[tuple[float, int, str | None]] | None] = []

    def extend(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob]) -> None:
        """Render the entries of ``logprobs`` not rendered yet; ``token_ids[i]`` is the
        token ``logprobs[i]`` belongs to."""
        for i in range(len(self.output), min(len(token_ids), len(logprobs))):
            lp = logprobs[i]
            self.output.append(self._entry(lp.logprob, token_ids[i]))
            if self.ask.top:
                self.top.append([self._entry(v, t) for t, v in lp.top] or None)

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"input_token_logprobs": [],
                               "output_token_logprobs": self.output}
        if self.ask.top:
            out["input_top_logprobs"] = []
            out["output_top_logprobs"] = self.top
        return out

    def _entry(self, logprob: float, token: int) -> tuple[float, int, str | None]:
        return logprob, token, (self._decoder.decode([token]) if self.ask.with_text
                                else None)
