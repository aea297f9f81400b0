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

``prompt_logprobs: k`` (vLLM's extension, chats too) is answered, beside the above, with
one entry per prompt token: null for the first, then a dict keyed by token id (a string
in JSON) of ``{"logprob", "rank", "decoded_token"}``: the prompt token first, then the
``k`` most likely not repeating it. A completion's ``echo`` starts its ``logprobs`` with
the prompt's tokens (the first one's ``token_logprobs`` and ``top_logprobs`` null), their
alternatives those ``logprobs: k`` asks, so ``prompt_logprobs`` is ``logprobs`` unless
given. As vLLM: ``k`` is at most :data:`MAX_LOGPROBS` (-1, the whole vocabulary, is more),
and a stream takes none above 0.

``return_tokens_as_token_ids`` names each token ``"token_id:<id>"`` instead of its text (in
``tokens`` and ``top_logprobs`` keys, and a chat's ``token`` fields), so that a client
reads the ids whatever their text. As vLLM: a chat entry's own ``bytes`` stay its text's,
its ``top_logprobs`` entries' are their names', and ``text_offset`` advances by the
length of each name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.request import TokenLogprob
from engine.text_stream import Decoder
from kvwire.openai_schema import BadRequest, optional

MAX_LOGPROBS = 20  # vLLM's --max-logprobs default
_FLOOR = -9999.0  # vLLM's stand-in for -inf in JSON


def logprobs_asked(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives per output token a body asks for (None: no log
    probabilities): a completion's ``logprobs``, a chat's ``top_logprobs`` (0 unless
    given) where its ``logprobs`` is true; each read as the other fields are
    (``optional``: vLLM's lax ``"true"`` or ``1``, ``"3"`` or ``3.0``). BadRequest naming
    the field and its value otherwise."""
    if chat:
        want = optional(body, "logprobs", bool, False)
        top = optional(body, "top_logprobs", int, None)
        if top and not want:
            raise BadRequest("when using 'top_logprobs', 'logprobs' must be set to true",
                             param="top_logprobs")
        return _bounded(top or 0, "top_logprobs") if want else None
    k = optional(body, "logprobs", int, None)
    return None if k is None else _bounded(k, "logprobs")


def prompt_logprobs_asked(body: dict[str, Any], stream: bool, vocab_size: int) -> int | None:
    """How many alternatives per prompt token a body's ``prompt_logprobs`` asks for (None:
    none; -1: the whole vocabulary), as vLLM bounds it; BadRequest naming the field
    otherwise."""
    k = optional(body, "prompt_logprobs", int, None)
    if k is None:
        return None
    if stream and (k > 0 or k == -1):
        raise BadRequest("'prompt_logprobs' are not available when 'stream' is true",
                         param="prompt_logprobs")
    if k < 0 and k != -1:
        raise BadRequest(f"'prompt_logprobs' must be >= 0, or -1 for the whole vocabulary, "
                         f"got {k}", param="prompt_logprobs")
    asked = vocab_size if k == -1 else k
    if asked > MAX_LOGPROBS:
        raise BadRequest(f"'prompt_logprobs' asks for {asked} alternatives per token, more "
                         f"than the most allowed, {MAX_LOGPROBS}", param="prompt_logprobs")
    return asked


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
    each token's text is decoded once. ``as_token_ids``: tokens named by their ids."""

    def __init__(self, k: int, decoder: Decoder, as_token_ids: bool = False) -> None:
        self.k = k
        self._decoder = decoder
        self._as_token_ids = as_token_ids
        self._texts: dict[int, str] = {}

    def _text(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self._decoder.decode([token])
        return text

    def _name(self, token: int) -> str:
        """How the answer names ``token``: its text, or ``token_id:<id>``."""
        return f"token_id:{token}" if self._as_token_ids else self._text(token)

    def completion(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob | None],
                   offset: int = 0) -> dict[str, Any]:
        """A completion's ``logprobs`` object for ``token_ids`` (``logprobs[i]`` is
        ``token_ids[i]``'s; None for an echoed prompt's first token, which has none);
        ``offset``: where the first token's text starts."""
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for token, lp in zip(token_ids, logprobs, strict=True):
            name = self._name(token)
            tokens.append(name)
            values.append(None if lp is None else max(lp.logprob, _FLOOR))
            tops.append(None if lp is None else {
                self._name(t): max(v, _FLOOR) for t, v in _candidates(token, lp)[: self.k + 1]})
            offsets.append(offset)
            offset += len(name)
        return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens,
                "top_logprobs": tops}

    def chat(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob]
             ) -> dict[str, Any]:
        """A chat's ``logprobs`` object for ``token_ids``."""
        content = []
        for token, lp in zip(token_ids, logprobs, strict=True):
            entry = self._chat_entry(token, lp.logprob, self._text(token))
            entry["top_logprobs"] = [self._chat_entry(t, v, self._name(t))
                                     for t, v in _candidates(token, lp)[: self.k]]
            content.append(entry)
        return {"content": content}

    def _chat_entry(self, token: int, logprob: float, spelt: str) -> dict[str, Any]:
        """An entry naming ``token``, its ``bytes`` those of ``spelt``."""
        return {"token": self._name(token), "logprob": max(logprob, _FLOOR),
                "bytes": list(spelt.encode("utf-8", errors="replace"))}


def render_prompt_logprobs(prompt_ids: Sequence[int], entries: Sequence[TokenLogprob],
                           decoder: Decoder) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs`` list for a prompt: None for its first token, then for each
    later token (``entries[i]`` is ``prompt_ids[i + 1]``'s) a dict keyed by token id of its
    ``logprob`` (-inf as -9999), ``rank`` and ``decoded_token`` (special tokens kept): the
    token first, then its alternatives ranked 1, 2, ... without it."""
    texts: dict[int, str] = {}

    def text(token: int) -> str:
        if token not in texts:
            texts[token] = decoder.decode([token])
        return texts[token]

    out: list[dict[str, Any] | None] = [None]
    for token, lp in zip(prompt_ids[1:], entries, strict=True):
        ranked = [(token, lp.logprob, lp.rank), *((t, v, r) for r, (t, v)
                                                  in enumerate(lp.top, 1) if t != token)]
        out.append({str(t): {"logprob": max(v, _FLOOR), "rank": r,
                             "decoded_token": text(t)} for t, v, r in ranked})
    return out
