"""``det checkpoint``: list an experiment's checkpoints, download one, delete some."""

from pathlib import Path

import typer

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.errors import NotFoundError, StateError, one_line
from det.harness.storage import storage_from_config
from det.queries.checkpoints import checkpoint_sizes
from det.queries.experiments import require_experiment
from det.sql import named

Q = named("cli")
READ = named("queries")

app = typer.Typer(no_args_is_help=True)

@app.command("list")
def list_(
    exp_id: int = typer.Argument(..., metavar="EXPERIMENT_ID"),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Checkpoints of an experiment's trials: state (COMPLETED, DELETING, DELETED) and size
    (freed: what deleting it gave back)."""
    with db() as conn:
        require_experiment(conn, exp_id)
        rows = checkpoint_sizes(conn, exp_id)
    if json_:
        print_json(rows)
        return
    print_table(rows, ["uuid", "trial_id", "steps_completed", "state", "size_bytes",
                       "freed_bytes", "reported_at"],
                ["UUID", "Trial", "Batches", "State", "Size", "Freed", "Reported"])


def find_checkpoint(conn, prefix: str) -> dict:
    """The checkpoint whose uuid is ``prefix`` or starts with it (as ``det checkpoint list``
    shows it; any case).

    Raises:
        NotFoundError: none, or more than one, starts so (the message names two).
    """
    rows = conn.execute(READ.checkpoints_by_prefix, {"prefix": prefix.strip()}).fetchall() \
        if prefix.strip() else []
    if not rows:
        raise NotFoundError(f"checkpoint {prefix} not found")
    if len(rows) > 1:
        raise NotFoundError(f"checkpoint {prefix}: more than one uuid starts so "
                            f"({rows[0]['uuid']}, {rows[1]['uuid']}, ...): give more of it")
    return rows[0]


@app.command("download")
def download(
    uuid: str = typer.Argument(..., metavar="UUID",
                               help="The checkpoint's uuid, or enough of its start."),
    output: Path = typer.Option(None, "--output", "-o",
                                help="Directory to write the files to (default: "
                                     "./checkpoints/UUID)."),
) -> None:
    """Copy a checkpoint's files from its storage (shared_fs, directory or s3) into a local
    directory, showing the bytes as they come. Links in the checkpoint are not followed:
    they are left out and named (a task's link to a file of its host would otherwise copy
    this host's file at that path)."""
    with db() as conn:
        row = find_checkpoint(conn, uuid)
    uuid = row["uuid"]
    output = output if output is not None else Path("checkpoints") / uuid
    if row["state"] != "COMPLETED":
        raise StateError(f"checkpoint {uuid} is {row['state']}")
    skipped = storage_from_config(row["storage"]).download(row["uuid"], output)
    if skipped:
        typer.echo(f"Left out {len(skipped)} link(s) or other entries that are not files or "
                   f"directories: {one_line(', '.join(skipped))}", err=True)
    typer.echo(f"Checkpoint {uuid} downloaded to {output}")


@app.command("delete")
def delete(
    uuids: list[str] = typer.Argument(..., metavar="UUID..."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete checkpoints of ended experiments: they become DELETING at once, and a GC task
    removes their files (then DELETED). Pinned checkpoints (model registry, warm starts) are
    refused. Asking again for a DELETING checkpoint retries a GC that gave up."""
    if not yes:
        typer.confirm(f"Delete the files of {len(uuids)} checkpoint(s) from their storage?",
                      abort=True)
    with db() as conn, conn.transaction():
        n = conn.execute(Q.delete_checkpoints, (uuids,)).fetchone()["n"]
    typer.echo(f"{n} checkpoint(s) DELETING; a GC task removes their files")
