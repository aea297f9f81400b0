"""A policy's routing state as bytes, to show that a call left it unchanged."""

from __future__ import annotations

import pickle
import random

from policies.base import Policy
from policies.request_memo import RequestMemo
from policies.ring import RingCache

# Random generators (``choose`` may draw tie breaks from them) and memos of pure functions
# (ring layouts by membership, what was derived from the last request): none is routing
# state.
NOT_STATE = (random.Random, RingCache, RequestMemo)


def snapshot(policy: Policy) -> bytes:
    """The policy's routing state, dict order included (``NOT_STATE`` set aside)."""
    state = {key: value for key, value in vars(policy).items()
             if not isinstance(value, NOT_STATE)}
    return pickle.dumps(state)
