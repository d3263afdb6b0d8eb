"""The ``det job`` app. Its commands live in :mod:`det.cli.queue` (the queue itself) and
:mod:`det.cli.simulate` (what-if passes), which register on ``app``."""

import typer

app = typer.Typer(no_args_is_help=True)
