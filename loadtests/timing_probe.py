"""Can one tenant learn from its own time to first token what another tenant sent?

The probe: for each of ``n`` fresh documents, the victim tenant sends it, or not (a coin
flip); then the attacker sends the same document and times its first token. If the victim
sending it makes the attacker's answer faster (a prefix-cache hit anywhere: a replica, or a
cache in the gateway), the attacker can classify: the ROC AUC of "faster means sent" is
near 1. Where tenants are isolated it stays at chance, 0.5. Run within one tenant (attacker
= victim), the same probe shows what the cache gives a tenant that is allowed to see it.

``python -m loadtests.timing_probe --probes 400`` starts a local fleet (sim engines with a
realistic cost model) behind a gateway with ``tenancy.isolate`` on and prints both AUCs as
JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from kvwire.arg_types import positive_int
from loadtests.error_events import error_told
from loadtests.json_out import print_json

TENANT_HEADER = "x-kvgate-tenant"
SECRET = "timing-probe-secret-0123456789abcdef"


def auc(sent: Sequence[float], not_sent: Sequence[float]) -> float:
    """P(a probe after the victim sent it is faster than one after it did not), ties 1/2."""
    wins = 0.0
    for a in sent:
        for b in not_sent:
            wins += 1.0 if a < b else 0.5 if a == b else 0.0
    return wins / (len(sent) * len(not_sent))


def document(rng: random.Random, words: int) -> str:
    return " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                            for _ in range(rng.randint(2, 9))) for _ in range(words))


def ttft(http: httpx.Client, model: str, prompt: str, tenant: str) -> float:
    """Seconds to the first event of ``prompt``'s streamed completion; a ``RuntimeError``
    naming it when that event is an error (nested under ``error``, or flat beside
    ``"object": "error"``: older vLLM's, SGLang's), or when none came before ``[DONE]``."""
    started = time.perf_counter()
    with http.stream("POST", "/v1/completions", headers={TENANT_HEADER: tenant},
                     json={"model": model, "prompt": prompt, "max_tokens": 2,
                           "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            took = time.perf_counter() - started
            if line == "data: [DONE]":
                break
            if error_told(json.loads(line[len("data: "):])) is not None:
                raise RuntimeError(f"the stream's first event is an error: {line[:300]}")
            return took
    raise RuntimeError("the stream ended without an event")


def probe(gateway: str, model: str, attacker: str, victim: str, probes: int, words: int,
          seed: int = 0) -> float:
    """The AUC over ``probes`` documents (at least 2), half of them (rounded down) sent by
    ``victim`` first, in a random order: a coin per document left one side empty now and
    then, and the AUC with it."""
    if probes < 2:
        raise ValueError(f"probes must be at least 2 (some sent by the victim first, some "
                         f"not), got {probes!r}")
    rng = random.Random(seed)
    sent_first = [i < probes // 2 for i in range(probes)]
    rng.shuffle(sent_first)
    sent: list[float] = []
    not_sent: list[float] = []
    with httpx.Client(base_url=gateway, timeout=60) as http:
        for by_victim in sent_first:
            doc = document(rng, words)
            if by_victim:
                ttft(http, model, doc, victim)
            (sent if by_victim else not_sent).append(ttft(http, model, doc, attacker))
    return auc(sent, not_sent)


def gateway_config() -> dict[str, Any]:
    """Tenancy as an operator isolating tenants would set it."""
    return {"tenancy": {"isolate": True, "secret": SECRET, "require_tenant": True},
            "trusted_proxies": ["127.0.0.0/8"]}


def _probes(text: str) -> int:
    """argparse type of ``--probes``: at least 2, so that both sides of the AUC have one."""
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2 (some documents sent by the "
                                         f"victim first, some not), got {value}")
    return value


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from loadtests.local_fleet import LocalFleet, LocalFleetSpec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probes", type=_probes, default=400,
                    help="documents probed (at least 2: half sent by the victim first)")
    ap.add_argument("--words", type=positive_int, default=300)
    ap.add_argument("--replicas", type=positive_int, default=2)
    ap.add_argument("--policy", default="prefix_affinity")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    spec = LocalFleetSpec(replicas=args.replicas, policy={"name": args.policy},
                          engine_args=("--model-name", "sim-model"),
                          gateway_config=gateway_config())
    # a directory of its own: the default one's fleet (``kvgate fleet up --detach``) would
    # refuse it
    with tempfile.TemporaryDirectory(prefix="kvgate-timing-probe-") as state_dir, \
            LocalFleet(spec, Path(state_dir)) as fleet:
        url = fleet.gateway_url
        report = {
            "probes": args.probes, "words": args.words, "policy": args.policy,
            "auc_across_tenants": round(probe(url, "sim-model", "attacker", "victim",
                                              args.probes, args.words, seed=1), 3),
            "auc_within_a_tenant": round(probe(url, "sim-model", "victim", "victim",
                                               args.probes, args.words, seed=2), 3),
        }
    print_json(report, args.json)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
