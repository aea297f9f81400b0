"""Reading a file the process was pointed at (a secret, a tokenizer's files): a regular
file only (or a link to one, as a mounted Kubernetes Secret's are), opened without waiting
(opening a FIFO waits for a writer: a start-up hung, silent), its size told before a byte
is read, and at most a bound of bytes read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISSOCK, "a socket"))


class NotRegularFile(ValueError):
    """The path is no regular file: ``kind`` says what it is ("a FIFO", ...)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class FileTooLarge(ValueError):
    """The file holds ``size`` bytes, more than the bound (told by its size, unread)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def read_regular(file: str | Path, limit: int) -> bytes:
    """``file``'s bytes, at most ``limit`` + 1 of them (one that grew past ``limit`` as it
    was read: the caller tells by the length). NotRegularFile, FileTooLarge, or the
    OSError that opening or reading it raised."""
    fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(next((name for test, name in _NOT_REGULAR
                                       if test(st.st_mode)), "something else"))
        if st.st_size > limit:
            raise FileTooLarge(st.st_size)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)
