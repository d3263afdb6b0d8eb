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

WEB = "det_web"
"""Wakes det serve's event streams (sent from SQL: ``det_web_event``). The payload is the
topics that changed, space-separated (built below), or ``*`` for all of them."""

ALL_TOPICS = "*"

EXPERIMENTS = "experiments"
"""The experiment list: an experiment was submitted or changed state, progress or archived."""

QUEUE = "queue"
"""The job queue: jobs, their runs or the agents changed."""

CLUSTER = "cluster"
"""Agents and slots: joined, lost, enabled, disabled, taken or released."""

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
    """The channel a task LISTENs on: for its preemption (desired state left RUNNING; empty
    payload), and for its trial's next searcher op being decided (payload ``OP_DECIDED``)."""
    return _bounded("alloc", str(int(allocation_id)))


OP_DECIDED = "op"
"""The payload on an allocation's channel when the searcher has read its trial's events."""


def experiment_topic(exp_id: int) -> str:
    """The topic of one experiment's page: its state, trials, metrics (det_web_event)."""
    return f"experiment:{int(exp_id)}"


def trial_topic(trial_id: int) -> str:
    """The topic of one trial's page: its state, metrics and logs (det_web_event)."""
    return f"trial:{int(trial_id)}"
