"""det.reconciler.searchers.tpe: TPE through Optuna, with optional ASHA early stopping. No
database."""

import json
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState

from det.cli.preview import preview_search
from det.configs import parse_experiment_config
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
    searcher_progress,
    searcher_step,
)
from det.reconciler.searchers.state import SearchState
from det.reconciler.searchers.tpe import TPE

HPS = {
    "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1},
    "layers": {"type": "int", "minval": 1, "maxval": 3},
    "dropout": {"type": "double", "minval": 0.1, "maxval": 0.5},
    "opt": {
        "name": {"type": "categorical", "vals": ["sgd", {"adam": [0.9, 0.99]}]},
        "beta": 0.9,
        "extra": {},
    },
    "bs": 32,
}
TOY_HPS = {
    "x": {"type": "double", "minval": 0.0, "maxval": 1.0},
    "y": {"type": "double", "minval": 0.0, "maxval": 1.0},
}


def make_config(
    seed: int = 7, hyperparameters: dict[str, Any] | None = None, **searcher: Any
) -> dict[str, Any]:
    """An expanded ``tpe`` config (``max_length`` 100 batches unless given)."""
    return parse_experiment_config(
        {
            "entrypoint": "model_def:Trial",
            "hyperparameters": HPS if hyperparameters is None else hyperparameters,
            "searcher": {
                "name": "tpe",
                "metric": "loss",
                "max_length": {"batches": 100},
                "max_trials": 20,
                **searcher,
            },
            "reproducibility": {"experiment_seed": seed},
        }
    ).expanded()


def creates(actions: Sequence[Action]) -> list[Create]:
    return [a for a in actions if isinstance(a, Create)]


def run_sequential(
    config: dict[str, Any],
    objective: Callable[[dict[str, Any]], float],
    restore: bool = False,
) -> tuple[dict[str, Any], list[Create]]:
    """Train every trial to ``max_length`` in turn, reporting ``objective(hparams)``; oldest
    open op first. Returns the final state and every ``Create``, in order."""
    state, actions = searcher_step(config, None, [])
    created = creates(actions)
    hparams = {c.request_id: c.hparams for c in created}
    pending = [a for a in actions if isinstance(a, ValidateAfter)]
    while pending:
        op = pending.pop(0)
        if restore:  # stored as JSONB (keys reordered) and read back
            state = json.loads(json.dumps(state, sort_keys=True))
        events: list[Event] = [
            ValidationCompleted(op.request_id, op.length, objective(hparams[op.request_id])),
            TrialExited(op.request_id),
        ]
        state, actions = searcher_step(config, state, events)
        created += creates(actions)
        hparams.update({c.request_id: c.hparams for c in creates(actions)})
        pending += [a for a in actions if isinstance(a, ValidateAfter)]
    return state, created


def toy_loss(hp: dict[str, Any]) -> float:
    """Squared distance to (0.8, 0.2): the good region is one corner of the unit square."""
    return (hp["x"] - 0.8) ** 2 + (hp["y"] - 0.2) ** 2


def in_good_region(hp: dict[str, Any]) -> bool:
    """Within 0.1 of (0.8, 0.2) on both axes: 4% of the square."""
    return abs(hp["x"] - 0.8) < 0.1 and abs(hp["y"] - 0.2) < 0.1


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


# --- sampling -----------------------------------------------------------------------------


def test_same_seed_and_events_give_the_same_samples() -> None:
    config = make_config(seed=11, max_trials=25, max_concurrent_trials=2, startup_trials=5)
    objective: Callable[[dict[str, Any]], float] = lambda hp: hp["dropout"] + hp["lr"]  # noqa: E731
    state, created = run_sequential(config, objective)
    again, created_again = run_sequential(config, objective, restore=True)
    assert (again, created_again) == (state, created)
    _, other = run_sequential(make_config(seed=12, max_trials=25, startup_trials=5), objective)
    assert [c.hparams for c in other] != [c.hparams for c in created]


def test_samples_are_in_bounds_and_shaped_like_the_config() -> None:
    config = make_config(seed=3, max_trials=40, max_concurrent_trials=1, startup_trials=5)
    _, created = run_sequential(config, lambda hp: hp["layers"] * hp["dropout"])
    assert len(created) == 40
    for c in created:
        hp = c.hparams
        assert hp["bs"] == 32 and hp["opt"]["beta"] == 0.9 and hp["opt"]["extra"] == {}
        assert 1e-4 <= hp["lr"] <= 1e-1
        assert hp["layers"] in {1, 2, 3} and isinstance(hp["layers"], int)
        assert 0.1 <= hp["dropout"] <= 0.5
        assert hp["opt"]["name"] in ("sgd", {"adam": [0.9, 0.99]})
        assert list(hp) == sorted(hp) and list(hp["opt"]) == sorted(hp["opt"])
    # TPE (trials after the 5 random ones) favours what scored best: 1 layer, low dropout.
    tpe_layers = [c.hparams["layers"] for c in created[10:]]
    assert tpe_layers.count(1) > len(tpe_layers) / 2


@pytest.mark.parametrize("smaller_is_better", [True, False])
def test_tpe_prefers_the_good_region_over_random(smaller_is_better: bool) -> None:
    """After 10 random trials, TPE's proposals land in a region covering 4% of the space far
    more often than chance (one-sided binomial test against p = 0.04); a random search with
    the same budget and seed does not, and TPE's proposals are closer to the optimum on
    average."""
    sign = 1.0 if smaller_is_better else -1.0
    common = {"max_trials": 60, "max_concurrent_trials": 1, "smaller_is_better": smaller_is_better}
    tpe = make_config(seed=5, hyperparameters=TOY_HPS, startup_trials=10, **common)
    _, created = run_sequential(tpe, lambda hp: sign * toy_loss(hp))
    proposals = [c.hparams for c in created[10:]]
    hits = sum(in_good_region(hp) for hp in proposals)
    assert binomial_tail(hits, len(proposals), 0.04) < 1e-4

    random_config = {**tpe, "searcher": {**tpe["searcher"], "name": "random"}}
    for key in ("startup_trials", "divisor", "max_rungs", "stop_once"):
        del random_config["searcher"][key]
    _, random_created = run_sequential(random_config, lambda hp: sign * toy_loss(hp))
    random_hits = sum(in_good_region(c.hparams) for c in random_created[10:])
    assert hits > 3 * max(random_hits, 1)
    mean_tpe = sum(toy_loss(hp) for hp in proposals) / len(proposals)
    mean_random = sum(toy_loss(c.hparams) for c in random_created[10:]) / len(proposals)
    assert mean_tpe < mean_random / 2


def test_startup_trials_are_random_until_enough_results() -> None:
    config = make_config(hyperparameters=TOY_HPS, max_trials=8, max_concurrent_trials=8)
    _, actions = searcher_step(config, None, [])
    assert len(creates(actions)) == 8  # all created before any result: all random
    assert len({c.hparams["x"] for c in creates(actions)}) == 8


# --- the search ---------------------------------------------------------------------------


def test_max_trials_and_concurrency_are_respected() -> None:
    config = make_config(max_trials=9, max_concurrent_trials=3, startup_trials=2)
    state, actions = searcher_step(config, None, [])
    open_ops = {a.request_id: a.length for a in actions if isinstance(a, ValidateAfter)}
    rng = random.Random(0)
    history = list(actions)
    while open_ops:
        assert len(open_ops) <= 3
        rid = rng.choice(sorted(open_ops))
        length = open_ops.pop(rid)
        state, actions = searcher_step(
            config, state, [ValidationCompleted(rid, length, rng.random()), TrialExited(rid)]
        )
        history += actions
        open_ops.update({a.request_id: a.length for a in actions if isinstance(a, ValidateAfter)})
    assert len(creates(history)) == 9
    assert history[-1] == Shutdown()
    assert searcher_progress(config, state) == 1.0
    assert len(state["method_state"]["params"]) == len(state["trials"]) == 9


def test_invalid_hp_is_replaced_and_not_modelled() -> None:
    config = make_config(max_trials=2, max_concurrent_trials=1)
    state, actions = searcher_step(config, None, [])
    (first,) = creates(actions)
    state, actions = searcher_step(
        config, state, [TrialExitedEarly(first.request_id, "invalid_hp")]
    )
    (second,) = creates(actions)
    assert second.hparams != first.hparams
    state, actions = searcher_step(
        config, state, [ValidationCompleted(second.request_id, 100, 0.5)]
    )
    assert actions[0] == Close(second.request_id)
    (third,) = creates(actions)  # the invalid trial did not count against max_trials
    method = TPE(parse_experiment_config(config))
    observed = method.observations(SearchState.from_json(state))
    assert [t.value for t in observed] == [0.5]
    state, actions = searcher_step(
        config,
        state,
        [TrialExited(second.request_id), TrialExitedEarly(third.request_id, "errored")],
    )
    assert actions == [Shutdown()]


def test_early_stopping_uses_asha_rungs_and_models_stopped_trials_as_pruned() -> None:
    config = make_config(
        hyperparameters=TOY_HPS,
        max_trials=9,
        max_concurrent_trials=3,
        max_rungs=3,
        divisor=3,
        stop_once=True,
        max_length={"batches": 90},
        startup_trials=3,
    )
    state, actions = searcher_step(config, None, [])
    rng = random.Random(2)
    open_ops = {a.request_id: a.length for a in actions if isinstance(a, ValidateAfter)}
    history = list(actions)
    while open_ops:
        rid = sorted(open_ops)[0]
        length = open_ops.pop(rid)
        state, actions = searcher_step(
            config, state, [ValidationCompleted(rid, length, rng.random())]
        )
        history += actions
        open_ops.update({a.request_id: a.length for a in actions if isinstance(a, ValidateAfter)})
    assert {a.length for a in history if isinstance(a, ValidateAfter)} == {10, 30, 90}
    assert len(creates(history)) == 9
    observed = TPE(parse_experiment_config(config)).observations(SearchState.from_json(state))
    assert len(observed) == 9
    for trial in observed:
        top = max(trial.intermediate_values)
        expected = TrialState.COMPLETE if top == 90 else TrialState.PRUNED
        assert trial.state == expected
    assert any(t.state == TrialState.PRUNED for t in observed)
    assert any(t.state == TrialState.COMPLETE for t in observed)


# --- properties ---------------------------------------------------------------------------

scripts = st.lists(
    st.tuples(st.floats(0, 0.999), st.sampled_from(["validate", "exit", "errored", "invalid_hp"])),
    max_size=30,
)


def run_script(
    config: dict[str, Any], script: list[tuple[float, str]], restore: bool
) -> tuple[dict[str, Any], list[Action]]:
    """One event per step on a trial that still has work (or is closed and may exit)."""
    state, history = searcher_step(config, None, [])
    open_ops = {a.request_id: a.length for a in history if isinstance(a, ValidateAfter)}
    for pick, kind in script:
        alive = sorted(t["request_id"] for t in state["trials"] if t["exit"] is None)
        if not alive:
            break
        rid = alive[int(pick * len(alive))]
        event: Event
        if kind == "validate" and rid in open_ops:
            event = ValidationCompleted(rid, open_ops.pop(rid), pick)
        elif kind in ("errored", "invalid_hp"):
            event = TrialExitedEarly(rid, kind)  # type: ignore[arg-type]
        else:
            event = TrialExited(rid)
        if restore:
            state = json.loads(json.dumps(state, sort_keys=True))
        state, actions = searcher_step(config, state, [event])
        history += actions
        open_ops.update({a.request_id: a.length for a in actions if isinstance(a, ValidateAfter)})
    return state, history


@settings(max_examples=25, deadline=None)
@given(
    script=scripts,
    seed=st.integers(0, 2**32 - 1),
    max_rungs=st.integers(1, 3),
    stop_once=st.booleans(),
)
def test_replay_after_restore_is_the_same_search(
    script: list[tuple[float, str]], seed: int, max_rungs: int, stop_once: bool
) -> None:
    config = make_config(
        seed,
        max_trials=6,
        max_concurrent_trials=2,
        startup_trials=2,
        max_rungs=max_rungs,
        divisor=2,
        stop_once=stop_once,
    )
    direct = run_script(config, script, restore=False)
    assert run_script(config, script, restore=True) == direct
    state, history = direct
    invalid = sum(1 for t in state["trials"] if t["exit"] == "invalid_hp")
    assert len(creates(history)) - invalid <= 6


# --- config and preview -------------------------------------------------------------------


def test_config_defaults() -> None:
    searcher = make_config()["searcher"]
    assert searcher["max_concurrent_trials"] == 4 and searcher["startup_trials"] == 10
    assert (searcher["max_rungs"], searcher["divisor"], searcher["stop_once"]) == (1, 4.0, False)


def test_preview_search_shows_the_rungs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "tpe.yaml"
    config.write_text(
        "entrypoint: a:B\nsearcher: {name: tpe, metric: loss, max_trials: 9, divisor: 3,"
        " max_rungs: 3, max_length: {batches: 90}}\n"
    )
    preview_search(config, json_=False)
    out = capsys.readouterr().out
    # 9 trials to 10 batches, 3 go on to 30, 1 to 90: 6*10 + 2*30 + 1*90 = 210.
    assert "tpe: 9 trials, 210 batches" in out


def test_describe_reads_tpe_rungs_like_ashas() -> None:
    from det.reconciler.searchers import trial_rungs

    config = make_config(hyperparameters=TOY_HPS, max_trials=5)
    state, created = run_sequential(config, toy_loss)
    rungs = trial_rungs(config, state)
    assert set(rungs) == {c.request_id for c in created}
    assert {r.status for r in rungs.values()} == {"done"}
    assert all(r.length == 100 and r.metric is not None for r in rungs.values())
