"""Flags that shape the replicas of a simulated or a local fleet alike (``loadtests.simulate``
and ``loadtests.run``): devices slower than the profile's, usage without cached tokens."""

from __future__ import annotations

import argparse

from kvwire.arg_types import slowdowns


def add_fleet_flags(parser: argparse.ArgumentParser, replicas: str) -> None:
    """``--no-cached-report`` (``cached_report``) and ``--slowdown`` (``slowdown``);
    ``replicas``: what the fleet's replicas are, in the help ("the engines")."""
    parser.add_argument("--no-cached-report", dest="cached_report", action="store_false",
                        help=f"{replicas}' usage tells no cached tokens, as vLLM's without "
                             "--enable-prompt-tokens-details and SGLang's without "
                             "--enable-cache-report (the gateway reads 0 cached; the hit "
                             "rates reported still count every cache hit)")
    parser.add_argument("--slowdown", type=slowdowns, default=(), metavar="F,F,...",
                        help=f"how many times slower than the profile's device each of "
                             f"{replicas}' is, r0 first (1 for those not named): --slowdown "
                             "1,1,1,3 makes r3's three times slower (a fleet of mixed or "
                             "throttled devices)")
