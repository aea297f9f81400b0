"""kvgate, the product: its command line (``kvgate.cli``) and the prefix-stability checks
users run in their own tests (``kvgate.layout``).

Each package keeps its own subcommand module (``gateway.serve``, ``gateway.audit_cli``,
``engine.cli``, ``engine.model.tiny``, ``loadtests.cli_fleet``, ``loadtests.cli_demo``); the
command line loads the one being run, by name.
"""
