"""``det model``: the model registry (spec: introduction-and-features, Model Registry).

A model groups checkpoints, possibly of different experiments, as numbered versions, with a
description, labels, metadata (a JSON object) and notes (Markdown). Each action is one
``det_model_*`` SQL function (``schema.sql``), one transaction; a model is named by its name
(compared regardless of case) or its id. A registered version pins its checkpoint: checkpoint
GC keeps it and its row cannot be deleted while the version exists.
"""

import json
from pathlib import Path
from typing import Any

import typer
from psycopg.types.json import Jsonb

from det.cli import checkpoints
from det.cli.output import print_json, print_table
from det.cli.session import db
from det.configs.limits import MAX_CONFIG_BYTES, json_value_problem
from det.errors import DetError
from det.queries.models import version_checkpoint
from det.sql import named

Q = named("cli")
READ = named("queries")

app = typer.Typer(no_args_is_help=True)

_VERSION_COLUMNS = (["version", "name", "checkpoint_uuid", "trial_id", "steps_completed",
                     "size_bytes", "validation_metrics", "metadata"],
                    ["Version", "Name", "Checkpoint", "Trial", "Batches", "Size", "Validation",
                     "Metadata"])


def _labels(text: str | None) -> list[str] | None:
    """``--labels a,b``: comma-separated; ``""`` is no labels. None: not given."""
    if text is None:
        return None
    return [label.strip() for label in text.split(",") if label.strip()]


def _metadata(text: str | None, option: str = "--metadata") -> dict[str, Any] | None:
    """``--metadata '{"k": 1}'``: a JSON object. Raises DetError naming the option."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise DetError(f"{option}: expected a JSON object, got invalid JSON ({e})") from None
    if not isinstance(value, dict):
        raise DetError(f"{option}: expected a JSON object, got {type(value).__name__}")
    return value


def _notes(text: str | None, file: Path | None) -> str | None:
    """``--notes TEXT`` or ``--notes-file FILE`` (Markdown, UTF-8, at most 1 MiB)."""
    if text is not None and file is not None:
        raise DetError("--notes and --notes-file: give one of them, not both")
    if file is None:
        return text
    try:
        with open(file, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise DetError(f"--notes-file {file}: cannot read it: {e.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise DetError(f"--notes-file {file}: larger than the limit of 1 MiB")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DetError(f"--notes-file {file}: not UTF-8 text (byte {e.start})") from None


def _check_storable(**fields: Any) -> None:
    """Raise DetError naming the field if a value cannot be stored (NUL characters, lone
    surrogates, NaN or infinities in metadata); the SQL functions check the rest."""
    problem = json_value_problem({k: v for k, v in fields.items() if v is not None})
    if problem is not None:
        raise DetError(f"{problem[0]}: {problem[1]}")


def _print_model(model: dict) -> None:
    typer.echo(f"Model {model['id']}: {model['name']}"
               f"{'  [archived]' if model['archived'] else ''}  owner {model['owner']}")
    if model["description"]:
        typer.echo(f"description: {model['description']}")
    typer.echo(f"labels: {', '.join(model['labels']) or '-'}")
    typer.echo(f"metadata: {json.dumps(model['metadata'])}")
    typer.echo(f"versions: {model['num_versions']}, "
               f"created {model['creation_time']:%Y-%m-%d %H:%M:%S}, "
               f"updated {model['last_updated_time']:%Y-%m-%d %H:%M:%S}")
    if model["notes"]:
        typer.echo(f"\nNotes:\n{model['notes']}")


@app.command("create")
def create(
    name: str = typer.Argument(..., help="Unique model name (not only digits, no slashes)."),
    description: str = typer.Option("", "--description", help="One-line description."),
    labels: str = typer.Option(None, "--labels", help="Comma-separated labels."),
    workspace: str = typer.Option(None, "--workspace-name", "-w",
                                  help="Workspace of the model (default: Uncategorized)."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Create an empty model, yours, in a workspace where you are an Editor."""
    label_list = _labels(labels)
    _check_storable(name=name, description=description, labels=label_list)
    with db() as conn:
        row = conn.execute(Q.model_create, (name, description, label_list, workspace)).fetchone()
    if json_:
        print_json(row)
        return
    typer.echo(f"Created model {row['id']}: {name}")


@app.command("list")
def list_(
    all_: bool = typer.Option(False, "--all", "-a", help="Include archived models."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Models: id, name, versions, labels, owner, last change."""
    with db() as conn:
        rows = conn.execute(READ.models, {"all": all_}).fetchall()
    if json_:
        print_json(rows)
        return
    print_table(rows, ["id", "name", "num_versions", "labels", "archived", "owner",
                       "last_updated_time", "description"],
                ["ID", "Name", "Versions", "Labels", "Archived", "Owner", "Updated",
                 "Description"])


@app.command("describe")
def describe(
    model: str = typer.Argument(..., metavar="NAME", help="Model name or id."),
    version: int = typer.Option(None, "--version", help="Show this version (default: all)."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A model: description, labels, metadata, notes and its versions."""
    with db() as conn:
        model_id = conn.execute(READ.find_model, {"model": model}).fetchone()["id"]
        if version is not None:
            conn.execute(Q.model_version_find, (model, version))
        row = conn.execute(READ.model, {"id": model_id}).fetchone()
        versions = conn.execute(READ.model_versions,
                                {"id": model_id, "version": version}).fetchall()
    if json_:
        print_json({**row, "versions": versions})
        return
    _print_model(row)
    typer.echo("\nVersions:")
    print_table(versions, *_VERSION_COLUMNS)
    for v in versions:
        if v["notes"]:
            typer.echo(f"\nNotes of version {v['version']}:\n{v['notes']}")


@app.command("list-versions")
def list_versions(
    model: str = typer.Argument(..., metavar="NAME", help="Model name or id."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A model's versions: number, checkpoint, trial, batches, validation metrics."""
    with db() as conn:
        model_id = conn.execute(READ.find_model, {"model": model}).fetchone()["id"]
        versions = conn.execute(READ.model_versions, {"id": model_id, "version": None}).fetchall()
    if json_:
        print_json(versions)
        return
    print_table(versions, *_VERSION_COLUMNS)


@app.command("register-version")
def register_version(
    model: str = typer.Argument(..., metavar="NAME", help="Model name or id."),
    uuid: str = typer.Argument(..., metavar="CHECKPOINT_UUID"),
    name: str = typer.Option(None, "--name", help="Version name."),
    notes: str = typer.Option(None, "--notes", help="Notes (Markdown)."),
    notes_file: Path = typer.Option(None, "--notes-file", help="Notes from a Markdown file."),
    metadata: str = typer.Option(None, "--metadata", help="Metadata: a JSON object."),
    labels: str = typer.Option(None, "--labels", help="Comma-separated labels."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Register a COMPLETED checkpoint as the model's next version; the checkpoint is then kept
    by checkpoint GC and cannot be deleted while the version exists, so you must be an Editor
    of the checkpoint's workspace as well as the model's."""
    text, meta, label_list = _notes(notes, notes_file), _metadata(metadata), _labels(labels)
    _check_storable(name=name, notes=text, metadata=meta, labels=label_list)
    with db() as conn:
        row = conn.execute(
            Q.model_register_version,
            (model, uuid, name, text, label_list,
             Jsonb(meta) if meta is not None else None)).fetchone()
    if json_:
        print_json(row)
        return
    typer.echo(f"Registered checkpoint {row['checkpoint_uuid']} as version {row['version']} "
               f"of model {model}")


@app.command("update")
def update(
    model: str = typer.Argument(..., metavar="NAME", help="Model name or id."),
    version: int = typer.Option(None, "--version",
                                help="Change this version instead of the model."),
    name: str = typer.Option(None, "--name", help="New name."),
    description: str = typer.Option(None, "--description", help="New description (model)."),
    labels: str = typer.Option(None, "--labels", help="Replace the labels (comma-separated)."),
    metadata: str = typer.Option(None, "--metadata",
                                 help="A JSON object merged into the metadata (its keys win)."),
    remove_metadata: list[str] = typer.Option(None, "--remove-metadata", metavar="KEY",
                                              help="Remove this metadata key (repeatable)."),
    notes: str = typer.Option(None, "--notes", help="Replace the notes (Markdown)."),
    notes_file: Path = typer.Option(None, "--notes-file",
                                    help="Replace the notes with a Markdown file."),
) -> None:
    """Change a model's (or with --version, a version's) name, description, labels, metadata
    or notes; what is not given stays. An archived model cannot change."""
    text, meta, label_list = _notes(notes, notes_file), _metadata(metadata), _labels(labels)
    if version is not None and description is not None:
        raise DetError("--description: a model version has no description; use --notes")
    _check_storable(name=name, description=description, notes=text, metadata=meta,
                    labels=label_list, remove_metadata=remove_metadata)
    args = (name, text, label_list, Jsonb(meta) if meta is not None else None,
            remove_metadata or None)
    with db() as conn:
        if version is None:
            conn.execute(Q.model_update, (model, name, description, *args[1:]))
        else:
            conn.execute(Q.model_version_update, (model, version, *args))
    typer.echo(f"Updated model {model}" + (f" version {version}" if version is not None else ""))


def _set_archived(model: str, archived: bool) -> None:
    with db() as conn:
        row = conn.execute(Q.model_set_archived, (model, archived)).fetchone()
    typer.echo(f"Model {row['name']}: {'archived' if archived else 'unarchived'}")


@app.command("archive")
def archive(model: str = typer.Argument(..., metavar="NAME", help="Model name or id.")) -> None:
    """Hide a model from `det model list` (unless --all) and freeze it: no new versions, no
    changes. Its versions still pin their checkpoints."""
    _set_archived(model, True)


@app.command("unarchive")
def unarchive(model: str = typer.Argument(..., metavar="NAME",
                                          help="Model name or id.")) -> None:
    """Undo `det model archive`."""
    _set_archived(model, False)


@app.command("move")
def move(
    model: str = typer.Argument(..., metavar="NAME", help="Model name or id."),
    workspace: str = typer.Option(..., "--workspace-name", "-w", help="Destination workspace."),
) -> None:
    """Move a model, with its versions, to another workspace (Editor in both)."""
    with db() as conn:
        conn.execute(Q.model_move, (model, workspace))
    typer.echo(f"Model {model}: moved to workspace {workspace}")


@app.command("delete")
def delete(
    model: str = typer.Argument(..., metavar="NAME", help="Model name or id."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete a model and all its versions; their checkpoints are no longer pinned (GC may
    then delete them)."""
    if not yes:
        typer.confirm(f"Delete model {model} and all its versions?", abort=True)
    with db() as conn:
        n = conn.execute(Q.model_delete, (model,)).fetchone()["n"]
    typer.echo(f"Deleted model {model} and its {n} version(s)")


@app.command("delete-version")
def delete_version(
    model: str = typer.Argument(..., metavar="NAME", help="Model name or id."),
    version: int = typer.Argument(..., metavar="VERSION"),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete one version of a model; its checkpoint is no longer pinned by it."""
    if not yes:
        typer.confirm(f"Delete version {version} of model {model}?", abort=True)
    with db() as conn:
        uuid = conn.execute(Q.model_version_delete, (model, version)).fetchone()["u"]
    typer.echo(f"Deleted version {version} of model {model} (checkpoint {uuid})")


@app.command("download")
def download(
    model: str = typer.Argument(..., metavar="NAME", help="Model name or id."),
    version: int = typer.Argument(None, metavar="[VERSION]", help="Default: the latest."),
    output: Path = typer.Option(..., "--output", "-o", help="Directory to write the files to."),
) -> None:
    """Copy a model version's checkpoint files from its storage into a local directory (as
    `det checkpoint download` does)."""
    with db() as conn:
        row = version_checkpoint(conn, model, version)
    typer.echo(f"Model {row['name']} version {row['version']}: checkpoint "
               f"{row['checkpoint_uuid']}")
    checkpoints.download(row["checkpoint_uuid"], output)
