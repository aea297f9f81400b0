"""``kvgate serve --config gateway.yaml [--host H] [--port P] [--workers N]
[--no-worker-routes]``"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import ipaddress
import logging
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gateway.listen_sockets import listen_socket, passive_addresses
from kvwire.secret_source import exposed_file_warning
from policies.config import ConfigError, is_secret_key

if TYPE_CHECKING:
    from gateway.config import GatewayConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="gateway YAML file")
    parser.add_argument("--host", help="override the config's host")
    parser.add_argument("--port", type=int, help="override the config's port")
    parser.add_argument("--workers", type=int, default=1,
                        help="gateway processes sharing the port (gateway.workers)")
    parser.add_argument("--no-worker-routes", dest="worker_routes", action="store_false",
                        help="with --workers: each worker's policy learns from its own "
                        "requests only (less CPU per request, fewer cache hits; "
                        "gateway.worker_routes)")


def run(args: argparse.Namespace) -> int:
    from gateway.admin import create_admin_app
    from gateway.app import create_app
    from gateway.config import load_config
    from gateway.http_server import run_server
    from gateway.state import build_state
    from kvwire.tokenizer import load_tokenizer

    try:
        config = load_config(args.config)
        overrides = {k: v for k, v in (("host", args.host), ("port", args.port))
                     if v is not None}
        if args.port is not None and not 0 < args.port <= 65535:
            raise ConfigError(f"--port must be in [1, 65535], got {args.port!r}")
        config = dataclasses.replace(config, **overrides)
        try:
            config.validate()  # the command line's values as the file's
        except ValueError as exc:
            raise ConfigError(f"{args.config}: {exc}") from exc
        _check_listeners(config, args.config, args.host is not None, args.port is not None)
        if args.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {args.workers!r}")
        if not config.replicas and not config.discovery and not config.admin.resolved_token():
            raise ConfigError(f"{args.config}: names no replica, no discovery and no admin "
                              "API to add one: the gateway would refuse every request")
        unknown = config.unknown_partition_replicas()
        if unknown:  # validate() refused them where no replica can join later
            logging.getLogger("kvgate").warning(
                "tenancy.partitions name %s, which no configured replica has as its id: "
                "their tenants get no replica until discovery or the admin API adds one "
                "with that id", ", ".join(map(repr, unknown)))
        for warning in exposed_secrets(config):
            logging.getLogger("kvgate").warning("%s", warning)
        if config.capture.path is not None:
            from gateway.capture_log import CaptureLog

            try:
                CaptureLog.check_path(config.capture.path)  # before any port is bound
            except OSError as exc:
                raise ConfigError(f"{args.config}: {exc.strerror}") from exc
        try:  # read before any worker starts, to be named here rather than in its traceback
            tokenizer = load_tokenizer(config.tokenizer, config.tokenizer_memo)
        except (FileNotFoundError, ValueError) as exc:
            raise ConfigError(f"{args.config}: {exc}") from None
        if args.workers > 1:
            del tokenizer  # each worker reads its own
            return _supervise(config, args)
        gw = build_state(config, tokenizer)
        app = create_app(config, gw)
        # read once more, and checked: its file or variable may have changed since
        token = config.admin.resolved_token()
        admin_app = None if token is None else create_admin_app(gw, token)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"kvgate serve: {exc}", file=sys.stderr)
        return 2
    print(f"kvgate serve: gateway on {_url(config.host, config.port)} "
          f"(policy {gw.policy.name}, {len(config.replicas)} replicas"
          + "".join(f", discovery {s.label}" for s in config.discovery) + ")",
          file=sys.stderr)
    if admin_app is not None:
        print(f"kvgate serve: admin API on {_url(config.admin.host, config.admin.port)}",
              file=sys.stderr)
    def drain() -> None:
        gw.draining = True
        # run in the signal handler: a closed stderr (whatever read it has gone) must not
        # raise there, where it would leave the server running past the signal
        with contextlib.suppress(OSError):
            print(f"kvgate serve: draining for {config.shutdown.grace_s} s, then stopping",
                  file=sys.stderr)

    run_server(app, config, admin_app, drain, on_cutoff=gw.stop_relays,
               on_refused=gw.refused_by_server)
    return 0


def exposed_secrets(config: GatewayConfig) -> list[str]:
    """A warning, one line each, for a secret the config exposes: a ``*_file`` secret that
    users other than its owner may read or write (``exposed_file_warning``), and a
    replica's API key sent over plain http:// to a host that is not this machine's
    (anyone on the path reads it): a key the replica has now (an empty one is none, and
    none is sent), or a key file, which may hold one once rewritten."""
    warnings = [warning for where, path in _secret_files(config, "")
                if (warning := exposed_file_warning(path, where)) is not None]
    for i, replica in enumerate(config.replicas):
        keyed = replica.api_key_file or replica.resolved_api_key() is not None
        url = urlsplit(replica.url)
        if keyed and url.scheme == "http" and not _loopback(url.hostname or ""):
            warnings.append(f"replicas[{i}] ({replica.id}) is sent its API key over plain "
                            f"http:// to {url.hostname}, readable on the network: use "
                            "https:// or a private network")
    return warnings


def _secret_files(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """(key, path) of each secret kept in a file (a ``*_file`` key: ``admin.token_file``,
    ``replicas[0].api_key_file`` ...) in the config dataclass ``value``, at ``where``."""
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _secret_files(item, f"{where.removesuffix('.')}[{i}].")
        return
    if not dataclasses.is_dataclass(value):
        return
    for field in dataclasses.fields(value):
        item = getattr(value, field.name)
        if field.name.endswith("_file") and is_secret_key(field.name):
            if isinstance(item, str) and item:
                yield f"{where}{field.name}", item
        else:
            yield from _secret_files(item, f"{where}{field.name}.")


def _loopback(host: str) -> bool:
    """Whether ``host`` (a URL's) is this machine: ``localhost`` or a loopback address."""
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url(host: str, port: int) -> str:
    """The address a start line names, as a browser or curl takes it: an IPv6 address in
    brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _check_listeners(config: GatewayConfig, path: str, host_given: bool,
                     port_given: bool = False) -> None:
    """The addresses the gateway will listen on resolve and can be bound (the port is
    free), and the admin API's is not the gateway's own port: named now, before start-up,
    rather than as a bare resolver error or a worker's traceback when binding (or, for the
    admin listener, only at shutdown)."""
    listeners = [("--host" if host_given else "host", "--port" if port_given else "port",
                  config.host, config.port)]
    if config.admin.resolved_token():
        admin = config.admin
        listeners.append(("admin.host", "admin.port", admin.host, admin.port))
        every = ("", "0.0.0.0", "::")  # a host that listens on every address
        if admin.port == config.port and (admin.host == config.host or admin.host in every
                                          or config.host in every):
            raise ConfigError(f"{path}: admin.port {admin.port} is the gateway's own port "
                              "on the same address; the admin API needs a listener of its "
                              "own")
    for key, port_key, host, port in listeners:
        try:  # an empty host: every interface, as asyncio reads it
            infos = passive_addresses(host, port)
        except (OSError, UnicodeError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            raise ConfigError(f"{path}: {key} {host!r} cannot be listened on: {why}") from None
        taken = _bind_error(infos)
        if taken is not None and taken.errno == errno.EADDRINUSE:
            raise ConfigError(f"{path}: {port_key} {port} on {host!r} is in use: stop what "
                              "holds it, or choose another port")
        if taken is not None:
            raise ConfigError(f"{path}: {key} {host!r} {port_key} {port} cannot be listened "
                              f"on: {taken.strerror}")


def _bind_error(infos: list[tuple[Any, ...]]) -> OSError | None:
    """The error binding any of these addresses raises, bound as the server binds them
    (``SO_REUSEADDR``; IPv6 only on an IPv6 socket), or None when each can be bound;
    every socket is closed again."""
    for info in infos:
        try:
            listen_socket(info).close()
        except OSError as exc:
            return exc
    return None


def _supervise(config: GatewayConfig, args: argparse.Namespace) -> int:
    from gateway.workers import Supervisor

    print(f"kvgate serve: {args.workers} workers on {_url(config.host, config.port)} "
          f"(policy {config.policy['name']}, {len(config.replicas)} replicas)",
          file=sys.stderr)
    if config.admin.resolved_token():
        print(f"kvgate serve: admin API on {_url(config.admin.host, config.admin.port)} "
              "(worker 0)", file=sys.stderr)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    return Supervisor(config, args.workers, level,
                      share_routes=getattr(args, "worker_routes", True)).run()
