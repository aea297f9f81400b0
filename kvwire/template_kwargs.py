"""A chat request's ``chat_template_kwargs`` (vLLM's field: extra variables for the model's
chat template, e.g. Qwen3's ``{"enable_thinking": false}``), checked and given to the
template as vLLM gives them.

vLLM (``resolve_chat_template_kwargs``, then transformers' ``apply_chat_template``):

- the field is an object or null (pydantic refuses anything else);
- ``chat_template`` and ``tokenize`` are refused, whatever the template;
- ``conversation`` and ``tools`` are ``apply_chat_template``'s own arguments and
  ``messages`` the template's: given again, the call fails, and vLLM answers 400;
- ``add_generation_prompt`` and ``continue_final_message`` give way to the request's own
  fields of those names;
- transformers' other arguments (``padding``, ``max_length``, ``return_dict`` ...) are
  consumed by it and never reach the template; ``documents`` does;
- any other key reaches the template only when the template reads a variable of that name
  (one it does not set itself); the rest are dropped. A key the template reads overrides
  the tokenizer's special tokens (``bos_token``, ``eos_token``) too.

The gateway renders with them to route on the text the replica prefills; the engine to
serve it. Refused keys are a 400 naming ``chat_template_kwargs.<key>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kvwire.media_parts import shown

FIELD = "chat_template_kwargs"
# keys one request may give: vLLM sets no bound; a template reads a handful, and each key
# is looked up in the template's variables at every rendering (the gateway renders a small
# chat on its event loop)
MAX_KEYS = 256
MAX_KEY_CHARS = 256

_REFUSED = {"chat_template": "the model's chat template is chosen by the server",
            "tokenize": "the server tokenizes the rendered chat itself"}
_OWN = {"messages": "the request's 'messages' are the template's messages",
        "conversation": "the request's 'messages' are the conversation",
        "tools": "the request's 'tools' are the template's tools"}
# apply_chat_template's own arguments, never the template's variables (``documents`` is
# passed on to it); the request's turn fields win over the two first
_CONSUMED = frozenset({"add_generation_prompt", "continue_final_message",
                       "sanitize_control_tokens", "padding", "truncation", "max_length",
                       "return_tensors", "return_dict", "return_assistant_tokens_mask",
                       "tokenizer_kwargs"})


class TemplateKwargsError(ValueError):
    """A refused ``chat_template_kwargs``; ``param`` names the field or its key."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


DOCUMENTS = "documents"


def request_template_kwargs(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A chat request's template variables as vLLM gives them to the template: its
    top-level ``documents`` (retrieved passages, which RAG templates such as Command-R's
    and Granite's render), then its ``chat_template_kwargs`` over them; None when it has
    neither. TemplateKwargsError naming the field for a bad value of either."""
    kwargs = check_template_kwargs(body.get(FIELD))
    documents = body.get(DOCUMENTS)
    if documents is None:
        return kwargs
    # vLLM's field: a list of objects whose values are strings
    if not isinstance(documents, list):
        raise TemplateKwargsError(f"'{DOCUMENTS}' must be an array of objects or null, got "
                                  f"{shown(documents)}", DOCUMENTS)
    for i, doc in enumerate(documents):
        if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
            raise TemplateKwargsError(f"'{DOCUMENTS}[{i}]' must be an object of strings, got "
                                      f"{shown(doc)}", f"{DOCUMENTS}[{i}]")
    return {DOCUMENTS: documents, **(kwargs or {})}


def check_template_kwargs(value: Any) -> dict[str, Any] | None:
    """The request's ``chat_template_kwargs`` (None when absent or null, as vLLM reads
    it); TemplateKwargsError naming the field when it is no object, holds more than
    ``MAX_KEYS`` keys or a key longer than ``MAX_KEY_CHARS``, or a key vLLM refuses (see
    the module docstring). Costs a lookup per refused name, not a pass over the keys
    beyond their count (run on the event loop)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TemplateKwargsError(f"'{FIELD}' must be an object, got {shown(value)}", FIELD)
    if len(value) > MAX_KEYS:
        raise TemplateKwargsError(f"'{FIELD}' holds {len(value)} keys, more than "
                                  f"{MAX_KEYS}", FIELD)
    for key, why in (*_REFUSED.items(), *_OWN.items()):
        if key in value:
            raise TemplateKwargsError(f"'{FIELD}' must not set {key!r}: {why}",
                                      f"{FIELD}.{key}")
    long = next((k for k in value if len(k) > MAX_KEY_CHARS), None)
    if long is not None:
        raise TemplateKwargsError(f"'{FIELD}' has a key of {len(long)} characters, more "
                                  f"than {MAX_KEY_CHARS}: {shown(long)}", FIELD)
    return value


def template_variables(kwargs: Mapping[str, Any] | None, reads: Iterable[str]
                       ) -> dict[str, Any]:
    """The variables of checked ``kwargs`` that reach a template that reads ``reads``
    (its undeclared variables), as vLLM lets them through."""
    if not kwargs:
        return {}
    names = reads if isinstance(reads, frozenset | set) else frozenset(reads)
    return {k: v for k, v in kwargs.items()
            if k in names and k not in _CONSUMED and k not in _OWN and k not in _REFUSED}
