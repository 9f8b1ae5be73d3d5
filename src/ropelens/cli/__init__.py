"""The ``ropelens`` command line: ``main`` in :mod:`ropelens.cli.main`, one module per command group,
shared option groups in :mod:`ropelens.cli.common`."""

from ropelens.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
