"""Step 8 of a pass: each pool's scheduler decides; this module reads its inputs and writes
its decision (new allocations' slots, preemptions, why the rest waits).

``load_pool`` is also what ``det job simulate`` replays under another scheduler.
"""

from collections.abc import Mapping
from typing import Any

import psycopg

from det.configs.cluster import SchedulerConfig
from det.reconciler import queries as q
from det.reconciler.isolation import isolated
from det.reconciler.schedulers import Agent, Decision, Task, schedule


def load_pool(conn: psycopg.Connection, pool: str) -> tuple[list[Agent], list[Task]]:
    """The pool's active agents and live tasks (queue order), as the schedulers take them."""
    agents = [Agent(a["agent_id"], tuple(a["slots"]), tuple(a["free"]), a["aux_running"],
                    a["max_aux"])
              for a in conn.execute(q.POOL_AGENTS, {"pool": pool}).fetchall()]
    held: dict[int, dict[str, tuple[int, ...]]] = {}
    for h in conn.execute(q.POOL_HELD, {"pool": pool}).fetchall():
        held.setdefault(h["allocation_id"], {})[h["agent_id"]] = tuple(h["slots"])
    tasks = []
    for t in conn.execute(q.POOL_TASKS, {"pool": pool}).fetchall():
        on: Mapping[str, tuple[int, ...]] = held.get(t["id"], {})
        if t["running"] and t["slots_needed"] == 0 and t["agent_id"]:
            on = {t["agent_id"]: ()}
        tasks.append(Task(t["id"], t["job_id"], t["slots_needed"], t["priority"], t["weight"],
                          t["preemptible"], t["max_slots"], t["running"], t["stopping"], on))
    return agents, tasks


def place(conn: psycopg.Connection) -> tuple[int, set[str], set[int]]:
    """Move waiting runs to a fallback pool where their job lists one, then schedule every
    pool with waiting allocations and write the decisions.

    Returns (allocations started or preempted, agents to wake, allocations to wake).
    """
    changes = conn.execute(q.FALL_BACK).rowcount
    agents_woken: set[str] = set()
    allocs_woken: set[int] = set()

    def place_pool(row: dict) -> None:
        nonlocal changes
        config = SchedulerConfig.model_validate(row["scheduler"])
        agents, tasks = load_pool(conn, row["resource_pool"])
        decision = schedule(config, agents, tasks)
        woken: tuple[set[str], set[int]] = (set(), set())
        changes += apply(conn, decision, *woken)
        agents_woken.update(woken[0])
        allocs_woken.update(woken[1])

    for row in conn.execute(q.POOLS_WITH_PENDING).fetchall():
        # A pool whose scheduling fails says why on its waiting runs; other pools go on.
        isolated(conn, f"scheduling pool {row['resource_pool']}", lambda row=row: place_pool(row),
                 lambda msg, row=row: conn.execute(q.POOL_FAILED, {
                     "pool": row["resource_pool"], "reason": f"scheduling failed: {msg}"}))
    return changes, agents_woken, allocs_woken


def apply(conn: psycopg.Connection, d: Decision, agents: set[str], allocs: set[int]) -> int:
    """Write one decision; reasons are written only where they changed."""
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
        conn.execute(q.ASSIGN, {"ids": chiefs[0], "agents": chiefs[1]})
        conn.execute(q.HOLD_SLOTS, {"ids": held[0], "agents": held[1], "slots": held[2]})
    preempted: list[dict[str, Any]] = []
    if d.release:
        preempted = conn.execute(q.PREEMPT, {"ids": list(d.release)}).fetchall()
    for p in preempted:
        allocs.add(p["id"])
        if p["agent_id"]:
            agents.add(p["agent_id"])
    if d.reasons:
        conn.execute(q.SET_PENDING_REASONS, {"ids": list(d.reasons),
                                             "reasons": list(d.reasons.values())})
    return len(d.allocate) + len(preempted)
