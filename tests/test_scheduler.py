"""The FIFO placement function: pure, checked with examples and hypothesis properties."""

from hypothesis import given
from hypothesis import strategies as st

from det.reconciler.scheduler import AgentSlots, Pending, schedule


def agent(name: str, n: int, free: int | None = None, zero: int = 0) -> AgentSlots:
    return AgentSlots(name, tuple(range(n)), tuple(range(n - (free if free is not None else n),
                                                         n)), zero)


def test_first_fit_in_queue_order() -> None:
    out = schedule([agent("a", 2), agent("b", 4)], [Pending(1, 3), Pending(2, 2), Pending(3, 1)])
    assert {a.allocation_id: a.slots for a in out} == {1: {"b": [0, 1, 2]}, 2: {"a": [0, 1]},
                                                       3: {"b": [3]}}


def test_gang_on_whole_idle_agents_or_nothing() -> None:
    out = schedule([agent("a", 4), agent("b", 4), agent("c", 4, free=2)], [Pending(1, 8)])
    assert out[0].slots == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]}
    assert schedule([agent("a", 4), agent("b", 4, free=3)], [Pending(1, 8)]) == []


def test_zero_slot_tasks_go_to_least_loaded_agent() -> None:
    out = schedule([agent("a", 1, zero=2), agent("b", 1, free=0, zero=1)],
                   [Pending(1, 0), Pending(2, 0)])
    assert [a.slots for a in out] == [{"b": []}, {"a": []}]


def test_no_agents_no_assignments() -> None:
    assert schedule([], [Pending(1, 1)]) == []


agents_st = st.lists(
    st.tuples(st.integers(0, 8), st.integers(0, 8)).map(lambda t: (max(t), min(t))),
    max_size=6,
).map(lambda xs: [agent(f"g{i}", n, free) for i, (n, free) in enumerate(xs)])
pending_st = st.lists(st.integers(0, 16), max_size=12).map(
    lambda xs: [Pending(i, n) for i, n in enumerate(xs)])


@given(agents_st, pending_st)
def test_properties(agents: list[AgentSlots], pending: list[Pending]) -> None:
    out = schedule(agents, pending)
    free = {a.agent_id: set(a.free) for a in agents}
    needed = {p.allocation_id: p.slots_needed for p in pending}
    used: set[tuple[str, int]] = set()
    assert len({a.allocation_id for a in out}) == len(out)
    for a in out:
        granted = [(g, s) for g, slots in a.slots.items() for s in slots]
        # gang: all the slots it asked for, or it is not in the output at all
        assert len(granted) == needed[a.allocation_id]
        for g, s in granted:
            assert s in free[g], "only free slots are granted"
            assert (g, s) not in used, "no slot is granted twice"
            used.add((g, s))
