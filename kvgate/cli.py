"""The ``kvgate`` command line: the product's entry point (``kvgate ...`` or
``python -m kvgate ...``).

Subcommands load their modules lazily, so ``kvgate serve`` never imports the engine's
executors and ``kvgate engine`` never imports the gateway's app.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
from collections.abc import Callable
from typing import Any

# name -> (module, help); each module offers add_arguments(parser) and run(args) -> int
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.serve", "run the gateway in front of a fleet"),
    "engine": ("engine.cli", "run one engine replica"),
    "make-tiny-model": ("engine.model.tiny", "write a small random model for demos and tests"),
    "fleet": ("loadtests.cli_fleet", "start or stop a local simulated fleet"),
    "demo": ("loadtests.cli_demo", "run a short local comparison of routing policies"),
    "audit": ("gateway.audit_cli", "find prompt layouts that defeat prefix caching in a "
              "capture log"),
    "plan": ("loadtests.plan", "size a fleet's cache for a workload; recommend a policy"),
    "top": ("gateway.top", "a live view of the fleet through the gateway's admin API"),
}
# an optional dependency's import name -> the extra that installs it (pyproject.toml)
EXTRAS = {"torch": "engine", "triton": "engine", "safetensors": "engine",
          "locust": "loadtest", "matplotlib": "loadtest",
          "kubernetes_asyncio": "kubernetes", "opentelemetry": "otel"}


def _unavailable(name: str, exc: ImportError) -> str:
    """Why ``kvgate NAME`` cannot run, with the extra that installs what it lacks."""
    extra = EXTRAS.get((exc.name or "").partition(".")[0])
    hint = f": pip install 'kvgate[{extra}]'" if extra else ""
    return f"kvgate {name} is unavailable ({exc}){hint}"


def build_parser(argv: list[str] | None = None
                 ) -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="kvgate", description="Cache-aware LLM routing")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)
    modules: dict[str, Any] = {}
    given = sys.argv[1:] if argv is None else argv
    wanted = next((a for a in given if a in SUBCOMMANDS), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name != wanted:
            continue  # import only the module of the subcommand being run
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # its arguments are unknown: any are taken (see main)
            p.description = _unavailable(name, exc)
            p.set_defaults(_missing=p.description)
            continue
        module.add_arguments(p)
        modules[name] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    missing = getattr(args, "_missing", None)
    if missing:  # whatever arguments follow: they are the unloaded subcommand's
        print(missing, file=sys.stderr)
        return 2
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(level=str(args.log_level).upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run: Callable[[argparse.Namespace], int] = modules[args.command].run
    try:
        return int(run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: what the command started has stopped on the way
        with contextlib.suppress(OSError):  # a closed stderr
            print(f"kvgate {args.command}: stopped", file=sys.stderr)
        return 130  # as a shell reports a command ended by SIGINT
    except OSError as exc:  # a path that cannot be read or written, an address not served
        logging.getLogger("kvgate").debug("kvgate %s failed", args.command, exc_info=True)
        what = f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else exc
        print(f"kvgate {args.command}: {what}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
