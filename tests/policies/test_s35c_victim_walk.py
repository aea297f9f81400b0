"""Telling what an admission would evict walks a bounded number of a cache model's entries,
whatever the model's size: a decision asks it of every candidate it scores."""

import random

import pytest

from policies.cache_model import PASSED_OVER_MAX, ChainEntry, PromptChain, ReplicaCacheModel
from policies.replica_models import ReplicaModels
from policies.ring import token_bytes

BLOCK = 128  # tokens of an entry


def prompt(first_key: int, entries: int = 16) -> list[ChainEntry]:
    """A unique prompt of ``entries`` entries (keys from ``first_key`` on)."""
    return [ChainEntry(first_key + i, BLOCK) for i in range(entries)]


def one_owner(prompts: int, owner: int = 7) -> ReplicaCacheModel:
    """A full model of ``prompts`` unique 16-entry prompts, all of ``owner``."""
    model = ReplicaCacheModel(prompts * 16 * BLOCK)
    for i in range(prompts):
        model.admit(prompt(i * 16), owner)
    assert model.used == model.capacity
    return model


@pytest.mark.parametrize("prompts", [64, 4096])
def test_a_full_model_of_the_admissions_own_owner_is_not_walked(prompts: int) -> None:
    # one affinity key over unique prompts: every entry is the admission's own owner's
    model = one_owner(prompts)
    assert model.evicted_tokens(16 * BLOCK, 7, lambda owner: True) == 0
    assert model.walked == 0
    assert list(model.victims(16 * BLOCK, keep_owner=7)) == []
    assert model.walked == 0
    # another owner's admission evicts the oldest prompt: 16 entries walked, not the model
    assert model.evicted_tokens(16 * BLOCK, 8, lambda owner: owner == 7) == 16 * BLOCK
    assert model.walked == 16
    model.check_integrity()


@pytest.mark.parametrize("prompts", [64, 4096])
def test_an_owner_with_others_entries_among_its_own_is_passed_over_a_bounded_number(
        prompts: int) -> None:
    # each of owner 7's prompts followed by an entry of others' prefill (owner 99): the
    # others' entries are spread over the whole model
    model = ReplicaCacheModel(prompts * 17 * BLOCK)
    for i in range(prompts):
        model.admit(prompt(i * 17), 7)
        model.admit([ChainEntry(i * 17 + 16, BLOCK)], 99)
    model.check_integrity()
    evicted = model.evicted_tokens(3 * BLOCK, 7, lambda owner: owner == 99)
    # three victims (one every 17 entries) at most, past at most PASSED_OVER_MAX of 7's
    assert model.walked <= PASSED_OVER_MAX + 3
    assert model.walked == 3 * 17  # all three found before the bound
    assert evicted == 3 * BLOCK
    # an admission that needs more of the others' than the bound reaches: the walk stops
    # at the bound, whatever the model's size
    model.evicted_tokens(prompts * BLOCK, 7, lambda owner: owner == 99)
    assert model.walked <= PASSED_OVER_MAX + PASSED_OVER_MAX // 16 + 1
    victims = list(model.victims(prompts * BLOCK, keep_owner=7))
    assert model.walked <= PASSED_OVER_MAX + PASSED_OVER_MAX // 16 + 1
    assert {v.owner for v in victims} == {99}


def test_past_the_bound_the_excess_falls_on_the_owners_own_old_entries() -> None:
    # more of owner 7's old entries at the LRU end than the bound, then a hot document's:
    # a new unique prompt of 7 touches none of the old ones, which go first, as predicted
    old = PASSED_OVER_MAX + 64
    model = ReplicaCacheModel((old + 16) * BLOCK)
    model.admit(prompt(0, old), 7)
    model.admit(prompt(old, 16), 3)
    new = prompt(10 * old, 16)
    assert model.evicted_tokens(16 * BLOCK, 7, lambda owner: owner == 3) == 0
    assert model.walked == PASSED_OVER_MAX + 1
    evicted = model.admit(new, 7)
    assert len(evicted) == 16 and not set(evicted) & {e.key for e in prompt(old, 16)}
    model.check_integrity()


def test_hot_victims_of_a_full_model_of_one_owner_walks_none_of_it() -> None:
    models = ReplicaModels(load_window_s=60.0)
    rng = random.Random(5)
    for i in range(256):  # unique 16-entry prompts, one prefix key
        units = token_bytes([rng.getrandbits(32) for _ in range(128)])
        models.admit("r0", 0, 64 * 16 * BLOCK, PromptChain(units, 8, 16.0, 7), owner=11,
                     prompt_tokens=16 * BLOCK, now=float(i))
    model = models.get("r0")
    assert model is not None and model.used == model.capacity
    assert models.hot_victims("r0", 16 * BLOCK, keep_owner=11, hot_owner=lambda owner: True,
                              memo={}) == 0
    assert model.walked == 0
    models.check_integrity()


def test_the_tokens_kept_per_owner_follow_every_change() -> None:
    model = ReplicaCacheModel(40 * BLOCK)
    model.admit(prompt(0, 8), 1)
    pending: list[tuple[int, list[int]]] = []
    model.admit(prompt(4, 8), 2, pending)  # takes 4 of owner 1's entries, brings 4 new
    model.check_integrity()
    assert model.evicted_tokens(40 * BLOCK, 2, lambda owner: True) == 4 * BLOCK
    model.forget(pending)
    model.check_integrity()
    model.admit([ChainEntry(0, 2 * BLOCK)], 3)  # grows an entry and takes it
    model.check_integrity()
    model.resize(3 * BLOCK)
    model.check_integrity()
    assert model.evicted_tokens(2 * BLOCK, 3, lambda owner: True) == BLOCK
    model.clear()
    model.check_integrity()
    assert model.evicted_tokens(BLOCK, None, lambda owner: True) == 0 and model.walked == 0
