"""Bad values are named as sent: a chat part's text that is not a string (its value, not
only its type), and a KV event batch's data parallel rank that is a boolean (no rank: it
was read as rank 1, and the batch's events were applied to that rank's index)."""

from __future__ import annotations

import msgpack
import pytest

from kvwire.chat_messages import ChatFormatError, normalize_messages
from kvwire.kv_event_format import AllBlocksCleared, KVEventBatch, decode_payload


@pytest.mark.parametrize(("text", "named"), [(5, "got 5"), ([1, 2], "got an array of 2")])
def test_a_text_part_that_is_not_a_string_is_named_with_its_value(text: object,
                                                                  named: str) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    with pytest.raises(ChatFormatError) as refused:
        normalize_messages(messages)
    assert refused.value.param == "messages[0].content[0].text"
    assert named in str(refused.value), str(refused.value)


@pytest.mark.parametrize("rank", [True, False])
def test_a_boolean_rank_is_no_rank(rank: bool) -> None:
    raw = msgpack.packb([2.0, [["AllBlocksCleared"]], rank])
    assert decode_payload(raw) == KVEventBatch(2.0, (AllBlocksCleared(),))
    assert decode_payload(raw).data_parallel_rank is None
