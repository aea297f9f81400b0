"""Replicas that run several data-parallel ranks behind one API server.

vLLM with ``--data-parallel-size N`` (its internal load balancer) and SGLang with
``--dp-size N`` serve N engines, each with its own KV cache and queue, on one port. Their
server spreads requests over the ranks by queue length alone, so a prefix routed to the
replica lands on any rank: a cache-aware router in front loses most of its hits. Both
servers take the rank a request must go to in the ``X-Data-Parallel-Rank`` header.

A replica configured with ``data_parallel_size: N`` is therefore N members of the fleet,
one per rank, with the ids ``<id>.dp0`` ... ``<id>.dp<N-1>``: each is routed to, loaded,
ejected and indexed on its own, and every request sent to one carries its rank's header.
Each rank's figures are read from the replica's ``/metrics`` by their rank label (vLLM's
``engine``, SGLang's ``dp_rank``), and its KV events from the rank's own endpoint: the
configured one with its port plus the rank, as both engines publish them (``inproc://``:
``_dp<rank>`` appended, as vLLM names it; ``ipc://`` likewise, which vLLM refuses with
data parallelism and some builds suffix so).
"""

from __future__ import annotations

import re

RANK_HEADER = "x-data-parallel-rank"
MAX_RANKS = 256
# the samples of one rank in a replica's /metrics: vLLM's engine index, SGLang's dp rank
RANK_LABELS = ("engine", "dp_rank")
_RANK_SUFFIX = re.compile(r"\.dp(\d+)\Z")


def rank_id(group: str, rank: int) -> str:
    """The fleet id of ``group``'s rank ``rank``."""
    return f"{group}.dp{rank}"


def group_of(replica_id: str) -> str:
    """The replica a rank's id belongs to (``id`` itself when it names no rank)."""
    found = _RANK_SUFFIX.search(replica_id)
    return replica_id[:found.start()] if found else replica_id


def names_rank(replica_id: str) -> int | None:
    """The rank ``replica_id`` ends with (``.dp<k>``), else None."""
    found = _RANK_SUFFIX.search(replica_id)
    return int(found.group(1)) if found else None


def rank_endpoint(endpoint: str, rank: int) -> str:
    """Where rank ``rank`` publishes what ``endpoint`` names for rank 0: a ``tcp://``
    endpoint's port plus the rank, another's name with ``_dp<rank>`` appended.
    ValueError naming the endpoint when its port would pass 65535."""
    if rank == 0:
        return endpoint
    if not endpoint.startswith("tcp://"):
        return f"{endpoint}_dp{rank}"
    head, _, port = endpoint.rpartition(":")
    if not (port.isascii() and port.isdigit()):
        raise ValueError(f"endpoint {endpoint!r} names no port to offset by rank {rank}")
    moved = int(port) + rank
    if moved > 65535:
        raise ValueError(f"endpoint {endpoint!r}: rank {rank} would publish on port {moved}, "
                         "past 65535")
    return f"{head}:{moved}"
