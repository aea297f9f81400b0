"""A ``/v1/responses`` stream whose generation fails mid-way (a step of its engine
raises) ends as OpenAI's does: an ``error`` event, then the terminal ``response.failed``
whose response has ``status: "failed"`` and the ``error`` (code, message), which the
official client's stream reads as its last event."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.engine_cores import FailsAfter
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
GOOD_STEPS = 4  # steps computed before the device fails


@pytest.fixture
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL, executor=lambda inner: FailsAfter(
        inner, GOOD_STEPS, "device fault"))


def test_a_stream_that_fails_mid_way_ends_with_response_failed(live: LiveEngine) -> None:
    events = list(live.client.responses.create(model=MODEL, input="a long story",
                                               stream=True, max_output_tokens=50))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created"
    assert "response.output_text.delta" in kinds  # it failed after it had begun
    assert kinds[-2:] == ["error", "response.failed"], kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    failed = events[-1].response  # type: ignore[union-attr]
    assert failed.status == "failed" and failed.id == events[0].response.id  # type: ignore[union-attr]
    # the response's code is OpenAI's; the engine's own is in its message
    assert failed.error is not None and failed.error.code == "server_error"
    assert failed.error.message.startswith("engine_step_failed: ")
    assert "device fault" in failed.error.message
    text = "".join(e.delta for e in events  # type: ignore[union-attr]
                   if e.type == "response.output_text.delta")
    # what came before the failure, as an incomplete message
    assert failed.output_text == text and failed.output[0].status == "incomplete"
    assert failed.usage is not None and 0 < failed.usage.output_tokens < 50
