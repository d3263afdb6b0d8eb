"""``det notebook`` and ``det tensorboard``: JupyterLab and TensorBoard in a task, opened
through det serve's proxy at ``/proxy/<id>/``."""

import os
import webbrowser
from collections.abc import Callable
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
from det.errors import DetError
from det.queries.tasks import get_task


def serve_url() -> str | None:
    """Where det serve answers: ``DET_MASTER`` (Determined's variable), else the web server
    ``det cluster up`` runs on this machine; None if neither. A ``DET_MASTER`` that is a
    database URL names det's database instead (:mod:`det.cli.master`)."""
    from det.cli.master import is_database_url

    url = os.environ.get("DET_MASTER")
    if url and not is_database_url(url):
        return (url if "://" in url else f"http://{url}").rstrip("/")
    from det.cli.cluster import running_web_url

    url = running_web_url()
    return url.rstrip("/") if url else None


def open_url(job: int, browser: bool) -> None:
    """Print the proxy URL of task ``job`` and, with ``browser``, open it in a browser."""
    path = f"/proxy/{job}/"
    base = serve_url()
    if base is None:
        typer.echo(f"{path} (no det serve found: set DET_MASTER to its URL, or run "
                   "det cluster up)")
        return
    typer.echo(f"{base}{path}")
    if browser:
        webbrowser.open(f"{base}{path}")


NO_BROWSER = typer.Option(False, "--no-browser", help="Print the URL only.")

notebook_app = typer.Typer(no_args_is_help=True)


@notebook_app.command("start")
def notebook_start(
    config_file: Path = CONFIG_FILE, config: list[str] = CONFIG, template: str = TEMPLATE,
    context_dir: Path = CONTEXT, workspace: str = WORKSPACE, project: str = PROJECT,
    force: bool = FORCE, no_browser: bool = NO_BROWSER,
) -> None:
    """Start JupyterLab; once it answers, print its URL (through det serve) and open it."""
    job = submit("NOTEBOOK", config_file, config, template, context_dir, workspace, project,
                 force)
    wait_ready(job)
    open_url(job, not no_browser)


tensorboard_app = typer.Typer(no_args_is_help=True)


@tensorboard_app.command("start")
def tensorboard_start(
    experiment_ids: list[int] = typer.Argument(None, metavar="EXPERIMENT_ID..."),
    trial_ids: list[int] = typer.Option([], "--trial-ids", "-t", metavar="TRIAL_ID",
                                        help="A trial to show. Repeatable."),
    config_file: Path = CONFIG_FILE, config: list[str] = CONFIG, template: str = TEMPLATE,
    context_dir: Path = CONTEXT, workspace: str = WORKSPACE, project: str = PROJECT,
    force: bool = FORCE, no_browser: bool = NO_BROWSER,
) -> None:
    """Start TensorBoard over the metrics of experiments and trials (you may view them);
    once it answers, print its URL (through det serve) and open it."""
    if not experiment_ids and not trial_ids:
        raise DetError("give at least one EXPERIMENT_ID or --trial-ids TRIAL_ID")
    job = submit("TENSORBOARD", config_file, config, template, context_dir, workspace,
                 project, force, experiment_ids=tuple(experiment_ids or ()),
                 trial_ids=tuple(trial_ids))
    wait_ready(job)
    open_url(job, not no_browser)


def _open_command(kind: str) -> Callable[..., None]:
    """``det notebook open`` / ``det tensorboard open`` for tasks of ``kind``."""

    def open_(job: int = ID, no_browser: bool = NO_BROWSER) -> None:
        """Print the task's URL (through det serve) once it answers, and open it."""
        job = parse_job_id(job, "ID")
        with db() as conn:
            get_task(conn, job, kind)
        wait_ready(job)
        open_url(job, not no_browser)
    return open_


notebook_app.command("open")(_open_command("NOTEBOOK"))
tensorboard_app.command("open")(_open_command("TENSORBOARD"))
add_common(notebook_app, "NOTEBOOK")
add_common(tensorboard_app, "TENSORBOARD")


