"""Markdown report of a load run: a table per policy and PNG plots next to it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtests.plots import plot_policies, plot_replica_load

COLUMNS = (
    ("policy", None),
    ("token hit rate", "token_hit_rate"),
    ("prefill tokens", "prefill_tokens"),
    ("requests ok / failed", None),
    ("TTFT p50 (s)", "ttft_p50_s"),
    ("TTFT p95 (s)", "ttft_p95_s"),
    ("TTFT p99 (s)", "ttft_p99_s"),
    ("e2e p50 (s)", "e2e_p50_s"),
    ("requests per replica", "replica_requests"),
)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return " / ".join(_cell(v) for v in value)
    return str(value)


def table(policies: Mapping[str, Mapping[str, Any]]) -> str:
    """A Markdown table, one row per policy."""
    lines = ["| " + " | ".join(c for c, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for name, r in policies.items():
        cells = []
        for title, key in COLUMNS:
            if title == "policy":
                cells.append(name)
            elif key is None:
                cell = f"{r['requests_ok']:,} / {r['requests_failed']:,}"
                notes = []
                if r.get("requests_unfinished"):
                    notes.append(f"{r['requests_unfinished']:,} unanswered at the end")
                if r.get("requests_unsent"):
                    notes.append(f"{r['requests_unsent']:,} due but never sent: every "
                                 "client was busy")
                if r.get("requests_failed"):
                    notes.append(f"{r['requests_failed']:,} failed")
                if notes and r.get("ttft_censored"):
                    notes.append(f"{r['ttft_censored']:,} without a first token or a whole "
                                 "answer, in TTFT at their wait so far: a lower bound")
                if notes:
                    cell += f" ({'; '.join(notes)})"
                cells.append(cell)
            else:
                cells.append(_cell(r.get(key)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratios(policies: Mapping[str, Mapping[str, Any]]) -> list[str]:
    base = policies.get("round_robin")
    if not base:
        return []
    out = []
    for name, r in policies.items():
        if name == "round_robin":
            continue
        # None: the engines counted no lookup in that run (not measured)
        if r["token_hit_rate"] is None:
            line = f"- {name}: token hit rate not measured"
        elif base["token_hit_rate"] is None:
            line = f"- {name}: token hit rate {r['token_hit_rate']:.3f} (round_robin's not " \
                "measured)"
        else:
            hit = (r["token_hit_rate"] / base["token_hit_rate"]
                   if base["token_hit_rate"] else float("inf"))
            line = f"- {name}: token hit rate {hit:.1f} x round_robin's"
        if r.get("ttft_p95_s") and base.get("ttft_p95_s"):
            line += f", p95 TTFT {r['ttft_p95_s'] / base['ttft_p95_s']:.2f} x round_robin's"
        out.append(line)
    return out


def write_report(report_dir: Path, cfg: Any, results: Mapping[str, Mapping[str, Any]],
                 failed: Mapping[str, str] | None = None) -> Path:
    """``report.md`` plus ``hit_rate_ttft.png`` and ``replica_load.png`` in ``report_dir``
    (the plots when a policy ran); ``failed``: the policies whose run failed, and why."""
    report_dir.mkdir(parents=True, exist_ok=True)
    if results:
        # a hit rate not measured (None) is drawn labelled so (NaN to the plot), not as a
        # rate of 0
        plot_policies(report_dir / "hit_rate_ttft.png",
                      {k: (math.nan if v["token_hit_rate"] is None else v["token_hit_rate"],
                           v["ttft_s"]) for k, v in results.items()},
                      title=f"{cfg.scenario}: {cfg.replicas} replicas, {cfg.rate:g} req/s "
                      "target")
        plot_replica_load(report_dir / "replica_load.png",
                          {k: v["replica_prefill_tokens"] for k, v in results.items()},
                          title="prefill tokens computed per replica (engines' counters)")
    rows = {k: {kk: vv for kk, vv in v.items() if kk != "ttft_s"} for k, v in results.items()}
    failures = [f"- **{name}** failed: `{why}`" for name, why in (failed or {}).items()]
    config = asdict(cfg)
    text = "\n".join([
        f"# Load run: {cfg.scenario}",
        "",
        f"{cfg.replicas} sim replicas (profile `{Path(cfg.profile).stem}`, "
        f"{cfg.kv_cache_gib:g} GiB KV each, eviction {cfg.eviction}) behind the gateway; "
        f"Locust with {cfg.users} users at a target of {cfg.rate:g} requests/s for "
        f"{cfg.duration_s:g} s per policy, a fresh fleet per policy.",
        "Token hit rate and prefill tokens come from the engines' own counters "
        "(`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`, scraped "
        "before and after; `-` where they counted no lookup: not measured); TTFT is "
        "measured by the client from when each request was due (its Poisson arrival, "
        "later than its send only when every client was busy) to its first streamed "
        "content, over the requests answered, those unanswered when the run "
        "stopped, those due by then that no client was free to send (one with no first "
        "token yet at how long it had waited: a lower bound) and the failed ones (at how "
        "long they had waited when the run stopped, as never answered: a router that "
        "fails requests fast is not timed as fast).",
        "",
        table(rows),
        "",
        *_ratios(rows),
        "",
        *([] if not failures else ["## Failed", "", *failures, ""]),
        *([] if not results else [
            "![token hit rate and TTFT CDF](hit_rate_ttft.png)",
            "",
            "![prefill tokens per replica](replica_load.png)",
            ""]),
        "## Configuration",
        "",
        "```",
        *(f"{k}: {v}" for k, v in config.items()),
        "```",
        "",
    ])
    path = report_dir / "report.md"
    path.write_text(text)
    return path
