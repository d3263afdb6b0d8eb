"""Which checkpoint storage det serve may read for a user, and with whose credentials.

det serve downloads a checkpoint from the storage its experiment's config names, and that
config is the user's. Unchecked, ``endpoint_url: http://127.0.0.1:PORT`` had det serve send
requests to any address it can reach, signed, when the config had no keys, with det serve's
own AWS credential chain (environment, ``~/.aws``, instance metadata), whose rights are the
cluster's, not the user's. The rule, for ``type: s3`` (``shared_fs`` and ``directory`` are
files on det serve's host, outside this rule):

* a given ``endpoint_url`` must be the cluster's own ``checkpoint_storage.endpoint_url`` or
  one of ``allowed_checkpoint_storage.endpoint_urls`` (compared by :func:`endpoint_key`);
  without one, requests go to AWS itself;
* the ``bucket`` must be the cluster's own ``checkpoint_storage.bucket`` or one of
  ``allowed_checkpoint_storage.buckets``;
* credentials: the config's own ``access_key`` / ``secret_key``; else det serve's own chain,
  but only for the cluster's own storage (same endpoint and bucket); else none (unsigned
  requests, which a public bucket answers).

With no cluster ``checkpoint_storage`` and no allow-list, det serve reads no S3 storage.
The GC task and ``det checkpoint download`` are outside the rule: they run with the
credentials of their own environment (the task's, the user's), not det serve's.
"""

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import tuple_row

from det.configs.cluster import ClusterConfig
from det.configs.experiment import S3Storage
from det.errors import PermissionDeniedError
from det.sql import named

Q = named("queries")


def endpoint_key(url: str) -> str:
    """``url`` (an S3 ``endpoint_url``) as the rule compares it: scheme and host in lower
    case, the scheme's default port made explicit, no trailing ``/``. User info, query and
    fragment are kept, so a URL with them never matches an allowed one (which has none)."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:  # a port that is not a number matches nothing allowed
        return url
    user = f"{parts.username}@" if parts.username else ""
    rest = parts.path.rstrip("/") + (f"?{parts.query}" if parts.query else "") + (
        f"#{parts.fragment}" if parts.fragment else "")
    return f"{scheme}://{user}{(parts.hostname or '').lower()}:{port}{rest}"


def storage_access(storage: Mapping[str, Any] | None, cluster: ClusterConfig) -> bool:
    """Check that det serve may read the checkpoint storage ``storage`` (an experiment
    config's ``checkpoint_storage`` section) for a user, by the rule of the module docstring;
    returns whether it may use its own credential chain there (only for the cluster's own
    storage, and only when ``storage`` has no keys of its own).

    Raises:
        PermissionDeniedError: an ``endpoint_url`` or ``bucket`` that ``cluster`` does not
            allow, naming the key, the value and what is allowed.
    """
    if not storage or storage.get("type") != "s3":
        return False
    own = cluster.checkpoint_storage if isinstance(cluster.checkpoint_storage, S3Storage) \
        else None
    allowed = cluster.allowed_checkpoint_storage
    own_endpoint = _key(own.endpoint_url) if own is not None else None
    endpoints = {endpoint_key(u) for u in allowed.endpoint_urls} | {own_endpoint} - {None}
    buckets = set(allowed.buckets) | ({own.bucket} if own is not None else set())
    endpoint, bucket = storage.get("endpoint_url") or None, storage.get("bucket")
    if endpoint is not None and _key(endpoint) not in endpoints:
        raise PermissionDeniedError(
            f"checkpoint_storage.endpoint_url: {endpoint!r} is not one det serve may read "
            f"checkpoints from (allowed: {_listed(sorted(endpoints))}; a ClusterAdmin adds "
            "one to the cluster config's allowed_checkpoint_storage.endpoint_urls)")
    if bucket not in buckets:
        raise PermissionDeniedError(
            f"checkpoint_storage.bucket: {bucket!r} is not one det serve may read checkpoints "
            f"from (allowed: {_listed(sorted(buckets))}; a ClusterAdmin adds one to the "
            "cluster config's allowed_checkpoint_storage.buckets)")
    return (own is not None and bucket == own.bucket and not storage.get("access_key")
            and _key(endpoint) == own_endpoint)


def _key(url: object) -> str | None:
    """:func:`endpoint_key` of an ``endpoint_url`` that may be absent (None: AWS itself)."""
    return endpoint_key(str(url)) if url else None


def _listed(values: list[str]) -> str:
    return ", ".join(repr(v) for v in values) if values else "none"


def stored_cluster_config(conn: psycopg.Connection) -> ClusterConfig:
    """The applied cluster config (``det cluster config apply``), else the default one."""
    row = conn.cursor(row_factory=tuple_row).execute(Q.applied_cluster_config).fetchone()
    return ClusterConfig.model_validate(row[0]) if row is not None else ClusterConfig()
