"""The ``ropelens`` command line's machinery: the option groups and ``Command``
(:mod:`ropelens.cli.common`), the ``--variant`` syntax (:mod:`ropelens.cli.variant_syntax`), and
``main`` (:mod:`ropelens.cli.main`), whose parser holds the command of every registered analysis
(the commands themselves are declared in ``ropelens.catalog``)."""

from ropelens.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
