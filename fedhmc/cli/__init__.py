"""The ``fedhmc`` command line, one module per subcommand; `main` is the entry point."""

from fedhmc.cli.main import main

__all__ = ["main"]
