"""Log probabilities on the OpenAI routes, in vLLM's shapes: what a body asks for, and the
``choices[i].logprobs`` object that answers it.

A completion asks with ``logprobs: k`` and is answered::

    {"tokens": [text, ...], "token_logprobs": [logprob, ...],
     "top_logprobs": [{text: logprob, ...}, ...], "text_offset": [offset, ...]}

A chat asks with ``logprobs: true`` and ``top_logprobs: k`` and is answered::

    {"content": [{"token", "logprob", "bytes": [utf-8 bytes],
                  "top_logprobs": [{"token", "logprob", "bytes"}, ...k]}, ...]}

``k`` is at most :data:`MAX_LOGPROBS` (vLLM's default ``max_logprobs``). As vLLM ranks
them, a position's candidates are the sampled token first, then the ``k`` most likely
(the sampled one not repeated): a completion lists the first ``k + 1`` of them (so
``logprobs: 0`` gives the sampled token's alone), a chat the first ``k``. Every output
token has its entry, as vLLM's ``output.token_ids`` do: the end-of-sequence or stop token,
and tokens whose text a stop string cut, too. A token's text is its own decoding with
special tokens kept; values below -9999 (``-inf``) are reported as -9999, as vLLM does.
A completion's ``text_offset`` counts the tokens' texts from where its answer (a stream:
its chunk's text) starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.request import TokenLogprob
from engine.text_stream import Decoder
from kvwire.openai_schema import BadRequest

MAX_LOGPROBS = 20  # vLLM's --max-logprobs default
_FLOOR = -9999.0  # vLLM's stand-in for -inf in JSON


def logprobs_asked(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives per output token a body asks for (None: no log
    probabilities): a completion's ``logprobs``, a chat's ``top_logprobs`` (0 unless
    given) where its ``logprobs`` is true. BadRequest naming the field otherwise."""
    if chat:
        want, top = body.get("logprobs"), body.get("top_logprobs")
        if want is not None and type(want) is not bool:
            raise BadRequest(f"'logprobs' must be a boolean, got {want!r:.40}",
                             param="logprobs")
        if top is not None and type(top) is not int:
            raise BadRequest(f"'top_logprobs' must be an integer, got {top!r:.40}",
                             param="top_logprobs")
        if top and not want:
            raise BadRequest("when using 'top_logprobs', 'logprobs' must be set to true",
                             param="top_logprobs")
        return _bounded(top or 0, "top_logprobs") if want else None
    k = body.get("logprobs")
    if k is None:
        return None
    if type(k) is not int:
        raise BadRequest(f"'logprobs' must be an integer, got {k!r:.40}", param="logprobs")
    return _bounded(k, "logprobs")


def _bounded(k: int, name: str) -> int:
    if not 0 <= k <= MAX_LOGPROBS:
        raise BadRequest(f"'{name}' must be in [0, {MAX_LOGPROBS}], got {k}", param=name)
    return k


def _candidates(token: int, lp: TokenLogprob) -> list[tuple[int, float]]:
    """(token id, logprob) as vLLM orders a position's: the sampled token, then the most
    likely ones without it."""
    return [(token, lp.logprob), *((t, v) for t, v in lp.top if t != token)]


class LogprobRenderer:
    """Renders output tokens' log probabilities for one answer, ``k`` alternatives each;
    each token's text is decoded once."""

    def __init__(self, k: int, decoder: Decoder) -> None:
        self.k = k
        self._decoder = decoder
        self._texts: dict[int, str] = {}

    def _text(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self._decoder.decode([token])
        return text

    def completion(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob],
                   offset: int = 0) -> dict[str, Any]:
        """A completion's ``logprobs`` object for ``token_ids`` (``logprobs[i]`` is
        ``token_ids[i]``'s); ``offset``: where the first token's text starts."""
        tokens, values, tops, offsets = [], [], [], []
        for token, lp in zip(token_ids, logprobs, strict=True):
            text = self._text(token)
            tokens.append(text)
            values.append(max(lp.logprob, _FLOOR))
            tops.append({self._text(t): max(v, _FLOOR)
                         for t, v in _candidates(token, lp)[: self.k + 1]})
            offsets.append(offset)
            offset += len(text)
        return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens,
                "top_logprobs": tops}

    def chat(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob]
             ) -> dict[str, Any]:
        """A chat's ``logprobs`` object for ``token_ids``."""
        content = []
        for token, lp in zip(token_ids, logprobs, strict=True):
            entry = self._chat_entry(token, lp.logprob)
            entry["top_logprobs"] = [self._chat_entry(t, v)
                                     for t, v in _candidates(token, lp)[: self.k]]
            content.append(entry)
        return {"content": content}

    def _chat_entry(self, token: int, logprob: float) -> dict[str, Any]:
        text = self._text(token)
        return {"token": text, "logprob": max(logprob, _FLOOR),
                "bytes": list(text.encode("utf-8", errors="replace"))}
