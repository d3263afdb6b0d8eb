"""``det cmd``: commands run on the cluster, their output streamed (Determined's
``det cmd run``)."""

from pathlib import Path

import typer

from det.cli.tasks import (
    CONFIG,
    CONFIG_FILE,
    CONTEXT,
    FORCE,
    PROJECT,
    TEMPLATE,
    WORKSPACE,
    add_common,
    follow_logs,
    submit,
)


def exit_status(run: dict) -> int:
    """The exit status ``det cmd run`` ends with for a command's ended ``run``
    (det.queries.tasks.run_of): the command's own, 128 + N for a command killed by signal N (as a
    shell says), 1 if no agent ever took it or it has no exit code (the reason printed on
    stderr)."""
    code = run["exit_code"]
    if code is None or not run["claimed"]:
        typer.echo(f"Error: the command did not run: {run['end_reason'] or run['state']}",
                   err=True)
        return 1
    if code != 0 and run["end_reason"]:
        typer.echo(f"[det] {run['end_reason']}", err=True)
    return 128 - code if code < 0 else min(code, 255)


app = typer.Typer(no_args_is_help=True)


@app.command("run", context_settings={"allow_interspersed_args": False})
def run(
    command: list[str] = typer.Argument(..., metavar="[--] CMD...",
                                        help="The command and its arguments, run as is."),
    config_file: Path = CONFIG_FILE, config: list[str] = CONFIG, template: str = TEMPLATE,
    context_dir: Path = CONTEXT, workspace: str = WORKSPACE, project: str = PROJECT,
    force: bool = FORCE,
    detach: bool = typer.Option(False, "--detach", "-d",
                                help="Print the id and return; do not stream its output."),
) -> None:
    """Run a command on the cluster: streams its output and exits with its exit status
    (1, with the reason, if it never ran)."""
    job = submit("COMMAND", config_file, config, template, context_dir, workspace, project,
                 force, entrypoint=command)
    if detach:
        typer.echo(job)
        return
    raise typer.Exit(exit_status(follow_logs(job, follow=True)))


add_common(app, "COMMAND")
