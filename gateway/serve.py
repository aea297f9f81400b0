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
    from gateway.app import create_app
    from gateway.config import load_config
    from gateway.http_server import run_server

    try:
        config = load_config(args.config)
        overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v}
        config = dataclasses.replace(config, **overrides)
        app = create_app(config)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"kvgate serve: {exc}", file=sys.stderr)
        return 2
    run_server(app, config)
    return 0
