"""What tenancy.md and gateway.md tell an operator about client API keys, against the
gateway's real app: which endpoints a key guards (every client endpoint but the probes'
and the scrape's, not only ``/v1/*``), and when a repeated ``Authorization`` header is
refused (only where the gateway reads it: with client keys)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gateway.app import create_app
from gateway.config import parse_config
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.servers import ThreadServer

DOCS = Path(__file__).resolve().parent.parent / "docs"
KEY = "acme-key-0123456789"
Serve = Callable[..., ThreadServer]


def _prose(name: str) -> str:
    text = re.sub(r"```.*?```", "", (DOCS / name).read_text(encoding="utf-8"), flags=re.S)
    return re.sub(r"\s*\n\s*", " ", text)


def _client_paths(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every route the gateway's client listener serves."""
    while not hasattr(app, "routes"):
        app = app.app  # the middleware it is wrapped in
    return [("POST" if "POST" in route.methods else "GET", route.path)
            for route in app.routes]


def _gateway(serve: Serve, keys: bool) -> tuple[str, list[tuple[str, str]]]:
    config: dict[str, Any] = {
        "replicas": [{"id": "r0", "url": serve(fake_replica(Behaviour("r0"))).url}],
        "scrape": {"enabled": False}}
    if keys:
        config["auth"] = {"api_keys": [{"key": KEY, "tenant": "acme"}]}
    app = create_app(parse_config(config))
    return serve(app).url, _client_paths(app)


def test_tenancy_md_names_the_endpoints_a_client_key_leaves_open(serve: Serve) -> None:
    url, paths = _gateway(serve, keys=True)
    open_paths = []
    with httpx.Client(base_url=url) as client:
        for method, path in paths:
            answer = client.request(method, path, json={"model": "sim-model", "prompt": "x"})
            if answer.status_code != 401:
                open_paths.append(path)
    assert "/v1/completions" not in open_paths and "/metrics" in open_paths
    named = re.search(r"makes every client endpoint except (.*?) \(which stay open",
                      _prose("tenancy.md"))
    assert named is not None, "tenancy.md no longer says which endpoints stay open"
    assert sorted(re.findall(r"`(/[\w/]+)`", named.group(1))) == sorted(open_paths)


def test_gateway_md_says_a_repeated_authorization_is_refused_only_with_client_keys(
        serve: Serve) -> None:
    twice = [("authorization", f"Bearer {KEY}"), ("authorization", "Bearer other")]
    refused = {}
    for keys in (False, True):
        url, _ = _gateway(serve, keys)
        answer = httpx.get(f"{url}/v1/models", headers=twice)
        refused[keys] = answer.status_code == 400 \
            and answer.json()["error"]["code"] == "repeated_authorization"
    assert refused == {False: False, True: True}
    sentence = re.search(r"An `Authorization` header sent twice.*?is a 400", _prose("gateway.md"))
    assert sentence is not None and "`auth.api_keys`" in sentence.group(0), sentence
