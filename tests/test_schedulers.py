"""The pure schedulers: spec examples, the 7-step priority example pass by pass, scenario
files, and hypothesis properties of every scheduler."""


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from det.configs.cluster import SchedulerConfig
from det.errors import ConfigError
from det.reconciler.schedulers import Agent, Task, schedule
from det.reconciler.schedulers.fair_share import shares
from det.reconciler.schedulers.fitting import Pool, never_fits
from det.reconciler.schedulers.priority import plan
from det.reconciler.schedulers.scenario import load_scenario

FAIR = SchedulerConfig(type="fair_share")
PRIO = SchedulerConfig(type="priority", preemption=True)
RR = SchedulerConfig(type="round_robin")


def agent(name: str, n: int, used: int = 0, max_aux: int = 100) -> Agent:
    return Agent(name, tuple(range(n)), tuple(range(used, n)), 0, max_aux)


def job(name: str, n: int, slots: int = 1, **kw) -> list[Task]:
    return [Task(f"{name}.{i}", name, slots, **kw) for i in range(n)]


def per_job(allocated: dict, tasks: list[Task]) -> dict:
    out: dict = {}
    for t in tasks:
        if t.id in allocated:
            out[t.job] = out.get(t.job, 0) + t.slots
    return out


def test_fair_share_divides_by_demand_times_weight_as_the_spec_says() -> None:
    assert shares(8, {"a": 10, "b": 30}, {"a": 1, "b": 1}) == {"a": 2, "b": 6}
    assert shares(8, {"a": 10, "b": 30}, {"a": 3, "b": 1}) == {"a": 4, "b": 4}
    # A satisfied job's leftover goes to the others; nobody with demand starves.
    assert shares(8, {"a": 1, "b": 30}, {"a": 10, "b": 1}) == {"a": 1, "b": 7}
    assert shares(8, {"a": 1, "b": 60}, {"a": 1, "b": 1}) == {"a": 1, "b": 7}


def test_fair_share_pass_on_eight_slots() -> None:
    tasks = job("a", 10) + job("b", 30)
    d = schedule(FAIR, [agent("g", 8)], tasks)
    assert per_job(d.allocate, tasks) == {"a": 2, "b": 6}
    weighted = job("a", 10, weight=3) + job("b", 30)
    assert per_job(schedule(FAIR, [agent("g", 8)], weighted).allocate, weighted) == {"a": 4,
                                                                                     "b": 4}
    assert d.reasons["a.2"] == "at its fair share: holds 2 of 2 slot(s)"


def test_fair_share_preempts_a_job_above_its_share_newest_first() -> None:
    a = [t._replace(running=True, on={"g": (i,)}) for i, t in enumerate(job("a", 8))]
    tasks = a + job("b", 8)
    d = schedule(FAIR, [agent("g", 8, used=8)], tasks)
    assert d.release == ["a.7", "a.6", "a.5", "a.4"] and not d.allocate
    assert "above its fair share" not in d.reasons["b.0"]
    # Tasks already stopping count first: nothing more is preempted.
    stopping = [t._replace(stopping=True) if t.id in d.release else t for t in a]
    assert schedule(FAIR, [agent("g", 8, used=8)], stopping + job("b", 8)).release == []


def test_max_slots_caps_fair_share_demand() -> None:
    # Demands 3 (capped from 10) and 10 on 8 slots: 8·3/13 ≈ 1.8 and 8·10/13 ≈ 6.2.
    tasks = job("a", 10, max_slots=3) + job("b", 10)
    assert per_job(schedule(FAIR, [agent("g", 8)], tasks).allocate, tasks) == {"a": 2, "b": 6}


def test_zero_slot_tasks_apart_and_limited_per_agent() -> None:
    tasks = job("n", 3, slots=0) + job("a", 2, slots=2)
    for cfg in (FAIR, PRIO, RR):
        d = schedule(cfg, [agent("g", 4, max_aux=2)], tasks)
        assert set(d.allocate) == {"n.0", "n.1", "a.0", "a.1"}, cfg.type
        assert "aux" in d.reasons["n.2"]
    assert never_fits(Task("x", "x", 0), [agent("g", 4, max_aux=0)]) is not None


def test_fitting_best_packs_worst_spreads_and_gangs_are_all_or_nothing() -> None:
    agents = [agent("a", 4, used=2), agent("b", 4)]
    assert Pool(agents, "best").fit(1) == {"a": [2]}
    assert Pool(agents, "worst").fit(1) == {"b": [0]}
    assert Pool([agent("a", 4), agent("b", 4)]).fit(8) == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]}
    assert Pool([agent("a", 4), agent("b", 4, used=1)]).fit(8) is None
    assert "largest agent has 4" in never_fits(Task("x", "x", 6), [agent("a", 4), agent("b", 4)])
    assert never_fits(Task("x", "x", 9), [agent("a", 4)]) == "needs 9 slots but the pool has 4"
    assert never_fits(Task("x", "x", 1), []) == "pool has no agents"
    # An agent of no slots (`det cluster up --slots 0` beside agents of other hosts) is no
    # size a gang is made of.
    assert never_fits(Task("x", "x", 2), [agent("local", 0), agent("a", 1), agent("b", 1)]) is None


def test_priority_without_preemption_waits_in_order() -> None:
    cfg = SchedulerConfig(type="priority")
    low = [t._replace(running=True, on={"g": (i,)}, priority=50)
           for i, t in enumerate(job("low", 4))]
    tasks = low + job("high", 1, slots=2, priority=10) + job("later", 1, priority=60)
    d = schedule(cfg, [agent("g", 4, used=4)], tasks)
    assert not d.allocate and not d.release
    assert d.reasons["later.0"].startswith("behind 1 job(s) of higher priority")


def test_waiting_reasons_name_the_first_holders_and_count_the_rest() -> None:
    """Reasons are worded once per (slots, own job holds) and reused; the holders named are
    the first four by id, whatever the order of the queue (issue 11 keeps five of them)."""
    cfg = SchedulerConfig(type="priority")
    running = [Task(f"r{j}", j, 1, priority=50, running=True, on={"g": (j,)})
               for j in (12, 3, 7, 1, 30, 2)]
    tasks = running + job("high", 2, slots=2, priority=10) + job("later", 2, priority=60)
    d = schedule(cfg, [agent("g", 6, used=6)], tasks)
    held = "slots are held by jobs 1, 2, 3 and 3 more"
    assert d.reasons["high.0"] == d.reasons["high.1"] == f"waiting for 2 free slot(s); {held}"
    assert d.reasons["later.0"] == ("behind 1 job(s) of higher priority; "
                                    f"waiting for 1 free slot(s); {held}")
    assert d.reasons["later.1"] is d.reasons["later.0"]  # worded once for the level
    own = running + [Task("mine", 3, 1, priority=60)]  # its own job is not named
    assert schedule(cfg, [agent("g", 6, used=6)], own).reasons["mine"] == (
        "waiting for 1 free slot(s); slots are held by jobs 1, 2, 7 and 2 more")


def test_preemption_reuses_slots_freed_earlier_in_the_pass() -> None:
    """Two 1-slot priority-10 tasks, a full 4-slot agent of two 2-slot priority-50 tasks:
    evicting the last one frees room for both, so the first keeps running (issue 10, item 6)."""
    low = [t._replace(running=True, on={"g": (2 * i, 2 * i + 1)}, priority=50)
           for i, t in enumerate(job("low", 2, slots=2))]
    tasks = low + job("high", 2, priority=10)
    d = schedule(PRIO, [agent("g", 4, used=4)], tasks)
    assert d.release == ["low.1"] and not d.allocate
    assert d.reasons == {"high.0": "preempting lower-priority tasks to make room",
                         "high.1": "waiting for preempted tasks to give their slots back"}


def test_preemption_leaves_out_a_victim_the_next_one_makes_unneeded() -> None:
    """A 2-slot task on a full pool: the lowest-priority task (1 slot) does not make room
    alone, the next one (2 slots) does without it: only that one is evicted, whether the two
    share an agent or not."""
    tasks = [Task("x", "x", 1, 90, running=True, on={"a": (0,)}),
             Task("y", "y", 2, 80, running=True, on={"b": (0, 1)}),
             Task("z", "z", 1, 70, running=True, on={"a": (1,)}),
             Task("hi", "hi", 2, 10)]
    d = schedule(PRIO, [agent("a", 2, used=2), agent("b", 2, used=2)], tasks)
    assert d.release == ["y"]
    one_agent = [Task("x", "x", 1, 90, running=True, on={"a": (0,)}),
                 Task("y", "y", 2, 80, running=True, on={"a": (1, 2)}),
                 Task("z", "z", 1, 70, running=True, on={"a": (3,)}),
                 Task("hi", "hi", 2, 10)]
    assert schedule(PRIO, [agent("a", 4, used=4)], one_agent).release == ["y"]


def test_round_robin_takes_turns() -> None:
    tasks = job("a", 4) + job("b", 4)
    d = schedule(RR, [agent("g", 4)], tasks)
    assert sorted(d.allocate) == ["a.0", "a.1", "b.0", "b.1"]
    assert d.reasons["a.3"] == "waiting its turn: 1 earlier task(s) of its job go first"


class Cluster:
    """Runs passes like the reconciler: allocated tasks start, preempted ones exit and queue
    again as a new run of the same trial."""

    def __init__(self, cfg: SchedulerConfig, agents: list[Agent]) -> None:
        self.cfg, self.agents, self.tasks = cfg, agents, []

    def submit(self, tasks: list[Task]) -> None:
        self.tasks += tasks

    def finish(self, job_name: str) -> None:
        self.tasks = [t for t in self.tasks if t.job != job_name]

    def settle(self, passes: int = 4) -> None:
        for _ in range(passes):
            d = schedule(self.cfg, self.live_agents(), self.tasks)
            runs = {}
            for t in self.tasks:
                if t.id in d.allocate:
                    runs[t.id] = t._replace(running=True,
                                         on={a: tuple(s) for a, s in d.allocate[t.id].items()})
                elif t.id in d.release:  # checkpoints, exits, and waits for another run
                    runs[t.id] = t._replace(running=False, on={})
            self.tasks = [runs.get(t.id, t) for t in self.tasks]

    def live_agents(self) -> list[Agent]:
        out = []
        for a in self.agents:
            held = {s for t in self.tasks if t.running for s in t.on.get(a.id, ())}
            aux = sum(1 for t in self.tasks if t.running and t.slots == 0 and a.id in t.on)
            out.append(Agent(a.id, a.slots, tuple(s for s in a.slots if s not in held), aux,
                             a.max_aux))
        return out

    def running(self) -> dict:
        return per_job({t.id: 1 for t in self.tasks if t.running}, self.tasks)


def test_the_specs_seven_step_priority_example() -> None:
    """spec: introduction-and-features, Task Priority (preemption on, 8 GPUs)."""
    c = Cluster(PRIO, [agent("g", 8)])
    # 1. A priority-2 ASHA experiment, 20 concurrent 1-slot trials: 8 run, on all 8 slots.
    c.submit(job("asha", 20, priority=2))
    c.settle()
    assert c.running() == {"asha": 8}
    # 2. A priority-1 distributed experiment of 4 slots: 4 ASHA trials are preempted.
    c.submit(job("dist1", 1, slots=4, priority=1))
    c.settle()
    assert c.running() == {"asha": 4, "dist1": 4}
    # 3. A priority-3 one-slot notebook (not preemptible) waits: nothing is idle.
    c.submit(job("notebook", 1, priority=3, preemptible=False))
    c.settle()
    assert c.running() == {"asha": 4, "dist1": 4}
    # 4. Both experiments complete; the notebook runs.
    c.finish("asha")
    c.finish("dist1")
    c.settle()
    assert c.running() == {"notebook": 1}
    # 5. A priority-1 experiment of 8 slots cannot run: the notebook is not preemptible.
    c.submit(job("dist8", 1, slots=8, priority=1))
    c.settle()
    assert c.running() == {"notebook": 1}
    # 6. A priority-2 experiment of 4 slots is backfilled onto the idle 7 slots.
    c.submit(job("dist2", 1, slots=4, priority=2))
    c.settle()
    assert c.running() == {"notebook": 1, "dist2": 4}
    # 7. The notebook is killed: the priority-2 experiment is preempted, priority 1 runs...
    c.finish("notebook")
    c.settle()
    assert c.running() == {"dist8": 8}
    # ... and once it completes, the priority-2 experiment runs again.
    c.finish("dist8")
    c.settle()
    assert c.running() == {"dist2": 4}


def test_scenario_file(tmp_path) -> None:
    text = """
scheduler: {type: priority, preemption: true, fitting_policy: best}
agents:
  - {id: a1, slots: 4, max_aux_containers: 100}
tasks:
  - {id: t1, job: j1, slots: 4, priority: 50, weight: 1, preemptible: true,
     state: running, on: {a1: 4}}
  - {id: t2, slots: 1, priority: 40}
"""
    sc = load_scenario(text, "s.yaml")
    d = schedule(sc.scheduler, *sc.to_model())
    assert (list(d.allocate), d.release) == ([], ["t1"])
    with pytest.raises(ConfigError, match="s.yaml: .*no agent 'a9'"):
        load_scenario(text.replace("on: {a1: 4}", "on: {a9: 4}"), "s.yaml")
    with pytest.raises(ConfigError, match="tasks"):
        load_scenario("tasks: [{id: x, slots: -1}]", "s.yaml")


# -- properties --------------------------------------------------------------------------------

CONFIGS = [FAIR, SchedulerConfig(type="priority"), PRIO, RR,
           SchedulerConfig(type="fair_share", fitting_policy="worst")]


@st.composite
def clusters(draw, max_agents: int = 5, runs: st.SearchStrategy = st.booleans(),
             priorities: st.SearchStrategy = st.integers(1, 99)):
    """(agents, tasks in queue order): a task runs, where it fits, when ``runs`` draws True."""
    sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=0, max_size=max_agents))
    agents = [Agent(f"g{i}", tuple(range(n)), tuple(range(n)), 0, draw(st.integers(0, 3)))
              for i, n in enumerate(sizes)]
    free = {a.id: list(a.slots) for a in agents}
    aux = {a.id: 0 for a in agents}
    tasks = []
    for i in range(draw(st.integers(0, 14))):
        slots = draw(st.sampled_from([0, 1, 1, 2, 4, 8]))
        t = Task(f"t{i}", f"j{draw(st.integers(0, 3))}", slots, draw(priorities),
                 draw(st.sampled_from([0.5, 1.0, 3.0])), draw(st.booleans()))
        fit = Pool([Agent(a, tuple(range(len(s))), tuple(s), 0, 100) for a, s in free.items()]
                   ).fit(slots) if slots else None
        if slots == 0 and agents and draw(runs):
            a = agents[0]
            if aux[a.id] < a.max_aux:
                aux[a.id] += 1
                t = t._replace(running=True, on={a.id: ()})
        elif fit and draw(runs):
            for a, s in fit.items():
                free[a] = [x for x in free[a] if x not in s]
            t = t._replace(running=True, on={a: tuple(s) for a, s in fit.items()})
        if t.running:
            t = t._replace(stopping=draw(st.sampled_from([False, False, False, True])))
        tasks.append(t)
    agents = [Agent(a.id, a.slots, tuple(free[a.id]), aux[a.id], a.max_aux) for a in agents]
    return agents, tasks


@settings(max_examples=300, deadline=None)
@given(clusters(), st.sampled_from(CONFIGS))
def test_properties(cluster, cfg) -> None:
    agents, tasks = cluster
    d = schedule(cfg, agents, tasks)
    by_id = {t.id: t for t in tasks}
    free = {a.id: set(a.free) for a in agents}
    aux_free = {a.id: a.max_aux - a.aux_running for a in agents}
    used = set()
    for tid, fit in d.allocate.items():
        t = by_id[tid]
        assert not t.running
        if t.slots == 0:
            (a,) = fit
            aux_free[a] -= 1
            assert aux_free[a] >= 0, "more zero-slot tasks than max_aux"
            continue
        # gang: all the slots or none, on one agent or on whole idle agents
        assert sum(len(s) for s in fit.values()) == t.slots
        if len(fit) > 1:
            assert all(set(s) == set(next(x for x in agents if x.id == a).slots)
                       for a, s in fit.items())
        for a, s in fit.items():
            for slot in s:
                assert slot in free[a], "only free slots"
                assert (a, slot) not in used, "no slot twice"
                used.add((a, slot))
    for tid in d.release:
        t = by_id[tid]
        assert t.running and t.preemptible, "preemption only touches preemptible running tasks"
    assert set(d.reasons) | set(d.allocate) == {t.id for t in tasks if not t.running}


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 40),
                                           min_size=1),
       st.data())
def test_fair_share_is_proportional_within_one_slot(capacity, demand, data) -> None:
    weight = {j: data.draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])) for j in demand}
    got = shares(capacity, demand, weight)
    assert sum(got.values()) == min(capacity, sum(demand.values()))
    assert all(0 <= got[j] <= demand[j] for j in demand)
    # Water-filling reference, in exact numbers.
    exact, open_, cap = {}, set(demand), float(capacity)
    while open_:
        total = sum(demand[j] * weight[j] for j in open_)
        full = {j for j in open_ if cap * demand[j] * weight[j] / total >= demand[j]}
        if not full:
            exact.update({j: cap * demand[j] * weight[j] / total for j in open_})
            break
        for j in full:
            exact[j] = demand[j]
            cap -= demand[j]
        open_ -= full
    for j in demand:
        assert abs(got[j] - exact[j]) < 1 + 1e-9


def _outranks(t: Task, e: Task, order: dict) -> bool:
    return (t.priority, order[t.id]) < (e.priority, order[e.id])


@settings(max_examples=400, deadline=None)
@given(clusters(max_agents=3, runs=st.sampled_from([True, True, True, False]),
                priorities=st.integers(1, 6)),
       st.sampled_from(["best", "worst"]))
def test_preemption_evicts_only_what_a_higher_priority_task_needs(cluster, policy) -> None:
    """Every eviction of a priority pass (preemption on) is needed by the task it is for.

    Replay the pass's steps (``priority.plan``) on a copy of the pool, slots and aux places.
    A step first gives back the resources of its ``evict`` tasks, then its task takes its
    ``fit``, which must lie in what is then free. For every step S and every task E in
    ``S.evict``: E is running and preemptible, evicted once in the pass, and either already
    stopping or outranked by S's task (a lower priority number, or the same and earlier in
    the queue); and with the resources of ``S.evict`` minus E given back (nothing else of
    the pass's state changed), S's task does not fit the pool by fitting's rules. So removing
    any single evicted task from the eviction set leaves the higher-priority task it was
    chosen for without room; in particular a step evicts nothing while the slots freed by
    earlier evictions of the pass suffice. The decision releases exactly the evicted tasks
    not already stopping, and, per part (slot and zero-slot tasks), nothing starts after the
    first eviction.
    """
    agents, tasks = cluster
    steps = plan(agents, tasks, preemption=True, fitting_policy=policy)
    order = {t.id: i for i, t in enumerate(tasks)}
    free = {a.id: set(a.free) for a in agents}
    aux = {a.id: a.max_aux - a.aux_running for a in agents}

    def pool() -> Pool:
        return Pool([Agent(a.id, a.slots, tuple(sorted(free[a.id])), a.max_aux - aux[a.id],
                           a.max_aux) for a in agents], policy)

    def give_back(e: Task, sign: int = 1) -> None:
        for a, s in e.on.items():
            if a in free:
                if e.slots == 0:
                    aux[a] += sign
                else:
                    free[a] = free[a] | set(s) if sign > 0 else free[a] - set(s)

    evicted: set = set()
    started_after_eviction = {True: False, False: False}  # per part: slots > 0
    for step in steps:
        t = step.task
        for e in step.evict:
            assert e.running and e.preemptible and e.id not in evicted
            assert e.stopping or _outranks(t, e, order), f"{e.id} outranks {t.id}"
            evicted.add(e.id)
            give_back(e)
        for e in step.evict:
            give_back(e, -1)
            assert pool().fit(t.slots) is None, f"{t.id} fits without evicting {e.id}"
            give_back(e)
        if step.evict:
            started_after_eviction[t.slots > 0] = True
        if step.reason is None:
            assert not started_after_eviction[t.slots > 0], f"{t.id} starts after a preemption"
        if step.fit is not None:
            for a, s in step.fit.items():
                if t.slots == 0:
                    aux[a] -= 1
                    assert aux[a] >= 0
                else:
                    assert set(s) <= free[a], f"{t.id} takes slots that are not free"
                    free[a] -= set(s)
    d = schedule(PRIO if policy == "best" else PRIO.model_copy(update={"fitting_policy": policy}),
                 agents, tasks)
    assert d.release == [e.id for s in steps for e in s.evict if not e.stopping]
    assert d.allocate == {s.task.id: s.fit for s in steps if s.reason is None}
