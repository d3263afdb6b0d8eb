"""``det template``: configuration templates (set, list, describe, remove).

A template is a partial experiment config that ``det experiment create --template NAME``
merges under the experiment's own config (``det.configs.templates``).
"""

from pathlib import Path

import typer
from psycopg.types.json import Jsonb

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.configs import read_config_file
from det.configs.templates import load_template
from det.errors import NotFoundError

app = typer.Typer(no_args_is_help=True)

LIST = """
SELECT name, owner, created_at, updated_at, config FROM templates ORDER BY name
"""

ONE = """
SELECT name, owner, created_at, updated_at, config, original FROM templates WHERE name = %(name)s
"""


def get_template(conn, name: str) -> dict:
    """The template row (``config``: its mapping). Raises NotFoundError."""
    row = conn.execute(ONE, {"name": name}).fetchone()
    if row is None:
        raise NotFoundError(f"template {name!r} not found (det template list shows them)")
    return row


@app.command("set")
def set_(
    name: str = typer.Argument(..., help="Template name."),
    file: Path = typer.Argument(..., metavar="FILE", help="Template YAML: a partial config."),
) -> None:
    """Create or replace a template (yours; replacing another user's takes ClusterAdmin). The
    file must be a mapping of experiment config keys; each key given must be valid, any may
    be left out."""
    text = read_config_file(file)
    config = load_template(text, source=str(file))
    with db() as conn:
        created = conn.execute("SELECT det_template_set(%s, %s, %s) AS c",
                               (name, Jsonb(config), text)).fetchone()["c"]
    typer.echo(f"{'Created' if created else 'Updated'} template {name}")


@app.command("list")
def list_(
    details: bool = typer.Option(False, "--details", "-d", help="Show each template's config."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Templates: name, owner, last change."""
    with db() as conn:
        rows = conn.execute(LIST).fetchall()
    if json_:
        print_json(rows)
        return
    columns = ["name", "owner", "updated_at"] + (["config"] if details else [])
    headers = ["Name", "Owner", "Updated"] + (["Config"] if details else [])
    print_table(rows, columns, headers)


@app.command("describe")
def describe(
    name: str = typer.Argument(..., help="Template name."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A template's YAML, as it was set (--json: its config as JSON)."""
    with db() as conn:
        row = get_template(conn, name)
    if json_:
        print_json(row)
        return
    typer.echo(row["original"], nl=not row["original"].endswith("\n"))


@app.command("remove")
def remove(name: str = typer.Argument(..., help="Template name.")) -> None:
    """Remove a template; experiments created from it keep their merged configs."""
    with db() as conn:
        conn.execute("SELECT det_template_remove(%s)", (name,))
    typer.echo(f"Removed template {name}")
