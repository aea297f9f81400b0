"""kvgate, the product: its command line (``kvgate.cli``) and nothing else.

Each package keeps its own subcommand module (``gateway.serve``, ``engine.cli``,
``engine.model.tiny``, ``loadtests.cli_fleet``, ``loadtests.cli_demo``); the command line
loads the one being run, by name.
"""
