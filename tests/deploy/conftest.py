"""Fixtures of the deploy tests: deploy/k8s rendered by ``kubectl kustomize``."""

from __future__ import annotations

import pytest

from tests.deploy.k8s_bundle import Objects, kustomize, objects_of


@pytest.fixture(scope="session")
def kustomized() -> str:
    """deploy/k8s rendered, once a session."""
    return kustomize()


@pytest.fixture(scope="module")
def objects(kustomized: str) -> Objects:
    """The rendered objects by (kind, name), parsed afresh for each module: a module
    that changed one would not change another's."""
    return objects_of(kustomized)
