"""Waits on conditions: tests poll what they expect instead of sleeping a guessed time."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from subprocess import Popen
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.02


def wait_until(predicate: Callable[[], T], timeout_s: float = 10.0, what: str = "the condition",
               retry: Callable[[], object] | None = None, retry_every_s: float = 1.0) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; raise
    ``AssertionError`` naming ``what`` after ``timeout_s`` seconds. ``retry`` runs every
    ``retry_every_s`` while waiting (to resend what a late subscriber missed)."""
    deadline = time.monotonic() + timeout_s
    last_retry = time.monotonic()
    while True:
        got = predicate()
        if got:
            return got
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        if retry is not None and now - last_retry >= retry_every_s:
            retry()
            last_retry = now
        time.sleep(POLL_S)


async def wait_until_async(predicate: Callable[[], T], timeout_s: float = 10.0,
                           what: str = "the condition",
                           retry: Callable[[], object] | None = None) -> T:
    """``wait_until`` for a test on the event loop: the loop runs while it waits;
    ``retry`` runs before every poll."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        if retry is not None:
            retry()
        await asyncio.sleep(POLL_S)


def answers_200(url: str, proc: Popen[bytes] | None = None) -> bool:
    """Whether ``url`` answers 200 now; raises when ``proc`` (its server) has exited."""
    if proc is not None and proc.poll() is not None:
        raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def wait_http(url: str, timeout_s: float = 30.0, proc: Popen[bytes] | None = None) -> None:
    """Wait until ``url`` answers 200 (and ``proc``, when given, is still running)."""
    wait_until(lambda: answers_200(url, proc), timeout_s, f"{url} to answer 200")
