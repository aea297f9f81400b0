"""Cheap identities of a prompt's pieces, for policies that match whole prompts.

Tokenizing a 6,000-token prompt costs ~10 ms of CPU; hashing its ~24 KB of text in
``chunk_chars`` pieces costs tens of microseconds. Two prompts share their first ``k``
chunk hashes exactly when they share their first ``k x chunk_chars`` characters (up to a
2^-32 chance per piece), which is what a prefix cache rewards. A prompt given as token ids
is cut every ``IDS_PER_CHUNK`` ids instead.

Each piece's hash is CRC-32 of its UTF-8 bytes: stable across processes, and computed in
C. The last piece may be shorter.
"""

from __future__ import annotations

from collections.abc import Sequence
from zlib import crc32

from policies.ring import token_bytes

IDS_PER_CHUNK = 16


def text_chunks(text: str, chunk_chars: int) -> list[int]:
    """CRC-32 of each ``chunk_chars`` characters of ``text``."""
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars!r}")
    if text.isascii():  # a character is a byte: encoded once, cut as bytes (a third less)
        data = text.encode("ascii")
        return [crc32(data[i : i + chunk_chars]) for i in range(0, len(data), chunk_chars)]
    return [crc32(text[i : i + chunk_chars].encode("utf-8", "surrogatepass"))
            for i in range(0, len(text), chunk_chars)]


def id_chunks(ids: Sequence[int]) -> list[int]:
    """CRC-32 of each ``IDS_PER_CHUNK`` token ids (u32 little-endian)."""
    data = token_bytes(ids)
    step = 4 * IDS_PER_CHUNK
    return [crc32(data[i : i + step]) for i in range(0, len(data), step)]
