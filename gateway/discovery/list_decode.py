"""Decoding a Kubernetes list answer without holding the event loop.

A page of 500 pods is ~2.3 MB of JSON: ``json.loads`` takes ~17 ms of it, orjson ~10 ms,
with the loop blocked all along. A thread does not help: both decoders hold the GIL for
the whole document, so the loop waits on the GIL just as long. Instead the top-level object
is walked here and its ``items`` decoded one at a time (each by the stdlib's C decoder),
handing the loop back between slices (``gateway.loop_slices``): a stall is then one slice
and one object, whatever the page holds.

``decode_list(text)`` returns what ``json.loads(text)`` returns, and raises the
``json.JSONDecodeError`` it raises, for any text (a non-object, whitespace anywhere, keys
in any order, a repeated key: the last one wins).
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.loop_slices import Slices

_WS = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
_raw_decode = json.JSONDecoder().raw_decode


def _skip(text: str, i: int) -> int:
    end = _WS.match(text, i)
    assert end is not None  # the pattern matches the empty string
    return end.end()


def _expect(text: str, i: int, chars: str, what: str) -> str:
    char = text[i:i + 1]
    if not char or char not in chars:
        raise json.JSONDecodeError(f"Expecting {what}", text, i)
    return char


async def decode_list(text: str) -> Any:
    """``json.loads(text)``, its top-level ``items`` decoded a slice at a time."""
    i = _skip(text, 0)
    if text[i:i + 1] != "{":
        return json.loads(text)  # not a list object: whatever json makes of it
    slices = Slices()
    body: dict[str, Any] = {}
    i = _skip(text, i + 1)
    if text[i:i + 1] == "}":
        return json.loads(text)  # {} (and whatever follows it)
    while True:
        # text[i:] is  "key" : value , ...   or   "key" : value }
        if text[i:i + 1] != '"':
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes",
                                       text, i)
        key, i = _raw_decode(text, i)
        i = _skip(text, i)
        _expect(text, i, ":", "':' delimiter")
        i = _skip(text, i + 1)
        if key == "items" and text[i:i + 1] == "[":
            items: list[Any] = []
            i = _skip(text, i + 1)
            if text[i:i + 1] == "]":
                i += 1
            else:
                while True:  # text[i:] is  item , item ... ]
                    item, i = _raw_decode(text, i)
                    items.append(item)
                    await slices.after_item()
                    i = _skip(text, i)
                    sep = _expect(text, i, ",]", "',' delimiter")
                    i = _skip(text, i + 1)
                    if sep == "]":
                        break
            value: Any = items
        else:
            value, i = _raw_decode(text, i)
        body[key] = value
        i = _skip(text, i)
        sep = _expect(text, i, ",}", "',' delimiter")
        i = _skip(text, i + 1)
        if sep == "}":
            break
    if i != len(text):
        raise json.JSONDecodeError("Extra data", text, i)
    return body

