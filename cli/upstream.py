"""Determined 0.38's CLI forms that det lacked under their upstream names:
``det version``, ``det master info``, ``det deploy local cluster-up|cluster-down``,
``det experiment list-checkpoints|download``, ``det trial download``, ``det checkpoint
describe``. :mod:`det.cli.main` adds each to its group; the short aliases (``e``, ``m``,
``rp``...) and ``ls`` are there too.

det has no master: its control plane is PostgreSQL, so "the master" these forms show or
reach is det's database (``-m postgresql://...``, ``DET_MASTER`` or ``DET_DB_URL``)."""

from importlib.metadata import version as package_version
from pathlib import Path

import typer

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.errors import NotFoundError, one_line
from det.harness.storage import storage_from_config
from det.queries.checkpoints import best_per_trial, describe_checkpoint, ranked_checkpoints
from det.queries.cluster import server_info
from det.queries.experiments import require_experiment
from det.queries.trials import require_trial


def _redacted(url: str) -> str:
    """``url`` without its password."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = {k: v for k, v in conninfo_to_dict(url).items() if k != "password"}
    return make_conninfo(**params)


def _master() -> dict:
    """What ``det version`` and ``det master info`` show of det's database and det serve.

    Raises:
        det.errors.DatabaseError: the database cannot be reached, or its schema is behind.
    """
    from det.cli.notebooks import serve_url
    from det.db.connect import database_url

    with db() as conn:
        row = server_info(conn)
    return {"version": package_version("det"), "database_url": _redacted(database_url()),
            **row, "serve_url": serve_url()}


def version() -> None:
    """The CLI's version, then its master's: det's database (Determined's `det version`);
    the client's line comes first, so it is there when the database cannot be reached."""
    typer.echo(f"client: det {package_version('det')}")
    info = _master()
    typer.echo(f"master: {info['database_url']} (PostgreSQL {info['server_version']}, "
               f"det schema {info['schema_version']})")


master_app = typer.Typer(no_args_is_help=True)


@master_app.command("info")
def master_info(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """det's "master": its database (URL without password, PostgreSQL version, schema
    version, the user the CLI acts as) and the det serve URL where one is known
    (DET_MASTER's, else the one det cluster up runs)."""
    info = _master()
    if json_:
        print_json(info)
        return
    for key, value in info.items():
        typer.echo(f"{key}: {value if value is not None else '-'}")


def deploy_app() -> typer.Typer:
    """``det deploy local cluster-up|cluster-down``: ``det cluster up|down`` under
    Determined's names (the same options)."""
    from det.cli.cluster import down, up

    local = typer.Typer(no_args_is_help=True)
    local.command("cluster-up", help=up.__doc__)(up)
    local.command("cluster-down", help=down.__doc__)(down)
    deploy = typer.Typer(no_args_is_help=True)
    deploy.add_typer(local, name="local", help="A cluster on this machine (det cluster up).")
    return deploy


def _bool(value: str | None, field: str) -> bool | None:
    """``--smaller-is-better``'s value: true/false (any case), None when not given.

    Raises:
        typer.BadParameter: anything else (named by ``field``).
    """
    if value is None:
        return None
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise typer.BadParameter(f"expected true or false, got {value!r}", param_hint=field)


def _sort(sort_by: str | None, smaller: str | None) -> tuple[str | None, bool | None]:
    """``--sort-by`` and ``--smaller-is-better``, which Determined requires together.

    Raises:
        typer.BadParameter: one without the other, or a bad boolean.
    """
    if (sort_by is None) != (smaller is None):
        raise typer.BadParameter("--sort-by and --smaller-is-better go together",
                                 param_hint="--sort-by")
    return sort_by, _bool(smaller, "--smaller-is-better")


SORT_BY = typer.Option(None, "--sort-by", help="Validation metric to rank by (default: the "
                                               "searcher's); needs --smaller-is-better.")
SMALLER = typer.Option(None, "--smaller-is-better", metavar="true|false",
                       help="The order for --sort-by.")
QUIET = typer.Option(False, "--quiet", "-q", help="Print only the downloaded paths.")


def _download(row: dict, output: Path, quiet: bool) -> None:
    """Copy checkpoint ``row``'s files into ``output`` as ``det checkpoint download`` does."""
    skipped = storage_from_config(row["storage"]).download(row["uuid"], output)
    if skipped:
        typer.echo(f"Left out {len(skipped)} link(s) or other entries that are not files or "
                   f"directories: {one_line(', '.join(skipped))}", err=True)
    typer.echo(str(output) if quiet else f"Checkpoint {row['uuid']} downloaded to {output}")


def experiment_download(
    exp_id: int = typer.Argument(..., metavar="EXPERIMENT_ID"),
    output_dir: Path = typer.Option(Path("checkpoints"), "--output-dir", "-o",
                                    help="Top directory: each checkpoint goes to DIR/UUID."),
    top_n: int = typer.Option(1, "--top-n", min=1,
                              help="The best checkpoint of each of the N best trials."),
    sort_by: str = SORT_BY,
    smaller_is_better: str = SMALLER,
    quiet: bool = QUIET,
) -> None:
    """Download the experiment's best checkpoint (by the searcher's metric, as validated at
    the checkpoint's batch count; without validations, the latest) into
    ./checkpoints/UUID (Determined's `det experiment download`)."""
    metric, smaller = _sort(sort_by, smaller_is_better)
    with db() as conn:
        require_experiment(conn, exp_id)
        rows = best_per_trial(ranked_checkpoints(conn, experiment=exp_id, metric=metric,
                                                 smaller_is_better=smaller), top_n)
    if not rows:
        raise NotFoundError(f"experiment {exp_id} has no completed checkpoint")
    for row in rows:
        _download(row, output_dir / row["uuid"], quiet)


def trial_download(
    trial_id: int = typer.Argument(..., metavar="TRIAL_ID"),
    best: bool = typer.Option(False, "--best", help="The checkpoint with the best validation."),
    latest: bool = typer.Option(False, "--latest", help="The most recent checkpoint."),
    uuid: str = typer.Option(None, "--uuid", help="This checkpoint of the trial."),
    output_dir: Path = typer.Option(None, "--output-dir", "-o",
                                    help="Directory for its files (default: "
                                         "./checkpoints/UUID)."),
    sort_by: str = SORT_BY,
    smaller_is_better: str = SMALLER,
    quiet: bool = QUIET,
) -> None:
    """Download one checkpoint of a trial: --best, --latest or --uuid (one of them, as in
    Determined's `det trial download`)."""
    if best + latest + (uuid is not None) != 1:
        raise typer.BadParameter("give one of --best, --latest, --uuid", param_hint="--best")
    metric, smaller = _sort(sort_by, smaller_is_better)
    with db() as conn:
        require_trial(conn, trial_id)
        rows = ranked_checkpoints(conn, trial=trial_id, metric=metric, smaller_is_better=smaller)
    if latest:
        rows = sorted(rows, key=lambda r: (r["steps_completed"], r["reported_at"]), reverse=True)
    if uuid is not None:
        rows = [r for r in rows if r["uuid"].startswith(uuid.strip().lower())]
    if not rows:
        raise NotFoundError(f"trial {trial_id} has no completed checkpoint"
                            + (f" {uuid}" if uuid is not None else ""))
    _download(rows[0], output_dir if output_dir is not None else
              Path("checkpoints") / rows[0]["uuid"], quiet)


def list_checkpoints(
    exp_id: int = typer.Argument(..., metavar="EXPERIMENT_ID"),
    best: int = typer.Option(None, "--best", min=1, metavar="N",
                             help="Only the best N, of those with a validation."),
    csv: bool = typer.Option(False, "--csv", help="Print CSV."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The experiment's completed checkpoints, best first by the searcher's metric as
    validated at each one's batch count (Determined's `det experiment list-checkpoints`)."""
    with db() as conn:
        require_experiment(conn, exp_id)
        rows = ranked_checkpoints(conn, experiment=exp_id, validated=best is not None)
    rows = rows[:best] if best is not None else rows
    shown = [{"uuid": r["uuid"], "trial_id": r["trial_id"],
              "steps_completed": r["steps_completed"], "metric_value": r["metric_value"],
              "reported_at": r["reported_at"]} for r in rows]
    if json_:
        print_json(shown)
    elif csv:
        import csv as csv_module
        import sys

        writer = csv_module.DictWriter(sys.stdout, fieldnames=list(shown[0]) if shown else [
            "uuid", "trial_id", "steps_completed", "metric_value", "reported_at"])
        writer.writeheader()
        writer.writerows(shown)
    else:
        print_table(shown, ["uuid", "trial_id", "steps_completed", "metric_value",
                            "reported_at"],
                    ["UUID", "Trial", "Batches", "Validation", "Reported"])


def checkpoint_describe(
    uuid: str = typer.Argument(..., metavar="UUID",
                               help="The checkpoint's uuid, or enough of its start."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """One checkpoint: its trial and experiment, batches, state, storage, files and
    metadata, and the validation its trial reported at its batch count."""
    from det.cli.checkpoints import find_checkpoint

    with db() as conn:
        uuid = find_checkpoint(conn, uuid)["uuid"]
        row = describe_checkpoint(conn, uuid)
    if json_:
        print_json(row)
        return
    for key in ("uuid", "experiment_id", "trial_id", "steps_completed", "state",
                "reported_at", "storage", "metadata", "validation"):
        typer.echo(f"{key}: {row[key] if row[key] is not None else '-'}")
    typer.echo(f"files: {len(row['resources'])}, "
               f"{sum(int(v) for v in row['resources'].values())} bytes")
