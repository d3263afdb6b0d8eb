"""Reading config templates as their users may: configs with secrets redacted."""

import psycopg

from det.errors import NotFoundError
from det.sql import named

Q = named("queries")


def list_templates(conn: psycopg.Connection, workspace: str | None) -> list[dict]:
    """The templates of ``workspace`` (None: every workspace the caller may view), by
    workspace and name."""
    return conn.execute(Q.templates, {"workspace": workspace}).fetchall()


def get_template(conn: psycopg.Connection, name: str, workspace: str) -> dict:
    """Template ``name`` of ``workspace`` as the caller may read it: ``workspace``, ``name``,
    ``owner``, times, ``config`` (its mapping, secrets as ``********``) and ``original`` (its
    YAML, or None when it holds secrets).

    Raises:
        NotFoundError: no such template in a workspace the caller may view.
    """
    row = conn.execute(Q.template, {"workspace": workspace, "name": name}).fetchone()
    if row is None:
        raise NotFoundError(f"template {name!r} not found in workspace {workspace!r} "
                            "(det template list shows them)")
    return row
