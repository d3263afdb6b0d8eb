"""An ended experiment's progress is what it trained over what it planned (issue 39, item 7):
one killed at 1,920 of 3,000 batches showed 0 %, one errored at 400 of 4,000 showed 100 %."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_asha import make_config as asha_config
from test_reconciler import config
from test_searchers import RANDOM_HPS, creates, make_config

from det.reconciler.searchers import (
    TrialExited,
    TrialExitedEarly,
    ValidationCompleted,
    ended_progress,
    searcher_progress,
    searcher_step,
)


def _single(length: int) -> tuple[dict, dict, str]:
    cfg = make_config({"name": "single", "max_length": {"batches": length}})
    state, actions = searcher_step(cfg, None, [])
    return cfg, state, creates(actions)[0].request_id


def test_killed_part_way_counts_what_it_trained() -> None:
    cfg, state, rid = _single(3000)
    state, _ = searcher_step(cfg, state, [ValidationCompleted(rid, 1000, 0.5)])
    assert searcher_progress(cfg, state) == pytest.approx(1 / 3)  # what it validated
    assert ended_progress(cfg, state, {rid: 1920}) == pytest.approx(0.64)
    assert ended_progress(cfg, state, {}) == pytest.approx(1 / 3)  # no progress reported


def test_errored_early_is_not_complete() -> None:
    cfg, state, rid = _single(4000)
    state, _ = searcher_step(cfg, state, [TrialExitedEarly(rid, "errored")])
    assert searcher_progress(cfg, state) == 1.0  # the search is over ...
    assert ended_progress(cfg, state, {rid: 400}) == pytest.approx(0.1)  # ... at 10 %


def test_a_finished_plan_is_complete() -> None:
    cfg, state, rid = _single(100)
    state, _ = searcher_step(cfg, state, [ValidationCompleted(rid, 100, 0.2), TrialExited(rid)])
    assert ended_progress(cfg, state, {rid: 100}) == 1.0
    assert ended_progress(cfg, None, {}) == 0.0  # killed before the search began


def test_random_counts_closed_errored_and_never_created_trials() -> None:
    cfg = make_config({"name": "random", "max_trials": 4, "max_concurrent_trials": 2},
                      RANDOM_HPS)
    state, actions = searcher_step(cfg, None, [])
    done, failed = (c.request_id for c in creates(actions))
    state, _ = searcher_step(cfg, state, [ValidationCompleted(done, 100, 0.1), TrialExited(done),
                                          TrialExitedEarly(failed, "errored")])
    # done: 1.0; failed at 50 of 100: 0.5; the two created after them: 0; of 4 planned
    assert ended_progress(cfg, state, {failed: 50}) == pytest.approx(1.5 / 4)


def test_asha_counts_units_trained_over_units_expected() -> None:
    cfg = asha_config(max_trials=4)
    state, actions = searcher_step(cfg, None, [])
    rids = [c.request_id for c in creates(actions)]
    expected = ended_progress(cfg, state, {rids[0]: 1}) - ended_progress(cfg, state, {})
    assert expected > 0
    assert ended_progress(cfg, state, {rid: 1 for rid in rids}) == pytest.approx(
        len(rids) * expected)


@given(st.integers(1, 10_000), st.floats(0, 1e9))
def test_ended_progress_is_a_fraction(length: int, trained: float) -> None:
    cfg, state, rid = _single(length)
    assert 0.0 <= ended_progress(cfg, state, {rid: trained}) <= 1.0


def _experiment(det, conn, tmp_path, length: int, trained: int) -> int:
    """An experiment whose trial's run trained ``trained`` of ``length`` batches (its op's
    reported progress, as det_task.report_progress writes it)."""
    cfg = config(tmp_path, "true", max_restarts="0")
    cfg.write_text(cfg.read_text().replace("batches: 10", f"batches: {length}"))
    eid = int(det("experiment", "create", str(cfg), str(tmp_path / "ctx")).stdout.split()[-1])
    det("reconcile", "--once")
    conn.execute("UPDATE searcher_ops o SET progress = %s FROM trials t "
                 "WHERE t.id = o.trial_id AND t.experiment_id = %s", (trained, eid))
    return eid


def _progress(det, eid: int) -> float:
    return json.loads(det("experiment", "describe", str(eid), "--json").stdout)["progress"]


def test_killed_and_errored_experiments_show_what_they_trained(det, conn, tmp_path) -> None:
    killed = _experiment(det, conn, tmp_path, 3000, 1920)
    det("experiment", "kill", str(killed))
    errored = _experiment(det, conn, tmp_path, 4000, 400)
    # its run fails (exit code 1) with no restarts left
    conn.execute("UPDATE allocations a SET state = 'TERMINATED', exit_code = 1, "
                 "ended_at = now() FROM trials t WHERE t.id = a.trial_id "
                 "AND t.experiment_id = %s", (errored,))
    for _ in range(3):
        det("reconcile", "--once")
    states = {r["id"]: r["state"] for r in conn.execute(
        "SELECT id, state::text FROM experiments")}
    assert states == {killed: "CANCELED", errored: "ERROR"}
    assert _progress(det, killed) == pytest.approx(0.64)
    assert _progress(det, errored) == pytest.approx(0.1)
    assert "[ERROR]  progress 10%" in det("experiment", "describe", str(errored)).stdout
