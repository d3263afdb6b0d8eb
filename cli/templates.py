"""``det template``: configuration templates (set, list, describe, remove).

A template is a partial experiment config that ``det experiment create --template NAME``
merges under the experiment's own config (``det.configs.templates``). It is its workspace's:
those who may view the workspace read it, its Editors write it, and reads show
its secrets (S3 keys, registry passwords, ...: ``det_user.redact_secrets`` in schema.sql) as
``********``. Only a submission gets them (:func:`det.submission.template_for_submission`).
"""

from pathlib import Path

import typer
import yaml
from psycopg.types.json import Jsonb

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.configs import read_config_file
from det.configs.templates import load_template
from det.queries.templates import get_template, list_templates
from det.sql import named

Q = named("cli")

app = typer.Typer(no_args_is_help=True)

DEFAULT_WORKSPACE = "Uncategorized"

def _workspace_option(what: str) -> typer.Option:
    return typer.Option(DEFAULT_WORKSPACE, "--workspace", "-w", help=f"Workspace {what}.")


@app.command("set")
def set_(
    name: str = typer.Argument(..., help="Template name."),
    file: Path = typer.Argument(..., metavar="FILE", help="Template YAML: a partial config."),
    workspace: str = _workspace_option("to keep it in (you need Editor there)"),
) -> None:
    """Create or replace a template of a workspace (as an Editor there). The file must be a
    mapping of experiment config keys; each key given must be valid, any may be left out."""
    text = read_config_file(file)
    config = load_template(text, source=str(file))
    with db() as conn:
        created = conn.execute(Q.template_set,
                               (workspace, name, Jsonb(config), text)).fetchone()["c"]
    typer.echo(f"{'Created' if created else 'Updated'} template {name} in workspace "
               f"{workspace}")


@app.command("list")
def list_(
    details: bool = typer.Option(False, "--details", "-d", help="Show each template's config."),
    workspace: str = typer.Option(None, "--workspace", "-w",
                                  help="Only this workspace's (default: every workspace you "
                                       "may view)."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Templates: workspace, name, owner, last change (--details: the config, secrets
    shown as ********)."""
    with db() as conn:
        rows = list_templates(conn, workspace)
    if json_:
        print_json(rows)
        return
    columns = ["workspace", "name", "owner", "updated_at"] + (["config"] if details else [])
    headers = ["Workspace", "Name", "Owner", "Updated"] + (["Config"] if details else [])
    print_table(rows, columns, headers)


@app.command("describe")
def describe(
    name: str = typer.Argument(..., help="Template name."),
    workspace: str = _workspace_option("it is in"),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A template's YAML as it was set; one holding secrets is shown as its config with the
    secrets as ******** (--json: its config as JSON)."""
    with db() as conn:
        row = get_template(conn, name, workspace)
    if json_:
        print_json(row)
        return
    if row["original"] is not None:
        typer.echo(row["original"], nl=not row["original"].endswith("\n"))
        return
    typer.echo(yaml.safe_dump(row["config"], sort_keys=False), nl=False)
    typer.echo(f"(template {name}: secret fields shown as ********)", err=True)


@app.command("remove")
def remove(
    name: str = typer.Argument(..., help="Template name."),
    workspace: str = _workspace_option("it is in (you need Editor there)"),
) -> None:
    """Remove a template; experiments created from it keep their merged configs."""
    with db() as conn:
        conn.execute(Q.template_remove, (workspace, name))
    typer.echo(f"Removed template {name} from workspace {workspace}")
