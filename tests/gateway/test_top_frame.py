"""``kvgate top``'s frame: what one screen shows for a snapshot."""

from __future__ import annotations

import io

from rich.console import Console

from gateway.top import frame
from gateway.top_window import TopWindow


def rendered(window: TopWindow, snapshot: dict[str, object]) -> str:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(
        frame(snapshot, window, "http://127.0.0.1:8001", error="timed out"))
    return out.getvalue()


def test_frame_shows_rates_health_and_a_gauge_only_replica() -> None:
    rep = {"id": "r0", "healthy": True, "queued_tokens": 1234, "in_flight": 2,
           "kv_usage": 0.5, "token_hit_rate": 0.4}
    down = {**rep, "id": "r1", "healthy": False, "last_error": "connect refused"}
    sglang = {**rep, "id": "r2", "token_hit_rate": 0.25, "hit_tokens": None,
              "query_tokens": None}
    window = TopWindow(10)

    def snap(hits: int, queries: int, affinity: int) -> dict[str, object]:
        counted = {"hit_tokens": hits, "query_tokens": queries, "requests": affinity,
                   "reasons": {"affinity": affinity}}
        return {"policy": "cost", "scrape_interval_s": 1.0,
                "replicas": [{**rep, **counted}, {**down, **counted},
                             {**sglang, "requests": 0, "reasons": {}}]}

    window.add(0.0, snap(0, 0, 0))
    window.add(2.0, snap(750, 1000, 6))
    screen = rendered(window, snap(750, 1000, 6))
    lines = {line.split("│")[1].strip(): line for line in screen.splitlines()
             if line.startswith("│")}
    assert "policy cost" in screen and "window 10 s" in screen
    assert "healthy" in lines["r0"] and "1,234" in lines["r0"] and "50%" in lines["r0"]
    assert "0.750" in lines["r0"] and "3.00" in lines["r0"] and "affinity 6" in lines["r0"]
    assert "DOWN connect refused" in lines["r1"]
    assert "0.250*" in lines["r2"] and "hit-rate gauge" in screen
    assert "fleet: 3 replicas, 6.00 req/s" in screen
    assert "last read failed: timed out" in screen


def test_text_from_replicas_is_shown_as_text_never_as_terminal_codes_or_markup() -> None:
    """A replica's error message (its own error body's words), ids and reasons reach the
    operator's terminal as printable text: escape sequences and rich markup are shown, not
    obeyed."""
    rep = {"id": "r0[/]", "healthy": False, "queued_tokens": 0, "in_flight": 0,
           "kv_usage": 0.0, "token_hit_rate": None, "hit_tokens": 1, "query_tokens": 2,
           "requests": 0, "reasons": {}, "last_error": "\x1b]0;owned\x07\x1b[2J\r\n[red]x"}
    window = TopWindow(10)
    snapshot: dict[str, object] = {"policy": "cost\x1b[5m", "scrape_interval_s": 1.0,
                                   "replicas": [rep]}
    window.add(0.0, snapshot)
    window.add(1.0, {**snapshot, "replicas": [
        {**rep, "requests": 1, "reasons": {"[bold]odd\x1b[2J": 1}}]})
    screen = rendered(window, snapshot)
    assert "\x1b" not in screen and "\x07" not in screen and "\r" not in screen
    assert "policy cost\\x1b[5m" in screen and "r0[/]" in screen
    assert "DOWN \\x1b]0;owned\\x07\\x1b[2J\\x0d\\x0a[red]x" in screen
    assert "[bold]odd\\x1b[2J 1" in screen
