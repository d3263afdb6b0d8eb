"""Reads of the model registry (reporting.models, reporting.model_versions), shared by
``det model`` and ``/api/v1/models``."""

import psycopg

from det.sql import named

Q = named("queries")


def version_checkpoint(conn: psycopg.Connection, model: str, version: int | None) -> dict:
    """Model ``model`` (name or id)'s ``version`` (None: the latest): ``name``, ``version``
    and ``checkpoint_uuid``. Raises what det_user.model_version_find raises for an unknown model
    or version (det.errors translates it)."""
    return conn.execute(Q.version_checkpoint, {"model": model, "version": version}).fetchone()
