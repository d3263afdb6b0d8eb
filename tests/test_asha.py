"""det.reconciler.searchers.asha: adaptive ASHA's plan, decisions and preview. No database."""

import bisect
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from det.cli.preview import preview_search
from det.configs import AdaptiveAshaSearcher, parse_experiment_config
from det.configs.length import UNBOUNDED
from det.configs.limits import INT64_MAX
from det.reconciler.searchers import (
    Action,
    Close,
    Create,
    Event,
    Shutdown,
    TrialExited,
    TrialExitedEarly,
    ValidateAfter,
    ValidationCompleted,
    ValidationReported,
    asha_preview,
    searcher_progress,
    searcher_step,
)
from det.reconciler.searchers.asha import (
    asha_brackets,
    rung_count,
    rung_lengths,
    split_by_weight,
    trial_rungs,
)

HPS = {"lr": {"type": "double", "minval": 0.0, "maxval": 1.0}}


def make_config(seed: int = 7, **searcher: Any) -> dict[str, Any]:
    """An expanded adaptive_asha config (``max_length`` in batches unless given)."""
    return parse_experiment_config(
        {
            "entrypoint": "model_def:Trial",
            "hyperparameters": HPS,
            "searcher": {
                "name": "adaptive_asha",
                "metric": "loss",
                "max_length": {"batches": 1000},
                **searcher,
            },
            "reproducibility": {"experiment_seed": seed},
        }
    ).expanded()


def searcher_of(config: dict[str, Any]) -> AdaptiveAshaSearcher:
    searcher = parse_experiment_config(config).searcher
    assert isinstance(searcher, AdaptiveAshaSearcher)
    return searcher


def created(actions: Sequence[Action]) -> list[str]:
    return [a.request_id for a in actions if isinstance(a, Create)]


# --- plan ---------------------------------------------------------------------------------


def test_rung_lengths_are_absolute_and_at_least_one() -> None:
    assert rung_lengths(1000, 4, 3) == (62, 250, 1000)
    assert rung_lengths(9000, 3, 3) == (1000, 3000, 9000)  # reference-facts §1.9 examples
    assert rung_lengths(576000, 3, 3) == (64000, 192000, 576000)
    assert rung_lengths(12, 3, 3) == (1, 4, 12)
    assert rung_lengths(3, 4, 3) == (1, 1, 3)
    assert rung_lengths(7, 2.5, 1) == (7,)


def test_rung_count_uses_float_logs() -> None:
    # ln(1000)/ln(10) is 2.9999999999999996: 3 rungs, as the reference computes it.
    assert rung_count(1000, 10_000, 10, 5) == 3
    assert rung_count(1000, 16, 4, 5) == 3  # capped by max_trials: ln 16 / ln 4 == 2
    assert rung_count(10**6, 10**6, 4, 5) == 5  # capped by max_rungs
    assert rung_count(3, 100, 4, 5) == 1


def test_brackets_for_16_trials_divisor_4_standard() -> None:
    searcher = searcher_of(make_config(max_trials=16))
    brackets = asha_brackets(searcher)
    assert [b.rungs for b in brackets] == [(62, 250, 1000), (250, 1000)]
    # Weights 4**2/3 and 4/2: int(11.6) = 11 and int(4.4) = 4, the remainder 1 to the first.
    assert [b.max_trials for b in brackets] == [12, 4]
    assert [b.max_concurrent_trials for b in brackets] == [12, 4]


def test_modes_and_explicit_bracket_rungs() -> None:
    aggressive = asha_brackets(searcher_of(make_config(max_trials=16, mode="aggressive")))
    assert [(b.rungs, b.max_trials) for b in aggressive] == [((62, 250, 1000), 16)]
    conservative = asha_brackets(
        searcher_of(make_config(max_trials=16, mode="conservative", max_concurrent_trials=4))
    )
    assert [b.rungs for b in conservative] == [(62, 250, 1000), (250, 1000), (1000,)]
    assert [b.max_trials for b in conservative] == [12, 3, 1]
    assert [b.max_concurrent_trials for b in conservative] == [2, 1, 1]
    explicit = asha_brackets(searcher_of(make_config(max_trials=16, bracket_rungs=[1, 4])))
    assert [b.rungs for b in explicit] == [(15, 62, 250, 1000), (1000,)]


def test_split_never_exceeds_the_total() -> None:
    assert split_by_weight(16, 4, [3, 2]) == [12, 4]
    # The reference's at-least-one rule would give 2+1+1+1 = 5 here.
    assert split_by_weight(4, 4, [4, 3, 2, 1]) == [1, 1, 1, 1]
    # More brackets than trials: only the most aggressive ones are kept.
    brackets = asha_brackets(searcher_of(make_config(max_trials=2, bracket_rungs=[1, 2, 3])))
    assert [len(b.rungs) for b in brackets] == [3, 2]
    assert [b.max_trials for b in brackets] == [1, 1]


def test_preview_counts_trials_per_rung_and_units() -> None:
    previews = asha_preview(searcher_of(make_config(max_trials=16)))
    assert [[(r.length, r.trials, r.stopped) for r in p.rungs] for p in previews] == [
        [(62, 12, 9), (250, 3, 2), (1000, 1, 1)],
        [(250, 4, 3), (1000, 1, 1)],
    ]
    assert [p.units for p in previews] == [9 * 62 + 2 * 250 + 1000, 3 * 250 + 1000]


# --- the reference's 0.38 form: max_time + time_metric, stopping only (§1.7) -------------

# divisor 2, max_time 4, 4 trials, one bracket: rungs at time metric values 1, 2 and 4.
TIMED = {"max_trials": 4, "divisor": 2, "mode": "aggressive", "max_time": 4,
         "time_metric": "batches", "max_length": None}


def reported(rid: str, time: Any, loss: Any) -> ValidationReported:
    """A validation row of trial ``rid`` carrying the time metric and the searcher metric."""
    return ValidationReported(rid, {"batches": time, "loss": loss})


def test_max_time_reads_results_from_validation_reports() -> None:
    """Under time_metric a trial's results are its validation reports at floor(time): an op's
    completion is none, nor is a report without a number under the time metric (a JSON
    boolean is none); a searcher metric that is not a number ranks worst; a time past int64
    (1e400 reads as infinity) is int64's largest, a negative one 0."""
    config = make_config(**TIMED)
    state, actions = searcher_step(config, None, [])
    a, b, c, d = created(actions)
    nothing: list[Event] = [ValidationCompleted(a, 4, 0.1), ValidationReported(a, {"loss": 0.1}),
                            *(reported(a, t, 0.1) for t in ("4", True, None, [4], {"v": 4}))]
    assert searcher_step(config, state, nothing) == (state, [])

    state, actions = searcher_step(config, state, [reported(a, 1.9, 5)])
    assert actions == []
    assert [t["length"] for t in state["trials"]] == [1, 0, 0, 0]
    state, actions = searcher_step(config, state, [reported(b, 1, "NaN")])
    assert actions == [Close(b)]  # ranked behind a's 5.0
    assert [(e["id"], e["metric"]) for e in state["method_state"]["brackets"][0]["rungs"][0]
            ] == [(a, 5.0), (b, None)]
    state, actions = searcher_step(config, state, [reported(c, float("inf"), 1.0)])
    assert actions == [Close(c)]  # past every rung: stopped at the top
    state, actions = searcher_step(config, state, [reported(d, -3, 1.0)])
    assert actions == []
    assert [t["length"] for t in state["trials"]] == [1, 1, INT64_MAX, 0]
    assert trial_rungs(config, state)[c].status == "done"


def test_max_time_plans_rungs_in_the_time_metric() -> None:
    """The rungs are values of the time metric, planned from max_time as from max_length;
    each trial gets one operation: max_time in a unit det's trainer knows, else unbounded."""
    by_time = searcher_of(make_config(max_trials=16, max_time=1000, time_metric="batches",
                                      max_length=None))
    assert [b.rungs for b in asha_brackets(by_time)] == [(62, 250, 1000), (250, 1000)]
    for metric, length in (("batches", 1000), ("epochs", 1000), ("seconds", UNBOUNDED)):
        config = make_config(max_trials=16, max_time=1000, time_metric=metric, max_length=None)
        assert {a.length for a in searcher_step(config, None, [])[1]
                if isinstance(a, ValidateAfter)} == {length}


def test_max_time_stops_trials_below_the_cut_as_the_reference() -> None:
    config = make_config(**TIMED)
    state, actions = searcher_step(config, None, [])
    a, b, c, d = created(actions)

    def report(rid: str, time: int, loss: float) -> list[Action]:
        nonlocal state
        state, out = searcher_step(config, state, [reported(rid, time, loss)])
        return out

    assert report(a, 1, 5.0) == []  # alone in rung 0: it goes on toward rung 1
    assert report(b, 1, 6.0) == [Close(b)]  # rung 0 holds 2: only the best 1 goes on
    assert report(c, 3, 4.0) == []  # one report passes rungs 0 and 1
    # Equal to a's 5.0, d is ranked ahead of it (the reference's stopping rule): second of 4
    # in rung 0, within the top 2.
    assert report(d, 1, 5.0) == []
    assert report(c, 4, 3.0) == [Close(c)]  # the top rung always stops
    assert report(a, 2, 4.5) == [Close(a)]  # rung 1: behind c's 4.0
    assert report(b, 2, 0.1) == []  # a stopped trial's later reports are ignored
    rungs = trial_rungs(config, state)
    assert {rid: (r.rung, r.status) for rid, r in rungs.items()} == {
        a: (1, "stopped"), b: (0, "stopped"), c: (2, "done"), d: (1, "promoted")}
    state, actions = searcher_step(config, state, [TrialExited(t) for t in (a, b, c)]
                                   + [TrialExitedEarly(d, "errored")])
    assert actions == [Shutdown()]


def test_max_time_refills_slots_and_ranks_only_early_exits() -> None:
    """A stopped trial's slot goes to a new trial; so does one whose code ended before its
    top rung, without a result; an errored one ranks worst at its rung."""
    config = make_config(**{**TIMED, "max_concurrent_trials": 1})
    state, actions = searcher_step(config, None, [])
    (a,) = created(actions)
    state, actions = searcher_step(config, state, [reported(a, 1, 1.0), TrialExited(a)])
    (b,) = created(actions)
    assert state["method_state"]["brackets"][0]["rungs"][1] == []
    state, actions = searcher_step(config, state, [TrialExitedEarly(b, "errored")])
    (c,) = created(actions)
    worst = state["method_state"]["brackets"][0]["rungs"][0][-1]
    assert (worst["id"], worst["metric"]) == (b, None)
    state, actions = searcher_step(config, state, [reported(c, 1, "NaN")])
    assert actions[0] == Close(c)  # not a number: ranks worst, behind a's 1.0 and b's error
    assert len(created(actions)) == 1


def reference_stops(rungs: tuple[int, ...], divisor: float,
                    reports: list[tuple[str, int, float]]) -> tuple[set[str], dict[str, int]]:
    """0.38's ``doEarlyStopping`` for one bracket, as reference-facts §1.7 states it: the
    trials stopped and each trial's rung."""
    metrics: list[list[float]] = [[] for _ in rungs]
    rung_of: dict[str, int] = {}
    stopped: set[str] = set()
    for rid, time, metric in reports:
        if rid in stopped:
            continue
        r = rung_of.get(rid, 0)
        while r < len(rungs):
            rung_of[rid] = r
            if time < rungs[r]:
                break
            index = bisect.bisect_left(metrics[r], metric)
            metrics[r].insert(index, metric)
            if r == len(rungs) - 1 or index >= max(int(len(metrics[r]) / divisor), 1):
                stopped.add(rid)
                break
            r += 1
    return stopped, rung_of


@settings(max_examples=150, deadline=None)
@given(
    trials=st.integers(1, 12),
    divisor=st.sampled_from([1.5, 2, 3, 4]),
    max_time=st.integers(1, 100),
    seed=st.integers(0, 2**32 - 1),
)
def test_max_time_decisions_match_the_reference_rule(trials: int, divisor: float,
                                                     max_time: int, seed: int) -> None:
    """Random interleavings of reports (each trial's time metric rising, metrics with ties)
    give the same stops and rungs as the reference's rule."""
    config = make_config(max_trials=trials, max_concurrent_trials=0, divisor=divisor,
                         mode="aggressive", max_time=max_time, time_metric="batches",
                         max_length=None)
    (bracket,) = asha_brackets(searcher_of(config))
    state, actions = searcher_step(config, None, [])
    ids = created(actions)
    rng = random.Random(seed)
    times = dict.fromkeys(ids, 0)
    reports = []
    closed: set[str] = set()
    for _ in range(6 * trials):
        rid = rng.choice(ids)
        times[rid] += rng.randint(0, max_time // 2 + 1)
        report = (rid, times[rid], float(rng.randint(0, 5)))
        reports.append(report)
        state, actions = searcher_step(config, state, [reported(*report)])
        closed |= {a.request_id for a in actions if isinstance(a, Close)}
        assert not created(actions)
    stopped, rung_of = reference_stops(bracket.rungs, divisor, reports)
    assert closed == stopped
    info = state["method_state"]["trials"]
    assert {rid: info[rid]["rung"] for rid in rung_of} == rung_of


# --- promotion (stop_once: false) ---------------------------------------------------------

# divisor 2, max_length 4, 4 trials, one bracket: rungs at 1, 2 and 4 batches.
SMALL = {"max_trials": 4, "divisor": 2, "mode": "aggressive", "max_length": {"batches": 4}}


def test_waiting_trial_is_promoted_when_a_worse_result_arrives() -> None:
    config = make_config(**SMALL)
    state, actions = searcher_step(config, None, [])
    a, b, c, d = created(actions)
    assert [x for x in actions if isinstance(x, ValidateAfter)] == [
        ValidateAfter(r, 1) for r in (a, b, c, d)
    ]

    # Alone in rung 0, ``a`` is not in the top half yet: it gets no work and waits.
    state, actions = searcher_step(config, state, [ValidationCompleted(a, 1, 0.5)])
    assert actions == []
    # ``b`` does worse: the rung now holds 2 results, so its best, ``a``, resumes to rung 1.
    state, actions = searcher_step(config, state, [ValidationCompleted(b, 1, 0.9)])
    assert actions == [ValidateAfter(a, 2)]
    # ``c`` is the best of 3 results: promoted at once (asynchronous promotion).
    state, actions = searcher_step(config, state, [ValidationCompleted(c, 1, 0.1)])
    assert actions == [ValidateAfter(c, 2)]
    state, actions = searcher_step(config, state, [ValidationCompleted(d, 1, 0.7)])
    assert actions == []

    state, actions = searcher_step(config, state, [ValidationCompleted(a, 2, 0.4)])
    assert actions == []
    state, actions = searcher_step(config, state, [ValidationCompleted(c, 2, 0.3)])
    assert actions == [ValidateAfter(c, 4)]
    # The top rung closes ``c``; nothing can be promoted any more, so the waiting trials close.
    state, actions = searcher_step(config, state, [ValidationCompleted(c, 4, 0.2)])
    assert actions == [Close(c), Close(a), Close(b), Close(d)]
    state, actions = searcher_step(config, state, [TrialExited(r) for r in (a, b, c, d)])
    assert actions == [Shutdown()]
    assert searcher_progress(config, state) == 1.0


def test_larger_is_better_ranks_the_other_way() -> None:
    config = make_config(smaller_is_better=False, **SMALL)
    state, actions = searcher_step(config, None, [])
    a, b, _, _ = created(actions)
    state, _ = searcher_step(config, state, [ValidationCompleted(a, 1, 0.5)])
    state, actions = searcher_step(config, state, [ValidationCompleted(b, 1, 0.9)])
    assert actions == [ValidateAfter(b, 2)]


def test_finished_bracket_still_trains_its_best_trial_to_the_top() -> None:
    # 3 trials with divisor 4: int(3/4) = 0, but once all have reported the best goes on.
    config = make_config(max_trials=3, mode="aggressive", bracket_rungs=[2])
    state, actions = searcher_step(config, None, [])
    a, b, c = created(actions)
    state, actions = searcher_step(
        config, state, [ValidationCompleted(a, 250, 3.0), ValidationCompleted(b, 250, 1.0)]
    )
    assert actions == []
    state, actions = searcher_step(config, state, [ValidationCompleted(c, 250, 2.0)])
    assert actions == [ValidateAfter(b, 1000)]
    state, actions = searcher_step(config, state, [ValidationCompleted(b, 1000, 0.5)])
    assert actions == [Close(b), Close(a), Close(c)]


def test_concurrency_cap_creates_trials_as_slots_free() -> None:
    config = make_config(max_concurrent_trials=2, **SMALL)
    state, actions = searcher_step(config, None, [])
    a, b = created(actions)
    state, actions = searcher_step(config, state, [ValidationCompleted(a, 1, 0.5)])
    (c,) = created(actions)
    # a and b are in rung 0 (2 results): a is promoted instead of creating a new trial.
    state, actions = searcher_step(config, state, [ValidationCompleted(b, 1, 0.6)])
    assert actions == [ValidateAfter(a, 2)]
    assert c not in (a, b)


def test_invalid_hp_is_replaced_and_leaves_the_rungs() -> None:
    config = make_config(max_trials=2, divisor=2, mode="aggressive", max_length={"batches": 2})
    state, actions = searcher_step(config, None, [])
    a, b = created(actions)
    state, _ = searcher_step(config, state, [ValidationCompleted(a, 1, 0.1)])
    state, actions = searcher_step(config, state, [ValidationCompleted(b, 1, 0.9)])
    assert actions == [ValidateAfter(a, 2)]
    state, actions = searcher_step(config, state, [TrialExitedEarly(a, "invalid_hp")])
    (c,) = created(actions)
    assert actions[-1] == ValidateAfter(c, 1)
    # ``a``'s result is gone: with b and c in rung 0, the better one goes on.
    state, actions = searcher_step(config, state, [ValidationCompleted(c, 1, 0.5)])
    assert actions == [ValidateAfter(c, 2)]
    state, actions = searcher_step(config, state, [ValidationCompleted(c, 2, 0.4)])
    assert actions == [Close(c), Close(b)]
    state, actions = searcher_step(config, state, [TrialExited(b), TrialExited(c)])
    assert actions == [Shutdown()]
    assert len(state["trials"]) == 3


def test_errored_trials_count_as_done() -> None:
    config = make_config(max_trials=2, divisor=2, mode="aggressive", max_length={"batches": 2})
    state, actions = searcher_step(config, None, [])
    a, b = created(actions)
    # ``a`` fails before reporting: it ranks worst in rung 0 and is not replaced, so ``b``'s
    # result makes the top half of 2 and goes on.
    state, actions = searcher_step(config, state, [TrialExitedEarly(a, "errored")])
    assert actions == []
    state, actions = searcher_step(config, state, [ValidationCompleted(b, 1, 5.0)])
    assert actions == [ValidateAfter(b, 2)]
    state, actions = searcher_step(config, state, [TrialExitedEarly(b, "errored")])
    assert actions == [Shutdown(failure=True)]


def test_trial_rungs_follow_the_search() -> None:
    config = make_config(max_trials=4, divisor=2, mode="aggressive", smaller_is_better=False,
                         max_length={"batches": 4})  # one bracket, rungs 1, 2, 4
    assert trial_rungs(config, None) == {}
    state, actions = searcher_step(config, None, [])
    a, b, c, d = created(actions)

    def rungs(state: dict[str, Any]) -> dict[str, tuple]:
        return {rid: (r.rung, r.length, r.status, r.metric, r.exit)
                for rid, r in trial_rungs(config, state).items()}

    assert rungs(state) == {rid: (0, 1, "running", None, None) for rid in (a, b, c, d)}
    # Of four results at rung 0 (d's errored run counts, last) the top two go on.
    state, _ = searcher_step(config, state, [
        ValidationCompleted(a, 1, 0.5), ValidationCompleted(b, 1, 0.7),
        ValidationCompleted(c, 1, 0.1), TrialExitedEarly(d, "errored")])
    assert rungs(state) == {a: (1, 2, "promoted", 0.5, None), b: (1, 2, "promoted", 0.7, None),
                            c: (0, 1, "waiting", 0.1, None), d: (0, 1, "stopped", None, "errored")}
    state, _ = searcher_step(config, state, [ValidationCompleted(b, 2, 0.8)])
    assert rungs(state)[b] == (1, 2, "waiting", 0.8, None)
    state, _ = searcher_step(config, state, [ValidationCompleted(a, 2, 0.4)])
    assert rungs(state)[a] == (1, 2, "waiting", 0.4, None)
    assert rungs(state)[b] == (2, 4, "promoted", 0.8, None)
    # b reaches the top; nothing is left to promote, so the waiting trials are closed.
    state, _ = searcher_step(config, state, [ValidationCompleted(b, 4, 0.9), TrialExited(b)])
    assert rungs(state) == {a: (1, 2, "stopped", 0.4, None), b: (2, 4, "done", 0.9, "completed"),
                            c: (0, 1, "stopped", 0.1, None), d: (0, 1, "stopped", None, "errored")}


def test_trial_rungs_needs_adaptive_asha() -> None:
    single = {"name": "single", "metric": "loss", "max_length": {"batches": 10}}
    config = {**make_config(max_trials=1), "searcher": single}
    with pytest.raises(ValueError, match="adaptive_asha"):
        trial_rungs(config, None)


# --- stopping (stop_once: true) -----------------------------------------------------------


def test_stop_once_closes_trials_outside_the_top_and_refills() -> None:
    config = make_config(stop_once=True, max_concurrent_trials=2, **SMALL)
    state, actions = searcher_step(config, None, [])
    a, b = created(actions)
    # The first result in a rung always continues (max(int(1/2), 1) = 1).
    state, actions = searcher_step(config, state, [ValidationCompleted(a, 1, 0.5)])
    assert actions == [ValidateAfter(a, 2)]
    # ``b`` ranks second of 2: closed for good, and its slot gets a new trial.
    state, actions = searcher_step(config, state, [ValidationCompleted(b, 1, 0.9)])
    (c,) = created(actions)
    assert actions[0] == Close(b) and actions[-1] == ValidateAfter(c, 1)
    # ``c`` is the best of 3 (keep 1): it continues.
    state, actions = searcher_step(config, state, [ValidationCompleted(c, 1, 0.1)])
    assert actions == [ValidateAfter(c, 2)]
    state, actions = searcher_step(config, state, [ValidationCompleted(a, 2, 0.5)])
    assert actions == [ValidateAfter(a, 4)]
    state, actions = searcher_step(config, state, [ValidationCompleted(c, 2, 0.6)])
    (d,) = created(actions)
    assert actions[0] == Close(c)
    state, actions = searcher_step(config, state, [ValidationCompleted(a, 4, 0.4)])
    assert actions == [Close(a)]  # the top rung; max_trials reached, so no new trial
    # Second of 4 in rung 0 (keep 2) continues; third of 3 in rung 1 (keep 1) stops.
    state, actions = searcher_step(config, state, [ValidationCompleted(d, 1, 0.3)])
    assert actions == [ValidateAfter(d, 2)]
    state, actions = searcher_step(config, state, [ValidationCompleted(d, 2, 0.7)])
    assert actions == [Close(d)]
    state, actions = searcher_step(config, state, [TrialExited(r) for r in (a, b, c, d)])
    assert actions == [Shutdown()]


# --- driving a whole search ---------------------------------------------------------------


def run_search(
    config: dict[str, Any], rng: random.Random, failures: float, restore: bool
) -> tuple[dict[str, Any], list[Action]]:
    """Play the reconciler and the trials until ``Shutdown``: a trial with an open
    ``ValidateAfter`` reports a random metric at that length (or, with probability
    ``failures``, errors or rejects its hyperparameters); a closed trial exits. Checks the
    invariants that hold at every step."""
    searcher = searcher_of(config)
    # Running trials (those with work) never exceed max_concurrent_trials, rounded up to one
    # per bracket.
    cap = searcher.max_concurrent_trials and max(
        searcher.max_concurrent_trials, len(asha_brackets(searcher))
    )
    state, actions = searcher_step(config, None, [])
    history = list(actions)
    open_ops: dict[str, int] = {}
    closed: set[str] = set()
    exited: set[str] = set()
    for _ in range(10_000):
        for action in actions:
            if isinstance(action, ValidateAfter):
                assert action.request_id not in open_ops  # one piece of work at a time
                assert action.request_id not in closed
                open_ops[action.request_id] = action.length
            elif isinstance(action, Close):
                assert action.request_id not in open_ops  # closed trials have no work left
                closed.add(action.request_id)
        assert not cap or len(open_ops) <= cap
        if any(isinstance(a, Shutdown) for a in actions):
            return state, history
        choices = sorted(open_ops) + sorted(closed - exited)
        assert choices, "the search is stuck: no trial has work and none is closing"
        rid = rng.choice(choices)
        event: Event
        if rid in open_ops:
            length = open_ops.pop(rid)
            roll = rng.random()
            if roll < failures / 2:
                event = TrialExitedEarly(rid, "errored")
                exited.add(rid)
            elif roll < failures:
                event = TrialExitedEarly(rid, "invalid_hp")
                exited.add(rid)
            else:
                event = ValidationCompleted(rid, length, rng.choice([rng.random(), 0.5]))
        else:
            event = TrialExited(rid)
            exited.add(rid)
        if restore:  # stored as JSONB (keys reordered) and read back by another reconciler
            state = json.loads(json.dumps(state, sort_keys=True))
        state, actions = searcher_step(config, state, [event])
        history += actions
        assert 0.0 <= searcher_progress(config, state) <= 1.0
    raise AssertionError("the search did not end")


asha_searchers = st.fixed_dictionaries(
    {
        "max_trials": st.integers(1, 40),
        "max_concurrent_trials": st.integers(0, 6),
        "divisor": st.sampled_from([1.5, 2, 3, 4, 5.5]),
        "max_rungs": st.integers(1, 5),
        "mode": st.sampled_from(["aggressive", "standard", "conservative"]),
        "stop_once": st.booleans(),
        "max_length": st.builds(lambda n: {"batches": n}, st.integers(1, 2000)),
    },
    optional={"bracket_rungs": st.lists(st.integers(1, 6), min_size=1, max_size=4)},
)


@settings(max_examples=150, deadline=None)
@given(
    searcher=asha_searchers,
    seed=st.integers(0, 2**32 - 1),
    failures=st.sampled_from([0.0, 0.1, 0.4]),
)
def test_search_invariants(searcher: dict[str, Any], seed: int, failures: float) -> None:
    config = make_config(seed, **searcher)
    state, history = run_search(config, random.Random(seed), failures, restore=False)
    brackets = asha_brackets(searcher_of(config))
    info = state["method_state"]["trials"]

    # No more than max_trials trials, invalid-HP replacements aside.
    invalid = sum(1 for t in state["trials"] if t["exit"] == "invalid_hp")
    assert len(created(history)) - invalid <= searcher["max_trials"]

    # Each trial trains to its bracket's rung lengths, never shorter than before, never past
    # the bracket's top rung.
    lengths: dict[str, list[int]] = {}
    for action in history:
        if isinstance(action, ValidateAfter):
            lengths.setdefault(action.request_id, []).append(action.length)
    for rid, asked in lengths.items():
        rungs = brackets[info[rid]["bracket"]].rungs
        assert asked == sorted(asked)
        assert set(asked) <= set(rungs)
        assert max(asked) <= rungs[-1] == searcher["max_length"]["batches"]

    # Shutdown once, last; without failures every bracket trained a trial to max_length.
    assert [a for a in history if isinstance(a, Shutdown)] == [history[-1]]
    assert searcher_progress(config, state) == 1.0
    if failures == 0.0 and not searcher["stop_once"]:
        top_length = searcher["max_length"]["batches"]
        tops = {info[rid]["bracket"] for rid, asked in lengths.items() if asked[-1] == top_length}
        assert tops == set(range(len(brackets)))


@settings(max_examples=40, deadline=None)
@given(searcher=asha_searchers, seed=st.integers(0, 2**32 - 1))
def test_replay_after_restore_is_the_same_search(searcher: dict[str, Any], seed: int) -> None:
    config = make_config(seed, **searcher)
    direct = run_search(config, random.Random(seed), 0.2, restore=False)
    assert run_search(config, random.Random(seed), 0.2, restore=True) == direct


def test_running_trials_respect_max_concurrent_trials() -> None:
    config = make_config(max_trials=30, max_concurrent_trials=3, divisor=2)
    state, actions = searcher_step(config, None, [])
    rng = random.Random(1)
    open_ops = {a.request_id: a.length for a in actions if isinstance(a, ValidateAfter)}
    while open_ops:
        assert len(open_ops) <= 3
        rid = rng.choice(sorted(open_ops))
        state, actions = searcher_step(
            config, state, [ValidationCompleted(rid, open_ops.pop(rid), rng.random())]
        )
        open_ops.update({a.request_id: a.length for a in actions if isinstance(a, ValidateAfter)})
    assert len(state["trials"]) == 30


def test_input_state_is_not_modified() -> None:
    config = make_config(**SMALL)
    state, actions = searcher_step(config, None, [])
    before = json.dumps(state, sort_keys=True)
    searcher_step(config, state, [ValidationCompleted(created(actions)[0], 1, 0.3)])
    assert json.dumps(state, sort_keys=True) == before


# --- det preview-search -------------------------------------------------------------------


def test_preview_search_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    asha = tmp_path / "asha.yaml"
    asha.write_text(
        "entrypoint: a:B\nsearcher: {name: adaptive_asha, metric: loss, max_trials: 16,"
        " max_length: {batches: 1000}}\n"
    )
    preview_search(asha, json_=False)
    out = capsys.readouterr().out
    assert "16 trials" in out and f"{2058 + 1750} batches" in out
    assert "62" in out and "250" in out
    asha.write_text(  # 0.38's form: rungs in the time metric, whatever its name
        "entrypoint: a:B\nsearcher: {name: adaptive_asha, metric: loss, max_trials: 8,"
        " divisor: 2, mode: aggressive, max_time: 32, time_metric: seconds}\n"
    )
    preview_search(asha, json_=False)
    assert "8 trials, 80 seconds of training" in capsys.readouterr().out

    grid = tmp_path / "grid.yaml"
    grid.write_text(
        "entrypoint: a:B\nhyperparameters: {a: {type: int, minval: 0, maxval: 9, count: 3},"
        " b: {type: categorical, vals: [x, y]}}\n"
        "searcher: {name: grid, metric: loss, max_length: {epochs: 2}}\n"
    )
    preview_search(grid, json_=False)
    assert "6 trials" in capsys.readouterr().out

    single = tmp_path / "single.yaml"
    single.write_text(
        "entrypoint: a:B\nsearcher: {name: single, metric: l, max_length: {records: 5}}"
    )
    preview_search(single, json_=False)
    assert "1 trial" in capsys.readouterr().out
