"""Reading users, groups, roles and the audit log (``det user``, ``det user-group``,
``det rbac``, ``det audit``). Row security decides what each caller sees."""

import psycopg

from det.sql import named

Q = named("queries")


def users(conn: psycopg.Connection, all_: bool, name: str | None = None) -> list[dict]:
    """Users, the active ones unless ``all_``; only ``name`` when given. Each has ``admin``
    (cluster-wide ClusterAdmin) and ``groups`` (names)."""
    return conn.execute(Q.users, {"all": all_, "name": name}).fetchall()


def user_roles(conn: psycopg.Connection, name: str) -> list[dict]:
    """The roles user ``name`` holds (``role``, ``workspace``, ``via``: directly or a group),
    cluster-wide ones first."""
    return conn.execute(Q.user_roles, {"name": name}).fetchall()


def groups(conn: psycopg.Connection, name: str | None = None) -> list[dict]:
    """Groups with their ``members`` (names); only ``name`` when given."""
    return conn.execute(Q.user_groups, {"name": name}).fetchall()


def is_cluster_admin(conn: psycopg.Connection) -> bool:
    """Whether the session is the schema's owner or a ClusterAdmin (det_user.permitted)."""
    return conn.execute(Q.is_cluster_admin).fetchone()["ok"]


def roles(conn: psycopg.Connection, exclude_global: bool) -> list[dict]:
    """The roles (``name``, ``permissions``, ``scope``, ``description``), fewest permissions
    first; without the cluster-wide-only ones when ``exclude_global``."""
    return conn.execute(Q.roles, {"exclude_global": exclude_global}).fetchall()


def caller_permissions(conn: psycopg.Connection) -> list[dict]:
    """What the session's det user may do (``permission``) and where (``workspace``)."""
    return conn.execute(Q.caller_permissions).fetchall()


def audit_log(conn: psycopg.Connection, actor: str | None, object_type: str | None,
              object_id: str | None, limit: int) -> list[dict]:
    """At most ``limit`` audit rows, newest first, of ``actor`` and the object given (None:
    any). Rows the caller may not read (all, unless ClusterAdmin) are absent."""
    return conn.execute(Q.audit_log, {"actor": actor, "object_type": object_type,
                                      "object_id": object_id, "limit": limit}).fetchall()
