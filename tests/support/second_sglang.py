"""An SGLang server's ``/metrics`` as its schedulers expose them: one sample of each
scheduler gauge per reporting scheduler, labelled ``tp_rank`` and ``pp_rank`` (and
``dp_rank`` under data parallelism). The scheduler at attention-TP rank 0 of every
pipeline stage reports (so ``--pp-size 2`` gives two samples of each gauge, one per stage,
each counting the same requests), and with ``--enable-metrics-for-all-schedulers`` every
TP rank does too (``SchedulerMetricsCollectorContext.init_new``). The tokenizer manager's
counters carry no rank."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route


@dataclass
class Ranks:
    """What each data-parallel group's schedulers report: ``running`` and ``queued``
    requests, ``max_total_num_tokens`` of KV per group, over ``tp`` x ``pp`` reporting
    schedulers."""

    tp: int = 1
    pp: int = 1
    dp: tuple[int, ...] = ()  # dp_rank labels (empty: no dp_rank label)
    running: int = 3
    queued: int = 2
    max_total_num_tokens: int = 100_000
    token_usage: float = 0.25


def metrics_text(r: Ranks) -> str:
    lines = []
    for name, kind, value in (("num_running_reqs", "gauge", float(r.running)),
                              ("num_queue_reqs", "gauge", float(r.queued)),
                              ("max_total_num_tokens", "gauge", float(r.max_total_num_tokens)),
                              ("token_usage", "gauge", r.token_usage),
                              ("cache_hit_rate", "gauge", 0.5)):
        lines.append(f"# TYPE sglang:{name} {kind}")
        for dp in r.dp or (None,):
            for pp in range(r.pp):
                for tp in range(r.tp):
                    dp_label = "" if dp is None else f',dp_rank="{dp}"'
                    lines.append(f'sglang:{name}{{engine_type="unified",model_name="m",'
                                 f'pp_rank="{pp}",tp_rank="{tp}"{dp_label}}} {value}')
    lines += ["# TYPE sglang:prompt_tokens counter",
              'sglang:prompt_tokens_total{model_name="m"} 1000.0',
              "# TYPE sglang:generation_tokens counter",
              'sglang:generation_tokens_total{model_name="m"} 200.0']
    return "\n".join(lines) + "\n"


def sglang_app(r: Ranks) -> Starlette:
    """An SGLang server's /health, /v1/models and /metrics (``metrics_text``)."""

    async def health(request: Request) -> Response:
        return Response(b"", status_code=200)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": "m", "object": "model", "owned_by": "sglang", "root": "m",
             "max_model_len": 4096}]})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(metrics_text(r))

    return Starlette(routes=[Route("/health", health), Route("/v1/models", models),
                             Route("/metrics", metrics)])
