import asyncio

import kubernetes_asyncio.client as k8s
from kubernetes_asyncio import watch as k8s_watch

from gateway.discovery.kube_source import RawWatch


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
