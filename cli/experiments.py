"""``det experiment``: create, list, describe, wait, pause, activate, cancel, kill, archive,
unarchive, delete, set (scheduling settings and the checkpoint GC policy)."""

import ast
import sys
import time
from pathlib import Path

import typer
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from tqdm import tqdm

from det import context
from det.cli.output import print_json, print_table
from det.cli.session import db, user
from det.cli.templates import get_template
from det.configs import is_trial_class, read_config_file
from det.configs.job import job_change
from det.configs.load import parse_experiment_config, parse_yaml
from det.configs.templates import merge
from det.db import database_url, det_home
from det.db.reconnect import Reconnecting
from det.errors import ConfigError, DetError
from det.queries.experiments import (
    CHECKPOINTS,
    STATE,
    TRIALS,
    ListFilter,
    add_rungs,
    get_experiment,
    job_of,
    list_experiments,
)
from det.reconciler.schedulers import Agent, Task
from det.reconciler.schedulers.fitting import never_fits

app = typer.Typer(no_args_is_help=True)

# `det experiment wait` exit codes, by terminal state.
WAIT_EXIT = {"COMPLETED": 0, "ERROR": 1, "CANCELED": 2}


def check_entrypoint(entrypoint: str | list[str], ctx: Path) -> None:
    """For a ``module:Class`` entrypoint, check the module file exists in the context and
    defines the class (read with ``ast``; nothing is imported).

    Raises:
        ConfigError: naming the missing file or class.
    """
    if not is_trial_class(entrypoint):
        return
    module, cls = entrypoint.split(":")
    rel = Path(*module.split("."))
    path = next((p for p in (ctx / f"{rel}.py", ctx / rel / "__init__.py") if p.is_file()), None)
    if path is None:
        raise ConfigError("entrypoint", f"{entrypoint}: no file {rel}.py in context {ctx}")
    tree = ast.parse(path.read_text(), filename=str(path))
    if not any(isinstance(n, ast.ClassDef) and n.name == cls for n in tree.body):
        raise ConfigError("entrypoint", f"{entrypoint}: {path.name} defines no class {cls}")


def expanded_config(config_file: Path, ctx: Path,
                    template: dict | None = None) -> tuple[dict, str]:
    """Read ``config_file`` and :func:`expand_config_text` it.

    Raises:
        ConfigError: unreadable or oversized file, or what expand_config_text raises.
    """
    return expand_config_text(read_config_file(config_file), str(config_file), ctx, template)


def expand_config_text(text: str, source: str, ctx: Path,
                       template: dict | None = None) -> tuple[dict, str]:
    """Validate and expand the config ``text`` (read from ``source``), merged over
    ``template`` (a template row: ``name``, ``config``; det.configs.templates) if given;
    returns (expanded config, original text). The CLI and ``POST /api/v1/experiments`` both
    submit through it.

    The default checkpoint storage is a shared_fs directory under det's home.

    Raises:
        ConfigError: invalid YAML or config (or merge), or an entrypoint the context lacks.
    """
    data = parse_yaml(text, source)
    if template is not None and isinstance(data, dict):
        data = merge(data, template["config"])
        source = f"{source} with template {template['name']!r}"
    cfg = parse_experiment_config(data, source)
    check_entrypoint(cfg.entrypoint, ctx)
    expanded = cfg.expanded()
    if expanded.get("checkpoint_storage") is None:
        expanded["checkpoint_storage"] = {
            "type": "shared_fs", "host_path": str(det_home() / "checkpoints"),
            "storage_path": None, "save_experiment_best": 0, "save_trial_best": 1,
            "save_trial_latest": 1}
    return expanded, text


@app.command("create")
def create(
    config_file: Path = typer.Argument(..., help="Experiment config (YAML)."),
    context_dir: Path = typer.Argument(..., help="Model-definition directory to upload."),
    local: bool = typer.Option(False, "--local", help="Run in this process, without a cluster."),
    test_mode: bool = typer.Option(
        False, "--test-mode",
        help="Only with --local: a few batches of training, validation, a checkpoint and a "
             "restore, in this process."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream the first trial's logs."),
    force: bool = typer.Option(False, "--force",
                               help="Submit even if no agent of the pool could ever run it."),
    template: str = typer.Option(None, "--template",
                                 help="Merge this configuration template under the config "
                                      "(the config's own values win)."),
) -> None:
    """Submit an experiment (one transaction: the experiment, its job and its context).

    Refused, unless --force, when the pool's agents could never hold one trial's slots
    (more slots than the pool has, or a pool without slots for a slot trial)."""
    if test_mode and not local:
        # Determined submits a small test experiment to the cluster for --test-mode alone;
        # det does not (yet), and must not run the full experiment in its place.
        raise DetError("--test-mode needs --local: det experiment create --local --test-mode "
                       "CONFIG CONTEXT runs the test in this process; a test experiment on the "
                       "cluster is not supported yet")
    tpl = None
    if template is not None:
        with db() as conn:
            tpl = get_template(conn, template)
    expanded, original = expanded_config(config_file, context_dir, tpl)
    if local:
        from det.harness.local import run_local

        run_local(expanded, context_dir, test_mode)
        return
    blob = context.pack(context_dir)
    with db() as conn, conn.transaction():
        if not force:
            refuse_unfit(conn, expanded)
        row = conn.execute("SELECT det_create_experiment(%s, %s, %s, %s) AS id",
                           (Jsonb(expanded), original, blob, user())).fetchone()
    typer.echo(f"Created experiment {row['id']}")
    if follow:
        from det.cli.trials import follow_experiment

        follow_experiment(row["id"])


POOL_CAPACITY = """
SELECT g.id, count(s.slot_id) AS slots FROM agents g LEFT JOIN slots s ON s.agent_id = g.id
 WHERE g.resource_pool = %(pool)s AND g.state <> 'LOST' GROUP BY g.id
"""


def refuse_unfit(conn, expanded: dict) -> None:
    """Raise ConfigError if no agent now registered in the job's pools (any of them, when
    ``resources.resource_pool`` is a list) could ever run one trial. A pool with no agents
    yet is let through: agents may join it later."""
    resources = expanded.get("resources") or {}
    pools = resources.get("resource_pool") or "default"
    pools = [pools] if isinstance(pools, str) else pools
    slots = resources.get("slots_per_trial", 1)
    reasons = []
    for pool in pools:
        agents = [Agent(r["id"], tuple(range(r["slots"])), ())
                  for r in conn.execute(POOL_CAPACITY, {"pool": pool}).fetchall()]
        reason = never_fits(Task("trial", "experiment", slots), agents) if agents else None
        if reason is None:
            return
        reasons.append(f"pool {pool!r}: {reason}")
    raise ConfigError("resources.slots_per_trial",
                      f"{slots} slots can never be scheduled: {'; '.join(reasons)} "
                      "(submit with --force to queue it anyway)")


@app.command("list")
def list_(
    all_: bool = typer.Option(False, "--all", "-a", help="Include archived experiments."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Experiments: id, name, state, progress, trials, owner, started."""
    with db() as conn:
        rows = list_experiments(conn, ListFilter(archived=all_))
    if json_:
        print_json(rows)
        return
    print_table(rows, ["id", "name", "state", "progress", "trials", "owner", "started"],
                ["ID", "Name", "State", "Progress %", "Trials", "Owner", "Started"])


@app.command("describe")
def describe(
    exp_id: int = typer.Argument(..., metavar="ID"),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Config, trials with hyperparameters, best validation metric, checkpoints; for
    adaptive_asha, each trial's rung, its status in the search and the metric that decided it."""
    with db() as conn:
        exp = get_experiment(conn, exp_id)
        trials = conn.execute(TRIALS, {"id": exp_id}).fetchall()
        ckpts = conn.execute(CHECKPOINTS, {"id": exp_id}).fetchall()
        asha = add_rungs(conn, exp, trials)
    if json_:
        print_json({**exp, "trials": trials, "checkpoints": ckpts})
        return
    searcher = exp["config"]["searcher"]
    metric, smaller = searcher["metric"], searcher.get("smaller_is_better", True)
    best = [t["best_validation"] for t in trials if t["best_validation"] is not None]
    typer.echo(f"Experiment {exp['id']}: {exp['name']}  [{exp['state']}]  "
               f"progress {exp['progress'] * 100:.0f}%  owner {exp['owner']}")
    typer.echo(f"searcher {searcher['name']}, metric {metric} "
               f"({'smaller' if smaller else 'larger'} is better); best: "
               f"{(min(best) if smaller else max(best)) if best else '-'}")
    typer.echo(f"resource pool {exp['resource_pool']}, priority {exp['priority']}, "
               f"weight {exp['weight']}, job {exp['job_id']}")
    if exp["archived"]:
        typer.echo("archived")
    if exp["delete_requested_at"]:
        typer.echo("being deleted: its rows go once its checkpoints' files are removed")
    if exp["checkpoint_gc_error"]:
        typer.echo(f"checkpoint GC failed: {exp['checkpoint_gc_error']}")
    typer.echo("\nTrials:")
    print_table(trials, ["id", "state", "hparams", "batches", "best_validation",
                         "restarts", "exit_reason"],
                ["ID", "State", "Hyperparameters", "Batches", f"Best {metric}", "Restarts",
                 "Exit"])
    if asha:
        typer.echo("\nRungs:")
        rows = [{"id": t["id"], **t["rung"]} for t in trials if t["rung"]]
        print_table(rows, ["id", "bracket", "rung", "length", "status", "metric"],
                    ["Trial", "Bracket", "Rung", "Length", "Search", f"Decided by {metric}"])
    typer.echo("\nCheckpoints:")
    print_table(ckpts, ["uuid", "trial_id", "steps_completed", "state", "validation"],
                ["UUID", "Trial", "Batches", "State", "Validation"])


def _action(exp_id: int, action: str) -> None:
    with db() as conn:
        get_experiment(conn, exp_id)
        state = conn.execute("SELECT det_experiment_action(%s, %s) AS s",
                             (exp_id, action)).fetchone()["s"]
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
                 file=sys.stderr, bar_format="{desc}: {percentage:3.0f}%|{bar}|") as bar:
        def read(conn) -> str:
            state = conn.execute(STATE, {"id": exp_id}).fetchone()["state"]
            if not bar.disable:  # the live progress only where it is drawn
                bar.n = round(get_experiment(conn, exp_id)["progress"] * 100)
                bar.set_description(f"Experiment {exp_id} {state}")
            return state

        while (state := session.run(what, read)) not in WAIT_EXIT:
            time.sleep(interval)
    typer.echo(f"Experiment {exp_id}: {state}")
    raise typer.Exit(WAIT_EXIT[state])


@app.command("archive")
def archive(exp_id: int = typer.Argument(..., metavar="ID")) -> None:
    """Hide an ended experiment from `det experiment list` (--all still shows it)."""
    with db() as conn:
        conn.execute("SELECT det_experiment_archive(%s, true)", (exp_id,))
    typer.echo(f"Experiment {exp_id}: archived")


@app.command("unarchive")
def unarchive(exp_id: int = typer.Argument(..., metavar="ID")) -> None:
    """Show an archived experiment in `det experiment list` again."""
    with db() as conn:
        conn.execute("SELECT det_experiment_archive(%s, false)", (exp_id,))
    typer.echo(f"Experiment {exp_id}: unarchived")


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
        gone = conn.execute("SELECT det_experiment_delete(%s) AS gone",
                            (exp_id,)).fetchone()["gone"]
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
        conn.execute("SELECT det_job_update(%s, %s, %s)", (job_of(conn, exp_id), field, value))
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


GC_PREVIEW = """
SELECT uuid::text AS uuid, trial_id, steps_completed, size_bytes, metric
  FROM det_checkpoints_to_delete(%(id)s, %(seb)s, %(stb)s, %(stl)s)
"""


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
    """Change the checkpoint GC policy (reference-facts §5). Shows the checkpoints the new
    policy deletes and asks first (unless --yes); an ended experiment's are deleted now, a
    running one's when it ends. Pinned checkpoints are never deleted."""
    params = {"id": exp_id, "seb": save_experiment_best, "stb": save_trial_best,
              "stl": save_trial_latest}
    with db() as conn:
        exp = get_experiment(conn, exp_id)
        if not yes:
            rows = conn.execute(GC_PREVIEW, params).fetchall()
            ended = exp["state"] in WAIT_EXIT
            when = "now" if ended else "when the experiment ends (if it ended now)"
            if not rows:
                typer.echo(f"The new policy deletes no checkpoint {when}.")
            else:
                total = sum(r["size_bytes"] or 0 for r in rows)
                typer.echo(f"The new policy deletes these {len(rows)} checkpoint(s) "
                           f"({total} bytes) {when}:")
                print_table(rows, ["uuid", "trial_id", "steps_completed", "metric", "size_bytes"],
                            ["UUID", "Trial", "Batches", exp["config"]["searcher"]["metric"],
                             "Bytes"])
            typer.confirm("Apply the new policy?", abort=True)
            conn.rollback()  # the preview's snapshot ends; the change is its own transaction
        with conn.transaction():
            n = conn.execute("SELECT det_set_gc_policy(%(id)s, %(seb)s, %(stb)s, %(stl)s) AS n",
                             params).fetchone()["n"]
    typer.echo(f"Experiment {exp_id}: GC policy set to save_experiment_best "
               f"{save_experiment_best}, save_trial_best {save_trial_best}, save_trial_latest "
               f"{save_trial_latest}; {n} checkpoint(s) DELETING")
