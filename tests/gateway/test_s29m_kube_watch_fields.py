import asyncio

import pytest

k8s_watch = pytest.importorskip("kubernetes_asyncio.watch")
k8s = pytest.importorskip("kubernetes_asyncio.client")

from gateway.discovery.kube_source import RawWatch  # noqa: E402


def test_the_raw_watch_sets_every_field_the_librarys_watch_sets() -> None:
    # RawWatch copies Watch.__init__ (to lend it the source's ApiClient): a library
    # release that sets one more field there would fail each watch at run time, not here
    async def fields() -> tuple[set[str], set[str]]:
        theirs = k8s_watch.Watch()
        api = k8s.ApiClient()
        try:
            return set(vars(theirs)), set(vars(RawWatch(api)))
        finally:
            await theirs._api_client.close()
            await api.close()

    theirs, ours = asyncio.run(fields())
    assert theirs == ours, f"Watch sets {sorted(theirs - ours)} that RawWatch does not"
