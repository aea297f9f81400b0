"""``kvgate top``: a live view of the fleet through the gateway's admin API.

Every ``--interval`` seconds (default 1) it reads ``GET /admin/top`` and redraws one row
per replica: health, queued prompt tokens, requests in flight, KV use, token hit rate and
requests per second over the last ``--window`` seconds (from the differences of the
cumulative counters, see ``top_window``), and the route reasons of the requests routed
there in that window; under the table, the requests the gateway holds a place for and
those waiting for one, and the busiest tenants' when any tenant has requests there.
The replicas' prefix-cache counters move only when the gateway scrapes them
(``scrape.interval_s``), so the window should span several scrapes.

``--once`` reads two snapshots ``--interval`` apart, prints one frame and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
import urllib.parse
from typing import Any, NamedTuple

import aiohttp
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gateway.top_window import TopWindow, number, replica_id
from kvwire.arg_types import float_between
from kvwire.secret_source import check_bearer, resolve_secret
from kvwire.terminal_text import printable

TOKEN_ENV = "KVGATE_ADMIN_TOKEN"
# --interval and --window, in seconds: from a twentieth of a second to a day
_SECONDS = float_between(0.05, 86400.0, " seconds")


class AdminError(Exception):
    """The admin API could not be read; the message says why, as ``printable`` text (it
    may quote what the admin endpoint answered)."""

    def __init__(self, message: str) -> None:
        super().__init__(printable(message))


def admin_url(text: str) -> str:
    """The admin listener's base URL from ``http[s]://host:port`` or ``host:port`` (as the
    config writes it); an ``ArgumentTypeError`` naming ``text`` when it is none."""
    url = text if "://" in text else f"http://{text}"
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # a ValueError for a port that is no port
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"must be http://host:port, https://host:port or host:port, got {text!r}")
    return url.rstrip("/")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admin", type=admin_url, default="http://127.0.0.1:8001",
                        help="the gateway's admin listener: http://admin.host:admin.port "
                             "(or host:port)")
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token", default=None,
                       help=f"the admin token (default: ${TOKEN_ENV}; a flag's value is "
                            "seen by the machine's other users in ps)")
    token.add_argument("--token-file", default=None, metavar="PATH",
                       help="a file holding the admin token (a mounted Secret's, say)")
    parser.add_argument("--interval", type=_SECONDS, default=1.0,
                        help="seconds between reads (0.05 to 86400)")
    parser.add_argument("--window", type=_SECONDS, default=10.0,
                        help="seconds of history behind the hit rate and requests/s")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")


FETCH_TIMEOUT_S = 2.0  # for one read, whole: connecting, the answer's head and its body
MAX_SNAPSHOT_BYTES = 16 << 20  # tens of thousands of replicas; a larger answer is refused
_MAX_ERROR_BYTES = 64 << 10  # of an error's body, read for its message


class _Answer(NamedTuple):
    status: int
    reason: str
    location: str | None
    body: bytes | None  # None: longer than the bound it was read with, not read


def fetch(admin: str, token: str, timeout_s: float = FETCH_TIMEOUT_S) -> dict[str, Any]:
    """One ``/admin/top`` snapshot, read whole within ``timeout_s`` and from at most
    ``MAX_SNAPSHOT_BYTES``; ``AdminError`` with the gateway's message if refused, or
    naming what it lacks when it is no snapshot (a replica without an ``id``). The token
    goes only to ``admin``: no proxy of the environment is used and no redirect followed
    (the admin API itself never redirects)."""
    url = f"{admin.rstrip('/')}/admin/top"
    try:
        answer = asyncio.run(_get(url, token, timeout_s))
    except TimeoutError:  # before OSError, which it is
        raise AdminError(f"{url} did not answer within {timeout_s:g} s") from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise AdminError(f"cannot read {url}: {exc}") from exc
    if not 200 <= answer.status < 300:
        if 300 <= answer.status < 400:
            message = (f"a redirect to {answer.location!r}, not followed "
                       "(the admin token goes only to --admin)")
        elif answer.body is None:
            message = f"{answer.reason} (a body over {_MAX_ERROR_BYTES} bytes, not read)"
        else:
            message = _error_message(answer.body) or answer.reason
        if answer.status == 404:  # a listener without the admin API: the client port, say
            raise AdminError(f"{url} answered 404 ({message}): `kvgate top` reads the "
                             "gateway's admin listener (admin.listen in its config, with "
                             "the admin token), not its client port; give that address "
                             "with --admin")
        raise AdminError(f"{admin} answered {answer.status}: {message}")
    if answer.body is None:
        raise AdminError(f"{url} answered over {MAX_SNAPSHOT_BYTES} bytes, not read: no "
                         "fleet snapshot is that large")
    try:
        data = json.loads(answer.body.decode())  # JSON is UTF-8 (RFC 8259)
    except RecursionError:
        raise AdminError(f"{url} answered JSON nested too deep for a fleet snapshot") from None
    except ValueError as exc:
        raise AdminError(f"cannot read {url}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("replicas"), list):
        raise AdminError(f"{url} did not answer a fleet snapshot")
    for i, rep in enumerate(data["replicas"]):
        try:
            replica_id(i, rep)
        except ValueError as exc:
            raise AdminError(f"{url}: {exc}") from None
    return data


async def _get(url: str, token: str, timeout_s: float) -> _Answer:
    """``GET url`` with the token, bounded as ``fetch`` says: a ``TimeoutError`` past
    ``timeout_s`` however slowly the answer comes."""
    async with asyncio.timeout(timeout_s), aiohttp.ClientSession(
            trust_env=False, auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None)) as session, session.get(
            url, allow_redirects=False, headers={
                "Authorization": f"Bearer {token}", "Accept-Encoding": "identity"}) as resp:
        limit = MAX_SNAPSHOT_BYTES if 200 <= resp.status < 300 else _MAX_ERROR_BYTES
        body: bytes | None = None
        if resp.content_length is None or resp.content_length <= limit:
            read = bytearray()
            async for chunk in resp.content.iter_any():
                read += chunk
                if len(read) > limit:
                    break
            else:
                body = bytes(read)
        return _Answer(resp.status, resp.reason or "", resp.headers.get("Location"), body)


def _error_message(body: bytes) -> str | None:
    """The message of the gateway's error body (``{"error": {"message": ...}}``)."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return str(message)


def _rate(value: float | None, fmt: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, fmt)


MISSING = "?"  # a cell whose field the snapshot lacks, or gives as no number


def frame(snapshot: dict[str, Any], window: TopWindow, admin: str,
          error: str | None = None) -> Group:
    """The screen for the latest ``snapshot``, rates from ``window``. A field a replica's
    entry lacks (a gateway of another version) is shown as ``?`` and named under the
    table; an entry without an id is a ``ValueError`` naming it (``fetch`` refuses such a
    snapshot first)."""
    title = Text.assemble(
        ("kvgate top", "bold"), f"  {admin}  policy "
        f"{printable(snapshot.get('policy', '?'))}  window {window.window_s:g} s (replica "
        f"counters scraped every {printable(snapshot.get('scrape_interval_s', '?'))} s)")
    table = Table(expand=False)
    for name, justify in (("replica", "left"), ("health", "left"), ("queued tok", "right"),
                          ("in flight", "right"), ("KV use", "right"),
                          ("hit rate", "right"), ("req/s", "right"), ("route reasons", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    total_rps = 0.0
    gauge_only = False
    missing: set[str] = set()

    def cell(rep: dict[str, Any], key: str, fmt: str) -> str:
        value = number(rep.get(key))
        if value is None:
            missing.add(key)
            return MISSING
        return format(value, fmt)

    for i, rep in enumerate(snapshot["replicas"]):
        rid = replica_id(i, rep)
        rates = window.rates(rid)
        hit = _rate(rates.token_hit_rate, ".3f")
        gauge = number(rep.get("token_hit_rate"))
        if rep.get("query_tokens") is None and gauge is not None:
            hit, gauge_only = f"{gauge:.3f}*", True  # SGLang: a gauge
        rps = _rate(rates.requests_per_s, ".2f")
        if number(rep.get("requests")) is None:
            rps = MISSING
            missing.add("requests")
        total_rps += rates.requests_per_s or 0.0
        healthy = rep.get("healthy")
        if healthy is True:
            health = Text("healthy", "green")
        elif healthy is False:
            health = Text(f"DOWN {printable(rep.get('last_error') or '')}".strip(), "red")
        else:
            health = Text(MISSING)
            missing.add("healthy")
        reasons = ", ".join(f"{printable(k)} {v}" for k, v in sorted(
            rates.reasons.items(), key=lambda kv: -kv[1])) or "-"
        # Text, not str: a str cell is read as rich markup ('[/]' in an id raised)
        table.add_row(Text(printable(rid)), health, cell(rep, "queued_tokens", ","),
                      cell(rep, "in_flight", ","), cell(rep, "kv_usage", ".0%"),
                      hit, rps, Text(reasons))
    footer = Text(f"fleet: {len(snapshot['replicas'])} replicas, "
                  f"{_rate(total_rps, '.2f')} req/s")
    admission = snapshot.get("admission")
    if isinstance(admission, dict):  # (none from a gateway of an older version)
        held, waiting = number(admission.get("in_flight")), number(admission.get("waiting"))
        footer.append(f"; gateway: {MISSING if held is None else format(held, ',')} in "
                      f"flight, {MISSING if waiting is None else format(waiting, ',')} "
                      "waiting for a place")
    parts: list[Any] = [title, table, footer]
    if isinstance(admission, dict):
        tenants = tenants_line(admission)
        if tenants is not None:
            parts.append(tenants)
    if gauge_only:
        parts.append(Text("* the replica exports a hit-rate gauge, not counters: its own "
                          "window"))
    if missing:
        parts.append(Text(f"{MISSING} not in the gateway's snapshot (or no number): "
                          f"{', '.join(sorted(missing))}", "yellow"))
    if error:
        parts.append(Text(f"last read failed: {error}", "red"))
    return Group(*parts)


LINE_TENANTS = 5  # the busiest tenants named on the screen; the rest counted


def tenants_line(admission: dict[str, Any]) -> Text | None:
    """The busiest tenants' requests (``admission.tenants``, the busiest first), in flight
    + waiting, those past ``LINE_TENANTS`` and the snapshot's own rest counted together;
    None when no tenant has any (or the gateway does not say)."""
    listed = admission.get("tenants")
    if not isinstance(listed, list) or not listed:
        return None
    named: list[str] = []
    more, more_held, more_waiting = 0, 0.0, 0.0
    for entry in listed:
        if not isinstance(entry, dict):
            continue
        held, waiting = number(entry.get("in_flight")) or 0, number(entry.get("waiting")) or 0
        if len(named) < LINE_TENANTS:
            tenant = entry.get("tenant")
            name = "(no tenant)" if tenant is None else printable(str(tenant))
            named.append(f"{name} {held:,g}+{waiting:,g}")
        else:
            more, more_held, more_waiting = more + 1, more_held + held, more_waiting + waiting
    rest = admission.get("tenants_more")
    if isinstance(rest, dict):
        more += int(number(rest.get("tenants")) or 0)
        more_held += number(rest.get("in_flight")) or 0
        more_waiting += number(rest.get("waiting")) or 0
    if not named:
        return None
    line = Text(f"tenants (in flight+waiting): {', '.join(named)}")
    if more:
        line.append(f"; {more:,} more {more_held:,g}+{more_waiting:,g}")
    return line


def _token(args: argparse.Namespace) -> str:
    """The admin token: ``--token``'s, ``--token-file``'s, else ``$KVGATE_ADMIN_TOKEN``'s,
    stripped as the gateway strips its own (a file's line end, a Windows one too); "" for
    none. ValueError naming the file (never the token) that cannot be read or holds none."""
    if args.token_file is None:
        return (args.token or os.environ.get(TOKEN_ENV) or "").strip()
    token = resolve_secret(None, args.token_file, None, "token",
                           ("--token", "--token-file", TOKEN_ENV))
    if token is None:
        raise ValueError(f"--token-file {args.token_file!r} holds no token")
    return token


def run(args: argparse.Namespace) -> int:
    try:
        token = _token(args)
        if token:  # else urllib's error would quote the header, token and all
            check_bearer(token, "the admin token")
    except ValueError as exc:
        print(f"kvgate top: {exc}", file=sys.stderr)
        return 2
    if not token:
        print(f"kvgate top: give the admin token with --token-file, ${TOKEN_ENV} or "
              "--token", file=sys.stderr)
        return 2
    window = TopWindow(args.window)
    console = Console()
    try:
        snapshot = fetch(args.admin, token)
        window.add(time.monotonic(), snapshot)
        if args.once:
            time.sleep(args.interval)
            snapshot = fetch(args.admin, token)
            window.add(time.monotonic(), snapshot)
            console.print(frame(snapshot, window, args.admin))
            return 0
    except AdminError as exc:
        print(f"kvgate top: {exc}", file=sys.stderr)
        return 1
    try:
        with Live(frame(snapshot, window, args.admin), console=console,
                  auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                error = None
                try:
                    snapshot = fetch(args.admin, token)
                    window.add(time.monotonic(), snapshot)
                except AdminError as exc:
                    error = str(exc)  # keep the last frame; say why it is stale
                live.update(frame(snapshot, window, args.admin, error), refresh=True)
    except KeyboardInterrupt:
        return 0
