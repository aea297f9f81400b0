"""``kvgate engine``: run one engine replica (sim or torch executor) behind its HTTP server.

Standalone: ``python -m engine.cli --executor sim --profile llama3-8b-h100 --port 8001``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

from engine.api_key import API_KEY_ENV, resolve_api_key
from engine.core import EngineConfig, EngineCore
from engine.cost_model import MAX_SLOWDOWN, CostModel, available_profiles, load_profile
from engine.eviction import EVICTION_POLICIES
from engine.executor import Executor, ExecutorInfo
from engine.kv_sizing import GIB, RECORD_BYTES_PER_BLOCK, blocks_in_gib, host_memory_bytes
from engine.responses_route import STORE_CHARS, STORE_LIMIT, TENANT_HEADER, StoreSettings
from engine.sim_embedding import SimEmbedder, seed_of
from engine.sim_executor import SimExecutor
from kvwire.arg_types import float_between, port, positive_float, positive_int
from kvwire.block_hashing import model_identity
from kvwire.kv_event_format import ENCODINGS
from kvwire.secret_source import exposed_file_warning

if TYPE_CHECKING:
    from engine.server import EngineServer

DEFAULT_KV_CACHE_GIB = 25.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", choices=["sim", "torch"], default="sim")
    parser.add_argument("--profile", default="llama3-8b-h100",
                        help=f"sim cost profile: one of {available_profiles()} or a YAML path")
    parser.add_argument("--slowdown", type=float_between(0, MAX_SLOWDOWN, open_low=True),
                        default=1.0,
                        help="sim: the device this many times slower than the profile's "
                             "(another generation's, a throttled one)")
    parser.add_argument("--model", default=None, help="model directory (torch executor)")
    parser.add_argument("--device", default="auto", help="torch device (torch executor)")
    parser.add_argument("--model-name", default=None,
                        help="served model name (default: from the profile or model dir)")
    parser.add_argument("--model-revision", default=None,
                        help="revision folded into the block hash chain's seed")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer dir or tokenizer.json (default: the project's own, "
                             "or the model dir for the torch executor)")
    parser.add_argument("--embedding-dim", type=int, default=None,
                        help="width of the sim executor's /v1/embeddings vectors (default: "
                             "the profile model's hidden size)")
    parser.add_argument("--kv-cache-gib", type=positive_float, default=None,
                        help=f"KV cache size, at most the device's memory (default "
                             f"{DEFAULT_KV_CACHE_GIB:g}, or half a device's memory where it "
                             "has less)")
    parser.add_argument("--block-size", type=positive_int, default=16)
    parser.add_argument("--eviction", choices=EVICTION_POLICIES, default="lru")
    parser.add_argument("--max-num-seqs", type=positive_int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=8192)
    parser.add_argument("--max-model-len", type=positive_int, default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port, default=8000)
    parser.add_argument("--log-level", default=argparse.SUPPRESS, type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="as kvgate --log-level (which it replaces)")
    parser.add_argument("--kv-events-endpoint", default=None, type=_zmq_endpoint,
                        help="publish KV cache events (vLLM's ZMQ format) on a PUB socket "
                             "bound here, e.g. tcp://*:5557 (default: off)")
    parser.add_argument("--no-prompt-tokens-details", action="store_true",
                        help="leave usage.prompt_tokens_details (the cached tokens) out of "
                             "chat and completion answers, as vLLM does without "
                             "--enable-prompt-tokens-details")
    parser.add_argument("--no-cache-config-info", action="store_true",
                        help="leave vllm:cache_config_info (the KV capacity) out of /metrics, "
                             "as a replica that exports its KV usage but not its capacity")
    parser.add_argument("--weight-version", default="default", metavar="VERSION",
                        help="the weight version SGLang's /generate meta_info and "
                             "/get_model_info name (as SGLang's --weight-version)")
    parser.add_argument("--served-by", default=None, metavar="NAME",
                        help="name this replica in every response's x-kvgate-served-by "
                             "header (which replica answered, behind any router)")
    parser.add_argument("--max-held-body-bytes", type=positive_int, default=None,
                        metavar="BYTES",
                        help="bytes of request bodies held at once, all requests together, "
                             "from their first byte until they are parsed: past it a request "
                             "gets 429 (Retry-After: 1), and a body larger than it alone "
                             "413 (default: 4 times the 64 MiB a body may hold)")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on every route but "
                             "/health, /version and /metrics (as vLLM's --api-key; the "
                             f"environment's {API_KEY_ENV} also sets it; default: no key)")
    parser.add_argument("--api-key-file", default=None, metavar="PATH",
                        help="as --api-key, the key read from this file (a mounted Secret; "
                             "surrounding whitespace stripped)")
    parser.add_argument("--drain-timeout-s", type=positive_float, default=None,
                        metavar="SECONDS",
                        help="on SIGTERM, let the requests in flight run at most this long, "
                             "then end those still running with an error (a stream with its "
                             "error event); a second SIGTERM stops at once (default: wait "
                             "until they finish)")
    parser.add_argument("--responses-store-limit", type=positive_int, default=STORE_LIMIT,
                        metavar="N",
                        help="stored /v1/responses answers kept for previous_response_id, "
                             f"all tenants together (default {STORE_LIMIT})")
    parser.add_argument("--responses-store-mib", type=positive_int,
                        default=STORE_CHARS >> 20, metavar="MIB",
                        help="their conversations' size, all together: about the memory "
                             "text holds; conversations of empty messages or tool calls "
                             "hold up to 3 or 6 times it (default "
                             f"{STORE_CHARS >> 20})")
    parser.add_argument("--responses-tenant-header", default=TENANT_HEADER, metavar="NAME",
                        help="the header naming a request's tenant (the gateway's "
                             "tenancy.header): past either bound, the tenant holding the "
                             "most stored responses loses its least recently used first "
                             f"(default {TENANT_HEADER})")
    parser.add_argument("--kv-events-topic", default="", help="topic frame of KV events")
    parser.add_argument("--kv-events-encoding", choices=ENCODINGS, default="array",
                        help="each KV event as a tagged array (vLLM's classic form) or as a "
                             "map with a 'type' key (the newer form, the only one vLLM's "
                             "router reads)")
    parser.add_argument("--kv-events-replay-endpoint", default=None, type=_zmq_endpoint,
                        help="ZMQ ROUTER endpoint serving the recent KV event batches again "
                             "(e.g. tcp://*:5558), for subscribers that missed some")


def _zmq_endpoint(text: str) -> str:
    """A ZMQ endpoint: transport://address (tcp://*:5557, ipc:///tmp/kv)."""
    transport, sep, address = text.partition("://")
    if not sep or transport not in ("tcp", "ipc", "inproc") or not address:
        raise argparse.ArgumentTypeError(
            f"must be a ZMQ endpoint such as tcp://*:5557 or ipc:///path, got {text!r}")
    return text


def make_executor(args: argparse.Namespace, tokenizer: Any) -> tuple[Executor, ExecutorInfo]:
    """The executor named by ``--executor`` and what the engine must know about it."""
    if args.executor == "sim":
        return _sim_executor(args, tokenizer)
    if args.executor == "torch":
        if getattr(args, "slowdown", 1.0) != 1.0:
            raise ValueError(f"--slowdown {args.slowdown:g} models a slower device in the sim "
                             "executor; the torch executor runs on the device it is given")
        return _torch_executor(args)
    raise ValueError(f"unknown executor {args.executor!r}; expected 'sim' or 'torch'")


def _kv_blocks(args: argparse.Namespace, kv_bytes_per_token: int, device: str = "",
               device_bytes: int | None = None) -> int:
    """The KV blocks served: ``--kv-cache-gib`` of them (by default 25 GiB, or half the
    ``device_bytes`` of memory of ``device`` where it has less). ``ValueError`` naming the
    flag when that is no block, more than the device's memory, or more blocks than the
    engine can keep a record of in this machine's memory."""
    gib = args.kv_cache_gib
    if device_bytes is not None:
        whose, have = device, device_bytes
        if gib is None and have < DEFAULT_KV_CACHE_GIB * GIB:
            gib = have / 2 / GIB
            logging.getLogger(__name__).warning(
                "%s has %.3g GiB of memory, less than the default --kv-cache-gib %g: "
                "using %.3g GiB", whose, have / GIB, DEFAULT_KV_CACHE_GIB, gib)
        elif gib is not None and gib * GIB > have:
            raise ValueError(f"--kv-cache-gib {gib:g} is more than the {have / GIB:.4g} GiB "
                             f"of memory {whose} has")
    gib = DEFAULT_KV_CACHE_GIB if gib is None else gib
    num_blocks = blocks_in_gib(gib, kv_bytes_per_token, args.block_size)
    if num_blocks < 1:
        raise ValueError(f"--kv-cache-gib {gib:g} holds no block of {args.block_size} "
                         f"tokens ({kv_bytes_per_token} bytes a token)")
    records, host = num_blocks * RECORD_BYTES_PER_BLOCK, host_memory_bytes()
    if host is not None and records > host:
        raise ValueError(f"--kv-cache-gib {gib:g} is {num_blocks:,} blocks, whose records "
                         f"alone need {records / GIB:.4g} GiB, more than the {host / GIB:.4g} "
                         "GiB of memory this machine has")
    return num_blocks


def _sim_executor(args: argparse.Namespace, tokenizer: Any) -> tuple[Executor, ExecutorInfo]:
    profile = load_profile(args.profile)
    kv_bytes = profile.model.kv_bytes_per_token
    num_blocks = _kv_blocks(args, kv_bytes)  # simulated: no memory for the KV itself
    vocab = int(tokenizer.vocab_size)
    # Generated ids avoid the low ids (special tokens and raw bytes) so output decodes to
    # readable text; EOS is then never produced and requests run to max_tokens.
    executor = SimExecutor(CostModel.from_profile(profile, getattr(args, "slowdown", 1.0)),
                           block_size=args.block_size,
                           eos_token_id=tokenizer.eos_token_id,
                           token_range=(min(259, vocab - 1), vocab))
    name = profile.model.name
    info = ExecutorInfo(model_name=name, model_id=model_identity(name, args.model_revision),
                        num_blocks=num_blocks,
                        max_model_len=args.max_model_len or profile.model.max_model_len,
                        kv_bytes_per_token=kv_bytes,
                        embedding_dim=profile.model.hidden_size if args.embedding_dim is None
                        else args.embedding_dim)
    return executor, info


def _torch_executor(args: argparse.Namespace) -> tuple[Executor, ExecutorInfo]:
    if not args.model:
        raise ValueError("--executor torch needs --model DIR")
    if getattr(args, "embedding_dim", None) is not None:
        raise ValueError("--embedding-dim applies to the sim executor only; the torch "
                         "executor serves no embeddings")
    # Imported here: the core and the sim path never import torch.
    from pathlib import Path

    try:
        from engine.executors.torch_executor import (
            TorchExecutor,
            device_memory_bytes,
            pick_device,
        )
        from engine.model.config import ModelConfig, kv_bytes_per_token
        from engine.model.loader import default_dtype
    except ImportError as exc:
        raise ValueError(f"--executor torch needs the engine extra ({exc}): "
                         "pip install 'kvgate[engine]'") from exc

    try:
        device = pick_device(args.device)
    except ValueError as exc:
        raise ValueError(f"--device {exc}") from None
    config = ModelConfig.from_file(Path(args.model) / "config.json")
    asked, positions = args.max_model_len, config.max_position_embeddings
    if asked is not None and asked > positions:  # as vLLM: the model has no positions past
        raise ValueError(f"--max-model-len {asked} is greater than the model's "
                         f"max_position_embeddings={positions} (its config.json)")
    dtype = default_dtype(config, device)
    kv_bytes = kv_bytes_per_token(config, dtype)
    num_blocks = _kv_blocks(args, kv_bytes, f"device {device}", device_memory_bytes(device))
    executor = TorchExecutor.from_dir(args.model, num_blocks=num_blocks,
                                      block_size=args.block_size, device=str(device),
                                      dtype=dtype)
    name = Path(args.model).resolve().name
    info = ExecutorInfo(model_name=name, model_id=model_identity(name, args.model_revision),
                        num_blocks=num_blocks,
                        max_model_len=args.max_model_len or config.max_position_embeddings,
                        kv_bytes_per_token=kv_bytes)
    return executor, info


def _fit_context(info: ExecutorInfo, block_size: int, asked: int | None) -> int:
    """The context length served: the model's, cut to what the KV cache holds (with a
    warning); one asked for (``--max-model-len``) that the cache cannot hold is an error,
    as in vLLM (a request that long could never run)."""
    capacity = info.num_blocks * block_size
    if info.max_model_len <= capacity:
        return info.max_model_len
    if asked is not None:
        raise ValueError(f"--max-model-len {asked} is larger than the {capacity} tokens the "
                         "KV cache can hold; raise --kv-cache-gib or lower --max-model-len")
    logging.getLogger(__name__).warning(
        "the model's context of %d tokens is larger than the %d tokens the KV cache holds: "
        "serving a context of %d", info.max_model_len, capacity, capacity)
    return capacity


def build_server(args: argparse.Namespace) -> Any:
    """An :class:`engine.server.EngineServer` configured from parsed arguments."""
    from engine.server import DEFAULT_MAX_HELD_BODY_BYTES, EngineServer
    from kvwire.tokenizer import load_tokenizer

    if args.model is not None and args.executor != "torch":  # not served: say so
        raise ValueError(f"--model is for the torch executor; add --executor torch to serve "
                         f"{args.model}")
    if args.model is not None and not os.path.isdir(args.model):  # before its tokenizer
        raise ValueError(f"--model {args.model}: no such directory")
    tok_path = args.tokenizer or (args.model if args.executor == "torch" else None)
    tokenizer = load_tokenizer(tok_path)
    executor, info = make_executor(args, tokenizer)
    config = EngineConfig(
        model_id=info.model_id,
        num_blocks=info.num_blocks,
        block_size=args.block_size,
        eviction=args.eviction,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=_fit_context(info, args.block_size, args.max_model_len),
    )
    core = EngineCore(executor, config)
    embedder = None
    if info.embedding_dim is not None:
        embedder = SimEmbedder(info.embedding_dim, seed_of(info.model_id))
    publisher = None
    if args.kv_events_endpoint:
        from engine.kv_event_publisher import KVEventPublisher  # pyzmq only when publishing

        publisher = KVEventPublisher(args.kv_events_endpoint, args.kv_events_topic,
                                     replay_endpoint=args.kv_events_replay_endpoint,
                                     encoding=args.kv_events_encoding)
    return EngineServer(core, tokenizer, model_name=args.model_name or info.model_name,
                        sleep_modeled_time=args.executor == "sim", kv_events=publisher,
                        cache_config_info=not args.no_cache_config_info,
                        embedder=embedder, weight_version=args.weight_version,
                        max_held_body_bytes=args.max_held_body_bytes
                        or DEFAULT_MAX_HELD_BODY_BYTES,
                        prompt_tokens_details=not args.no_prompt_tokens_details)


class Served(NamedTuple):
    """What ``kvgate engine`` serves: the engine's ``server`` and the ASGI ``app`` uvicorn
    runs (behind its API key and its ``--served-by`` name, when given)."""

    server: EngineServer
    app: Any


def build_served(args: argparse.Namespace) -> Served:
    """The server and app configured from parsed arguments; ValueError naming the flag at
    fault. The API key is read first: a bad one is named before any model loads."""
    from engine.server import ServedBy, build_app

    api_key = resolve_api_key(args.api_key, args.api_key_file)
    exposed = exposed_file_warning(args.api_key_file, "--api-key-file") \
        if args.api_key_file else None
    if exposed is not None:
        logging.getLogger(__name__).warning("%s", exposed)
    server = build_server(args)
    app: Any = build_app(server, api_key=api_key, responses_store=StoreSettings(
        args.responses_store_limit, args.responses_store_mib << 20,
        args.responses_tenant_header))
    if args.served_by:  # outside the key's check: a refusal names the replica too
        app = ServedBy(app, args.served_by)
    return Served(server, app)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    level = str(getattr(args, "log_level", "info"))
    logging.basicConfig(level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server, app = build_served(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"kvgate engine: {exc}", file=sys.stderr)
        return 2
    if server.kv_events is not None:
        from engine.kv_event_publisher import BindError  # pyzmq only when publishing

        try:  # bound before serving: a busy endpoint is refused here, not at start-up
            server.kv_events.bind()
        except BindError as exc:
            flag = "--kv-events-replay-endpoint" if exc.replay else "--kv-events-endpoint"
            print(f"kvgate engine: {flag} {exc.endpoint}: cannot bind: {exc.reason}",
                  file=sys.stderr)
            return 2
    logging.getLogger(__name__).info(
        "serving %s: %d KV blocks of %d tokens, eviction %s, executor %s",
        server.model_name, server.core.config.num_blocks, args.block_size, args.eviction,
        args.executor)
    from engine.drain import DrainingServer
    from kvwire.http10 import Http10Protocol

    # an HTTP/1.0 client's stream unchunked (Http10Protocol), as the gateway's
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=level.lower(),
                            ws="none", http=Http10Protocol)
    http = DrainingServer(config, server.engine, args.drain_timeout_s)
    with contextlib.suppress(KeyboardInterrupt):
        http.run()
    return 0 if http.started else 3  # as uvicorn.run: 3 when the app failed to start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvgate engine", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
