"""The reconcile contract (det.reconciler.contract): a step's result, and the loop's two steps
(the pass and the provisioner) keeping it on a real database."""

import functools
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from det.reconciler.contract import Result, Step, run_steps
from det.reconciler.loop import MAX_CHAINED_PASSES
from det.reconciler.passes import Settings, run_pass
from det.reconciler.provision import Provisioner


def test_a_step_that_changed_something_asks_to_run_again_at_once() -> None:
    assert Result(3).requeue
    assert not Result(0).requeue
    assert not Result().requeue


def test_run_steps_runs_every_step_in_order_and_counts_all_their_changes() -> None:
    called: list[tuple[str, object]] = []

    def step(name: str, changes: int) -> Step:
        def run(conn: psycopg.Connection) -> Result:
            called.append((name, conn))
            return Result(changes)
        return run

    conn = object()
    # A step that changed nothing does not stop the ones after it (the provisioner still
    # runs after an idle pass).
    assert run_steps(conn, [step("pass", 0), step("provision", 2)]) == Result(2)
    assert called == [("pass", conn), ("provision", conn)]
    assert run_steps(conn, [step("pass", 0), step("provision", 0)]) == Result(0)


def test_the_loop_steps_converge_and_then_change_nothing(det, db_url: str,
                                                         tmp_path: Path) -> None:
    """A queued experiment and no agent: the first call creates its trial and run (requeue),
    the calls after it settle within the chain's bound, and once they report no change, a
    further call changes nothing (idempotent: level-triggered, nothing left to do)."""
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("name: c\nentrypoint: 'true'\n"
                   "searcher: {name: single, metric: loss, max_length: {batches: 10}}\n")
    (tmp_path / "ctx").mkdir()
    det("experiment", "create", str(cfg), str(tmp_path / "ctx"))
    steps: list[Step] = [functools.partial(run_pass, settings=Settings(), holder="test"),
                         Provisioner(tmp_path / "home").step]
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as leader:
        assert run_steps(leader, steps).requeue
        calls = 1
        while run_steps(leader, steps).requeue:
            calls += 1
            assert calls < MAX_CHAINED_PASSES
        assert run_steps(leader, steps) == Result(0)
        runs = leader.execute("SELECT state::text AS s FROM allocations").fetchall()
    assert runs == [{"s": "PENDING"}]
