"""A load run tells an engine restarted between its scrapes by the process's start time on
its /metrics: each policy runs on a fresh fleet, so its counters before the run are 0 and
none can go back; before, such a restart went unnoticed (``replicas_restarted`` empty)."""

from __future__ import annotations

from loadtests import engine_counters
from tests.support.processes import Process, Processes
from tests.support.servers import free_port


def _engine(spawn: Processes, port: int) -> tuple[Process, str]:
    url = f"http://127.0.0.1:{port}"
    proc = spawn("engine", "--executor", "sim", "--model-name", "sim", "--kv-cache-gib", "1",
                 "--max-model-len", "4096", "--port", str(port), "--log-level", "WARNING",
                 ready_url=url + "/health")
    return proc, url


def test_s35l_an_engine_restarted_on_its_port_from_counters_of_0_is_seen(spawn: Processes
                                                                          ) -> None:
    port = free_port()
    first, url = _engine(spawn, port)
    before = [engine_counters.scrape(url)]
    assert before[0]["queries"] == 0  # a fresh engine: no counter can go back
    same = engine_counters.deltas(before, [engine_counters.scrape(url)])
    assert same.restarted == ()

    first.terminate()  # the engine stops; another starts on the same port
    first.wait(timeout=10)
    _engine(spawn, port)
    after = [engine_counters.scrape(url)]
    d = engine_counters.deltas(before, after)
    assert d.restarted == (0,)
    assert d.total("queries") == 0 and d.token_hit_rate is None
    # told by the process's start time, which the engine's /metrics exports
    assert 0 < before[0][engine_counters.STARTED] < after[0][engine_counters.STARTED]
