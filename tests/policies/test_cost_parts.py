"""The ``cost`` policy's parts on their own: the replicas' cache models, the scratch set and
the prefix keys (their work inside the policy is in ``test_cost``)."""

import random

import pytest

from policies.base import ReplicaView, RouteRequest
from policies.cache_model import PromptChain
from policies.cost_config import CostConfig
from policies.prefix_keys import PrefixKeys
from policies.replica_models import ReplicaModels
from policies.ring import RingCache, token_bytes
from policies.scratch_set import ScratchSet


def chain(seed: int, pieces: int = 64) -> PromptChain:
    rng = random.Random(seed)
    units = token_bytes([rng.getrandbits(32) for _ in range(pieces)])
    return PromptChain(units, 8, 16.0, 7)  # entries of 8 pieces, 128 tokens each


def fleet(n: int, epoch: int = 0) -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", epoch=epoch) for i in range(n)]


def test_a_model_matches_what_went_there_until_its_replica_restarts() -> None:
    models = ReplicaModels(load_window_s=60.0)
    doc, views = chain(1), fleet(3)
    index = {r.id: i for i, r in enumerate(views)}
    assert models.admit("r1", 0, 4096, doc, owner=11, prompt_tokens=1024, now=0.0) == 1024
    assert models.admit("r1", 0, 4096, doc, owner=11, prompt_tokens=1024, now=1.0) == 0
    # at most the prompt's tokens less one are cached (the engine computes the last)
    assert models.matches(doc, 11, views, index, [True] * 3, 1024) == {1: 1023}
    assert models.matches(doc, 11, views, index, [True, False, True], 1024) == {}
    # the replica restarted (a new epoch): its old model says nothing, and the next
    # admission there starts an empty one
    assert models.matches(doc, 11, fleet(3, epoch=1), index, [True] * 3, 1024) == {}
    assert models.admit("r1", 1, 4096, doc, owner=11, prompt_tokens=1024, now=2.0) == 1024
    models.check_integrity()


def test_removing_or_resetting_a_replica_forgets_what_it_held() -> None:
    models = ReplicaModels(load_window_s=60.0)
    views = fleet(2)
    index, up = {"r0": 0, "r1": 1}, [True, True]
    for rid in ("r0", "r1"):
        models.admit(rid, 0, 4096, chain(2), owner=5, prompt_tokens=1024, now=0.0)
    models.reset("r0")
    assert models.matches(chain(2), 5, views, index, up, 1024) == {1: 1023}
    models.remove("r1")
    assert models.matches(chain(2), 5, views, index, up, 1024) == {}
    assert models.get("r1") is None and models.get("r0") is not None
    models.check_integrity()


def test_a_model_too_small_for_two_documents_evicts_the_older() -> None:
    models = ReplicaModels(load_window_s=60.0)
    views, index, up = fleet(1), {"r0": 0}, [True]
    models.admit("r0", 0, 1024, chain(3), owner=3, prompt_tokens=1024, now=0.0)
    assert models.hot_victims("r0", 1024, keep_owner=4, hot_owner=lambda owner: owner == 3,
                              memo={}) == 1024
    models.admit("r0", 0, 1024, chain(4), owner=4, prompt_tokens=1024, now=1.0)
    assert models.matches(chain(3), 3, views, index, up, 1024) == {}
    assert models.matches(chain(4), 4, views, index, up, 1024) == {0: 1023}
    models.check_integrity()


def test_prefill_this_copy_did_not_send_ages_the_model() -> None:
    models = ReplicaModels(load_window_s=60.0)
    views, index, up = fleet(1), {"r0": 0}, [True]
    models.admit("r0", 0, 2048, chain(5), owner=5, prompt_tokens=1024, now=0.0)
    models.age([ReplicaView("r0", prefill_tokens_per_s=1500.0)], now=0.0,
               size_of=lambda rid: (0, 2048))  # first seen: its time starts
    # this copy sent 1,024 tokens in the last second; the replica prefilled 1,500
    models.age([ReplicaView("r0", prefill_tokens_per_s=1500.0)], now=1.0,
               size_of=lambda rid: (0, 2048))
    assert models.matches(chain(5), 5, views, index, up, 1024) == {0: 1023}
    # ... then 5,000 a second: the others' prefill no longer fits beside the document
    models.age([ReplicaView("r0", prefill_tokens_per_s=5000.0)], now=2.0,
               size_of=lambda rid: (0, 2048))
    assert models.matches(chain(5), 5, views, index, up, 1024) == {}
    models.check_integrity()


def members(scratch: ScratchSet, n: int, up: list[bool] | None = None) -> list[str]:
    ids = [f"r{i}" for i in range(n)]
    ring, owners = RingCache(64).layout(ids, [1.0] * n)
    up = up if up is not None else [True] * n
    return [ids[i] for i in scratch.members(ring.points, owners, len(ring), up, sum(up))]


def test_the_scratch_set_leaves_a_home_and_skips_replicas_that_are_down() -> None:
    scratch = ScratchSet(CostConfig(min_scratch=2))
    first = members(scratch, 8)
    assert len(first) == 2 and len(members(scratch, 2)) == 1  # never the whole fleet
    down = [f"r{i}" != first[0] for i in range(8)]
    assert first[1] in members(scratch, 8, down) and first[0] not in members(scratch, 8, down)


def test_the_scratch_set_waits_for_judged_requests_then_grows_a_replica_a_window() -> None:
    cfg = CostConfig(min_scratch=1, max_scratch_fraction=0.5, scratch_utilization=0.5)
    scratch = ScratchSet(cfg)
    sizes = {}
    # every request rare: 1,750 uncached tokens a second at 1 ms a token need 3.5 replicas
    # at the target utilization; a window is 64 routed requests
    for routed in range(1, 400):
        scratch.judged(routed * 0.1, 175, rare=True)
        scratch.resize(routed * 0.1, routed, 64, None, 1e-3, 8, 0, 0.0)
        sizes[routed] = scratch.size
    assert sizes[127] == 1  # too few judged yet to say
    assert sizes[128] == sizes[191] == 2  # then one replica more, and a window to wait
    assert sizes[192] == sizes[255] == 3
    assert sizes[256] == sizes[399] == 4  # where the load puts it (a half of 8 at most)


@pytest.mark.parametrize("affinity", [None, "conversation-7"])
def test_prefix_keys_are_the_same_in_every_process_and_part_of_the_namespace(
        affinity: str | None) -> None:
    tokens = list(range(1000, 1400))
    one, two = PrefixKeys(CostConfig()), PrefixKeys(CostConfig())

    def key(keys: PrefixKeys, model: str, salt: str | None = None) -> int:
        return keys.prefix(RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model=model,
                                        cache_salt=salt, affinity_key=affinity)).key

    assert key(one, "m") == key(two, "m")
    assert key(one, "m") != key(one, "other-model")
    assert key(one, "m") != key(one, "m", salt="tenant-b")


def test_an_affinity_key_names_the_prefix_whatever_the_prompt() -> None:
    keys = PrefixKeys(CostConfig())

    def key(tokens: list[int], affinity: str | None) -> int:
        return keys.prefix(RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m",
                                        affinity_key=affinity)).key

    a, b = list(range(500)), list(range(7, 507))
    assert key(a, "c1") == key(b, "c1") and key(a, "c1") != key(a, "c2")
    assert key(a, None) != key(b, None)
