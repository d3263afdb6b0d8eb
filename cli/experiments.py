"""``det experiment``: create, list, describe, wait, logs, pause, activate, cancel, kill,
archive, unarchive, delete, set (scheduling settings and the checkpoint GC policy)."""

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import typer
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from tqdm import tqdm

from det import context
from det.cli.output import duration, flatten, number, print_json, print_table, size
from det.cli.session import db
from det.configs import read_config_file
from det.configs.job import job_change
from det.db import database_url
from det.db.reconnect import Reconnecting
from det.errors import DetError
from det.figures import PROGRESS_KEYS
from det.queries.experiments import (
    ListFilter,
    get_experiment,
    job_of,
    list_experiments,
)
from det.queries.workspaces import placement, workspace_defaults
from det.reconciler.searchers.live import add_rungs, page_with_live_progress, with_live_progress
from det.sql import named
from det.submission import context_with, expanded_config, refuse_unfit, template_for_submission

Q = named("cli")
READ = named("queries")

app = typer.Typer(no_args_is_help=True)

# `det experiment wait`'s progress bar: "Experiment 3 ACTIVE  29%|███   | 0:41 elapsed, ~1:40
# left" (it read "Experiment 3 ACTIVE: :  29%", with no time).
WAIT_BAR = "{desc} {percentage:3.0f}%|{bar}| {elapsed} elapsed, ~{remaining} left"

# `det experiment wait` exit codes, by terminal state.
WAIT_EXIT = {"COMPLETED": 0, "ERROR": 1, "CANCELED": 2}


@app.command("create")
def create(
    config_file: Path = typer.Argument(..., help="Experiment config (YAML)."),
    context_dir: Path = typer.Argument(..., help="Model-definition directory to upload."),
    local: bool = typer.Option(False, "--local", help="Run in this process, without a cluster."),
    test_mode: bool = typer.Option(
        False, "--test-mode", "--test", "-t",
        help="Test the config and code with a very small experiment: one batch of training, "
             "a validation and a checkpoint. On the cluster, an archived test experiment whose "
             "logs are followed; with --local, in this process (plus a restore)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream the first trial's logs."),
    force: bool = typer.Option(False, "--force",
                               help="Submit even if no agent of the pool could ever run it."),
    template: str = typer.Option(None, "--template",
                                 help="Merge this configuration template under the config "
                                      "(the config's own values win)."),
    config_overrides: list[str] = typer.Option(
        [], "--config", metavar="KEY=VALUE",
        help="Override a config key (dotted, e.g. resources.slots_per_trial=2; the value is "
             "YAML). Repeatable."),
    paused: bool = typer.Option(False, "--paused", help="Do not activate the experiment."),
    include: list[Path] = typer.Option(
        [], "--include", "-i",
        help="A file or directory added to the context, at its top level. Repeatable."),
    workspace: str = typer.Option(None, "--workspace", "-w",
                                  help="Workspace to place it in (with --project; default: "
                                       "the config's workspace key, else Uncategorized)."),
    project: str = typer.Option(None, "--project", help="Project (of --workspace) to place it in."),
    project_id: int = typer.Option(None, "--project_id",
                                   help="Place it in the project with this id."),
) -> None:
    """Submit an experiment (one transaction: the experiment, its job and its context), owned
    by you, in a project where you are an Editor. The workspace's default resource pool and
    checkpoint storage apply when the config names none.

    Refused, unless --force, when the pool's agents could never hold one trial's slots
    (more slots than the pool has, or a pool without slots for a slot trial)."""
    tpl, defaults = None, None
    if template is not None or not local:
        with db() as conn:
            # a template is its workspace's: the one the experiment goes to
            workspace, project = placement(conn, read_config_file(config_file),
                                           str(config_file), workspace, project, project_id)
            if template is not None:
                tpl = template_for_submission(conn, template, workspace)
            if not local:
                defaults = workspace_defaults(conn, workspace)
    with context_with(context_dir, include) as ctx:
        expanded, original = expanded_config(config_file, ctx, tpl, config_overrides,
                                             test=test_mode and not local, defaults=defaults)
        if local:
            from det.harness.local import run_local

            run_local(expanded, ctx, test_mode)
            return
        blob = context.pack(ctx)
    with db() as conn, conn.transaction():
        if not force:
            refuse_unfit(conn, expanded)
        row = conn.execute(Q.create_experiment,
                           (Jsonb(expanded), original, blob, workspace, project)).fetchone()
        if paused:
            conn.execute(Q.experiment_pause, (row["id"],))
    if test_mode:
        typer.echo(f"Created test experiment {row['id']}")
        _follow_test(row["id"])
        return
    typer.echo(f"Created experiment {row['id']}")
    if follow and not paused:
        from det.cli.trials import follow_experiment

        follow_experiment(row["id"])


def _follow_test(exp_id: int) -> None:
    """Follow a ``--test`` experiment's logs to its end, archive it, and say whether the test
    passed (exit 1 if not)."""
    from det.cli.trials import follow_experiment

    follow_experiment(exp_id)
    with Reconnecting(database_url(), row_factory=dict_row) as session:
        while (state := session.run(
                f"det experiment {exp_id}: state",
                lambda c: c.execute(READ.experiment_state,
                                    {"id": exp_id}).fetchone()["state"])) not in WAIT_EXIT:
            time.sleep(0.5)
    with db() as conn:
        conn.execute(Q.experiment_archive, (exp_id,))
    if state != "COMPLETED":
        raise DetError(f"test experiment {exp_id} ended {state}: the model definition test "
                       "failed (see its logs above)")
    typer.echo(f"Test experiment {exp_id} COMPLETED (archived): model definition test "
               "succeeded")


@app.command("fork")
def fork(
    exp_id: int = typer.Argument(..., metavar="ID", help="Experiment to fork."),
    config_file: Path = typer.Option(
        None, "--config-file", help="The new experiment's config (YAML; default: the "
                                    "experiment's own original config)."),
    config_overrides: list[str] = typer.Option(
        [], "--config", metavar="KEY=VALUE",
        help="Override a config key (dotted; the value is YAML). Repeatable."),
    force: bool = typer.Option(False, "--force",
                               help="Submit even if no agent of the pool could ever run it."),
    workspace: str = typer.Option(None, "--workspace", "-w",
                                  help="Workspace to place it in (with --project; default: "
                                       "the config's workspace key, else the experiment's)."),
    project: str = typer.Option(None, "--project", help="Project (of --workspace) to place it in."),
    project_id: int = typer.Option(None, "--project_id",
                                   help="Place it in the project with this id."),
) -> None:
    """Create an experiment from experiment ID: its model definition (the context it was
    submitted with) and a new config, checked as `det experiment create` checks one; one
    transaction. The WebUI's Fork does the same."""
    from det.submission import fork_experiment

    text = read_config_file(config_file) if config_file is not None else None
    with db() as conn:
        new_id = fork_experiment(conn, exp_id, text, str(config_file or f"experiment {exp_id}"),
                                 config_overrides, workspace, project, project_id, force)
    typer.echo(f"Created experiment {new_id} (forked from experiment {exp_id})")


@app.command("list")
def list_(
    all_: bool = typer.Option(False, "--all", "-a", help="Include archived experiments."),
    workspace: str = typer.Option(None, "--workspace", "-w", help="Only this workspace's."),
    project: str = typer.Option(None, "--project", help="Only this project's."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The experiments you may view: id, name, state, progress, trials, searcher, best
    validation metric, owner, workspace, project, started and how long it ran (so far)."""
    with db() as conn:
        rows = page_with_live_progress(conn, list_experiments(
            conn, ListFilter(archived=all_, workspace=workspace, project=project)))
    if json_:
        print_json(rows)
        return
    now = datetime.now(UTC)
    for r in rows:
        r["best"] = (f"{r['metric']} {number(r['best_validation'])}"
                     if r["best_validation"] is not None else "")
        r["duration"] = duration((r["ended"] or now) - r["started"]) if r["started"] else ""
    print_table(rows, ["id", "name", "state", "progress", "trials", "searcher", "best", "owner",
                       "workspace", "project", "started", "duration"],
                ["ID", "Name", "State", "Progress %", "Trials", "Searcher", "Best", "Owner",
                 "Workspace", "Project", "Started", "Duration"])


@app.command("describe")
def describe(
    exp_id: int = typer.Argument(..., metavar="ID"),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Config, trials with hyperparameters, best validation metric, checkpoints; for
    adaptive_asha, each trial's rung, its status in the search and the metric that decided it."""
    with db() as conn:
        exp = with_live_progress(conn, get_experiment(conn, exp_id))
        trials = conn.execute(READ.experiment_trials, {"id": exp_id}).fetchall()
        ckpts = conn.execute(READ.experiment_checkpoints, {"id": exp_id}).fetchall()
        asha = add_rungs(conn, exp, trials)
    if json_:
        print_json({**exp, "trials": trials, "checkpoints": ckpts})
        return
    # An old or partial stored config shows "-" for what it lacks (its column is NULL).
    metric = exp["searcher_metric"] or "-"
    smaller = exp["smaller_is_better"] is not False
    best = [t["best_validation"] for t in trials if t["best_validation"] is not None]
    typer.echo(f"Experiment {exp['id']}: {exp['name']}  [{exp['state']}]  "
               f"progress {exp['progress'] * 100:.0f}%  owner {exp['owner']}")
    typer.echo(f"searcher {exp['searcher_name'] or '-'}, metric {metric} "
               f"({'smaller' if smaller else 'larger'} is better); best: "
               f"{number(min(best) if smaller else max(best)) if best else '-'}")
    typer.echo(f"resource pool {exp['resource_pool']}, priority {exp['priority']}, "
               f"weight {exp['weight']}, job {exp['job_id']}")
    if exp["archived"]:
        typer.echo("archived")
    if exp["delete_requested_at"]:
        typer.echo("being deleted: its rows go once its checkpoints' files are removed")
    if exp["checkpoint_gc_error"]:
        typer.echo(f"checkpoint GC failed: {exp['checkpoint_gc_error']}")
    if exp["paused_reason"]:
        typer.echo(f"paused by the cluster: {exp['paused_reason']}; fix it, then "
                   f"`det experiment activate {exp['id']}`")
    typer.echo("\nTrials:")
    print_table(*trials_table(trials, metric))
    if asha:
        typer.echo("\nRungs:")
        rows = [{"id": t["id"], **t["rung"]} for t in trials if t["rung"]]
        print_table(rows, ["id", "bracket", "rung", "length", "status", "metric"],
                    ["Trial", "Bracket", "Rung", "Length", "Search", f"Decided by {metric}"])
    typer.echo("\nCheckpoints:")
    print_table(ckpts, ["uuid", "trial_id", "steps_completed", "state", "validation"],
                ["UUID", "Trial", "Batches", "State", "Validation"])


def trials_table(trials: list[dict], metric: str) -> tuple[list[dict], list[str], list[str]]:
    """Rows, columns and headers of describe's trials table: one column per hyperparameter
    and per metric of each trial's best validation (nested names joined by dots), the
    searcher's ``metric`` first, as "Best <metric>", batches and epochs not again (the
    hyperparameters were once one JSON blob, the metrics absent). Each group's columns in name
    order (the database keeps a JSON object's keys shortest first)."""
    hps: set[str] = set()
    metrics: set[str] = set()
    rows = []
    for t in trials:
        hp = flatten(t["hparams"])
        val = {k: v for k, v in flatten(t["validation"]).items()
               if k != metric and k not in PROGRESS_KEYS}
        hps.update(hp)
        metrics.update(val)
        # Prefixed keys: a hyperparameter or metric may be called "id" or "state".
        rows.append({**t, **{f"hp.{k}": v for k, v in hp.items()},
                     **{f"m.{k}": v for k, v in val.items()}})
    hp_names, metric_names = sorted(hps), sorted(metrics)
    columns = (["id", "state", *(f"hp.{k}" for k in hp_names), "batches", "best_validation",
                *(f"m.{k}" for k in metric_names), "restarts", "exit_reason"])
    headers = ["ID", "State", *hp_names, "Batches", f"Best {metric}", *metric_names,
               "Restarts", "Exit"]
    return rows, columns, headers


def _action(exp_id: int, action: str) -> None:
    with db() as conn:
        get_experiment(conn, exp_id)
        state = conn.execute(Q.experiment_action, (exp_id, action)).fetchone()["s"]
    typer.echo(f"Experiment {exp_id}: {state}")


@app.command("pause")
def pause(exp_id: int = typer.Argument(..., metavar="ID")) -> None:
    """Trials checkpoint at their next opportunity and stop; their slots are freed."""
    _action(exp_id, "pause")


@app.command("activate")
def activate(exp_id: int = typer.Argument(..., metavar="ID")) -> None:
    """Trials resume from their latest checkpoints."""
    _action(exp_id, "activate")


@app.command("cancel")
def cancel(exp_id: int = typer.Argument(..., metavar="ID")) -> None:
    """Trials checkpoint and stop for good."""
    _action(exp_id, "cancel")


@app.command("kill")
def kill(exp_id: int = typer.Argument(..., metavar="ID")) -> None:
    """Trials stop now, without a checkpoint."""
    _action(exp_id, "kill")


def wait_description(exp_id: int, state: str, done: int, total: int) -> str:
    """The wait bar's words before its percentage: the experiment, its state and how many of
    the trials made so far have ended."""
    return f"Experiment {exp_id} {state}, {done}/{total} trials done"


@app.command("wait")
def wait(
    exp_id: int = typer.Argument(..., metavar="ID"),
    interval: float = typer.Option(1.0, help="Seconds between checks."),
) -> None:
    """Block until the experiment ends, showing its progress on a terminal (batches trained
    so far count). Exit code: 0 COMPLETED, 1 ERROR, 2 CANCELED. Rides out database restarts:
    it reconnects and goes on waiting."""
    with db() as conn:
        get_experiment(conn, exp_id)
    what = f"det experiment wait {exp_id}"
    # tqdm draws only on a terminal (disable=None); elsewhere only the final line is printed.
    with Reconnecting(database_url(), row_factory=dict_row) as session, \
            tqdm(total=100, desc=f"Experiment {exp_id}", unit="%", disable=None,
                 file=sys.stderr, bar_format=WAIT_BAR) as bar:
        def read(conn) -> str:
            state = conn.execute(READ.experiment_state, {"id": exp_id}).fetchone()["state"]
            if not bar.disable:  # the live progress only where it is drawn
                exp = with_live_progress(conn, get_experiment(conn, exp_id))
                bar.n = round(exp["progress"] * 100)
                bar.set_description_str(wait_description(
                    exp_id, state, **conn.execute(READ.trials_done, {"id": exp_id}).fetchone()))
            return state

        while (state := session.run(what, read)) not in WAIT_EXIT:
            time.sleep(interval)
    typer.echo(f"Experiment {exp_id}: {state}")
    raise typer.Exit(WAIT_EXIT[state])


@app.command("logs")
def logs(
    exp_id: int = typer.Argument(..., metavar="ID"),
    follow: bool = typer.Option(False, "--follow", "-f",
                                help="Keep streaming, new trials included, until it ends."),
    timestamps: bool = typer.Option(False, "--timestamps", "-t",
                                    help="Start each line with when it was written (UTC)."),
    tail: int = typer.Option(None, "--tail", min=0,
                             help="Only the last N lines (with -f: then the new ones)."),
) -> None:
    """Every trial's output (and det's notes on its runs), in the order written, each line
    after its trial and run: [trial 5 run 2]."""
    from det.cli.trials import stream_experiment_logs

    stream_experiment_logs(exp_id, follow, timestamps=timestamps, tail=tail)


@app.command("archive")
def archive(exp_id: int = typer.Argument(..., metavar="ID")) -> None:
    """Hide an ended experiment from `det experiment list` (--all still shows it)."""
    with db() as conn:
        conn.execute(Q.experiment_archive, (exp_id,))
    typer.echo(f"Experiment {exp_id}: archived")


@app.command("unarchive")
def unarchive(exp_id: int = typer.Argument(..., metavar="ID")) -> None:
    """Show an archived experiment in `det experiment list` again."""
    with db() as conn:
        conn.execute(Q.experiment_unarchive, (exp_id,))
    typer.echo(f"Experiment {exp_id}: unarchived")


@app.command("move")
def move(
    exp_id: int = typer.Argument(..., metavar="ID"),
    workspace_name: str = typer.Argument(..., help="Destination workspace."),
    project_name: str = typer.Argument(..., help="Destination project (of that workspace)."),
) -> None:
    """Move an experiment, with its trials, checkpoints and logs, to another project (Editor
    where it is and where it goes)."""
    with db() as conn:
        conn.execute(Q.experiment_move, (exp_id, workspace_name, project_name))
    typer.echo(f"Experiment {exp_id}: moved to project {project_name} of workspace "
               f"{workspace_name}")


@app.command("delete")
def delete(
    exp_id: int = typer.Argument(..., metavar="ID"),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete an ended experiment: a GC task removes its checkpoints' files, then its rows
    (trials, metrics, logs, checkpoints) go in one transaction. Refused if one of its
    checkpoints is pinned (model registry, warm start)."""
    if not yes:
        typer.confirm(f"Delete experiment {exp_id} with all its checkpoints, metrics and logs?",
                      abort=True)
    with db() as conn:
        gone = conn.execute(Q.experiment_delete, (exp_id,)).fetchone()["gone"]
    if gone:
        typer.echo(f"Experiment {exp_id}: deleted")
    else:
        typer.echo(f"Experiment {exp_id}: deleting; a GC task removes its checkpoints' files, "
                   "then its rows go")


set_app = typer.Typer(no_args_is_help=True)
app.add_typer(set_app, name="set",
              help="Change an experiment's scheduling settings or checkpoint GC policy.")

def _set_job(exp_id: int, field: str, value: str) -> None:
    value = job_change(field, value)  # checked before the transaction: a bad value changes nothing
    with db() as conn, conn.transaction():
        conn.execute(Q.job_update, (job_of(conn, exp_id), field, value))
    typer.echo(f"Experiment {exp_id}: {field} set to {value}")


@set_app.command("priority")
def set_priority(exp_id: int = typer.Argument(..., metavar="ID"),
                 priority: str = typer.Argument(..., metavar="N",
                                                help="1-99; lower runs first.")) -> None:
    """Set the experiment's priority (priority scheduler)."""
    _set_job(exp_id, "priority", priority)


@set_app.command("weight")
def set_weight(exp_id: int = typer.Argument(..., metavar="ID"),
               weight: str = typer.Argument(..., metavar="W",
                                            help="Fair-share weight: a number > 0, at most 1e6.")
               ) -> None:
    """Set the experiment's weight (fair-share scheduler)."""
    _set_job(exp_id, "weight", weight)




@set_app.command("gc-policy")
def set_gc_policy(
    exp_id: int = typer.Argument(..., metavar="ID"),
    save_experiment_best: int = typer.Option(..., "--save-experiment-best", min=0,
                                             help="Best checkpoints of the experiment to keep."),
    save_trial_best: int = typer.Option(..., "--save-trial-best", min=0,
                                        help="Best checkpoints of each trial to keep."),
    save_trial_latest: int = typer.Option(..., "--save-trial-latest", min=0,
                                          help="Latest checkpoints of each trial to keep."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Apply without preview and question."),
) -> None:
    """Change the checkpoint GC policy (Determined 0.38's checkpoint GC rule). Shows the
    checkpoints the new
    policy deletes and asks first (unless --yes); an ended experiment's are deleted now, a
    running one's once it reports a new checkpoint or ends. Pinned checkpoints (a live trial's
    latest among them) are never deleted."""
    params = {"id": exp_id, "seb": save_experiment_best, "stb": save_trial_best,
              "stl": save_trial_latest}
    with db() as conn:
        exp = get_experiment(conn, exp_id)
        if not yes:
            rows = conn.execute(Q.gc_preview, params).fetchall()
            ended = exp["state"] in WAIT_EXIT
            when = ("now" if ended else
                    "at its next checkpoint or when the experiment ends (if it ended now)")
            if not rows:
                typer.echo(f"The new policy deletes no checkpoint {when}.")
            else:
                total = sum(r["size_bytes"] or 0 for r in rows)
                typer.echo(f"The new policy deletes these {len(rows)} checkpoint(s) "
                           f"({size(total)}) {when}:")
                print_table(rows, ["uuid", "trial_id", "steps_completed", "metric", "size_bytes"],
                            ["UUID", "Trial", "Batches",
                             exp["searcher_metric"] or "Metric",
                             "Size"])
            typer.confirm("Apply the new policy?", abort=True)
            conn.rollback()  # the preview's snapshot ends; the change is its own transaction
        with conn.transaction():
            n = conn.execute(Q.set_gc_policy, params).fetchone()["n"]
    typer.echo(f"Experiment {exp_id}: GC policy set to save_experiment_best "
               f"{save_experiment_best}, save_trial_best {save_trial_best}, save_trial_latest "
               f"{save_trial_latest}; {n} checkpoint(s) DELETING")
