"""A model's chat template compiled as transformers compiles it for ``apply_chat_template``
(what vLLM renders a chat with), so that the gateway, the engine and a vLLM replica make
one text of one chat.

transformers' environment is a Jinja sandbox that differs from a plain one where
templates rely on it:

- ``tojson`` is ``json.dumps``: keys in the order given, non-ASCII characters and
  ``< > & '`` as they are, ``indent``, ``separators`` and ``sort_keys`` as keyword
  arguments. Jinja's own filter sorts keys and writes ``<`` as ``\\u003c`` (and ``é`` as
  ``\\u00e9``): a tool schema (Qwen's and Hermes' templates list each with ``tojson``)
  read otherwise than the model is served it;
- ``{% break %}`` and ``{% continue %}`` (Jinja's ``loopcontrols``), and
  ``{% generation %}`` blocks, rendered as their content (transformers marks the
  assistant's text with them for training);
- ``raise_exception(message)`` (the template refuses the chat: a ``TemplateError``) and
  ``strftime_now(format)``, the local time (a Llama 3 template's date line).

A rendering stops at ``MAX_RENDERED_CHARS`` (:func:`render`), and so does one ``tojson``
with an ``indent`` (Llama 3.1's template writes each tool so): indented, every level of a
value indents every line below it, so a tool schema nested 700 deep in 1.5 KB writes 2 MB,
and one request's tools gigabytes. No single operation of a template builds a string or a
list past that bound, or a number past ``MAX_NUMBER_BITS``, either (``'x' * 3000000000``,
``'x' | center(3000000000)``, ``'{:>3000000000}'.format(x)``, ``2 ** 3000000000``): its size
is told from its operands first and the template refused (``TemplateBuildTooLong``, naming
it) before a byte of it is built. A container turned into text (``~``, ``string``,
``pprint``, ``join``, ``%``, ``{{ }}``) is measured by its text, each item as often as it is
referenced (``[s] * 10`` writes ``s`` ten times), and ``slice`` by its count.

The messages are given as vLLM gives them (``template_messages``), and, as vLLM, a
template that loops over a message's content (Gemma 3's, Llama 4's: ``{% for item in
message['content'] %}``) gets each message's content as a list of ``{"type": "text",
"text": ...}`` parts; any other gets it as one text (``ChatTemplate.content_parts``).
"""

from __future__ import annotations

import json
import math
import re
import string
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, MappingView, Sequence
from datetime import datetime
from itertools import chain
from pprint import PrettyPrinter
from typing import Any, NamedTuple

import orjson
from jinja2 import TemplateError, meta, nodes, pass_context
from jinja2.compiler import CodeGenerator, Frame
from jinja2.environment import Template
from jinja2.ext import Extension, loopcontrols
from jinja2.filters import (
    do_batch,
    do_center,
    do_indent,
    do_replace,
    make_attrgetter,
    sync_do_join,
    sync_do_slice,
)
from jinja2.parser import Parser
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import Namespace, generate_lorem_ipsum
from markupsafe import soft_str

from kvwire.chat_messages import PARTS, ChatFormatError


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


class TemplateRefused(ChatFormatError):
    """A model's chat template refuses a chat: its ``raise_exception``, an error of its own
    (a role it does not take, a field it reads that the chat lacks), or a value it would
    build past its bounds. That template's judgement, which another model's template need
    not share (the gateway's tokenizer may not be its replicas'); the chat may be well
    formed."""


# the characters one chat may render to: more than any model's context holds (8M tokens
# of 4 characters), and twice what the gateway's default body limit (16 MiB) carries
MAX_RENDERED_CHARS = 1 << 25


class RenderTooLong(ChatFormatError):
    """A chat renders to more than ``MAX_RENDERED_CHARS`` characters."""

    def __init__(self) -> None:
        super().__init__(f"the chat renders to more than {MAX_RENDERED_CHARS:,} characters "
                         f"with the model's chat template")


class JSONTree(dict[str, Any]):
    """A mapping read from a request's JSON (a tool, its function and parameters, a tool
    call's arguments): a tree, no value in it referenced twice, so its JSON text is no
    longer than a small multiple of what it holds, and ``tojson`` writes it before it is
    measured. A template's own values may hold one text many times (``[s] * 1000``):
    ``tojson`` measures those through every reference first."""

    __slots__ = ()


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent,
                               separators=separators, sort_keys=sort_keys)
    if indent is None:  # the C encoder, once the text is known to be within the bound
        if type(value) is not JSONTree and not isinstance(value, str | int | float | None):
            _json_within_bound(value)
        text = encoder.encode(value)
        if len(text) > MAX_RENDERED_CHARS:
            raise RenderTooLong
        return text
    # indented (json.dumps' own pure-Python pieces, as many): stopped at the bound
    return _joined_within_bound(encoder.iterencode(value))


def _json_within_bound(value: Any) -> None:
    """RenderTooLong when ``value``'s JSON text passes ``MAX_RENDERED_CHARS``, counted
    through every reference (a list that holds one long text many times, as a template
    builds with ``*``, writes it each time), stopped as soon as it passes."""
    written, todo = 0, [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            written += len(item) + 3
        elif isinstance(item, Mapping):
            written += 2
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list | tuple):
            written += 2
            todo.extend(item)
        else:
            written += 4
        if written > MAX_RENDERED_CHARS:
            raise RenderTooLong


def render(template: Template, context: Mapping[str, Any]) -> str:
    """``template`` rendered with ``context``; RenderTooLong as soon as the text passes
    ``MAX_RENDERED_CHARS`` (a template may repeat what it is given: the text is never
    held past the bound and one piece)."""
    return _joined_within_bound(template.generate(context))


def _joined_within_bound(pieces: Iterable[str]) -> str:
    """``pieces`` joined; RenderTooLong as soon as they pass ``MAX_RENDERED_CHARS``, no
    more than the bound and one piece ever held (a ``_BoundedBuffer``, counted as it was
    written, joined at once)."""
    if type(pieces) is _BoundedBuffer:
        return "".join(pieces)
    kept, written = [], 0
    for piece in pieces:
        written += len(piece)
        if written > MAX_RENDERED_CHARS:
            raise RenderTooLong
        kept.append(piece)
    return "".join(kept)


# the bits of a number a template computes: far past any a chat needs (Python writes none
# of more than 4,300 digits, ~14,000 bits)
MAX_NUMBER_BITS = 1 << 16


class TemplateBuildTooLong(TemplateRefused):
    """A template's single operation would build a string or list past
    ``MAX_RENDERED_CHARS`` or a number past ``MAX_NUMBER_BITS``; refused before it is
    built, naming the template and the operation."""

    def __init__(self, label: str, operation: str, size: int, number: bool) -> None:
        unit, bound = ("bits", MAX_NUMBER_BITS) if number else \
            ("characters or items", MAX_RENDERED_CHARS)
        name = label or "the model's chat template"
        super().__init__(f"{name} builds a {'number' if number else 'value'} of ~{size:,} "
                         f"{unit} with {operation}, past the {bound:,} a chat template may "
                         f"build")


def _within(context: Context, operation: str, size: int, number: bool = False) -> None:
    """TemplateBuildTooLong when ``size`` passes its bound."""
    if size > (MAX_NUMBER_BITS if number else MAX_RENDERED_CHARS):
        raise TemplateBuildTooLong(getattr(context.environment, "label", ""), operation,
                                   size, number)


def _length(value: Any) -> int:
    """The characters ``value`` stands for where it is built into text (a container's
    text, ``_text_size``)."""
    if isinstance(value, str):
        return len(value)
    return _text_size(value) if isinstance(value, _CONTAINERS) else len(str(value))


# the values whose text is their items' text, each written as often as it is referenced
_CONTAINERS = (list, tuple, set, frozenset, Mapping, MappingView, Namespace, bytes)


def _text_size(value: Any) -> int:
    """An upper bound, near enough, on the length of ``str(value)`` (or its ``pprint``
    with no line broken): its strings' lengths (a string not printable ten characters a
    character, as escaped) and a few characters an item, counted through every reference
    (``[s] * 1000`` writes ``s`` each time) and stopped as soon as it passes
    ``MAX_RENDERED_CHARS``."""
    written, todo = 0, [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            written += len(item) + 2 if item.isprintable() else 10 * len(item) + 2
        elif isinstance(item, list | tuple | set | frozenset | MappingView):
            written += 16 + 2 * len(item)
            if written <= MAX_RENDERED_CHARS:
                todo.extend(item)  # type: ignore[arg-type]
        elif isinstance(item, Mapping):
            written += 16 + 4 * len(item)
            if written <= MAX_RENDERED_CHARS:
                todo.extend(item.keys())
                todo.extend(item.values())
        elif type(item) is Namespace:  # <Namespace {...}>: its attributes' text
            written += 13
            todo.append(item._Namespace__attrs)
        elif isinstance(item, bytes):
            written += 4 * len(item) + 3
        elif isinstance(item, int):
            written += item.bit_length() * 3 // 10 + 2
        else:
            written += len(repr(item))
        if written > MAX_RENDERED_CHARS:
            break
    return written


def _count(value: Any) -> int:
    """``value`` as a repeat count or width (0 where it is none: the operation refuses)."""
    return value if isinstance(value, int) and value > 0 else 0


def _spec_widths(spec: str) -> int:
    """The widths and precisions a format spec's digits ask for (a run Python refuses as
    too long counted past any bound)."""
    return sum(int(run) if len(run) < 20 else 10 ** 20 for run in re.findall(r"\d+", spec))


def _formatted_size(text: str, count: int, widths: int, values: Sequence[Any]) -> int:
    """An upper bound, near enough, on the length of ``text`` formatted with ``values``
    into ``count`` fields: its own characters, the fields' ``widths`` and precisions and
    each field as long as the longest value."""
    longest = max((_length(v) for v in values), default=0)
    return len(text) + widths + count * longest


def _percent_fields(text: str) -> Iterator[tuple[str, str]]:
    """Each conversion of the ``%`` format ``text``, in order, as its width and precision
    (``'*'``, digits or ``''``); ``%%`` is none."""
    at = text.find("%")
    while 0 <= at < len(text) - 1:
        at += 1
        if text[at] == "%":
            at = text.find("%", at + 1)
            continue
        if text[at] == "(":  # a mapping key, its parentheses nested as Python reads them
            depth = 0
            while at < len(text):
                depth += {"(": 1, ")": -1}.get(text[at], 0)
                at += 1
                if depth == 0:
                    break
        field = re.compile(r"[#0 +-]*(\*|\d*)(?:\.(\*|\d*))?").match(text, at)
        assert field is not None  # every part of it may be empty
        yield field.group(1), field.group(2) or ""
        at = text.find("%", field.end() + 1)  # past the conversion's letter


def _percent_size(text: str, args: Any) -> int:
    """``_formatted_size`` of ``text % args``: a ``*`` width or precision reads the next
    argument, a conversion the one after it."""
    values = list(args.values() if isinstance(args, Mapping) else
                  args if isinstance(args, tuple) else (args,))
    # a mapping gives a '*' nothing to read: Python refuses it
    starred = [] if isinstance(args, Mapping) else values
    widths, count, read = 0, 0, 0
    for field in _percent_fields(text):
        count += 1
        for part in field:
            if part == "*":
                width = starred[read] if read < len(starred) else 0
                widths += abs(width) if isinstance(width, int) else 0
                read += 1
            else:
                widths += _spec_widths(part)
        read += 1
    return _formatted_size(text, count, widths, values)


def _nested_text(value: Any, conversion: str | None) -> str:
    """What a nested ``{}`` field writes into the spec around it (``'?'`` for a value too
    long to be part of a spec Python takes)."""
    if (isinstance(value, int) and value.bit_length() <= 256) or isinstance(value, float):
        text = str(value)
    elif isinstance(value, str):
        text = value
    else:
        return "?"
    if conversion in ("r", "a"):
        text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= 64 else "?"


def _format_size(text: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    """``_formatted_size`` of ``text.format(*args, **kwargs)`` (0 where it is no format:
    ``format`` refuses it): a field's spec is read with its nested ``{}`` fields written
    in, each the argument it names."""
    formatter = string.Formatter()
    try:
        parsed = [(name, spec or "") for _, name, spec, _ in formatter.parse(text)
                  if name is not None]
        auto, widths = 0, 0
        for name, spec in parsed:
            if name == "" or name[0] in ".[":
                auto += 1
            written = []
            for literal, nested, _, conversion in formatter.parse(spec):
                written.append(literal)
                if nested is None:
                    continue
                key = re.split(r"[.\[]", nested, maxsplit=1)[0]
                compound = key != nested
                if key == "":
                    key, auto = str(auto), auto + 1
                value = (args[int(key)] if int(key) < len(args) else None) \
                    if key.isdigit() else kwargs.get(key)
                if compound:  # an attribute or item of it: its largest int item
                    items = value.values() if isinstance(value, Mapping) else \
                        value if isinstance(value, list | tuple) else (value,)
                    value = max((abs(v) for v in items if isinstance(v, int)), default=None)
                written.append(_nested_text(value, conversion))
            widths += _spec_widths("".join(written))
    except ValueError:
        return 0
    return _formatted_size(text, len(parsed), widths, [*args, *kwargs.values()])


def _binop_size(operator: str, left: Any, right: Any) -> tuple[int, bool]:
    """The size ``left operator right`` would have (characters or items; bits for a
    number: the second value true), from its operands alone."""
    sized = str | list | tuple
    if operator == "*":
        if isinstance(left, sized) and isinstance(right, int):
            return len(left) * _count(right), False
        if isinstance(right, sized) and isinstance(left, int):
            return len(right) * _count(left), False
        if isinstance(left, int) and isinstance(right, int):
            return left.bit_length() + right.bit_length(), True
    elif operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        return len(left) + len(right), False
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) \
            and abs(left) > 1 and right > 0:
        return int(right * math.log2(abs(left))) + 1, True
    elif operator == "%" and isinstance(left, str):
        return _percent_size(left, right), False
    return 0, False


# the string methods that build a longer string than their operands
_GROWING_STR_METHODS = frozenset(("center", "ljust", "rjust", "zfill", "expandtabs", "join",
                                  "replace", "format", "format_map"))


def _str_method_size(text: str, name: str, args: Sequence[Any],
                     kwargs: Mapping[str, Any]) -> int:
    """The length ``text.name(*args, **kwargs)`` would have, for the string methods that
    build a longer string than their operands (``_GROWING_STR_METHODS``; 0 for the
    others)."""
    if name in ("center", "ljust", "rjust", "zfill") and args:
        return max(len(text), _count(args[0]))
    if name == "expandtabs":
        return len(text) + text.count("\t") * _count(
            args[0] if args else kwargs.get("tabsize", 8))
    if name == "join" and args and isinstance(args[0], list | tuple):
        return sum(map(_length, args[0])) + len(text) * max(0, len(args[0]) - 1)
    if name == "replace" and len(args) >= 2:
        return _replaced_size(text, *args[:3])
    if name == "format":
        return _format_size(text, args, kwargs)
    if name == "format_map" and len(args) == 1 and isinstance(args[0], Mapping):
        return _format_size(text, (), args[0])
    return 0


def _replaced_size(text: Any, old: Any, new: Any, count: Any = -1) -> int:
    """The length of ``text.replace(old, new, count)`` (each as a string)."""
    text, old, new = str(text), str(old), str(new)
    found = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(text) + found * max(0, len(new) - len(old))


def _materialized(value: Any) -> Any:
    """An iterable as a list, to be measured and then read (a string, list or tuple as it
    is)."""
    return value if isinstance(value, str | list | tuple) else list(value)


@pass_context
def _center(context: Context, value: Any, width: int = 80) -> str:
    _within(context, "center", max(_length(value), _count(width)))
    return do_center(value, width)


@pass_context
def _indent(context: Context, s: Any, width: int | str = 4, first: bool = False,
            blank: bool = False) -> str:
    text = str(s)
    step = len(width) if isinstance(width, str) else _count(width)
    _within(context, "indent", len(text) + (text.count("\n") + 1) * step)
    return do_indent(text, width, first, blank)


@pass_context
def _format(context: Context, value: Any, *args: Any, **kwargs: Any) -> str:
    if args and kwargs:
        raise TemplateError("can't handle positional and keyword arguments at the same "
                            "time")
    _within(context, "format", _percent_size(str(value), kwargs or args))
    return str(value) % (kwargs or args)


@pass_context
def _join(context: Context, value: Any, d: str = "",
          attribute: str | int | None = None) -> str:
    items = _materialized(value)
    if attribute is not None:
        items = list(map(make_attrgetter(context.environment, attribute), items))
    _within(context, "join", sum(map(_length, items)) + len(str(d)) * max(0, len(items) - 1))
    return sync_do_join(context.eval_ctx, items, d)


@pass_context
def _replace(context: Context, s: Any, old: Any, new: Any, count: int | None = None) -> str:
    _within(context, "replace", _replaced_size(s, old, new, -1 if count is None else count))
    return do_replace(context.eval_ctx, s, old, new, count)


@pass_context
def _batch(context: Context, value: Any, linecount: int, fill_with: Any = None
           ) -> Iterator[list[Any]]:
    if fill_with is not None:
        _within(context, "batch", _count(linecount))
    return do_batch(value, linecount, fill_with)


@pass_context
def _sum(context: Context, iterable: Any, attribute: str | int | None = None,
         start: Any = 0) -> Any:
    items = _materialized(iterable)
    if attribute is not None:
        items = list(map(make_attrgetter(context.environment, attribute), items))
    if isinstance(start, list | tuple) and all(type(i) is type(start) for i in items):
        # sequences joined: measured first, and built in one pass, not one copy an item
        _within(context, "sum", len(start) + sum(map(len, items)))
        return type(start)(chain(start, *items))
    return sum(items, start)


@pass_context
def _slice(context: Context, value: Any, slices: int, fill_with: Any = None
           ) -> Iterator[list[Any]]:
    _within(context, "slice", _count(slices))
    return sync_do_slice(value, slices, fill_with)


@pass_context
def _string(context: Context, value: Any) -> str:
    _within(context, "string", _length(value))
    return soft_str(value)


@pass_context
def _pprint(context: Context, value: Any) -> str:
    _within(context, "pprint", _length(value))
    # its lines indented as deep as a value is nested: written within the bound
    stream = _BoundedBuffer(getattr(context.environment, "label", ""), "pprint")
    PrettyPrinter(stream=stream).pprint(value)  # type: ignore[arg-type]
    return "".join(stream)[:-1]  # less the line's end pprint writes


@pass_context
def _lipsum(context: Context, n: int = 5, html: bool = True, min: int = 20, max: int = 100
            ) -> str:
    _within(context, "lipsum", _count(n) * _count(max) * 16)  # words of up to ~15 letters
    return generate_lorem_ipsum(n, html, min, max)


class _BoundedBuffer(list[str]):
    """The text of a block, a macro or a ``{% set %}`` block as it is written, refused
    once it passes ``MAX_RENDERED_CHARS``."""

    __slots__ = ("_label", "_operation", "_written")

    def __init__(self, label: str, operation: str = "a block's text") -> None:
        super().__init__()
        self._label, self._operation, self._written = label, operation, 0

    def _passed(self) -> TemplateBuildTooLong:
        return TemplateBuildTooLong(self._label, self._operation, self._written, False)

    def append(self, piece: str) -> None:
        self._written += len(piece)
        if self._written > MAX_RENDERED_CHARS:
            raise self._passed()
        list.append(self, piece)

    def extend(self, pieces: Iterable[str]) -> None:
        pieces = tuple(pieces)
        self._written += sum(map(len, pieces))
        if self._written > MAX_RENDERED_CHARS:
            raise self._passed()
        list.extend(self, pieces)

    write = append  # a stream's (pprint writes to one)


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator with ``a ~ b`` measured before it is joined, and a block's
    text (``_BoundedBuffer``) as it is written."""

    def buffer(self, frame: Frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.new_buffer()")

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        else:
            join = "markup_join" if frame.eval_ctx.autoescape else "str_join"
        self.write("environment.concat_within(context, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(f"), {join})")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with each operation that builds a string, a list or a
    number from smaller ones measured first (see the module docstring)."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset(("*", "**", "+", "%"))

    def __init__(self, label: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.label = label  # the template's name in errors (never in its code)
        # a block's, a macro's or a {% set %} block's text, joined
        self.concat = _joined_within_bound  # type: ignore[assignment]
        self.filters.update(center=_center, indent=_indent, format=_format, join=_join,
                            replace=_replace, batch=_batch, sum=_sum, slice=_slice,
                            string=_string, pprint=_pprint)
        self.finalize = self._finalized
        self.globals["lipsum"] = _lipsum

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and type(left) is str and type(right) is str \
                and len(left) + len(right) <= MAX_RENDERED_CHARS:
            return left + right  # most of a template's operations, kept cheap
        size, number = _binop_size(operator, left, right)
        _within(context, repr(operator), size, number)
        return self.binop_table[operator](left, right)

    def _finalized(self, value: Any) -> Any:
        """An output's value, a container's text measured before it is written."""
        if type(value) is not str and isinstance(value, _CONTAINERS):
            size = _text_size(value)
            if size > MAX_RENDERED_CHARS:
                raise TemplateBuildTooLong(self.label, "output", size, False)
        return value

    def new_buffer(self) -> _BoundedBuffer:
        return _BoundedBuffer(self.label)

    def concat_within(self, context: Context, pieces: tuple[Any, ...],
                      join: Callable[[Iterable[Any]], str]) -> str:
        _within(context, "'~'", sum(map(_length, pieces)))
        return join(pieces)

    def call(self, context: Context, obj: Any, /, *args: Any,  # type: ignore[override]
             **kwargs: Any) -> Any:
        kind = type(obj)  # a str method, or str.format as the sandbox wraps it, measured
        method = obj if kind is types.BuiltinMethodType else \
            obj.__dict__.get("__wrapped__") if kind is types.FunctionType else None
        if type(method) is types.BuiltinMethodType and isinstance(method.__self__, str) \
                and method.__name__ in _GROWING_STR_METHODS:
            if method.__name__ == "join" and args:
                args = (_materialized(args[0]), *args[1:])
            _within(context, f"str.{method.__name__}",
                    _str_method_size(method.__self__, method.__name__, args, kwargs))
        if not self.is_safe_callable(obj):
            raise SecurityError(f"{obj!r} is not safely callable")
        return context.call(obj, *args, **kwargs)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Generation(Extension):
    """``{% generation %}...{% endgeneration %}``: its content."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_content"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _content(caller: Callable[[], str]) -> str:
        return caller()


def template_messages(messages: Sequence[Mapping[str, Any]], content_parts: bool = False
                      ) -> list[dict[str, Any]]:
    """Normalized messages (``normalize_messages``) as vLLM gives them to a chat template:
    an assistant turn's tool calls with their ``arguments`` read from JSON text into
    values (empty: ``{}``), so that ``arguments | tojson`` writes the object, not a string
    of it, and no ``tool_calls`` where the list is empty; its ``reasoning`` also as
    ``reasoning_content`` and ``thinking``. ChatFormatError naming a call
    whose arguments are no JSON text (vLLM refuses it too).

    With ``content_parts`` (a template that loops over a message's content), each
    message's content is a list of text parts: the parts it was given as (media by their
    placeholders), or its text as one part; a tool turn's stays one text, as vLLM keeps
    it for templates that read a tool's result as text."""
    out = []
    for i, given in enumerate(messages):
        message = {k: v for k, v in given.items() if k != PARTS}
        if content_parts and message["role"] != "tool":
            parts = given.get(PARTS)
            texts = parts if isinstance(parts, tuple) else \
                (message["content"],) if message["content"] else ()
            message["content"] = [{"type": "text", "text": text} for text in texts]
        reasoning = message.get("reasoning")
        if reasoning is not None:  # read by templates as reasoning_content (Qwen3's) or
            # thinking (gpt-oss'): vLLM gives the first, transformers the second
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        calls = message.get("tool_calls")
        if calls is None:
            out.append(message)
            continue
        read = []
        for j, call in enumerate(calls):
            text = call["function"]["arguments"]
            try:
                arguments = orjson.loads(text) if text else {}
                if type(arguments) is dict:
                    arguments = JSONTree(arguments)
            except orjson.JSONDecodeError:
                where = f"messages[{i}].tool_calls[{j}].function.arguments"
                raise ChatFormatError(f"{where} must be JSON text, got {text!r:.60}",
                                      param=where) from None
            read.append({**call, "function": {**call["function"], "arguments": arguments}})
        out.append({**message, "tool_calls": read} if read else
                   {k: v for k, v in message.items() if k != "tool_calls"})
    return out


def template_tools(tools: Sequence[Any] | None) -> list[Any] | None:
    """The request's checked ``tools`` (``check_tools``) as vLLM gives them to a chat
    template: each function tool as its request model writes it back (``model_dump``),
    ``{"type": "function", "function": {"name", "description", "parameters", ...}, ...}``,
    the fields in that order, one left out written as null, other keys after them as given
    (a template writes each with ``tojson``: a tool sent without its ``description`` or in
    another key order is still the replica's text); an empty list stays one (a Llama 3
    template tells ``[]`` from none); other tools as given."""
    if tools is None:
        return None
    out: list[Any] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or tool.get("type", "function") != "function":
            out.append(tool)
            continue
        parameters = fn.get("parameters")
        function = JSONTree(
            name=fn.get("name"), description=fn.get("description"),
            parameters=JSONTree(parameters) if type(parameters) is dict else parameters,
            **{k: v for k, v in fn.items() if k not in ("name", "description", "parameters")})
        out.append(JSONTree(type="function", function=function,
                            **{k: v for k, v in tool.items() if k not in ("type", "function")}))
    return out


def _loops_over_content(root: nodes.Template) -> bool:
    """Whether a template loops over a message's content (``{% for item in
    message['content'] %}``, the message a loop variable over ``messages`` or a variable
    set from them), as vLLM tells a template that takes content as parts from one that
    takes text (its "openai" and "string" content formats)."""
    messages = list(_names_set_from(root, "messages"))
    message_names = [loop.target.name for loop in root.find_all(nodes.For)
                     if isinstance(loop.target, nodes.Name)
                     and any(_reads(loop.iter, name) for name in messages)]
    return any(isinstance(loop.target, nodes.Name)
               and any(_reads(loop.iter, name, "content") for name in message_names)
               for loop in root.find_all(nodes.For))


def _reads(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """Whether ``node`` is ``name`` (``name[key]`` or ``name.key`` with a ``key``),
    maybe filtered, tested or sliced."""
    if isinstance(node, nodes.Filter | nodes.Test):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, name, key)
    if key is None:
        return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name
    if isinstance(node, nodes.Getitem):
        return _reads(node.node, name) and isinstance(node.arg, nodes.Const) \
            and node.arg.value == key
    return isinstance(node, nodes.Getattr) and _reads(node.node, name) and node.attr == key


def _names_set_from(root: nodes.Node, name: str) -> Iterator[str]:
    """``name`` and, breadth first, every variable ``{% set %}`` from it or from those."""
    yield name
    seen, todo = {name}, deque([name])
    while todo:
        source = todo.popleft()
        for assign in root.find_all(nodes.Assign):
            target = assign.target
            if isinstance(target, nodes.Name) and target.name not in seen \
                    and _reads(assign.node, source):
                seen.add(target.name)
                todo.append(target.name)
                yield target.name


class ChatTemplate(NamedTuple):
    template: Template
    content_parts: bool  # it loops over a message's content: give it as parts
    # the variables it reads and does not set itself (``chat_template_kwargs`` reach it
    # only by these names, as vLLM passes them)
    variables: frozenset[str] = frozenset()


def compile_template(source: str, name: str | None = None) -> ChatTemplate:
    """``source`` compiled in transformers' environment (see the module docstring),
    whether it reads content as parts, and the variables it reads; jinja2's
    ``TemplateSyntaxError`` when it is no template. ``name`` names it in errors."""
    env = _BoundedSandbox(name or "", trim_blocks=True, lstrip_blocks=True,
                          extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    parsed = env.parse(source)
    return ChatTemplate(env.from_string(source), _loops_over_content(parsed),
                        frozenset(meta.find_undeclared_variables(parsed)))
