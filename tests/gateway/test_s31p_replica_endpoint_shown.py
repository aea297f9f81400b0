"""A replica's KV event endpoint that is refused is named in a bounded message (its start),
as every other config value is: a 2 MB endpoint string was echoed whole in the error (and
in the admin API's 400)."""

from __future__ import annotations

import pytest

from gateway.config import ReplicaConfig


@pytest.mark.parametrize("key", ["kv_events", "kv_events_replay"])
@pytest.mark.parametrize("value", ["x" * 2_000_000,  # no ZMQ scheme
                                   "tcp://" + "h" * 2_000_000 + ":0"])  # port 0
def test_a_refused_endpoint_is_named_by_its_start(key: str, value: str) -> None:
    with pytest.raises(ValueError) as refused:
        ReplicaConfig(id="r0", url="http://127.0.0.1:8000", **{key: value}).validate()
    message = str(refused.value)
    assert message.startswith(f"{key} '"), message[:200]
    assert len(message) < 300, len(message)
