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
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson
from jinja2 import TemplateError, nodes
from jinja2.environment import Template
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvwire.chat_messages import ChatFormatError


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


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


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Normalized messages (``normalize_messages``) as vLLM gives them to a chat template:
    an assistant turn's tool calls with their ``arguments`` read from JSON text into
    values (empty: ``{}``), so that ``arguments | tojson`` writes the object, not a string
    of it, and no ``tool_calls`` where the list is empty. ChatFormatError naming a call
    whose arguments are no JSON text (vLLM refuses it too)."""
    out = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls is None:
            out.append(dict(message))
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


def compile_template(source: str) -> Template:
    """``source`` compiled in transformers' environment (see the module docstring);
    jinja2's ``TemplateSyntaxError`` when it is no template."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)
