"""``det trial``: logs (optionally followed) and details."""

import time

import typer

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.errors import NotFoundError

app = typer.Typer(no_args_is_help=True)

TRIAL = """
SELECT t.id, t.experiment_id, t.state::text AS state, t.hparams, t.seed, t.restarts, t.runs,
       t.steps_completed, t.best_validation, t.latest_checkpoint::text AS latest_checkpoint,
       t.exit_reason, t.start_time, t.end_time
  FROM trials t WHERE t.id = %(id)s
"""

LOGS_AFTER = """
SELECT id, ts, stream, line FROM task_logs
 WHERE trial_id = %(trial)s AND id > %(after)s ORDER BY id LIMIT 5000
"""

FIRST_TRIAL = "SELECT min(id) AS id FROM trials WHERE experiment_id = %(id)s"

METRICS = """
SELECT "group", steps_completed, "values" FROM metrics
 WHERE trial_id = %(id)s ORDER BY steps_completed, id
"""

TERMINAL = {"COMPLETED", "CANCELED", "ERROR"}


def _trial(conn, trial_id: int) -> dict:
    row = conn.execute(TRIAL, {"id": trial_id}).fetchone()
    if row is None:
        raise NotFoundError(f"trial {trial_id} not found")
    return row


def stream_logs(trial_id: int, follow: bool, interval: float = 0.5) -> None:
    """Print the trial's logs; with ``follow``, keep printing until the trial ends."""
    with db() as conn:
        conn.autocommit = True
        _trial(conn, trial_id)
        after = 0
        while True:
            rows = conn.execute(LOGS_AFTER, {"trial": trial_id, "after": after}).fetchall()
            for r in rows:
                prefix = "[det] " if r["stream"] == "det" else ""
                typer.echo(f"{prefix}{r['line']}", err=r["stream"] == "stderr")
                after = r["id"]
            if rows:
                continue
            if not follow or _trial(conn, trial_id)["state"] in TERMINAL:
                # One more read: lines flushed between the last read and the state check.
                if not conn.execute(LOGS_AFTER, {"trial": trial_id, "after": after}).fetchone():
                    return
                continue
            time.sleep(interval)


def follow_experiment(exp_id: int) -> None:
    """Stream the logs of the experiment's first trial once it exists."""
    with db() as conn:
        conn.autocommit = True
        while (row := conn.execute(FIRST_TRIAL, {"id": exp_id}).fetchone())["id"] is None:
            time.sleep(0.5)
    stream_logs(row["id"], follow=True)


@app.command("logs")
def logs(
    trial_id: int = typer.Argument(..., metavar="TRIAL_ID"),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until it ends."),
) -> None:
    """The trial's stdout and stderr (and det's own notes on its runs), from the database."""
    stream_logs(trial_id, follow)


@app.command("describe")
def describe(
    trial_id: int = typer.Argument(..., metavar="TRIAL_ID"),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The trial's state, hyperparameters and metrics."""
    with db() as conn:
        trial = _trial(conn, trial_id)
        metrics = conn.execute(METRICS, {"id": trial_id}).fetchall()
    if json_:
        print_json({**trial, "metrics": metrics})
        return
    print_table([trial], ["id", "experiment_id", "state", "steps_completed", "best_validation",
                          "restarts", "latest_checkpoint"],
                ["ID", "Experiment", "State", "Batches", "Best", "Restarts", "Checkpoint"])
    typer.echo(f"\nhyperparameters: {trial['hparams']}\n")
    print_table(metrics, ["group", "steps_completed", "values"], ["Group", "Batches", "Metrics"])
