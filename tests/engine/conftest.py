"""The ``core`` fixture: a tiny sim engine (see ``tests.support.engine_cores``)."""

from __future__ import annotations

import pytest

from engine.core import EngineCore
from tests.support.engine_cores import make_core


@pytest.fixture
def core() -> EngineCore:
    return make_core()
