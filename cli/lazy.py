"""A command group that imports a command's module only when that command runs.

Importing every command of ``det`` (FastAPI for ``det serve``, the docker SDK for
``det image``, the searchers for ``det preview-search``, the config models) took ~2 s of CPU on
a 2-core host before any command began: each ``det`` invocation paid it, a submission from a
script or a cron job included. This is click's documented lazy-loading pattern
("Lazily Loading Subcommands") on typer's group class, so help keeps typer's formatting.
"""

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from difflib import get_close_matches
from functools import cache

import typer
import typer.core
import typer.main


def reflow(text: str) -> str:
    """``text`` (a docstring) with each paragraph on one line, for the terminal to wrap: typer
    keeps the docstring's own line breaks in every paragraph but the first, which broke
    sentences mid-line at any width but the source's. A paragraph of indented or
    bulleted lines keeps its breaks."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        p if any(line.startswith((" ", "-", "*", "\b")) for line in p.splitlines())
        else " ".join(p.split()) for p in paragraphs)


def _reflow_help(command) -> None:
    """:func:`reflow` the help of ``command`` and of every command below it."""
    if command.help:
        command.help = reflow(command.help)
    for sub in getattr(command, "commands", {}).values():
        _reflow_help(sub)


def _add_ls(command) -> None:
    """Give every group below ``command`` that has ``list`` a hidden ``ls``: Determined's
    alias of each of its ``list`` commands."""
    commands = getattr(command, "commands", None)
    if commands is None:
        return
    if "list" in commands and "ls" not in commands:
        alias = copy.copy(commands["list"])
        alias.name, alias.hidden = "ls", True
        commands["ls"] = alias
    for sub in list(commands.values()):
        _add_ls(sub)


@dataclass(frozen=True)
class Lazy:
    """One command of the group: ``load`` imports its module and returns its Typer app (a
    group of commands, whose help is ``help``) or its function (one command, whose help is
    its docstring); an alias is ``hidden``."""

    load: Callable[[], typer.Typer | Callable]
    help: str | None = None
    hidden: bool = False


def group(commands: dict[str, Lazy]) -> type[typer.core.TyperGroup]:
    """A TyperGroup class (for ``typer.Typer(cls=...)``) whose commands are ``commands``,
    each built at its first lookup: running ``det job list`` imports the job commands only.
    The group's own help lists each command by its ``Lazy.help`` without building any:
    ``det --help`` imported every command module (FastAPI, the docker SDK, the searchers),
    1.2 s of CPU of its 2.8."""

    @cache
    def build(name: str) -> typer.core.TyperCommand | typer.core.TyperGroup:
        lazy = commands[name]
        target = lazy.load()
        if isinstance(target, typer.Typer):
            command = typer.main.get_group(target)
            command.help = lazy.help
        else:
            single = typer.Typer()
            single.command(name)(target)
            command = typer.main.get_command(single)
        command.name = name
        command.hidden = lazy.hidden
        _reflow_help(command)
        _add_ls(command)
        return command

    class LazyGroup(typer.core.TyperGroup):
        listing = False
        """True while the group's help is written: commands are then named, not built."""

        def list_commands(self, ctx) -> list[str]:
            return [*super().list_commands(ctx), *commands]

        def get_command(self, ctx, cmd_name: str):
            if cmd_name in commands:
                if self.listing:
                    lazy = commands[cmd_name]
                    return typer.core.TyperCommand(cmd_name, help=lazy.help,
                                                   hidden=lazy.hidden)
                return build(cmd_name)
            return super().get_command(ctx, cmd_name)

        def format_help(self, ctx, formatter) -> None:
            self.listing = True
            try:
                super().format_help(ctx, formatter)
            finally:
                self.listing = False

        def resolve_command(self, ctx, args: list[str]):
            # typer suggests close names from the commands built so far: name the others too
            name = args[0] if args else ""
            if (name and not name.startswith("-") and not ctx.resilient_parsing
                    and self.get_command(ctx, name) is None):
                close = get_close_matches(name, [n for n, c in commands.items() if not c.hidden])
                hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
                ctx.fail(f"No such command {name!r}.{hint}")
            return super().resolve_command(ctx, args)

    return LazyGroup
