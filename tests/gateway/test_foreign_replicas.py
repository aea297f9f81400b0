"""The gateway in front of replicas it did not write: what vLLM and SGLang really send."""

from __future__ import annotations

import zmq

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from policies.kv_index import KVIndex
from tests.support import foreign_vllm as vllm
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

CHAIN = list(range(48))  # three blocks of 16
OTHER = list(range(100, 116))


async def test_blocks_offloaded_to_cpu_and_evicted_there_stay_on_the_gpu() -> None:
    """vLLM's KV offloading publishes its CPU copies, and their eviction, on the GPU's
    stream under the same hashes: neither is a change to the GPU's prefix cache."""
    ctx = zmq.Context()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1", kv_events=endpoint)])
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet, index, reconcile_s=0.05)
    await sub.start()
    hashes: list[int | bytes] = [2**63 + 1, 2, b"\x07" * 32]
    try:
        first = vllm.kv_message(0, [vllm.block_stored(hashes, None, CHAIN)])
        await wait_until_async(lambda: index.match([*CHAIN, 1], ["r0"]) == {"r0": 3}, 10,
                               "the GPU's blocks in the index",
                               retry=lambda: pub.send_multipart(first))
        pub.send_multipart(vllm.kv_message(1, [vllm.offloaded(hashes)]))
        pub.send_multipart(vllm.kv_message(2, [vllm.block_removed(hashes[1:], "CPU")]))
        pub.send_multipart(vllm.kv_message(3, [vllm.block_stored([9], None, OTHER)]))
        await wait_until_async(lambda: index.match([*OTHER, 1], ["r0"]) == {"r0": 1}, 10,
                               "the messages after the offload applied")
        assert index.match([*CHAIN, 1], ["r0"]) == {"r0": 3}
        assert sub.malformed == 0
        pub.send_multipart(vllm.kv_message(4, [vllm.block_removed(hashes[1:])]))
        await wait_until_async(lambda: index.match([*CHAIN, 1], ["r0"]) == {"r0": 1}, 10,
                               "the GPU's eviction applied")
    finally:
        await sub.stop()
        pub.close()
        ctx.term()
