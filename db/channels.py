"""NOTIFY channels: the one place Python names them, listens and notifies.

NOTIFY is a wake-up hint only (docs/architecture.md): every listener also polls. PostgreSQL
has no privilege on LISTEN or NOTIFY (any role may use any channel it can name), so a
channel's name is a secret: the SQL function ``det_internal.channel(kind, key)`` builds it
from a random cluster key that only the schema's owner reads (schema.sql, "NOTIFY
channels"). Python names a channel by its kind and key (:class:`Channel`) and never holds the
name: each actor LISTENs through the function its role may call, which runs the LISTEN inside
the database, so the name is not even in the statement's text (``pg_stat_activity`` shows a
session's last statement to every session of the same role: all tasks share ``det_task``):

* the reconciler (the owner): :func:`listen` on :data:`RECONCILER`;
* det serve (``det_web``): :func:`listen_web`;
* an agent (``det_agent``): :func:`listen_agent`, its own channel;
* a task (``det_task``): :func:`listen_task`, its own allocation's channel, by its token.

A user role can call none of them, nor read the key, so it can neither hear det's channels
nor wake det's processes through them.
"""

from typing import Any, NamedTuple

import psycopg
from psycopg.rows import tuple_row

from det.sql import named

Q = named("db")


class Channel(NamedTuple):
    """A channel by kind (``reconciler``, ``web``, ``agent``, ``alloc``) and key (an agent's or
    allocation's id; '' for the cluster-wide ones); ``det_internal.channel`` names it."""

    kind: str
    key: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.key}".strip()


RECONCILER = Channel("reconciler")
"""Wakes the reconciler: user actions, agent reports, searcher events (sent from SQL)."""

WEB = Channel("web")
"""Wakes det serve's event streams (sent from SQL: ``det_internal.web_event``). The payload is the
topics that changed, space-separated (built below), or ``*`` for all of them."""

ALL_TOPICS = "*"

EXPERIMENTS = "experiments"
"""The experiment list: an experiment was submitted or changed state, progress or archived."""

QUEUE = "queue"
"""The job queue: jobs, their runs or the agents changed."""

CLUSTER = "cluster"
"""Agents and slots: joined, lost, enabled, disabled, taken or released."""


def agent(agent_id: str) -> Channel:
    """The channel an agent LISTENs on for new assignments and desired-state changes."""
    return Channel("agent", agent_id)


def allocation(allocation_id: int) -> Channel:
    """The channel a task LISTENs on: for its preemption (desired state left RUNNING; empty
    payload), and for its trial's next searcher op being decided (payload ``OP_DECIDED``)."""
    return Channel("alloc", str(int(allocation_id)))


OP_DECIDED = "op"
"""The payload on an allocation's channel when the searcher has read its trial's events."""


def experiment_topic(exp_id: int) -> str:
    """The topic of one experiment's page: its state, trials, metrics (det_internal.web_event)."""
    return f"experiment:{int(exp_id)}"


def trial_topic(trial_id: int) -> str:
    """The topic of one trial's page: its state, metrics and logs (det_internal.web_event)."""
    return f"trial:{int(trial_id)}"


def listen(conn: psycopg.Connection[Any], channel: Channel) -> None:
    """The session of ``conn`` LISTENs on ``channel`` (from its transaction's commit on; at
    once in autocommit). The schema's owner only (``det_internal.listen``).

    Raises:
        psycopg.errors.InsufficientPrivilege: ``conn``'s role is not the owner.
    """
    conn.execute(Q.listen, channel)


def notify(conn: psycopg.Connection[Any], channel: Channel, payload: str) -> None:
    """NOTIFY ``channel`` with ``payload`` (delivered at the transaction's commit). The
    schema's owner only (``det_internal.channel``)."""
    conn.execute(Q.notify, (*channel, payload))


def name(conn: psycopg.Connection[Any], channel: Channel) -> str:
    """The name of ``channel`` in this cluster, to compare with a ``Notify.channel``. The
    schema's owner only (``det_internal.channel``): never hand it to a user or task."""
    return conn.cursor(row_factory=tuple_row).execute(Q.channel_name, channel).fetchone()[0]


def listen_agent(conn: psycopg.Connection[Any], agent_id: str) -> None:
    """An agent's session LISTENs on its own channel (``det_agent.listen``, det_agent)."""
    conn.execute(Q.agent_listen, (agent_id,))


def listen_task(conn: psycopg.Connection[Any], token: str) -> None:
    """A task's session LISTENs on its allocation's channel (``det_task.listen``, det_task).

    Raises:
        psycopg.errors.InvalidAuthorizationSpecification: ``token`` is no live allocation's.
    """
    conn.execute(Q.task_listen, (token,))


async def listen_web(conn: psycopg.AsyncConnection[Any]) -> None:
    """det serve's listener LISTENs on the web channel (``det_web.listen``, det_web)."""
    await conn.execute(Q.web_listen)
