"""``kvgate serve --config gateway.yaml [--host H] [--port P]``"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from policies.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="gateway YAML file")
    parser.add_argument("--host", help="override the config's host")
    parser.add_argument("--port", type=int, help="override the config's port")


def run(args: argparse.Namespace) -> int:
    from gateway.admin import create_admin_app
    from gateway.app import create_app
    from gateway.config import load_config
    from gateway.http_server import run_server
    from gateway.state import build_state

    try:
        config = load_config(args.config)
        overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v}
        config = dataclasses.replace(config, **overrides)
        gw = build_state(config)
        app = create_app(config, gw)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"kvgate serve: {exc}", file=sys.stderr)
        return 2
    print(f"kvgate serve: gateway on http://{config.host}:{config.port} "
          f"(policy {gw.policy.name}, {len(config.replicas)} replicas"
          + "".join(f", discovery {s.label}" for s in config.discovery) + ")",
          file=sys.stderr)
    admin_app = None
    if config.admin.resolved_token():
        admin_app = create_admin_app(gw)
        print(f"kvgate serve: admin API on http://{config.admin.host}:{config.admin.port}",
              file=sys.stderr)
    def drain() -> None:
        gw.draining = True
        print(f"kvgate serve: draining for {config.shutdown.grace_s} s, then stopping",
              file=sys.stderr)

    run_server(app, config, admin_app, drain)
    return 0
