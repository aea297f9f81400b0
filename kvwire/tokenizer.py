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

``bounded`` (``kvwire.bounded_encoding``) encodes a text far longer than a model's context
at a bounded cost in memory.

Each file of a tokenizer directory is read up to a bound no real one reaches
(``MAX_TOKENIZER_BYTES``, ``MAX_CONFIG_BYTES``, ``MAX_TEMPLATE_BYTES``): a larger one, or
one that is no regular file, is refused naming it and the bound, before it is read.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from kvwire.bounded_encoding import BoundedEncoder
from kvwire.bounded_memo import BoundedMemo
from kvwire.chat_messages import PARTS, ChatFormatError, normalize_messages
from kvwire.chat_template import (
    ChatTemplate,
    RenderTooLong,
    TemplateBuildTooLong,
    TemplateRefused,
    compile_template,
    render,
    template_messages,
    template_tools,
)
from kvwire.media_parts import shown
from kvwire.regular_files import FileTooLarge, NotRegularFile, read_regular
from kvwire.template_kwargs import template_variables
from kvwire.tokenizer_build import ASSET_DIR, EOS_TOKEN
from kvwire.whole_encoding import WholeEncodings, space_cut

DEFAULT_CHARS_PER_TOKEN = 4.0
_READ_MARGIN = 1.1  # characters read for a prefix over what it is expected to take
_SEEN_ALPHA = 0.5  # weight of the latest prompt in the characters per token seen

# the bytes a tokenizer directory's files are read up to, far past any model's: a
# tokenizer.json reaches ~35 MB (Gemma's; Llama 3's ~9 MB), a tokenizer_config.json a few
# MB (as the engine's config.json, 64 MiB), a chat template ~100 KB (all of a model's
# templates together, whether files or a config's field)
MAX_TOKENIZER_BYTES = 256 << 20
MAX_CONFIG_BYTES = 64 << 20
MAX_TEMPLATE_BYTES = 4 << 20


# a remembered prefix encoding: (first tokens, tokens in text[:cut], cut,
# text[budget:cut + 1])
_Memo = tuple["array[int]", int, int, str]


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
        # encodings of texts far past a model's context, at a bounded cost in memory
        self.bounded = BoundedEncoder(tokenizer, self.encode, self.encode_many)
        # whole prompts through remembered prefixes (``whole_encoding``), with the memo,
        # their rest read in bounded pieces
        self.whole = WholeEncodings(self.bounded.encode_whole, max(2, memo_size // 4)) \
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
            name: compile_template(text, f"the chat template {name!r}"
                                         + (f" of {source}" if source else ""))
            for name, text in named.items() if text}
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
        if max_tokens is None:  # read in bounded pieces (``BoundedEncoder.encode_whole``)
            ids = self.bounded.encode_whole(text) if self.whole is None \
                else self.whole.encode(text, group)
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

    # -- chat -----------------------------------------------------------------------------
    def render_chat(self, messages: Sequence[Any], add_generation_prompt: bool = True,
                    tools: Sequence[Any] | None = None, continue_final_message: bool = False,
                    template_kwargs: Mapping[str, Any] | None = None,
                    builtin_layout: bool = False) -> str:
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
        and ``documents`` (null unless given); the built-in layout reads none.

        ``TemplateRefused`` (a ChatFormatError) when the model's template refuses the chat
        (``raise_exception``, an error of its own, a value past its bounds): the template's
        judgement, which the built-in layout (``builtin_layout``, whatever templates the
        tokenizer has) does not share. Any other ChatFormatError refuses the chat whatever
        the template (a malformed message, a value nested too deeply)."""
        if add_generation_prompt and continue_final_message:
            raise ChatFormatError("'add_generation_prompt' and 'continue_final_message' "
                                  "cannot both be true")
        normalized = normalize_messages(messages)
        chosen = None if builtin_layout else self._chosen_template(tools)
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
            except TemplateBuildTooLong:  # the template's own doing, named in the message
                raise
            except RenderTooLong as exc:  # most likely a deep value, indented: named so
                field = _deepest(tools, given, variables)
                raise ChatFormatError(f"{exc} ('{field}' holds the most deeply nested "
                                      f"value)", param=field) from None
            except (TemplateError, TypeError, ValueError, LookupError,
                    AttributeError) as exc:  # the template refuses these messages (a system
                # role it does not take, roles out of turn)
                raise TemplateRefused(f"the model's chat template refused the messages: "
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
        TemplateRefused when the model's templates are named but none ``default``."""
        if not self._templates:
            return None
        if tools is not None and "tool_use" in self._templates:
            return self._templates["tool_use"]
        chosen = self._templates.get("default")
        if chosen is None:
            raise TemplateRefused(f"the model's chat templates are named "
                                  f"{sorted(self._templates)}, and none 'default'")
        return chosen


# put after the content of the message a template's text is cut at (transformers' own tag)
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _cut_at_tag(text: str) -> str:
    """``text`` up to the last :data:`_CONTINUE_TAG`, less the spacing before it where the
    template trimmed the tag's own; TemplateRefused when the template dropped it."""
    at = text.rfind(_CONTINUE_TAG.strip())
    if at < 0:
        raise TemplateRefused("'continue_final_message' is set but the model's chat template "
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
    if not file.exists():
        raise FileNotFoundError(f"tokenizer file not found: {file}")
    data = _read_bounded(file, MAX_TOKENIZER_BYTES, "a tokenizer.json")
    try:
        tokenizer = Tokenizer.from_buffer(data)
    except Exception as exc:  # the tokenizers library raises a bare Exception
        raise ValueError(f"tokenizer file {file} cannot be read as a tokenizer: {exc}") \
            from None
    del data  # the text, no longer needed once parsed
    config = _read_json(file.parent / "tokenizer_config.json")
    special = _special_tokens(config)
    chat_template = _chat_templates(file.parent, config)
    return PromptTokenizer(tokenizer, chat_template, special, source=str(file),
                           memo_size=memo_size)


def _read_json(file: Path) -> dict[str, Any]:
    """A model's JSON file (``tokenizer_config.json``, ``chat_template.json``) read as UTF-8
    (templates hold non-ASCII text whatever the locale); empty when there is none,
    ValueError naming the file when it is no JSON object."""
    if not file.exists():
        return {}
    try:
        config = json.loads(_read_bounded(file, MAX_CONFIG_BYTES, "a model's JSON config")
                            .decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file} cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object, got {type(config).__name__}")
    return config


def _read_bounded(file: Path, limit: int, what: str) -> bytes:
    """``file``'s bytes; ValueError naming it and ``limit`` (``what`` says what is read up
    to it) when it holds more, told by its size before a byte is read (a file that grows
    as it is read: after ``limit`` and one), or when it is no regular file (a pipe, a
    device, a directory: ``read_regular``)."""
    try:
        data = read_regular(file, limit)
    except NotRegularFile:
        raise ValueError(f"{file} is not a regular file; {what} is read from one") from None
    except FileTooLarge as exc:
        raise ValueError(f"{file} is {exc.size:,} bytes; {what} is read up to {limit:,} "
                         "bytes") from None
    if len(data) > limit:
        raise ValueError(f"{file} holds more than {limit:,} bytes; {what} is read up to "
                         f"{limit:,} bytes")
    return data


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
    ValueError naming the config's field when it is neither, and naming the file or field
    when the templates pass ``MAX_TEMPLATE_BYTES`` all together."""
    files = {"default": directory / "chat_template.jinja",
             **{file.name.removesuffix(".jinja"): file
                for file in sorted((directory / "additional_chat_templates").glob("*.jinja"))}}
    read: dict[str, str] = {}
    left = MAX_TEMPLATE_BYTES  # for all of them together
    for name, file in files.items():
        if file.exists():
            data = _read_bounded(file, left, f"the rest of a model's chat templates "
                                             f"({MAX_TEMPLATE_BYTES:,} bytes all together)")
            left -= len(data)
            read[name] = _text_lines(data.decode("utf-8"))
    if read:
        return read
    processor = directory / "chat_template.json"  # a multimodal model's processor's, which
    if processor.is_file():  # vLLM takes before the tokenizer's
        template = _read_json(processor).get("chat_template")
        if not isinstance(template, str):
            raise ValueError(f"{processor} holds no chat_template string, got "
                             f"{shown(template)}")
        return _within_template_bound({"default": template}, f"{processor}'s chat_template")
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        named = {"default": template} if template else {}
    elif isinstance(template, list) and all(
            isinstance(t, Mapping) and isinstance(t.get("name"), str)
            and isinstance(t.get("template"), str) for t in template):
        named = {t["name"]: t["template"] for t in template}
    else:
        raise ValueError(f"tokenizer_config.json's chat_template must be a template or a "
                         f"list of {{'name': ..., 'template': ...}}, got {shown(template)}")
    return _within_template_bound(named, "tokenizer_config.json's chat_template")


def _within_template_bound(named: dict[str, str], where: str) -> dict[str, str]:
    """``named``, or ValueError naming ``where`` they are when they pass
    ``MAX_TEMPLATE_BYTES`` characters all together."""
    total = sum(len(text) for text in named.values())
    if total > MAX_TEMPLATE_BYTES:
        raise ValueError(f"{where} holds {total:,} characters; a model's chat templates "
                         f"are read up to {MAX_TEMPLATE_BYTES:,} all together")
    return named


def _text_lines(text: str) -> str:
    """``text`` with its line ends as a file read as text gives them (``\\r\\n`` and ``\\r``
    as ``\\n``), as transformers reads a template file."""
    return text.replace("\r\n", "\n").replace("\r", "\n")
