"""Every command's help reads as plain text: no reStructuredText markup, real metavars
(issue 10, "Telling the truth")."""

import pytest
import typer
from typer.testing import CliRunner

from det.cli.main import app


def _commands(group, path: tuple[str, ...] = ()):
    yield path
    if hasattr(group, "list_commands"):  # det's own group builds its commands when asked
        ctx = typer.Context(group)
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if not cmd.hidden:
                yield from _commands(cmd, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) or "det" for p in COMMANDS])
def test_help_is_plain_text(path: tuple[str, ...]) -> None:
    r = CliRunner().invoke(app, [*path, "--help"], terminal_width=100)
    assert r.exit_code == 0, r.output
    for bad in ("``", "<bool>", "<str>", "{", ":mod:", ":func:", "Raises:"):
        assert bad not in r.output, f"det {' '.join(path)} --help shows {bad!r}:\n{r.output}"


def test_paragraphs_wrap_at_the_terminal_not_at_the_docstring() -> None:
    """Issue 34: `det experiment --help` broke its descriptions mid-sentence where the
    docstring's source lines ended; each paragraph is one line for the terminal to wrap."""
    r = CliRunner().invoke(app, ["experiment", "create", "--help"], terminal_width=250,
                           env={"COLUMNS": "250"})
    assert "Refused, unless --force, when the pool's agents could never hold one trial's slots " \
           "(more slots than the pool has" in r.output


def test_reflow_keeps_paragraphs_and_lists() -> None:
    from det.cli.lazy import reflow

    assert reflow("One\n    two.\n\n    Three\n    four.") == "One two.\n\nThree four."
    listed = "Kinds:\n- a\n- b"
    assert reflow(listed) == listed
