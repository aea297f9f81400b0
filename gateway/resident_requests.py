"""What this gateway knows each replica is holding in KV for it: the streamed requests it
is running, each a prompt plus the tokens generated so far.

A request counts from its first streamed byte (the replica has prefilled its whole
prompt and holds it) to its end. Its resident tokens, in the replica's tokens::

    prompt_gateway_tokens x (replica tokens per gateway token)  +  output chunks so far

(one content chunk per generated token, as vLLM and kvgate's engine stream). A
non-streamed answer is never tracked: nothing tells how far along it is.

Two requests whose prompts start alike may share KV blocks on the replica, so their
sum would overstate what it holds; ``head_key`` names a prompt's first characters so
such samples can be told apart (``prompt_head_key``).

Only the event loop thread (or the simulator's) touches this. Memory is one small record
per request in flight, which admission limits bound, and a counter per replica until it
leaves (``forget``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain

from gateway.request_parse import ParsedRequest

HEAD_CHARS = 256  # characters of a prompt that name its head (~64 tokens, ~4 KV blocks)
HEAD_IDS = 64


def prompt_head_key(parsed: ParsedRequest) -> int:
    """An identity of the prompt's first ``HEAD_CHARS`` characters (``HEAD_IDS`` ids),
    within this process; the cache salt is part of it, as it is of the replica's blocks.
    Chats read only that far into their tools and messages (``_head_text``), however large
    the rest (a tool list, an image's data)."""
    salt = parsed.cache_salt or ""
    if parsed.prompt_ids is not None:
        return hash((salt, tuple(parsed.prompt_ids[:HEAD_IDS])))
    if parsed.prompt_text is not None:
        return hash((salt, parsed.prompt_text[:HEAD_CHARS]))
    tools: list[str] = []
    head: list[str] = []
    _head_text(parsed.tools, tools, HEAD_CHARS)
    for message in parsed.messages or ():
        content = message.get("content") if isinstance(message, dict) else None
        if _head_text(content, head, HEAD_CHARS) <= 0:
            break
        head.append("\0")
    return hash((salt, "".join(tools), "".join(head)))


def _head_text(value: object, out: list[str], budget: int) -> int:
    """Append the strings (and other scalars) of ``value``, walked depth first (a dict's
    keys each before its value), to ``out`` until ``budget`` characters; returns the
    budget left. The walk keeps its own stack of iterators, one per level it is inside,
    so a value nested as deep as JSON allows (1,024 levels, past Python's recursion
    limit) is read as any other, and stops as soon as the budget is spent."""
    stack: list[Iterator[object]] = [iter((value,))]
    while stack and budget > 0:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, dict):
            stack.append(chain.from_iterable(item.items()))
        elif isinstance(item, list | tuple):
            stack.append(iter(item))
        elif item is not None:
            text = item if isinstance(item, str) else repr(item)
            out.append(text[:budget])
            budget -= len(out[-1])
    return budget


_END = object()  # an iterator's end, in _head_text


@dataclass(slots=True, eq=False)
class Resident:
    """One request a replica is running for this gateway."""

    replica: str
    prompt_gateway_tokens: int
    head_key: int
    output_tokens: Callable[[], int | None]  # generated so far (None: unknown yet)
    ended: bool = False


@dataclass(slots=True)
class _Replica:
    running: dict[Resident, None] = field(default_factory=dict)
    changes: int = 0  # requests started or ended there, ever


class ResidentRequests:
    """The tracked requests by replica, and a count of changes per replica (a sample
    taken while it did not move saw one stable set)."""

    def __init__(self, known: Callable[[str], bool] | None = None) -> None:
        self._replicas: dict[str, _Replica] = {}
        self._known = known  # whether a replica is in the fleet (None: any is)

    def started(self, replica: str, prompt_gateway_tokens: int, head_key: int,
                output_tokens: Callable[[], int | None]) -> Resident:
        """A request's first streamed byte came from ``replica``. One that left the
        fleet meanwhile (``forget`` came first) keeps no record: a record made after its
        ``forget`` was never dropped, one per departed replica (a Kubernetes rollout's
        pod names, each seen once)."""
        entry = Resident(replica, prompt_gateway_tokens, head_key, output_tokens)
        if self._known is not None and not self._known(replica):
            entry.ended = True
            return entry
        slot = self._replicas.setdefault(replica, _Replica())
        slot.running[entry] = None
        slot.changes += 1
        return entry

    def ended(self, entry: Resident) -> None:
        """The request ended, however (idempotent)."""
        if entry.ended:
            return
        entry.ended = True
        slot = self._replicas.get(entry.replica)
        if slot is not None and slot.running.pop(entry, False) is None:
            slot.changes += 1

    def running(self, replica: str) -> Sequence[Resident]:
        slot = self._replicas.get(replica)
        return tuple(slot.running) if slot is not None else ()

    def changes(self, replica: str) -> int:
        """Starts and ends at ``replica`` so far (kept until ``forget``)."""
        slot = self._replicas.get(replica)
        return slot.changes if slot is not None else 0

    def forget(self, replica: str) -> None:
        """The replica left: its requests end without being counted again."""
        slot = self._replicas.pop(replica, None)
        for entry in slot.running if slot is not None else ():
            entry.ended = True
