"""det.reconciler.searchers: pure single/random/grid search. No database."""

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from det.configs import IntHP, LogHP, parse_experiment_config
from det.reconciler.searchers import (
    Action,
    Close,
    Create,
    Event,
    SearcherError,
    Shutdown,
    TrialExited,
    TrialExitedEarly,
    ValidateAfter,
    ValidationCompleted,
    ValidationReported,
    searcher_progress,
    searcher_step,
)
from det.reconciler.searchers.sampling import grid_axis, grid_points, round_half_away


def make_config(
    searcher: dict[str, Any], hyperparameters: dict[str, Any] | None = None, seed: int = 7
) -> dict[str, Any]:
    """An expanded experiment config, as the reconciler reads it from the database."""
    return parse_experiment_config(
        {
            "entrypoint": "model_def:Trial",
            "hyperparameters": hyperparameters or {},
            "searcher": {"metric": "loss", "max_length": {"batches": 100}, **searcher},
            "reproducibility": {"experiment_seed": seed},
        }
    ).expanded()


RANDOM_HPS = {
    "lr": {"type": "log", "minval": -5, "maxval": -1, "base": 10},
    "layers": {"type": "int", "minval": 1, "maxval": 3},
    "dropout": {"type": "double", "minval": 0.1, "maxval": 0.5},
    "opt": {"name": {"type": "categorical", "vals": ["sgd", "adam"]}, "beta": 0.9},
    "bs": 32,
}


def creates(actions: Sequence[Action]) -> list[Create]:
    return [a for a in actions if isinstance(a, Create)]


def check_pairs(actions: Sequence[Action], length: int = 100) -> None:
    """Every Create is immediately followed by its ValidateAfter(max_length)."""
    for i, action in enumerate(actions):
        if isinstance(action, Create):
            assert actions[i + 1] == ValidateAfter(action.request_id, length)


# --- grid ---------------------------------------------------------------------------------


def test_round_half_away_from_zero() -> None:
    assert [round_half_away(x) for x in (0.5, 1.5, 2.5, -0.5, -2.5, 2.4)] == [1, 2, 3, -1, -3, 2]


def test_int_axis_rounding_and_clamping() -> None:
    axis = grid_axis(IntHP(type="int", minval=0, maxval=5, count=3))
    assert axis == [0, 3, 5]  # 2.5 rounds up, not to even
    assert grid_axis(IntHP(type="int", minval=-5, maxval=0, count=3)) == [-5, -3, 0]
    assert grid_axis(IntHP(type="int", minval=1, maxval=2, count=1)) == [2]  # midpoint 1.5
    assert grid_axis(IntHP(type="int", minval=1, maxval=3, count=10)) == [1, 2, 3]


def test_double_and_log_axes() -> None:
    assert grid_points(
        parse_experiment_config(
            {
                "entrypoint": "x",
                "hyperparameters": {"d": {"type": "double", "minval": 0, "maxval": 1, "count": 3}},
                "searcher": {"name": "grid", "metric": "l", "max_length": {"batches": 1}},
            }
        ).hyperparameters
    ) == [{"d": 0.0}, {"d": 0.5}, {"d": 1.0}]
    axis = grid_axis(LogHP(type="log", minval=-3, maxval=-1, base=10, count=3))
    assert axis == pytest.approx([0.001, 0.01, 0.1])
    assert grid_axis(LogHP(type="log", minval=1, maxval=3, base=2, count=1)) == [4.0]


def test_grid_order_sorted_names_last_axis_fastest() -> None:
    config = make_config(
        {"name": "grid", "max_concurrent_trials": 0},
        {
            "b": {"type": "int", "minval": 0, "maxval": 10, "count": 2},
            "a": {"type": "categorical", "vals": ["x", "y"]},
            "n": {"z": {"type": "categorical", "vals": [1, 2]}, "c": 5, "e": {}},
        },
    )
    points = grid_points(parse_experiment_config(config).hyperparameters)
    assert points[:3] == [
        {"a": "x", "b": 0, "n": {"c": 5, "e": {}, "z": 1}},
        {"a": "x", "b": 0, "n": {"c": 5, "e": {}, "z": 2}},
        {"a": "x", "b": 10, "n": {"c": 5, "e": {}, "z": 1}},
    ]
    assert len(points) == 8
    _, actions = searcher_step(config, None, [])
    check_pairs(actions)
    # The reference pops grid points from the end: the last point starts first.
    assert [c.hparams for c in creates(actions)] == points[::-1]


def test_grid_respects_max_concurrent_and_runs_every_point_once() -> None:
    config = make_config(
        {"name": "grid", "max_concurrent_trials": 2},
        {"a": {"type": "categorical", "vals": [1, 2, 3, 4, 5]}},
    )
    state, actions = searcher_step(config, None, [])
    seen = [c.hparams["a"] for c in creates(actions)]
    assert seen == [5, 4]
    while True:
        alive = [t["request_id"] for t in state["trials"] if t["exit"] is None]
        if not alive:
            break
        state, actions = searcher_step(config, state, [TrialExited(alive[0])])
        seen += [c.hparams["a"] for c in creates(actions)]
        assert len([t for t in state["trials"] if t["exit"] is None]) <= 2
    assert seen == [5, 4, 3, 2, 1]
    assert actions[-1] == Shutdown()


def test_grid_does_not_replace_invalid_hp() -> None:
    config = make_config({"name": "grid"}, {"a": {"type": "categorical", "vals": [1, 2]}})
    state, actions = searcher_step(config, None, [])
    ids = [c.request_id for c in creates(actions)]
    state, actions = searcher_step(
        config, state, [TrialExitedEarly(ids[0], "invalid_hp"), TrialExited(ids[1])]
    )
    assert actions == [Shutdown()]


def test_grid_without_hyperparameters_is_one_trial() -> None:
    _, actions = searcher_step(make_config({"name": "grid"}), None, [])
    assert [c.hparams for c in creates(actions)] == [{}]


# --- random / single ------------------------------------------------------------------------


def test_random_samples_are_in_bounds_and_int_includes_maxval() -> None:
    config = make_config(
        {"name": "random", "max_trials": 300, "max_concurrent_trials": 0}, RANDOM_HPS
    )
    _, actions = searcher_step(config, None, [])
    samples = [c.hparams for c in creates(actions)]
    assert len(samples) == 300
    check_pairs(actions)
    for hp in samples:
        assert 1e-5 <= hp["lr"] <= 1e-1
        assert hp["layers"] in (1, 2, 3) and isinstance(hp["layers"], int)
        assert 0.1 <= hp["dropout"] < 0.5
        assert hp["opt"]["name"] in ("sgd", "adam") and hp["opt"]["beta"] == 0.9
        assert hp["bs"] == 32
    assert {hp["layers"] for hp in samples} == {1, 2, 3}
    assert len({c.request_id for c in creates(actions)}) == 300
    assert all(0 <= c.seed < 2**31 for c in creates(actions))


def test_random_is_reproducible_from_the_seed() -> None:
    config = make_config({"name": "random", "max_trials": 5}, RANDOM_HPS, seed=123)
    assert searcher_step(config, None, []) == searcher_step(config, None, [])
    other = make_config({"name": "random", "max_trials": 5}, RANDOM_HPS, seed=124)
    assert creates(searcher_step(other, None, [])[1]) != creates(searcher_step(config, None, [])[1])


def test_single_creates_one_trial_and_closes_it_at_max_length() -> None:
    config = make_config({"name": "single"}, RANDOM_HPS)
    state, actions = searcher_step(config, None, [])
    assert len(creates(actions)) == 1
    rid = creates(actions)[0].request_id
    state, actions = searcher_step(config, state, [ValidationCompleted(rid, 50, 0.3)])
    assert actions == []
    assert searcher_progress(config, state) == pytest.approx(0.5)
    state, actions = searcher_step(
        config, state, [ValidationCompleted(rid, 100, 0.2), ValidationCompleted(rid, 100, 0.2)]
    )
    assert actions == [Close(rid)]
    assert searcher_progress(config, state) == 1.0
    state, actions = searcher_step(config, state, [TrialExited(rid)])
    assert actions == [Shutdown()]
    # Anything after shutdown, or a repeated exit, is ignored.
    assert searcher_step(config, state, [TrialExitedEarly(rid, "errored")])[1] == []


def test_random_replaces_invalid_hp_but_single_does_not() -> None:
    config = make_config({"name": "random", "max_trials": 2, "max_concurrent_trials": 1})
    state, actions = searcher_step(config, None, [])
    first = creates(actions)[0].request_id
    state, actions = searcher_step(config, state, [TrialExitedEarly(first, "invalid_hp")])
    second = creates(actions)[0].request_id
    state, actions = searcher_step(config, state, [TrialExited(second)])
    third = creates(actions)[0].request_id
    state, actions = searcher_step(config, state, [TrialExited(third)])
    assert actions == [Shutdown()]
    assert len(state["trials"]) == 3

    single = make_config({"name": "single"})
    state, actions = searcher_step(single, None, [])
    state, actions = searcher_step(
        single, state, [TrialExitedEarly(creates(actions)[0].request_id, "invalid_hp")]
    )
    assert actions == [Shutdown()]


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        (["errored", "errored"], Shutdown(failure=True)),
        (["user_requested_stop", "user_requested_stop"], Shutdown(cancel=True)),
        (["errored", None], Shutdown()),
        (["errored", "user_requested_stop"], Shutdown()),
        ([None, None], Shutdown()),
    ],
)
def test_shutdown_rules(reasons: list[str | None], expected: Shutdown) -> None:
    config = make_config({"name": "random", "max_trials": 2, "max_concurrent_trials": 2})
    state, actions = searcher_step(config, None, [])
    ids = [c.request_id for c in creates(actions)]
    events: list[Event] = [
        TrialExited(rid) if reason is None else TrialExitedEarly(rid, reason)  # type: ignore[arg-type]
        for rid, reason in zip(ids, reasons, strict=True)
    ]
    _, actions = searcher_step(config, state, events)
    assert actions == [expected]


def test_event_for_unknown_trial_is_an_error() -> None:
    config = make_config({"name": "single"})
    state, _ = searcher_step(config, None, [])
    with pytest.raises(SearcherError):
        searcher_step(config, state, [TrialExited("no-such-trial")])


def test_a_method_that_cannot_run_its_config_is_a_searcher_error() -> None:
    config = make_config({"name": "tpe", "max_trials": 4, "max_length": {"batches": 10}})
    config["hyperparameters"] = {"a.b": 1, "a": {"b": {"type": "int", "minval": 0, "maxval": 3}}}
    with pytest.raises(SearcherError, match="tpe"):
        searcher_step(config, None, [])


@pytest.mark.parametrize("searcher", [
    {"name": "random", "max_trials": 3, "max_concurrent_trials": 1},
    # ASHA's state nests rungs (lists) that a validation changes in place
    {"name": "adaptive_asha", "max_trials": 4, "max_concurrent_trials": 2, "divisor": 2},
])
def test_input_state_is_not_modified(searcher: dict[str, Any]) -> None:
    config = make_config(searcher, RANDOM_HPS)
    state, actions = searcher_step(config, None, [])
    before = json.dumps(state, sort_keys=True)
    first = next(a for a in actions if isinstance(a, ValidateAfter))
    searcher_step(config, state, [ValidationCompleted(first.request_id, first.length, 0.5),
                                  TrialExited(first.request_id)])
    assert json.dumps(state, sort_keys=True) == before


def test_a_state_stored_with_the_older_rng_key_resumes_bit_exactly() -> None:
    """Searches saved before 2026-11-25 hold the RNG key as 624 numbers, later ones as base64:
    both resume to the same trials."""
    import base64

    import numpy as np

    config = make_config({"name": "random", "max_trials": 4, "max_concurrent_trials": 1},
                         RANDOM_HPS)
    state, actions = searcher_step(config, None, [])
    assert isinstance(state["rng"]["key"], str)
    older = json.loads(json.dumps(state))
    older["rng"]["key"] = np.frombuffer(base64.b64decode(state["rng"]["key"]),
                                        dtype="<u4").tolist()
    assert len(older["rng"]["key"]) == 624
    first = next(a for a in actions if isinstance(a, Create))
    done = [TrialExited(first.request_id)]
    assert searcher_step(config, older, done) == searcher_step(config, state, done)


def test_a_reused_generator_draws_as_a_new_one() -> None:
    """Generators given back by finished steps are reused (a new RandomState costs ~270 us,
    issue 11): one that drew normals (whose cached gaussian is part of the state) and
    integers, reseeded or set from a stored state, draws exactly as a fresh one."""
    import numpy as np

    from det.reconciler.searchers import rng as rng_module

    used = rng_module.new_rng(5)
    used.standard_normal()  # leaves a cached gaussian behind
    used.randint(0, 10, size=700)  # past one twist of the key
    stored = rng_module.rng_to_json(used)
    expected = np.random.RandomState(11)
    rng_module.recycle(used)
    again = rng_module.new_rng(11)
    assert again is used
    assert all(np.array_equal(a, b) for a, b in zip(again.get_state(), expected.get_state(),
                                                    strict=True))
    assert [again.standard_normal(), again.randint(0, 2**31)] == [
        expected.standard_normal(), expected.randint(0, 2**31)]
    rng_module.recycle(again)
    restored = rng_module.rng_from_json(stored)
    assert rng_module.rng_to_json(restored) == stored


def test_a_finished_search_state_gives_its_rng_back() -> None:
    """After ``finish`` (the end of a step) the state's generator may be another step's: the
    working copy refuses to draw from it."""
    from det.reconciler.searchers.state import SearchState

    search = SearchState.new("random", 3)
    search.rng.randint(0, 5)
    data = search.finish()
    assert data["rng"]["pos"] == 1
    with pytest.raises(RuntimeError, match="finished"):
        search.rng.randint(0, 5)
    # the stored form resumes where the finished one stopped
    assert SearchState.from_json(data).rng.randint(0, 2**31) == SearchState.new(
        "random", 3).rng.randint(0, 2**31, size=2)[1]


def test_a_step_that_draws_nothing_keeps_the_stored_rng_without_rebuilding_it(
        monkeypatch) -> None:
    """Rebuilding the RNG and storing it again was ~0.4 ms of each step (issue 11): a step
    that draws nothing (a validation, a single trial's end) stores it as it was, untouched;
    one that creates a trial draws from the stored RNG as before."""
    from det.reconciler.searchers import state as state_module

    config = make_config({"name": "random", "max_trials": 2, "max_concurrent_trials": 1},
                         RANDOM_HPS)
    state, actions = searcher_step(config, None, [])
    first = next(a for a in actions if isinstance(a, Create))
    expected = searcher_step(config, state, [TrialExited(first.request_id)])

    def refuse(data):
        raise AssertionError("the RNG was rebuilt for a step that draws nothing")

    with monkeypatch.context() as m:
        m.setattr(state_module, "rng_from_json", refuse)
        validated, _ = searcher_step(config, state, [ValidationCompleted(first.request_id,
                                                                         50, 0.5)])
    assert validated["rng"] == state["rng"]
    after, actions = searcher_step(config, validated, [TrialExited(first.request_id)])
    assert (after["rng"], actions) == (expected[0]["rng"], expected[1])
    assert creates(actions)  # the trial that drew from the stored RNG


# --- properties -----------------------------------------------------------------------------

# An event script: (which alive trial, as a fraction of the alive list; what happens to it).
EVENT_KINDS = ["validate_half", "validate_full", "exited", "errored", "invalid_hp",
               "user_requested_stop"]
scripts = st.lists(
    st.tuples(st.floats(0, 0.999), st.sampled_from(EVENT_KINDS)), min_size=0, max_size=60
)


def _event(kind: str, rid: str) -> Event:
    if kind == "validate_half":
        return ValidationCompleted(rid, 50, 1.0)
    if kind == "validate_full":
        return ValidationCompleted(rid, 100, 1.0)
    if kind == "exited":
        return TrialExited(rid)
    return TrialExitedEarly(rid, kind)  # type: ignore[arg-type]


def run_script(
    config: dict[str, Any], script: list[tuple[float, str]], restore: bool
) -> tuple[dict[str, Any], list[list[Action]], list[int]]:
    """Feed one event per step, choosing among the trials that are still alive.

    Returns the final state, each step's actions, and the number of live trials after each.
    """
    state, actions = searcher_step(config, None, [])
    batches = [actions]
    alive_counts = [len(creates(actions))]
    for pick, kind in script:
        alive = [t["request_id"] for t in state["trials"] if t["exit"] is None]
        if not alive:
            break
        if restore:  # as if stored in JSONB and read back by another reconciler
            state = json.loads(json.dumps(state))
        state, actions = searcher_step(config, state, [_event(kind, alive[int(pick * len(alive))])])
        batches.append(actions)
        alive_counts.append(sum(1 for t in state["trials"] if t["exit"] is None))
    return state, batches, alive_counts


searcher_configs = st.one_of(
    st.builds(
        lambda mt, mct: {"name": "random", "max_trials": mt, "max_concurrent_trials": mct},
        st.integers(1, 8),
        st.integers(0, 4),
    ),
    st.just({"name": "single"}),
    st.builds(lambda mct: {"name": "grid", "max_concurrent_trials": mct}, st.integers(0, 4)),
)
GRID_HPS = {
    "a": {"type": "int", "minval": 0, "maxval": 9, "count": 3},
    "b": {"type": "categorical", "vals": ["x", "y"]},
}


@settings(max_examples=150, deadline=None)
@given(searcher=searcher_configs, script=scripts, seed=st.integers(0, 2**32 - 1))
def test_search_invariants(
    searcher: dict[str, Any], script: list[tuple[float, str]], seed: int
) -> None:
    config = make_config(searcher, GRID_HPS, seed)
    state, batches, alive_counts = run_script(config, script, restore=False)
    actions = [a for batch in batches for a in batch]
    for batch in batches:
        check_pairs(batch)

    if searcher["name"] == "grid":
        planned, cap = 6, searcher["max_concurrent_trials"]
    elif searcher["name"] == "single":
        planned, cap = 1, 1
    else:
        planned, cap = searcher["max_trials"], searcher["max_concurrent_trials"]
    invalid = sum(1 for t in state["trials"] if t["exit"] == "invalid_hp")
    counted = len(creates(actions)) - (invalid if searcher["name"] == "random" else 0)
    assert counted <= planned  # max_trials (or the grid size) is never exceeded

    # Never more than max_concurrent_trials alive at once.
    if cap:
        assert max(alive_counts) <= cap
    ids = [c.request_id for c in creates(actions)]
    assert len(ids) == len(set(ids))

    # At most one Close per trial.
    closes = [a.request_id for a in actions if isinstance(a, Close)]
    assert len(closes) == len(set(closes))

    # Shutdown exactly when every trial has exited, at most once, and last.
    shutdowns = [a for a in actions if isinstance(a, Shutdown)]
    all_exited = all(t["exit"] is not None for t in state["trials"])
    assert len(shutdowns) == (1 if all_exited else 0)
    if shutdowns:
        assert actions[-1] == shutdowns[0]
        assert counted == planned
        assert searcher_progress(config, state) == 1.0
    assert 0.0 <= searcher_progress(config, state) <= 1.0


@settings(max_examples=60, deadline=None)
@given(searcher=searcher_configs, script=scripts, seed=st.integers(0, 2**32 - 1))
def test_replay_and_restore_give_the_same_search(
    searcher: dict[str, Any], script: list[tuple[float, str]], seed: int
) -> None:
    hparams = GRID_HPS if searcher["name"] == "grid" else {**GRID_HPS, **RANDOM_HPS}
    config = make_config(searcher, hparams, seed)
    direct = run_script(config, script, restore=False)
    assert run_script(config, script, restore=True) == direct
    assert run_script(config, script, restore=False) == direct


def test_batched_events_equal_one_at_a_time() -> None:
    config = make_config(
        {"name": "random", "max_trials": 6, "max_concurrent_trials": 2}, RANDOM_HPS
    )
    state0, actions = searcher_step(config, None, [])
    a, b = (c.request_id for c in creates(actions))
    events: list[Event] = [
        ValidationCompleted(a, 100, 0.1),
        TrialExited(a),
        TrialExitedEarly(b, "errored"),
    ]
    batched = searcher_step(config, state0, events)
    state, stepwise = state0, []
    for event in events:
        state, acts = searcher_step(config, state, [event])
        stepwise += acts
    assert batched == (state, stepwise)


@pytest.mark.parametrize("searcher", [
    {"name": "single"},
    {"name": "random", "max_trials": 2},
    {"name": "grid"},
    {"name": "adaptive_asha", "max_trials": 4, "divisor": 2},
    {"name": "tpe", "max_trials": 4},
])
def test_validation_reports_mean_nothing_without_a_time_metric(searcher: dict[str, Any]
                                                               ) -> None:
    """Every validation row is recorded (ValidationReported); without searcher.time_metric a
    trial's result is its op's ValidationCompleted alone, so a report leaves the search as it
    was, even one naming no trial of it."""
    config = make_config(searcher, GRID_HPS if searcher["name"] == "grid" else RANDOM_HPS)
    state, actions = searcher_step(config, None, [])
    rid = creates(actions)[0].request_id
    reports: list[Event] = [ValidationReported(rid, {"loss": 0.1, "batches": 100}),
                            ValidationReported("no-such-trial", {"loss": 0.1})]
    assert searcher_step(config, state, reports) == (state, [])
    result = ValidationCompleted(rid, 100, 0.1)
    after = searcher_step(config, state, [result])
    assert after[0] != state
    assert searcher_step(config, state, [*reports, result, *reports]) == after
