"""KV events' fields beyond a block's hashes and tokens, kept as the subscriber applies
them: a salted chain's extra keys when a long stored run is applied in slices."""

from __future__ import annotations

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from kvwire.kv_event_format import BlockStored, KVEventBatch, encode_payload
from policies.kv_index import KVIndex
from tests.support.servers import free_port


def _fleet() -> Fleet:
    return Fleet([ReplicaConfig("r0", "http://127.0.0.1:1",
                                kv_events=f"tcp://127.0.0.1:{free_port()}")])


def _frames(seq: int, payload: bytes) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), payload]


async def test_a_salted_run_applied_in_slices_keeps_its_salt() -> None:
    # one stored run past a slice (8,192 blocks): block 0 is hashed over a cache salt, so
    # no unsalted prompt's tokens may match any of the run; its slices dropped the extra
    # keys and indexed the salted tenant's document for everyone
    n = 8_200
    tokens = tuple(i % 50_000 for i in range(16 * n))
    salted = BlockStored(tuple(range(1, n + 1)), None, tokens, 16,
                         extra_keys=(("tenant-salt",),) + (None,) * (n - 1))
    index = KVIndex(16)
    sub = KVEventSubscriber(_fleet(), index)
    await sub.receive("r0", _frames(0, encode_payload(KVEventBatch(0.0, (salted,), 0))),
                      None)
    assert index.match(tokens[:64], ["r0"]) == {"r0": 0}
    # the first slice is keyed elsewhere, the next one's parent is unknown
    assert index.num_blocks("r0") == 0
    assert index.stats.keyed_elsewhere + index.stats.orphans == n
    index.check_integrity()
