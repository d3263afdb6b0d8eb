"""``det trial``: logs (optionally followed) and details."""

import time
from pathlib import Path

import typer
from psycopg.rows import dict_row

from det.cli.logs import stream_log_rows
from det.cli.output import cell, flatten, print_json, print_table
from det.cli.session import db
from det.db import database_url
from det.db.reconnect import Reconnecting
from det.errors import DetError
from det.queries.experiments import get_experiment
from det.queries.trials import get_trial
from det.sql import named
from det.states import TERMINAL

READ = named("queries")
app = typer.Typer(no_args_is_help=True)

def stream_logs(trial_id: int, follow: bool, interval: float = 0.5, timestamps: bool = False,
                head: int | None = None, tail: int | None = None) -> None:
    """Print the trial's logs, every line on stdout (the harness's own lines are its stderr:
    `det trial logs 1 | grep` lost them), each after its time with ``timestamps``;
    only the first ``head`` or the last ``tail`` lines when given; with ``follow``, keep
    printing until the trial ends. Rides out database restarts
    (:func:`det.cli.logs.stream_log_rows`).
    """
    after = 0
    with db() as conn:
        get_trial(conn, trial_id)
        if tail is not None:
            last = conn.execute(READ.trial_logs_tail,
                                {"trial": trial_id, "limit": tail + 1}).fetchall()
            after = last[-1]["id"] if len(last) > tail else 0
    stream_log_rows(f"det trial logs {trial_id}",
                    lambda c, after: c.execute(READ.trial_logs_after,
                                               {"trial": trial_id, "after": after,
                                                "limit": 5000}).fetchall(),
                    (lambda c: get_trial(c, trial_id)["state"] in TERMINAL) if follow else None,
                    interval, timestamps=timestamps, after=after, head=head)


def stream_experiment_logs(exp_id: int, follow: bool, interval: float = 0.5,
                           timestamps: bool = False, tail: int | None = None) -> None:
    """Print every trial's log lines of the experiment in the order they were written, each
    after its trial and run (``[trial 5 run 2]``, :func:`det.cli.logs.line_prefix`), only the
    last ``tail`` when given; with ``follow``, keep printing (trials that start later
    included) until the experiment ends. Raises ``NotFoundError`` for an unknown experiment.
    """
    after = 0
    with db() as conn:
        get_experiment(conn, exp_id)
        if tail is not None:
            last = conn.execute(READ.experiment_logs_tail,
                                {"experiment": exp_id, "limit": tail + 1}).fetchall()
            after = last[-1]["id"] if len(last) > tail else 0
    stream_log_rows(
        f"det experiment logs {exp_id}",
        lambda c, after: c.execute(READ.experiment_logs_after,
                                   {"experiment": exp_id, "after": after,
                                    "limit": 5000}).fetchall(),
        (lambda c: c.execute(READ.experiment_state, {"id": exp_id}).fetchone()["state"]
         in TERMINAL) if follow else None,
        interval, timestamps=timestamps, after=after)


def follow_experiment(exp_id: int) -> None:
    """Stream the logs of the experiment's first trial once it exists; rides out database
    restarts."""
    with Reconnecting(database_url(), row_factory=dict_row) as session:
        while (row := session.run(
                f"det experiment {exp_id}: first trial",
                lambda c: c.execute(READ.first_trial, {"id": exp_id}).fetchone()))["id"] is None:
            time.sleep(0.5)
    stream_logs(row["id"], follow=True)


@app.command("logs")
def logs(
    trial_id: int = typer.Argument(..., metavar="TRIAL_ID"),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until it ends."),
    timestamps: bool = typer.Option(False, "--timestamps", "-t",
                                    help="Start each line with when it was written (UTC)."),
    head: int = typer.Option(None, "--head", min=0, help="Only the first N lines."),
    tail: int = typer.Option(None, "--tail", min=0,
                             help="Only the last N lines (with -f: then the new ones)."),
) -> None:
    """The trial's stdout and stderr (and det's own notes on its runs), from the database,
    all on stdout."""
    if head is not None and (tail is not None or follow):
        raise DetError("--head: give it alone, not with --tail or --follow")
    stream_logs(trial_id, follow, timestamps=timestamps, head=head, tail=tail)


@app.command("describe")
def describe(
    trial_id: int = typer.Argument(..., metavar="TRIAL_ID"),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
    superseded: bool = typer.Option(
        False, "--superseded",
        help="Also show the metrics of earlier runs that a restart superseded (they reported "
             "after the checkpoint the next run resumed from), with the run that did."),
) -> None:
    """The trial's state, hyperparameters and metrics: its one history, each step as the run
    that trained it last reported it."""
    with db() as conn:
        trial = get_trial(conn, trial_id)
        metrics = conn.execute(READ.trial_metrics,
                               {"id": trial_id, "superseded": superseded}).fetchall()
        runs = conn.execute(READ.trial_runs, {"id": trial_id}).fetchall()
    columns = ["group", "steps_completed", "values"]
    if superseded:
        columns.append("superseded_by_run")
    else:
        metrics = [{k: m[k] for k in columns} for m in metrics]
    if json_:
        print_json({**trial, "runs": runs, "metrics": metrics})
        return
    print_table([trial], ["id", "experiment_id", "state", "batches", "best_validation",
                          "restarts", "latest_checkpoint"],
                ["ID", "Experiment", "State", "Batches", "Best", "Restarts", "Checkpoint"])
    typer.echo(f"\nhyperparameters: {cell(trial['hparams'])}")
    if trial["metadata"]:
        typer.echo(f"metadata: {trial['metadata']}")
    if runs:
        typer.echo("")
        print_table(runs, ["run", "state", "agent_id", "exit_code", "exit_reason"],
                    ["Run", "State", "Agent", "Exit code", "Exit reason"])
    typer.echo("")
    # One column per metric name (any group's), not the values as one JSON cell.
    seen: set[str] = set()
    rows = []
    for m in metrics:
        values = flatten(m["values"])
        seen.update(values)
        rows.append({**m, **{f"m.{k}": v for k, v in values.items()}})
    names = sorted(seen)
    print_table(rows, ["group", "steps_completed", *(f"m.{k}" for k in names),
                       *(["superseded_by_run"] if superseded else [])],
                ["Group", "Batches", *names, *(["Superseded by run"] if superseded else [])])


@app.command("continue")
def continue_(
    trial_id: int = typer.Argument(..., metavar="TRIAL_ID"),
    config_file: Path = typer.Option(
        None, "--config-file", help="The new experiment's config (YAML; default: the trial's "
                                    "experiment's original config)."),
    config_overrides: list[str] = typer.Option(
        [], "--config", metavar="KEY=VALUE",
        help="Override a config key (dotted; the value is YAML), e.g. "
             "searcher.max_length.batches=400 to train further. Repeatable."),
    force: bool = typer.Option(False, "--force",
                               help="Submit even if no agent of the pool could ever run it."),
    workspace: str = typer.Option(None, "--workspace", "-w",
                                  help="Workspace to place it in (with --project; default: "
                                       "the config's workspace key, else the trial's)."),
    project: str = typer.Option(None, "--project", help="Project (of --workspace) to place it in."),
) -> None:
    """Create an experiment of one trial (searcher single) with this trial's hyperparameters
    and model definition that resumes it from its latest checkpoint: its weights and
    optimizer state loaded, batches counted on from the checkpoint's. The checkpoint stays
    pinned while the new experiment exists. The WebUI's Continue does the same."""
    from det.configs import read_config_file
    from det.submission import continue_trial

    text = read_config_file(config_file) if config_file is not None else None
    with db() as conn:
        new_id = continue_trial(conn, trial_id, text,
                                str(config_file or f"trial {trial_id}'s experiment"),
                                config_overrides, workspace, project, None, force)
    typer.echo(f"Created experiment {new_id} (continues trial {trial_id})")
