"""A KV event payload whose bad field nests deeper than ``repr`` goes is one malformed
event, skipped and counted, not an error out of the decoder: the other events of the
batch are kept."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from kvwire.kv_event_format import (
    AllBlocksCleared,
    BlockRemoved,
    KVWireError,
    decode_payload,
)
from tests.support.nesting import nested


@pytest.mark.parametrize("bad", [
    ["BlockRemoved", [nested(1000)], "GPU"],
    ["BlockStored", [1], None, [1] * 16, nested(1000), None, "GPU", None],
    {"type": nested(1000)},
])
def test_a_deeply_nested_bad_field_is_one_malformed_event(bad: Any) -> None:
    payload = msgpack.packb([1.0, [bad, ["BlockRemoved", [7], "GPU"],
                                   ["AllBlocksCleared"]], 0])
    batch = decode_payload(payload)
    assert batch.malformed == 1
    assert batch.events == (BlockRemoved((7,)), AllBlocksCleared())


def test_a_deeply_nested_batch_is_a_wire_error_naming_a_bounded_value() -> None:
    with pytest.raises(KVWireError, match=r"payload events must be a list, got \{") as err:
        decode_payload(msgpack.packb({"ts": 1.0, "events": {"x": nested(1000)}}))
    assert len(str(err.value)) < 300
