"""Placement, in each pass: each pool's scheduler decides; this module reads its inputs and
writes its decision (new allocations' slots, preemptions, why the rest waits).

``load_pool`` is also what ``det job simulate`` replays under another scheduler.
"""

import gc
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import tuple_row

from det.configs.cluster import SchedulerConfig
from det.reconciler.isolation import isolated
from det.reconciler.schedulers import Agent, Decision, Task, schedule
from det.reconciler.schedulers.model import NOWHERE
from det.sql import named

Q = named("reconciler")


class PoolState(NamedTuple):
    """What one pool's scheduler decides over, read in one go: its active agents, its live
    tasks in queue order, and ``reasons`` (``{allocation id: pending_reason now}`` for each
    waiting allocation, None where it has none) so that :func:`apply` writes only the reasons
    that change."""

    agents: list[Agent]
    tasks: list[Task]
    reasons: dict[int, str | None]


def load_pool(conn: psycopg.Connection, pool: str) -> PoolState:
    """The pool's active agents and live tasks (queue order), as the schedulers take them.

    Rows come as tuples (a pass over 100,000 tasks reads 100,000 rows: a dict per row costs),
    in binary (the slot-id arrays parse faster).
    """
    cur = conn.cursor(row_factory=tuple_row, binary=True)
    params = {"pool": pool}
    agents = [Agent(agent_id, tuple(slots), tuple(free), aux_running, max_aux)
              for agent_id, slots, free, aux_running, max_aux
              in cur.execute(Q.pool_agents, params).fetchall()]
    held: dict[int, dict[str, tuple[int, ...]]] = {}
    for alloc, agent_id, slots in cur.execute(Q.pool_held, params).fetchall():
        held.setdefault(alloc, {})[agent_id] = tuple(slots)
    tasks = []
    reasons: dict[int, str | None] = {}
    for (alloc, job, slots_needed, priority, weight, max_slots, preemptible, running, stopping,
         agent_id, reason, ran, checkpointed) in cur.execute(Q.pool_tasks, params).fetchall():
        on = held.get(alloc, NOWHERE)
        if running and slots_needed == 0 and agent_id:
            on = {agent_id: ()}
        elif not running:
            reasons[alloc] = reason
        tasks.append(Task(alloc, job, slots_needed, priority, weight, preemptible, max_slots,
                          running, stopping, on, math.inf if ran is None else ran,
                          bool(checkpointed)))
    return PoolState(agents, tasks, reasons)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for one pool's read, decision and write.

    A pass over 100,000 queued jobs makes a few hundred thousand objects (rows, tasks,
    reasons) and no cycles: reference counting frees them all, while the collector's runs,
    triggered by the allocations alone, would walk them again and again (a third of the
    decision's time at 100,000 jobs).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def place(conn: psycopg.Connection) -> tuple[int, set[str], set[int]]:
    """Move waiting runs to a fallback pool where their job lists one, then schedule every
    pool with waiting allocations and write the decisions.

    Returns (allocations started or preempted, agents to wake, allocations to wake).
    """
    changes = conn.execute(Q.fall_back).rowcount
    agents_woken: set[str] = set()
    allocs_woken: set[int] = set()

    def place_pool(row: dict) -> None:
        nonlocal changes
        config = SchedulerConfig.model_validate(row["scheduler"])
        woken: tuple[set[str], set[int]] = (set(), set())
        with collector_paused():
            state = load_pool(conn, row["resource_pool"])
            decision = schedule(config, state.agents, state.tasks)
            changes += apply(conn, decision, *woken, state.reasons)
        agents_woken.update(woken[0])
        allocs_woken.update(woken[1])

    for row in conn.execute(Q.pools_with_pending).fetchall():
        # A pool whose scheduling fails says why on its waiting runs; other pools go on.
        isolated(conn, f"scheduling pool {row['resource_pool']}", lambda row=row: place_pool(row),
                 lambda msg, row=row: conn.execute(Q.pool_failed, {
                     "pool": row["resource_pool"], "reason": f"scheduling failed: {msg}"}))
    return changes, agents_woken, allocs_woken


def apply(conn: psycopg.Connection, d: Decision, agents: set[str], allocs: set[int],
          current: Mapping[int, str | None] | None = None) -> int:
    """Write one decision; reasons are written only where they changed.

    ``current``: the reasons as read (:attr:`PoolState.reasons`); a reason equal to its
    allocation's there is not sent at all (in a steady pass nearly every one), and the
    statement itself skips any other that is unchanged. Returns allocations started or
    preempted; adds the agents and allocations to wake to ``agents`` and ``allocs``.
    """
    chiefs: tuple[list, list] = ([], [])
    held: tuple[list, list, list] = ([], [], [])
    for alloc, fit in d.allocate.items():
        chiefs[0].append(alloc)
        chiefs[1].append(next(iter(fit)))
        for agent, slot_ids in fit.items():
            for slot in slot_ids:
                for column, value in zip(held, (alloc, agent, slot), strict=True):
                    column.append(value)
            agents.add(agent)
    if chiefs[0]:
        conn.execute(Q.assign, {"ids": chiefs[0], "agents": chiefs[1]})
        conn.execute(Q.hold_slots, {"ids": held[0], "agents": held[1], "slots": held[2]})
    preempted: list[dict[str, Any]] = []
    if d.release:
        why = [d.preempted_for.get(i, (None, "preemption")) for i in d.release]
        preempted = conn.execute(Q.preempt, {"ids": list(d.release),
                                             "jobs": [job for job, _ in why],
                                             "rules": [rule for _, rule in why]}).fetchall()
    for p in preempted:
        allocs.add(p["id"])
        if p["agent_id"]:
            agents.add(p["agent_id"])
    known = current or {}
    # known.get(i, i) is never a reason (an int): an allocation not read counts as changed
    changed = {i: r for i, r in d.reasons.items() if known.get(i, i) != r}
    if changed:
        conn.execute(Q.set_pending_reasons, {"ids": list(changed),
                                             "reasons": list(changed.values())})
    return len(d.allocate) + len(preempted)
