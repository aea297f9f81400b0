"""Prompt to token ids, identical in the gateway and in the engine.

``load_tokenizer(path)`` takes a directory holding ``tokenizer.json`` (and optionally a chat
template: ``chat_template.jinja``, a processor's ``chat_template.json``, or
``tokenizer_config.json``'s ``chat_template``) or the
file itself; ``None`` loads the
project's own BPE tokenizer (``kvwire/tokenizer_build.py``). Chat messages are rendered with
the model's chat template when there is one, else with a fixed ChatML layout, so the gateway
and every replica see the same token stream for the same messages.

``encode_prefix`` tokenizes only as far as a caller needs: the text is cut at a whitespace
boundary, where byte-level pre-tokenization gives exactly a prefix of the full encoding, and
the cut is widened until it yields enough tokens or covers the whole text.

``encode_within`` and ``encode_tail`` bound what a text far longer than a model's context
costs: the first proves a text encodes to more than a limit from a bounded read (or from its
length alone), the second reads a text's last tokens from its end.
"""

from __future__ import annotations

import functools
import json
import re
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from kvwire.bounded_memo import BoundedMemo
from kvwire.chat_messages import PARTS, ChatFormatError, normalize_messages
from kvwire.chat_template import (
    ChatTemplate,
    RenderTooLong,
    compile_template,
    render,
    template_messages,
    template_tools,
)
from kvwire.media_parts import shown
from kvwire.template_kwargs import template_variables
from kvwire.tokenizer_build import ASSET_DIR, EOS_TOKEN
from kvwire.whole_encoding import WholeEncodings, space_cut

DEFAULT_CHARS_PER_TOKEN = 4.0
_READ_MARGIN = 1.1  # characters read for a prefix over what it is expected to take
_SEEN_ALPHA = 0.5  # weight of the latest prompt in the characters per token seen


# a remembered prefix encoding: (first tokens, tokens in text[:cut], cut,
# text[budget:cut + 1])
_Memo = tuple["array[int]", int, int, str]


# ``encode_within`` encodes a text whole when its UTF-8 bytes are at most this many per token
# of the limit (a token takes a byte at least, so its encoding holds about that many tokens
# per token of the limit at most: typical text, 2 to 5 bytes a token, is encoded once); else
# it reads pieces of at most _PIECE_CHARS_PER_TOKEN characters per token of the limit
_WHOLE_BYTES_PER_TOKEN = 6
_PIECE_CHARS_PER_TOKEN = 3
_MIN_READ_CHARS = 4096
# a cut: a space right after a character that is not whitespace (``space_cut``'s positions)
_CUT = re.compile(r"(?<=\S) ")
# normalizers that never drop characters, and the most input characters one of their
# output characters stands for (Unicode composition joins at most 4 code points into one)
_NORMALIZER_SHRINK = {"NFD": 1, "NFKD": 1, "Lowercase": 1, "Prepend": 1, "ByteLevel": 1,
                      "NFC": 4, "NFKC": 4}


@dataclass(frozen=True, slots=True)
class BoundedEncoding:
    """``encode_within``'s answer: ``ids``, the text's whole encoding (``at_least`` its
    length), or None when the text was proven to encode to more than the limit asked
    without being encoded whole; ``at_least`` then a count its encoding reaches."""

    ids: list[int] | None
    at_least: int


@dataclass(frozen=True, slots=True)
class PrefixEncoding:
    """The first tokens of a text; ``total_estimate`` is exact when ``complete``."""

    ids: Sequence[int]
    complete: bool
    total_estimate: int


class PromptTokenizer:
    """A thread-safe wrapper of an HF ``tokenizers.Tokenizer`` plus chat rendering."""

    def __init__(self, tokenizer: Any, chat_template: str | Mapping[str, str] | None = None,
                 special: Mapping[str, str] | None = None, source: str = "",
                 memo_size: int = 0) -> None:
        self._tok = tokenizer
        self._fast = getattr(tokenizer, "encode_batch_fast", None)
        # prefix encodings remembered by the text they read (for repeated documents and
        # system prompts), token ids as compact u32 arrays; off when memo_size is 0
        self._memo: BoundedMemo[tuple[str, int, str], _Memo] | None = (
            BoundedMemo(memo_size) if memo_size > 0 else None)
        # whole prompts through remembered prefixes (``whole_encoding``), with the memo
        self.whole = WholeEncodings(self.encode, max(2, memo_size // 4)) \
            if memo_size > 0 else None
        self.source = source
        # the special tokens by name, as the template reads them (transformers gives it
        # those the tokenizer has, and no others)
        self._special = dict(special or {})
        self.eos_token: str = self._special.get("eos_token", EOS_TOKEN)
        self.bos_token: str = self._special.get("bos_token", "")
        self.eos_token_id: int | None = tokenizer.token_to_id(self.eos_token)
        self.vocab_size: int = tokenizer.get_vocab_size()
        # the model's chat templates by name, compiled as transformers compiles them (vLLM
        # renders with them): one template is the default; of several, a chat with tools is
        # rendered with the one named tool_use, where there is one, as transformers chooses
        named = {"default": chat_template} if isinstance(chat_template, str) else \
            dict(chat_template or {})
        self._templates: dict[str, ChatTemplate] = {
            name: compile_template(source) for name, source in named.items() if source}
        # the ids the tokenizer's post-processor puts around one text (a Llama's BOS before
        # it): vLLM and SGLang encode a completion's text prompt with them, and a rendered
        # chat, whose template writes its own, without
        self.text_prefix_ids, self.text_suffix_ids = _special_ends(tokenizer)
        self.chars_per_token = DEFAULT_CHARS_PER_TOKEN
        sample = "the parties agree that the term of this agreement shall be five years. " * 8
        self.chars_per_token = len(sample) / max(1, len(self.encode(sample)))
        self._seen_chars_per_token = self.chars_per_token  # learned by encode_prefix

    # -- plain text ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """The text's ids, without the offsets and alignments HF ``encode`` also builds
        (``encode_batch_fast``, where the library has it: about a fifth less CPU on a long
        prompt)."""
        if self._fast is None:
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        return list(self._fast([text], add_special_tokens=False)[0].ids)

    def prompt_ids(self, ids: Sequence[int]) -> list[int]:
        """A text prompt's ``encode`` ids as vLLM and SGLang give them to the model: inside
        the tokenizer's special tokens (``text_prefix_ids``, ``text_suffix_ids``)."""
        return [*self.text_prefix_ids, *ids, *self.text_suffix_ids]

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` of each text, in one call (the library's own threads)."""
        if self._fast is None:
            encs = self._tok.encode_batch(list(texts), add_special_tokens=False)
        else:
            encs = self._fast(list(texts), add_special_tokens=False)
        return [list(enc.ids) for enc in encs]

    def encode_with_ends(self, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """For each text, its ids and, for each id, the character offset where its text
        ends (encoded in parallel by the library's own threads)."""
        encs = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [(list(enc.ids), [end for _, end in enc.offsets]) for enc in encs]

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        """Each id's token as the vocabulary spells it (a byte-level BPE's ``Ġthe``, not
        `` the``), as transformers' ``convert_ids_to_tokens``; ValueError naming an id the
        vocabulary lacks."""
        out = []
        for i in ids:
            token = self._tok.id_to_token(i)
            if token is None:
                raise ValueError(f"token id {i} is not in the vocabulary")
            out.append(str(token))
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``; special tokens' text left out unless told otherwise."""
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def encode_prefix(self, text: str, max_tokens: int | None, group: str = ""
                      ) -> PrefixEncoding:
        """The first ``max_tokens`` tokens of ``text`` (all when ``None``). The memo is
        kept per ``group`` (a trust group, e.g. a tenant's cache salt): a remembered
        encoding is never found from another group, so its speed tells nothing."""
        if max_tokens is None:
            ids = self.encode(text) if self.whole is None else self.whole.encode(text, group)
            return PrefixEncoding(ids, True, len(ids))
        if max_tokens <= 0:
            return PrefixEncoding([], False, self.estimate_tokens(text))
        hit = self.remembered_prefix(text, max_tokens, group)
        if hit is not None:
            return hit
        first = self._first_budget(max_tokens)  # the memo's key length
        # what is read: the characters the prompts seen lately took per token, with a
        # margin (the fixed estimate is off by a fifth for some texts, either way)
        budget = int(max_tokens * self._seen_chars_per_token * _READ_MARGIN) + 16
        tries = 0
        while True:
            if budget >= len(text):
                ids = self.encode(text)
                if len(ids) >= max(64, max_tokens // 2):  # whole texts teach it too
                    self._learn(len(text), len(ids))
                return PrefixEncoding(ids[:max_tokens], True, len(ids))
            cut = space_cut(text, 0, budget)
            if cut <= 0:
                budget *= 2
                continue
            # [0, cut) ends right before a space after a non-space: its encoding is a prefix
            # of the full one.
            ids = self.encode(text[:cut])
            if len(ids) >= 64:
                self._learn(cut, len(ids))
            if len(ids) >= max_tokens:
                if self._memo is not None:
                    # remembered by the first budget's text; the rest it read is kept to
                    # check, through the space at the cut: the same text followed by another
                    # character there (a word's end) encodes its last token otherwise
                    self._memo.put((group, max_tokens, text[:first]), (
                        array("I", ids[:max_tokens]), len(ids), cut,
                        text[first:max(cut + 1, first)]))
                estimate = max(len(ids), int(len(ids) * len(text) / cut))
                return PrefixEncoding(ids[:max_tokens], False, estimate)
            # short: read on by what the missing tokens take at this text's own rate (from
            # the third try on, twice as far: a text whose spaces stop still ends)
            tries += 1
            missing = (max_tokens - len(ids)) * cut / max(1, len(ids))
            budget = max(budget + 64, int(cut + missing * 1.25) + 64) if tries < 3 \
                else budget * 2

    def _learn(self, chars: int, tokens: int) -> None:
        """One more encoding's characters per token, into the figure reads are sized by
        (threads may race here: an update lost is harmless). It moves the read length,
        and so a long prompt's extrapolated length by a few percent: never its ids."""
        self._seen_chars_per_token += _SEEN_ALPHA * (chars / tokens
                                                     - self._seen_chars_per_token)

    def _first_budget(self, max_tokens: int) -> int:
        return int(max_tokens * self.chars_per_token * 1.25) + 16

    def remembered_prefix(self, text: str, max_tokens: int, group: str = ""
                          ) -> PrefixEncoding | None:
        """``encode_prefix(text, max_tokens)`` if remembered, else None; costs
        microseconds, so callers may try it before handing the encoding to a thread."""
        if self._memo is None or max_tokens <= 0:
            return None
        budget = self._first_budget(max_tokens)
        if budget >= len(text):
            return None
        hit = self._memo.get((group, max_tokens, text[:budget]), None)
        if hit is None:
            return None
        ids, n_cut, cut, rest = hit
        if rest and not text.startswith(rest, budget):
            return None  # the same start, but the encoding read further and differs there
        return PrefixEncoding(ids, False, max(n_cut, int(n_cut * len(text) / cut)))

    def estimate_tokens(self, text: str) -> int:
        return int(len(text) / self.chars_per_token) + 1

    # -- bounded encodings -----------------------------------------------------------------
    # Both rest on the property ``encode_prefix`` and ``kvwire.whole_encoding`` rely on: at a
    # cut (a space right after a non-space), the tokenizer's pre-tokenization splits, so no
    # token spans a cut, the text before a cut encodes to a prefix of the whole encoding and
    # the text after it to the rest. A piece read alone from a cut may encode its first word
    # otherwise than the whole does (a normalizer's ``Prepend``, Metaspace's prefix marker):
    # its count is taken less that first word's own, so a count is never over-stated.

    def encode_within(self, text: str, max_tokens: int) -> BoundedEncoding:
        """``encode(text)`` unless ``text`` is proven to encode to more than ``max_tokens``
        tokens first, reading a bounded part of it: the memory a text far past a model's
        context costs stays about a few times the limit's, not the text's.

        Proven by its length alone when every token covers at most ``max_token_chars``
        characters (more than ``max_tokens`` times that many characters cannot fit), else
        by encoding it in pieces of at most ``3 x max_tokens`` characters from cut to cut,
        summing a lower bound of each piece's tokens, until the sum passes ``max_tokens``.
        A stretch with no cut in the reach of a piece is not encoded: it counts its
        characters over ``max_token_chars`` and, for a byte-level model, its runs of
        non-ASCII bytes over its longest token of those (``WideTokens``). A text that may
        fit is encoded whole, so its ids are exact: one without spaces (ASCII) shorter than
        ``max_tokens x max_token_chars`` characters is, at up to a token a character; one
        whose tokenizer has no ``max_token_chars`` and that is not proven by its pieces,
        whatever its length."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if self._encodes_whole(text, max_tokens):
            ids = self.encode(text)
            return BoundedEncoding(ids, len(ids))
        longest = self.max_token_chars
        if longest is not None and len(text) > max_tokens * longest:
            return BoundedEncoding(None, -(-len(text) // longest))
        counted = self._count_from_start(text, max_tokens, longest)
        if counted > max_tokens:
            return BoundedEncoding(None, counted)
        ids = self.encode(text)
        return BoundedEncoding(ids, len(ids))

    def encode_many_within(self, texts: Sequence[str], max_tokens: int
                           ) -> list[BoundedEncoding]:
        """``encode_within`` of each text: those short enough to encode whole in one call
        (the library's own threads), the others one by one."""
        short = [i for i, t in enumerate(texts) if self._encodes_whole(t, max_tokens)]
        out: list[BoundedEncoding | None] = [None] * len(texts)
        for i, ids in zip(short, self.encode_many([texts[i] for i in short]), strict=True):
            out[i] = BoundedEncoding(ids, len(ids))
        return [self.encode_within(t, max_tokens) if got is None else got
                for t, got in zip(texts, out, strict=True)]

    def encode_tail(self, text: str, keep: int) -> list[int]:
        """``encode(text)[-keep:]``, read from the text's end: the text from a cut, twice
        as long each try, until it holds ``keep`` tokens after its first word (those are
        the whole encoding's, see above); the whole text when no such cut is found."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if self._encodes_whole(text, keep):
            return self.encode(text)[-keep:]
        read = _PIECE_CHARS_PER_TOKEN * (keep + 1) + _MIN_READ_CHARS
        while read < len(text):
            cut = _next_cut(text, len(text) - read, len(text))
            if cut > 0:
                ids = self.encode(text[cut:])
                word = _next_cut(text, cut + 1, len(text))
                first = len(self.encode(text[cut:word])) if word > 0 else len(ids)
                if len(ids) - first >= keep:
                    return ids[-keep:]
            read *= 2
        return self.encode(text)[-keep:]

    @functools.cached_property
    def max_token_chars(self) -> int | None:
        """The most characters of a text one token can stand for (its longest vocabulary
        entry or added token, times what its normalizer may join into one character); None
        where that has no bound: a model with an unknown token that may cover any run
        (WordPiece, Unigram, or BPE that is neither byte-level nor falls back to bytes) or
        a normalizer that may drop characters (Bert's, NMT's, Strip, a regex Replace)."""
        return _max_token_chars(self._tok)

    @functools.cached_property
    def _wide_tokens(self) -> WideTokens | None:
        """How few tokens a run of non-ASCII text takes at least (byte-level models)."""
        return WideTokens.of(self._tok)

    def _encodes_whole(self, text: str, max_tokens: int) -> bool:
        """Whether ``text`` is short enough to encode whole whatever it holds: at most
        ``_WHOLE_BYTES_PER_TOKEN`` UTF-8 bytes per token of the limit."""
        cap = _WHOLE_BYTES_PER_TOKEN * (max_tokens + 1) + _MIN_READ_CHARS
        if len(text) > cap:
            return False
        if text.isascii() or 4 * len(text) <= cap:
            return True
        return len(text.encode("utf-8", "surrogatepass")) <= cap

    def _count_from_start(self, text: str, max_tokens: int, longest: int | None) -> int:
        """A count of tokens ``text`` encodes to at least, read from its start in pieces
        from cut to cut until it passes ``max_tokens`` or the text ends (see
        ``encode_within``)."""
        piece = _PIECE_CHARS_PER_TOKEN * (max_tokens + 1) + _MIN_READ_CHARS
        counted = start = 0
        while start < len(text) and counted <= max_tokens:
            # [start, end): a cut (or the text's start) to the first cut past half a piece
            # (or the text's end); no token of the whole spans either
            end = _next_cut(text, start + piece // 2, len(text))
            end = len(text) if end < 0 else end
            least = -(-(end - start) // longest) if longest is not None else 0
            if end - start > piece and self._wide_tokens is not None:
                least = max(least, self._wide_tokens.at_least(text, start, end))
            if end - start <= piece:
                n = len(self.encode(text[start:end]))
                if start > 0:  # less its first word, which alone may encode otherwise
                    word = _next_cut(text, start + 1, end)
                    n -= len(self.encode(text[start:word])) if word > 0 else n
                least = max(least, n)
            counted += least
            start = end
        return counted

    # -- chat -----------------------------------------------------------------------------
    def render_chat(self, messages: Sequence[Any], add_generation_prompt: bool = True,
                    tools: Sequence[Any] | None = None, continue_final_message: bool = False,
                    template_kwargs: Mapping[str, Any] | None = None) -> str:
        """Render OpenAI chat messages (and the request's ``tools``) to the prompt text the
        model sees. Without a chat template, tools go into the system message as one JSON
        object per line inside ``<tools>`` tags, the layout Qwen2 and Hermes templates use.

        ``continue_final_message`` (with ``add_generation_prompt`` false; ChatFormatError
        with both): the text ends right after the final message's content, without its
        end of turn, so the model continues that message. A template renders the messages
        with a tag after that content and the text is cut at the tag, as transformers'
        ``apply_chat_template`` (which vLLM calls) does; a template that trims the content
        loses the tag's space too, and then the text is cut before the trimmed spacing.

        ``template_kwargs``: the request's ``chat_template_kwargs``, checked
        (``kvwire.template_kwargs``), given to the template as vLLM gives them: those it
        reads, over the tokenizer's special tokens (each one the config names, no other)
        and ``documents`` (null unless given); the built-in layout reads none."""
        if add_generation_prompt and continue_final_message:
            raise ChatFormatError("'add_generation_prompt' and 'continue_final_message' "
                                  "cannot both be true")
        normalized = normalize_messages(messages)
        chosen = self._chosen_template(tools)
        if chosen is not None:
            if continue_final_message:
                final = normalized[-1]
                normalized[-1] = {**final, "content": final["content"] + _CONTINUE_TAG}
                parts = final.get(PARTS)
                if isinstance(parts, tuple):  # the tag after the last part's text
                    normalized[-1][PARTS] = (*parts[:-1], parts[-1] + _CONTINUE_TAG) \
                        if parts else (_CONTINUE_TAG,)
            given = template_messages(normalized, chosen.content_parts)
            variables = template_variables(template_kwargs, chosen.variables)
            try:
                text = render(chosen.template, {
                    **self._special, "documents": None, **variables,
                    "messages": given, "add_generation_prompt": add_generation_prompt,
                    "tools": template_tools(tools),
                })
            except RecursionError:  # a value nested past what tojson writes (vLLM answers
                # that with a 400 too): named by the field that holds the deepest one
                field = _deepest(tools, given, variables)
                raise ChatFormatError(f"'{field}' is nested too deeply for the model's chat "
                                      f"template to render", param=field) from None
            except RenderTooLong as exc:  # most likely a deep value, indented: named so
                field = _deepest(tools, given, variables)
                raise ChatFormatError(f"{exc} ('{field}' holds the most deeply nested "
                                      f"value)", param=field) from None
            except (TemplateError, TypeError, ValueError, LookupError,
                    AttributeError) as exc:  # the template refuses these messages (a system
                # role it does not take, roles out of turn)
                raise ChatFormatError(f"the model's chat template refused the messages: "
                                      f"{exc}") from None
            return _cut_at_tag(text) if continue_final_message else text
        if tools:
            try:
                listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
            except RecursionError:  # JSON allows 1,024 levels; json.dumps about 1,000
                raise ChatFormatError("'tools' is nested too deeply to render",
                                      param="tools") from None
            block = f"# Tools\n\n<tools>\n{listed}\n</tools>"
            if normalized[0]["role"] == "system":
                first = normalized[0]
                normalized[0] = {"role": "system", "content": f"{first['content']}\n\n{block}"}
            else:
                normalized.insert(0, {"role": "system", "content": block})
        parts = [f"<|im_start|>{m['role']}\n{m['content']}{_calls(m)}<|im_end|>\n"
                 for m in normalized]
        if continue_final_message:  # the final turn open after its content
            final = normalized[-1]
            parts[-1] = f"<|im_start|>{final['role']}\n{final['content']}"
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)

    def _chosen_template(self, tools: Sequence[Any] | None) -> ChatTemplate | None:
        """The template a chat is rendered with, as transformers' ``get_chat_template``
        chooses it: ``tool_use`` when the chat has tools (an empty list too) and the model
        has one, else ``default``; None without templates (the built-in layout), and
        ChatFormatError when the model's templates are named but none ``default``."""
        if not self._templates:
            return None
        if tools is not None and "tool_use" in self._templates:
            return self._templates["tool_use"]
        chosen = self._templates.get("default")
        if chosen is None:
            raise ChatFormatError(f"the model's chat templates are named "
                                  f"{sorted(self._templates)}, and none 'default'")
        return chosen


# put after the content of the message a template's text is cut at (transformers' own tag)
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _cut_at_tag(text: str) -> str:
    """``text`` up to the last :data:`_CONTINUE_TAG`, less the spacing before it where the
    template trimmed the tag's own; ChatFormatError when the template dropped it."""
    at = text.rfind(_CONTINUE_TAG.strip())
    if at < 0:
        raise ChatFormatError("'continue_final_message' is set but the model's chat template "
                              "does not render the final message's content")
    if text.startswith(_CONTINUE_TAG, at):
        return text[:at]
    return text[:at].rstrip()  # the template trimmed the content: its spacing is gone


def _deepest(tools: Any, messages: Any, variables: Any) -> str:
    """The field of a chat that holds its most deeply nested value."""
    return max((("tools", tools), ("messages", messages), ("chat_template_kwargs", variables)),
               key=lambda named: _nesting(named[1]))[0]


def _nesting(value: Any) -> int:
    """How deep ``value``'s lists and objects nest (a scalar: 0), walked with a stack of
    its own (a value too deep for Python's recursion limit is what it measures)."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, Mapping):
            item = list(item.values())
        if isinstance(item, list | tuple):
            deepest = max(deepest, depth + 1)
            todo.extend((child, depth + 1) for child in item)
    return deepest


def _calls(message: Mapping[str, Any]) -> str:
    """An assistant turn's tool calls as the built-in layout writes them (Hermes and Qwen2
    templates' ``<tool_call>`` blocks); empty for any other turn."""
    return "".join(
        "\n<tool_call>\n" + json.dumps({"name": call["function"]["name"],
                                        "arguments": call["function"]["arguments"]},
                                       ensure_ascii=False) + "\n</tool_call>"
        for call in message.get("tool_calls") or ())


def _next_cut(text: str, start: int, end: int) -> int:
    """The first cut (a space right after a non-space) in ``[start, end)``, or -1."""
    found = _CUT.search(text, start, end)
    return found.start() if found else -1


def _max_token_chars(tokenizer: Any) -> int | None:
    """``PromptTokenizer.max_token_chars`` of an HF tokenizer, read off its JSON form."""
    try:
        spec = json.loads(tokenizer.to_str())
        vocab = tokenizer.get_vocab(with_added_tokens=True)
    except (AttributeError, TypeError, ValueError):
        return None
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not vocab:
        return None
    # every character has a token: byte-level (its 256 bytes) or falling back to bytes
    if not model.get("byte_fallback") and "ByteLevel" not in _kinds(spec.get("pre_tokenizer")):
        return None
    shrink = 1
    for node in _nodes(spec.get("normalizer")):
        kind = node.get("type")
        pattern = node.get("pattern") or {}
        if kind == "Replace" and isinstance(pattern.get("String"), str) \
                and node.get("content"):  # a string for another: joins len(pattern) at most
            shrink *= max(1, -(-len(pattern["String"]) // len(node["content"])))
        elif kind in _NORMALIZER_SHRINK:
            shrink *= _NORMALIZER_SHRINK[kind]
        else:
            return None
    # a byte-level token's string has a character per byte: at least one per text character
    return max(len(token) for token in vocab) * shrink


_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


@dataclass(frozen=True, slots=True)
class WideTokens:
    """A byte-level BPE's longest token in bytes, and its longest token of non-ASCII bytes
    alone (CJK, emoji: a few characters, where its longest token of all may be a run of a
    hundred dashes or spaces): what bounds the tokens of a text without spaces."""

    longest_bytes: int
    longest_non_ascii_bytes: int

    @staticmethod
    def of(tokenizer: Any) -> WideTokens | None:
        """Read off a tokenizer with no normalizer, byte-level pre-tokenization and a BPE
        model; None for any other."""
        try:
            spec = json.loads(tokenizer.to_str())
            vocab = tokenizer.get_vocab(with_added_tokens=False)
        except (AttributeError, TypeError, ValueError):
            return None
        if spec.get("normalizer") is not None or (spec.get("model") or {}).get("type") != "BPE" \
                or "ByteLevel" not in _kinds(spec.get("pre_tokenizer")):
            return None
        byte_of = _byte_level_bytes()
        # the vocabulary spells a byte a character; an added token is plain text
        added = [str(t.get("content", "")).encode("utf-8", "surrogatepass")
                 for t in spec.get("added_tokens") or ()]
        spelt = [bytes(byte_of.get(c, 0) for c in token) for token in vocab]
        every = spelt + added
        wide = [len(b) for b in every if b and min(b) >= 0x80]
        if not every or not wide:
            return None
        return WideTokens(max(len(b) for b in every), max(wide))

    def at_least(self, text: str, start: int, end: int) -> int:
        """The tokens ``text[start:end]`` holds at least, where no token spans ``start`` or
        ``end``: each run of non-ASCII characters in it is covered by tokens of its bytes
        alone, but for the two that may reach past its ends (``longest_bytes`` of it each
        at most)."""
        least = 0
        for run in _NON_ASCII.finditer(text, start, end):
            inside = len(run.group().encode("utf-8", "surrogatepass")) - 2 * self.longest_bytes
            if inside > 0:
                least += -(-inside // self.longest_non_ascii_bytes)
        return least


@functools.cache
def _byte_level_bytes() -> dict[str, int]:
    """The byte each character of a byte-level vocabulary stands for (GPT-2's table)."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
             *range(ord("®"), ord("ÿ") + 1)]
    hidden = [b for b in range(256) if b not in shown]
    return {**{chr(b): b for b in shown}, **{chr(256 + i): b for i, b in enumerate(hidden)}}


def _nodes(node: Any) -> list[dict[str, Any]]:
    """The normalizers or pre-tokenizers of one, a ``Sequence``'s in order."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        inner = node.get("normalizers") or node.get("pretokenizers") or []
        return [leaf for child in inner for leaf in _nodes(child)]
    return [node]


def _kinds(node: Any) -> set[str]:
    return {str(leaf.get("type")) for leaf in _nodes(node)}


def _special_ends(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids ``tokenizer``'s post-processor adds before and after one text, read off an
    encoding with them and one without (none where the plain ids are not found whole in
    the other)."""
    sample = "the parties agree"
    plain = list(tokenizer.encode(sample, add_special_tokens=False).ids)
    full = list(tokenizer.encode(sample, add_special_tokens=True).ids)
    for at in range(len(full) - len(plain) + 1):
        if full[at:at + len(plain)] == plain:
            return tuple(full[:at]), tuple(full[at + len(plain):])
    return (), ()


def load_tokenizer(path: str | Path | None = None, memo_size: int = 0) -> PromptTokenizer:
    """Load a tokenizer directory or ``tokenizer.json``; ``None`` = the project tokenizer.
    ``memo_size`` > 0 remembers that many prefix encodings (see ``encode_prefix``)."""
    from tokenizers import Tokenizer

    base = Path(path) if path is not None else ASSET_DIR
    file = base / "tokenizer.json" if base.is_dir() else base
    if not file.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {file}")
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:  # the tokenizers library raises a bare Exception
        raise ValueError(f"tokenizer file {file} cannot be read as a tokenizer: {exc}") \
            from None
    config = _read_json(file.parent / "tokenizer_config.json")
    special = _special_tokens(config)
    chat_template = _chat_templates(file.parent, config)
    return PromptTokenizer(tokenizer, chat_template, special, source=str(file),
                           memo_size=memo_size)


def _read_json(file: Path) -> dict[str, Any]:
    """A model's JSON file (``tokenizer_config.json``, ``chat_template.json``) read as UTF-8
    (templates hold non-ASCII text whatever the locale); empty when there is none,
    ValueError naming the file when it is no JSON object."""
    if not file.is_file():
        return {}
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file} cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object, got {type(config).__name__}")
    return config


def _special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """The tokenizer's special tokens by name, as transformers gives them to a chat
    template: each ``*_token`` of the config (``bos_token``, ``unk_token``, ``pad_token``,
    a multimodal model's ``image_token`` ...) and each of a map of
    ``extra_special_tokens``, as text or as an added token's ``content``."""
    extra = config.get("extra_special_tokens")
    named = {**config, **(extra if isinstance(extra, Mapping) else {})}
    out = {}
    for key, value in named.items():
        text = value.get("content") if isinstance(value, Mapping) else value
        if isinstance(key, str) and key.endswith("_token") and isinstance(text, str):
            out[key] = text
    return out


def _chat_templates(directory: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """The model's chat templates by name, as transformers loads them: files beside the
    tokenizer (where transformers saves them now), ``chat_template.jinja`` the default and
    ``additional_chat_templates/<name>.jinja`` the others, over the config's
    ``chat_template`` (one template, the default, or a list of ``{"name", "template"}``).
    ValueError naming the config's field when it is neither."""
    files = {"default": directory / "chat_template.jinja",
             **{file.name.removesuffix(".jinja"): file
                for file in sorted((directory / "additional_chat_templates").glob("*.jinja"))}}
    read = {name: file.read_text(encoding="utf-8") for name, file in files.items()
            if file.is_file()}
    if read:
        return read
    processor = directory / "chat_template.json"  # a multimodal model's processor's, which
    if processor.is_file():  # vLLM takes before the tokenizer's
        template = _read_json(processor).get("chat_template")
        if not isinstance(template, str):
            raise ValueError(f"{processor} holds no chat_template string, got "
                             f"{shown(template)}")
        return {"default": template}
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return {"default": template} if template else {}
    if isinstance(template, list) and all(
            isinstance(t, Mapping) and isinstance(t.get("name"), str)
            and isinstance(t.get("template"), str) for t in template):
        return {t["name"]: t["template"] for t in template}
    raise ValueError(f"tokenizer_config.json's chat_template must be a template or a list "
                     f"of {{'name': ..., 'template': ...}}, got {shown(template)}")
