"""``python -m ropelens``: the command line."""

from ropelens.cli import main

raise SystemExit(main())
