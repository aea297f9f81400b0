import pytest

from loadtests.bench_proxy import _prefix_tokenize_ms
from loadtests.gateway_cpu import documents


def test_the_prefix_tokenizing_cost_is_timed_back_to_back_and_spaced() -> None:
    out = _prefix_tokenize_ms(documents(4, words=1500))
    assert set(out) == {"back_to_back", "spaced_10ms"}
    assert all(v > 0 for v in out.values())


@pytest.mark.slow
def test_the_floor_proxy_relays_the_backend_answer_unchanged_and_is_measured() -> None:
    """The minimal streaming pass-through answers what the backend answers, byte for byte,
    streamed or not, and ``_floor_cpu`` measures its CPU per request for each kind."""
    import argparse
    import os
    import urllib.request

    from loadtests.bench_proxy import _floor_cpu, _stop, _wait, uvicorn_app
    from loadtests.gateway_cpu import bodies

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    backend, base = uvicorn_app("loadtests.bench_proxy:backend_app", env)
    try:
        _wait(f"{base}/health", backend)
        prompts = documents(2, words=50)
        proxy, proxied = uvicorn_app("loadtests.proxy_clients:aiohttp_stream_app",
                                     dict(env, BENCH_BACKEND=base))
        try:
            _wait(f"{proxied}/health", proxy)
            for stream in (True, False):
                body = bodies(prompts, stream)[0]

                def answer(url: str, body: bytes = body) -> bytes:
                    req = urllib.request.Request(url + "/v1/completions", data=body)
                    with urllib.request.urlopen(req, timeout=10) as r:
                        return r.read()
                direct = answer(base)
                assert direct == answer(proxied)
                assert (b"data: [DONE]" in direct) == stream
        finally:
            _stop(proxy)
        args = argparse.Namespace(rate=50.0, cpu_seconds=0.4)
        out = _floor_cpu(base, env, prompts, args)
        assert set(out) == {"stream_repeated", "stream_fresh", "plain_repeated"}
    finally:
        _stop(backend)
