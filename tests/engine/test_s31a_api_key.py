"""``kvgate engine --api-key`` (``--api-key-file``, ``KVGATE_ENGINE_API_KEY``), as vLLM's and
SGLang's: with a key, every route needs ``Authorization: Bearer <key>``, the control
endpoints that drop state or stop work among them; only ``/health``, ``/version`` and
``/metrics`` stay open. A key that cannot be used stops the engine at start, named."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine import cli as engine_cli
from engine.api_key import API_KEY_ENV
from engine.server import EngineServer, build_app
from gateway.app import create_app
from gateway.config import parse_config
from gateway.state import build_state
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_servers import served_core
from tests.support.gateway_harness import Serve
from tests.support.waiting import wait_until

KEY = "engine-key-0123456789abcdef"
MODEL = "tiny-sim"
# a prompt of several full blocks of 4 tokens: cached once it is computed
COMPLETION = {"model": MODEL, "prompt": "the quick brown fox jumps over the lazy dog " * 4,
              "max_tokens": 2}
# a cache no block fits: past the key's check, the engine would stop here (named) all the
# same, before it serves
NO_BLOCK = ["--kv-cache-gib", "1e-9"]


def _keyed_engine(serve: Serve) -> tuple[EngineServer, str]:
    """A tiny sim engine served with ``KEY``: its server and URL."""
    srv = EngineServer(served_core(), load_tokenizer(None), model_name=MODEL,
                       sleep_modeled_time=True)
    return srv, serve(build_app(srv, api_key=KEY)).url


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _refused(r: httpx.Response, code: str) -> dict[str, Any]:
    """The error of a 401 refusing a request for its key (``code``), checked."""
    assert r.status_code == 401, (r.status_code, r.text)
    assert r.headers["www-authenticate"] == "Bearer"
    error: dict[str, Any] = r.json()["error"]
    assert error["type"] == "authentication_error" and error["code"] == code, error
    assert error["param"] is None and "API key" in error["message"], error
    return error


def test_with_a_key_every_route_but_the_probes_needs_it(serve: Serve) -> None:
    srv, url = _keyed_engine(serve)
    with httpx.Client(base_url=url, timeout=10) as http:
        error = _refused(http.post("/v1/completions", json=COMPLETION), "missing_api_key")
        assert "Authorization: Bearer" in error["message"]
        _refused(http.post("/v1/completions", json=COMPLETION, headers=_bearer("wrong")),
                 "invalid_api_key")
        _refused(http.post("/v1/completions", json=COMPLETION,
                           headers={"authorization": f"Basic {KEY}"}), "missing_api_key")
        # a key one character longer or shorter is another key
        _refused(http.get("/v1/models", headers=_bearer(KEY + "x")), "invalid_api_key")
        _refused(http.get("/v1/models", headers=_bearer(KEY[:-1])), "invalid_api_key")
        _refused(http.get("/no/such/route"), "missing_api_key")  # before any routing
        twice = http.get("/v1/models", headers=[("authorization", f"Bearer {KEY}")] * 2)
        assert twice.status_code == 400 and \
            twice.json()["error"]["code"] == "repeated_authorization", twice.text

        # the probes, the version and the metrics stay open
        for path in ("/health", "/version", "/metrics"):
            assert http.get(path).status_code == 200, path

        # the right key (the scheme in any case) is served
        done = http.post("/v1/completions", json=COMPLETION,
                         headers={"authorization": f"bearer {KEY}"})
        assert done.status_code == 200 and done.json()["choices"][0]["text"], done.text

        # the control endpoints: refused without the key, and nothing done
        for method, path, body in (("POST", "/reset_prefix_cache", None),
                                   ("POST", "/flush_cache", None),
                                   ("GET", "/flush_cache", None),
                                   ("POST", "/abort_request", {"abort_all": True})):
            _refused(http.request(method, path, json=body), "missing_api_key")
            _refused(http.request(method, path, json=body, headers=_bearer("no")),
                     "invalid_api_key")
        # the completion's prompt blocks were still cached: the first reset with the key
        # drops them
        reset = http.post("/reset_prefix_cache", headers=_bearer(KEY))
        assert reset.status_code == 200 and reset.json()["dropped_blocks"] > 0, reset.text
        assert http.post("/flush_cache", headers=_bearer(KEY)).status_code == 200
        assert http.post("/abort_request", json={"abort_all": True},
                         headers=_bearer(KEY)).status_code == 200
    assert srv.engine.alive


def _parsed(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    return parser.parse_args([*argv, "--kv-cache-gib", "0.05"])


def test_a_key_read_from_a_file_guards_the_served_app(
        tmp_path: Path, serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")  # as a Secret made from a file holds it
    served = engine_cli.build_served(_parsed(["--api-key-file", str(key_file),
                                              "--served-by", "r1"]))
    url = serve(served.app).url
    refused = httpx.get(f"{url}/v1/models")
    _refused(refused, "missing_api_key")
    assert refused.headers["x-kvgate-served-by"] == "r1"  # a refusal names the replica too
    listed = httpx.get(f"{url}/v1/models", headers=_bearer(KEY))
    assert listed.status_code == 200
    assert listed.json()["data"][0]["id"] == served.server.model_name
    # without any key the same flags serve every route open, as before
    assert httpx.get(f"{serve(engine_cli.build_served(_parsed([])).app).url}/v1/models"
                     ).status_code == 200


def test_a_key_the_engine_cannot_use_stops_it_at_start_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-key"
    empty.write_text(" \n")
    missing = tmp_path / "no-such-key"
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    for argv, said in (
            (["--api-key-file", str(empty)], f"--api-key-file {str(empty)!r} holds no key"),
            # a path that names nothing is not shown: it may be the key itself
            (["--api-key-file", str(missing)], f"--api-key-file (a path of "
             f"{len(str(missing))} characters, not shown in case it is the secret): No such "
             "file"),
            (["--api-key", ""], "--api-key is empty"),
            (["--api-key", " padded"], "the API key starts or ends with a space"),
            (["--api-key", KEY, "--api-key-file", str(empty)],
             "--api-key and --api-key-file are set")):
        assert engine_cli.main([*argv, *NO_BLOCK]) == 2, argv
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1 and "Traceback" not in err, err
    # the variable: an empty one is refused, and one beside the flag names both, not the key
    monkeypatch.setenv(API_KEY_ENV, "")
    assert engine_cli.main(NO_BLOCK) == 2
    assert f"{API_KEY_ENV} is empty" in capsys.readouterr().err
    monkeypatch.setenv(API_KEY_ENV, KEY)
    assert engine_cli.main(["--api-key", "other-key-0123456789", *NO_BLOCK]) == 2
    err = capsys.readouterr().err
    assert f"--api-key and {API_KEY_ENV} are set" in err and KEY not in err \
        and "other-key" not in err, err


def test_a_gateway_with_the_replicas_key_is_served_by_a_keyed_engine(serve: Serve) -> None:
    _, engine_url = _keyed_engine(serve)
    config = parse_config({"replicas": [{"id": "e", "url": engine_url, "api_key": KEY}],
                           "policy": {"name": "round_robin"},
                           "health": {"interval_s": 0.2}, "scrape": {"interval_s": 0.2}})
    state = build_state(config)
    url = serve(create_app(config, state)).url
    # the engine's model list, asked with the key, names its model to the gateway
    wait_until(lambda: state.fleet.models() == {MODEL}, 10, "the engine's model list")
    r = httpx.post(f"{url}/v1/completions", json=COMPLETION, timeout=10)
    assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
