"""What a det command imports before it acts: only its own command's module (issue 11: every
``det`` invocation imported all of them, FastAPI and the docker SDK included, ~2 s on a
2-core host). Each check runs in a fresh interpreter."""

import pytest
from test_harness_imports import modules_after

OTHERS = {"det.api", "det.cli.serve", "docker", "det.cli.image", "det.reconciler.searchers",
          "det.cli.preview", "det.cli.experiments", "det.cli.queue", "det.cli.checkpoints"}


def test_importing_the_cli_imports_no_command() -> None:
    modules = modules_after("import det.cli.main")
    assert not modules & {*OTHERS, "det.cli.cluster", "det.cli.agents", "det.cli.users"}


def test_det_help_lists_every_command_and_imports_none() -> None:
    """``det --help`` built every command to list it (issue 34: 2.8 s of CPU, 1.2 s of it
    det.api); now each is listed by its line in det.cli.main.COMMANDS, and psycopg, which
    only a command's error needs, stays out too."""
    script = ("import os\nos.environ['COLUMNS'] = '250'  # one line per command\n"
              "from typer.testing import CliRunner\n"
              "from det.cli.main import COMMANDS, app\n"
              "r = CliRunner().invoke(app, ['--help'])\n"
              "assert r.exit_code == 0, r.output\n"
              "for name, lazy in COMMANDS.items():\n"
              "    assert lazy.hidden or (name in r.output and lazy.help in r.output), name\n")
    modules = modules_after(script)
    assert not {m for m in modules if m.startswith("det.cli.") and m not in (
        "det.cli.main", "det.cli.lazy")}
    assert not modules & {*OTHERS, "psycopg", "fastapi"}


def test_det_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    from typer.testing import CliRunner

    from det.cli.main import app

    r = CliRunner().invoke(app, ["--version"])
    assert (r.exit_code, r.output) == (0, f"det {version('det')}\n")


@pytest.mark.parametrize(("args", "own"), [
    (["job", "--help"], "det.cli.queue"),
    (["agent", "list", "--help"], "det.cli.agents"),
    (["user", "whoami", "--help"], "det.cli.login"),
    (["cluster", "config", "show", "--help"], "det.cli.pools"),
])
def test_a_command_imports_its_own_module_only(args: list[str], own: str) -> None:
    modules = modules_after(
        "from typer.testing import CliRunner\n"
        "from det.cli.main import app\n"
        f"r = CliRunner().invoke(app, {args!r})\n"
        "assert r.exit_code == 0, r.output\n"
    )
    assert own in modules
    assert not modules & (OTHERS - {own})


def test_a_mistyped_command_is_told_the_close_names() -> None:
    from typer.testing import CliRunner

    from det.cli.main import app

    r = CliRunner().invoke(app, ["experimnt", "list"])
    assert r.exit_code == 2 and "No such command 'experimnt'. Did you mean 'experiment'?" \
        in r.output
    r = CliRunner().invoke(app, ["zzz"])
    assert r.exit_code == 2 and "No such command 'zzz'." in r.output
    assert "Did you mean" not in r.output
