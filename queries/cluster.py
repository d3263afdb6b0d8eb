"""Reading the cluster: agents, slots (and what holds each), resource pools, the cluster
config."""

import psycopg

from det.sql import named

Q = named("queries")


def pool_bindings(conn: psycopg.Connection, pool: str | None) -> list[dict]:
    """(``resource_pool``, ``workspace``) of each binding of ``pool`` (None: every pool)."""
    return conn.execute(Q.pool_bindings, {"pool": pool}).fetchall()


def pool_schedulers(conn: psycopg.Connection) -> list[dict]:
    """Each pool's ``name`` and ``scheduler`` (det_user.pool_scheduler: its config), by name."""
    return conn.execute(Q.pool_schedulers).fetchall()


def server_info(conn: psycopg.Connection) -> dict:
    """The database's ``server_version``, ``database``, ``user_name`` (the session's role)
    and ``schema_version`` (det's)."""
    return conn.execute(Q.server_info).fetchone()
