"""Placement of pending allocations onto free slots: a pure function.

This is first-fit in queue order within one resource pool. A multi-slot allocation lands on
one agent when one has enough free slots; otherwise on several whole idle agents of equal
slot count (gang placement: all or nothing). Zero-slot allocations go to the active agent
running the fewest of them.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AgentSlots:
    """An agent that can take work: its id, its enabled slots, and which of them are free."""

    agent_id: str
    slots: tuple[int, ...]
    free: tuple[int, ...]
    zero_slot_tasks: int = 0


@dataclass(frozen=True)
class Pending:
    """An allocation waiting for slots, in queue order."""

    allocation_id: int
    slots_needed: int


@dataclass(frozen=True)
class Assignment:
    """Slots granted to an allocation: ``{agent_id: [slot ids]}``."""

    allocation_id: int
    slots: dict[str, list[int]] = field(default_factory=dict)


def schedule(agents: Sequence[AgentSlots], pending: Sequence[Pending]) -> list[Assignment]:
    """Place ``pending`` (in queue order) onto ``agents``' free slots, first fit.

    Returns the assignments made; an allocation that fits nowhere is left pending. Never
    assigns a slot twice, and never more slots than an agent has free.
    """
    free = {a.agent_id: list(a.free) for a in agents}
    size = {a.agent_id: len(a.slots) for a in agents}
    zero_load = {a.agent_id: a.zero_slot_tasks for a in agents}
    out: list[Assignment] = []
    for p in pending:
        if not agents:
            break
        if p.slots_needed == 0:
            agent = min(zero_load, key=lambda a: (zero_load[a], a))
            zero_load[agent] += 1
            out.append(Assignment(p.allocation_id, {agent: []}))
            continue
        single = next((a for a in free if len(free[a]) >= p.slots_needed), None)
        if single is not None:
            taken, free[single] = free[single][: p.slots_needed], free[single][p.slots_needed :]
            out.append(Assignment(p.allocation_id, {single: taken}))
            continue
        gang = _whole_agents(free, size, p.slots_needed)
        if gang:
            out.append(Assignment(p.allocation_id, {a: free[a] for a in gang}))
            for a in gang:
                free[a] = []
    return out


def _whole_agents(free: dict[str, list[int]], size: dict[str, int], needed: int) -> list[str]:
    """Idle agents of one size whose slots add up to exactly ``needed``, or [] if none."""
    by_size: dict[int, list[str]] = {}
    for agent, slots in free.items():
        if slots and len(slots) == size[agent]:
            by_size.setdefault(size[agent], []).append(agent)
    for n, idle in sorted(by_size.items(), reverse=True):
        if needed % n == 0 and len(idle) >= needed // n:
            return idle[: needed // n]
    return []
