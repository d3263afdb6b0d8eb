"""``det checkpoint``: list an experiment's checkpoints, download one."""

from pathlib import Path

import fsspec
import typer

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.errors import NotFoundError, StateError

app = typer.Typer(no_args_is_help=True)

LIST = """
SELECT c.uuid::text AS uuid, c.trial_id, c.steps_completed, c.state, c.reported_at,
       (SELECT sum(value::bigint) FROM jsonb_each_text(c.resources)) AS size_bytes
  FROM checkpoints c JOIN trials t ON t.id = c.trial_id
 WHERE t.experiment_id = %(id)s ORDER BY c.trial_id, c.steps_completed
"""

ONE = "SELECT uuid::text AS uuid, state, storage FROM checkpoints WHERE uuid::text = %(uuid)s"


def storage_url(storage: dict, uuid: str) -> str:
    """Where a checkpoint's files are, as an fsspec URL (shared_fs: a local path)."""
    if storage.get("type") == "shared_fs":
        base = Path(storage["host_path"]) / (storage.get("storage_path") or "")
        return str(base / uuid)
    if storage.get("type") == "directory":
        return str(Path(storage["container_path"]) / uuid)
    raise StateError(f"checkpoint {uuid}: storage type {storage.get('type')!r} is not supported")


@app.command("list")
def list_(
    exp_id: int = typer.Argument(..., metavar="EXPERIMENT_ID"),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Checkpoints of an experiment's trials."""
    with db() as conn:
        rows = conn.execute(LIST, {"id": exp_id}).fetchall()
    if json_:
        print_json(rows)
        return
    print_table(rows, ["uuid", "trial_id", "steps_completed", "state", "size_bytes",
                       "reported_at"],
                ["UUID", "Trial", "Batches", "State", "Bytes", "Reported"])


@app.command("download")
def download(
    uuid: str = typer.Argument(...),
    output: Path = typer.Option(..., "--output", "-o", help="Directory to write the files to."),
) -> None:
    """Copy a checkpoint's files from its storage into a local directory."""
    with db() as conn:
        row = conn.execute(ONE, {"uuid": uuid}).fetchone()
    if row is None:
        raise NotFoundError(f"checkpoint {uuid} not found")
    if row["state"] != "COMPLETED":
        raise StateError(f"checkpoint {uuid} is {row['state']}")
    src = storage_url(row["storage"], uuid)
    fs, path = fsspec.core.url_to_fs(src)
    if not fs.exists(path):
        raise NotFoundError(f"checkpoint {uuid}: its files are gone from {src}")
    output.mkdir(parents=True, exist_ok=True)
    fs.get(path.rstrip("/") + "/", str(output), recursive=True)
    typer.echo(f"Checkpoint {uuid} downloaded to {output}")
