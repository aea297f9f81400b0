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
and one request's tools gigabytes.

The messages are given as vLLM gives them (``template_messages``), and, as vLLM, a
template that loops over a message's content (Gemma 3's, Llama 4's: ``{% for item in
message['content'] %}``) gets each message's content as a list of ``{"type": "text",
"text": ...}`` parts; any other gets it as one text (``ChatTemplate.content_parts``).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import orjson
from jinja2 import TemplateError, meta, nodes
from jinja2.environment import Template
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvwire.chat_messages import PARTS, ChatFormatError


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


# the characters one chat may render to: more than any model's context holds (8M tokens
# of 4 characters), and twice what the gateway's default body limit (16 MiB) carries
MAX_RENDERED_CHARS = 1 << 25


class RenderTooLong(ChatFormatError):
    """A chat renders to more than ``MAX_RENDERED_CHARS`` characters."""

    def __init__(self) -> None:
        super().__init__(f"the chat renders to more than {MAX_RENDERED_CHARS:,} characters "
                         f"with the model's chat template")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent,
                               separators=separators, sort_keys=sort_keys)
    if indent is None:  # the C encoder, no longer than a few times the value's own text
        return encoder.encode(value)
    # indented (json.dumps' own pure-Python pieces, as many): stopped at the bound
    return _joined_within_bound(encoder.iterencode(value))


def render(template: Template, context: Mapping[str, Any]) -> str:
    """``template`` rendered with ``context``; RenderTooLong as soon as the text passes
    ``MAX_RENDERED_CHARS`` (a template may repeat what it is given: the text is never
    held past the bound and one piece)."""
    return _joined_within_bound(template.generate(context))


def _joined_within_bound(pieces: Iterable[str]) -> str:
    """``pieces`` joined; RenderTooLong as soon as they pass ``MAX_RENDERED_CHARS``, no
    more than the bound and one piece ever held."""
    kept, written = [], 0
    for piece in pieces:
        written += len(piece)
        if written > MAX_RENDERED_CHARS:
            raise RenderTooLong
        kept.append(piece)
    return "".join(kept)


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
        function = {"name": fn.get("name"), "description": fn.get("description"),
                    "parameters": fn.get("parameters"),
                    **{k: v for k, v in fn.items()
                       if k not in ("name", "description", "parameters")}}
        out.append({"type": "function", "function": function,
                    **{k: v for k, v in tool.items() if k not in ("type", "function")}})
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


def compile_template(source: str) -> ChatTemplate:
    """``source`` compiled in transformers' environment (see the module docstring),
    whether it reads content as parts, and the variables it reads; jinja2's
    ``TemplateSyntaxError`` when it is no template."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    parsed = env.parse(source)
    return ChatTemplate(env.from_string(source), _loops_over_content(parsed),
                        frozenset(meta.find_undeclared_variables(parsed)))
