"""``det shell``: an SSH server in a task (det.harness.interactive.shell), opened with the
system ``ssh`` and the task's own key."""

import os
import subprocess
import tempfile
from pathlib import Path

import typer

from det.cli.session import db
from det.cli.tasks import (
    CONFIG,
    CONFIG_FILE,
    CONTEXT,
    FORCE,
    ID,
    PROJECT,
    TEMPLATE,
    WORKSPACE,
    add_common,
    submit,
    wait_ready,
)
from det.configs.job import parse_job_id
from det.db import det_home
from det.errors import DetError
from det.queries.tasks import get_task
from det.sql import named

Q = named("cli")

SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"]
"""Every task's sshd has a new host key, so none is remembered or checked; the task's own
key is the only one offered."""


def ssh_argv(address: str, key_file: str, ssh_args: list[str]) -> list[str]:
    """The ``ssh`` command line that logs in to a shell at its run's ``address``
    (``user@host:port``: the task's sshd lets in its own user alone, recorded by the task,
    det.harness.interactive.shell) with the private key in ``key_file``, then ``ssh_args``.

    Raises:
        DetError: an address without its user.
    """
    user, at, host_port = address.rpartition("@")
    if not at:
        raise DetError(f"the shell's address {address!r} names no user")
    host, _, port = host_port.rpartition(":")
    return ["ssh", "-i", key_file, "-p", port, *SSH_OPTIONS, f"{user}@{host.strip('[]')}",
            *ssh_args]


def ssh_key(conn, job: int) -> str:
    """The private key that opens shell ``job`` (det_user.task_ssh_key).

    Raises:
        NotFoundError / PermissionDeniedError: not a shell the caller may open (Editor).
    """
    key = conn.execute(Q.task_ssh_key, (job,)).fetchone()["k"]
    return key if key.endswith("\n") else key + "\n"  # ssh refuses a key without it


def write_key(path: str | Path, key: str) -> None:
    """Write ``key`` to ``path``, readable by its owner alone (ssh refuses any other)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)


def open_shell(job: int, ssh_args: list[str]) -> int:
    """Run the system ``ssh`` into shell ``job`` once its server answers; returns ssh's exit
    status. The private key lives in a 0600 temporary file removed afterwards."""
    with db() as conn:
        key = ssh_key(conn, job)  # refused before any wait
    run = wait_ready(job)
    with tempfile.TemporaryDirectory(prefix=f"det-shell-{job}-") as tmp:
        key_file = str(Path(tmp) / "key")
        write_key(key_file, key)
        return subprocess.run(ssh_argv(run["address"], key_file, ssh_args)).returncode


app = typer.Typer(no_args_is_help=True)


@app.command("start")
def shell_start(
    config_file: Path = CONFIG_FILE, config: list[str] = CONFIG, template: str = TEMPLATE,
    context_dir: Path = CONTEXT, workspace: str = WORKSPACE, project: str = PROJECT,
    force: bool = FORCE,
    detach: bool = typer.Option(False, "--detach", "-d", help="Print the id; do not open it."),
) -> None:
    """Start a shell (an SSH server in a task) and open it with ssh."""
    job = submit("SHELL", config_file, config, template, context_dir, workspace, project, force)
    typer.echo(job)
    if not detach:
        raise typer.Exit(open_shell(job, []))


@app.command("open", context_settings={"allow_interspersed_args": False})
def shell_open(job: int = ID,
               ssh_args: list[str] = typer.Argument(None, metavar="[-- SSH_ARGS...]",
                                                    help="Passed to ssh (a command to run)."),
               ) -> None:
    """Log in to the shell with the system ssh and the task's own key (Editor of its
    workspace); exits with ssh's status."""
    job = parse_job_id(job, "ID")
    with db() as conn:
        get_task(conn, job, "SHELL")
    raise typer.Exit(open_shell(job, list(ssh_args or [])))


@app.command("show_ssh_command")
def show_ssh_command(job: int = ID) -> None:
    """Print the ssh command that opens the shell; its key is saved, readable by you alone,
    under det's home."""
    job = parse_job_id(job, "ID")
    with db() as conn:
        get_task(conn, job, "SHELL")
        key = ssh_key(conn, job)  # refused before any wait
    run = wait_ready(job)
    keys = det_home() / "ssh"
    keys.mkdir(mode=0o700, parents=True, exist_ok=True)
    key_file = keys / f"shell-{job}.key"
    write_key(key_file, key)
    typer.echo(" ".join(ssh_argv(run["address"], str(key_file), [])))


add_common(app, "SHELL")
