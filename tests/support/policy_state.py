"""A policy's routing state as bytes, to show that a call left it unchanged."""

from __future__ import annotations

import pickle
import random

from policies.base import Policy
from policies.ring import RingCache

# Random generators (``choose`` may draw tie breaks from them) and memos of pure functions
# (ring layouts by membership): neither is routing state.
NOT_STATE = (random.Random, RingCache)


def snapshot(policy: Policy) -> bytes:
    """The policy's routing state, dict order included (``NOT_STATE`` set aside)."""
    state = {key: value for key, value in vars(policy).items()
             if not isinstance(value, NOT_STATE)}
    return pickle.dumps(state)
