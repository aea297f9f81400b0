"""A file's lines read within a bound: a line longer than the bound is named, never held
(one line of ``/dev/zero``, read whole, grew without end)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

PIECE_BYTES = 1 << 20  # a line is read at most this much at a time


def bounded_lines(path: str | Path, max_line_bytes: int
                  ) -> Iterator[tuple[int, bytes | None]]:
    """``path``'s lines that are not blank, each with its newline and its number (from 1);
    ``None`` for one longer than ``max_line_bytes``, whose pieces are let go as they are
    read."""
    with open(path, "rb") as f:
        number = 0
        while True:
            pieces: list[bytes] = []  # of the line being read, while within the bound
            size = 0  # the line's bytes read so far
            while True:
                piece = f.readline(PIECE_BYTES)
                size += len(piece)
                if size <= max_line_bytes:
                    pieces.append(piece)
                else:
                    pieces.clear()
                if piece.endswith(b"\n") or not piece:  # the line, or the file, ended
                    break
            if not size:
                return
            number += 1
            if size > max_line_bytes:
                yield number, None
            else:
                line = b"".join(pieces)
                if line.strip():
                    yield number, line
