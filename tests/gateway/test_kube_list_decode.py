"""Kubernetes discovery's list pages, MBs of JSON, decoded without holding the event loop:
the decoder against ``json.loads``, and a real list (the real kubernetes_asyncio client,
the stand-in API server of tests.support.fake_kube_api) watched from the loop."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway import loop_slices
from gateway.discovery.config import KubernetesSourceConfig
from gateway.discovery.kube_source import KubernetesSource
from gateway.discovery.list_decode import decode_list
from tests.support.fake_kube_api import FakeKubeAPI, pod_list_turns, write_kubeconfig
from tests.support.servers import ThreadServer

Serve = Callable[..., ThreadServer]

PAGE = json.dumps({"kind": "PodList", "apiVersion": "v1",
                   "metadata": {"resourceVersion": "7", "continue": "c"},
                   "items": [{"metadata": {"name": f"p{i}", "labels": {"items": [i]}},
                              "status": {"podIP": f"10.0.0.{i}", "x": [None, True, 1.5, "é"]}}
                             for i in range(4)]})
TEXTS = [
    PAGE, json.dumps(json.loads(PAGE), indent=2), "\n" + PAGE + " \n",
    '{"items": [], "metadata": {}}', '{ "items" : [ ] }', '{"items": [1]}', "{}", " { } ",
    '{"metadata": {"items": [1, 2]}, "items": [3]}',  # only the top level's, in any order
    '{"items": [1], "items": [2, 3]}',  # a repeated key: the last one
    '{"items": {"a": 1}}', '{"items": "x"}', "[1, 2]", '"s"', "null", "7",
    '{"items": [NaN, -Infinity]}',
    # malformed: the same JSONDecodeError as json.loads, message and position
    "", "   ", "{", "}", '{"items": [', '{"items": [1', '{"items": [1,', '{"items": [1,]}',
    '{"items": [1 2]}', '{"items": [1]', '{"items": [1],}', '{"items": []} x', '{"a" 1}',
    '{"a": 1 "b": 2}', '{1: 2}', '{"a": }', "\ufeff{}", PAGE[:-1], PAGE[:len(PAGE) // 2],
    PAGE.replace("},", "}", 1), PAGE + "}",
]


def decoded(decode: Callable[[str], Any], text: str) -> tuple[Any, ...]:
    try:
        return ("value", decode(text))
    except json.JSONDecodeError as exc:
        return ("error", exc.msg, exc.pos)


@pytest.mark.parametrize("slice_s", [0.0, loop_slices.SLICE_S])
async def test_decode_list_is_json_loads(monkeypatch: pytest.MonkeyPatch, slice_s: float
                                         ) -> None:
    monkeypatch.setattr(loop_slices, "SLICE_S", slice_s)  # 0: hand back after every item
    for text in TEXTS:
        want = decoded(json.loads, text)
        try:
            got: tuple[Any, ...] = ("value", await decode_list(text))
        except json.JSONDecodeError as exc:
            got = ("error", exc.msg, exc.pos)
        assert repr(got) == repr(want), text  # repr: NaN != NaN


async def test_a_list_page_is_decoded_with_the_loop_handed_back(
        serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the page was decoded in one go on the event loop: ~17 ms for 500 pods, ~260 ms for
    # 5,000, every request of the gateway waiting meanwhile
    monkeypatch.setattr(loop_slices, "SLICE_S", 0.0)  # hand back after every item
    api = FakeKubeAPI(kind="Pod")
    server = serve(api.app())
    names = {f"vllm-{i:03d}" for i in range(200)}
    for name in names:
        api.put({"metadata": {"name": name, "namespace": "llm", "labels": {"app": "vllm"}},
                 "status": {"podIP": "10.0.0.1", "phase": "Running"}})
    path = write_kubeconfig(tmp_path, server.url)
    source = KubernetesSource(KubernetesSourceConfig(
        namespace="llm", label_selector="app=vllm", port=8000, kubeconfig=path))
    pages, decoding = await pod_list_turns(source, path)
    assert pages == 1
    assert set(source.objects) == names and source.resource_version == str(api.rv)
    assert decoding >= len(names) // 2, f"the loop ran {decoding} times in the decode"
