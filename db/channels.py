"""NOTIFY channel names: the one place they are built.

NOTIFY is a wake-up hint only (docs/architecture.md): every listener also polls. A
PostgreSQL channel name is an identifier of at most 63 bytes (NAMEDATALEN - 1); ``pg_notify``
refuses a longer one and ``LISTEN`` silently truncates it, so a name built from an unbounded id
would fail a whole reconciler pass. Names that would be too long are replaced by a digest of
the id, the same in every process.
"""

import hashlib

RECONCILER = "det_reconciler"
"""Wakes the reconciler: user actions, agent reports, searcher events (sent from SQL)."""

MAX_BYTES = 63


def _bounded(prefix: str, key: str) -> str:
    name = f"{prefix}_{key}"
    if len(name.encode()) <= MAX_BYTES:
        return name
    return f"{prefix}_h{hashlib.sha1(key.encode()).hexdigest()}"


def agent(agent_id: str) -> str:
    """The channel an agent LISTENs on for new assignments and desired-state changes."""
    return _bounded("agent", agent_id)


def allocation(allocation_id: int) -> str:
    """The channel a task LISTENs on for its preemption (desired state left RUNNING)."""
    return _bounded("alloc", str(int(allocation_id)))
