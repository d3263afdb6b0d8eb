"""What the end of a run means for its trial: a pure function.

Rules (spec: experiment-lifecycle, Pausing and Activating; Determined 0.38's ``experiment.json``
schema ``max_restarts``):

* a trial that was being stopped (STOPPING_*) stays so, whatever the exit code; the pass's
  finishing step moves it to its terminal state (SQL ``det_user.stopped_state``) once no run of it
  is left, which also covers a paused trial that had no run when it was stopped;
* a failed run (non-zero exit, or its agent was lost) restarts the trial from its latest
  checkpoint while ``max_restarts`` allows one more restart; then the trial errors, and
  ``restarts`` counts the restarts that were made (the failure that ends it is not one);
* a clean exit (0) after a stop request (preemption, pause) leaves the trial to resume later;
* so does any end of a planned stop (``planned_stop``: its agent stopped it on purpose, as
  ``det cluster down`` does, or killed it when it could not heartbeat for its lease, as in a
  long database outage), a run killed after the agent's grace included: it is
  not a failure, ``restarts`` is unchanged, and the next run resumes from the latest
  checkpoint;
* a failed run that could not write a checkpoint to its storage (``storage_error``: no space,
  quota, read-only, I/O error) pauses the trial and its experiment with that reason
  and counts no restart: the storage is the experiment's, so every run of every trial would
  hit the same wall and spend its restarts on it; the work so far is kept, and once the
  operator has fixed the storage ``det experiment activate`` resumes from the latest
  checkpoint;
* a clean exit with no stop request and no open searcher operation leaves the trial to the
  searcher (it may promote it, or close it);
* so does a clean exit after the task was told there was no more work (``out_of_work``:
  ``det_task.current_op`` answered NULL) even if an operation is open now: the searcher opened it
  after that answer (an adaptive ASHA promotion racing the exit), and the trial's next run
  takes it;
* a clean exit with no stop request while an operation is still open, the task never told
  its work was over, means the code ended its own training (a Core API loop that decides its
  own length, as in the reference's 0.38): the trial is done, and closed.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class RunEnd:
    """A terminated allocation of a trial, as the settle step sees it: ``open_op`` whether
    the trial has a searcher operation open now, ``out_of_work`` whether the task was told
    it had none left (``allocations.out_of_work``), ``planned_stop`` whether its agent stopped
    it on purpose (``allocations.planned_stop``), ``storage_error`` the task's checkpoint
    storage error (``allocations.storage_error``), if any."""

    trial_state: str
    restarts: int
    max_restarts: int
    exit_code: int | None
    exit_reason: str | None
    stop_requested: bool = False
    open_op: bool = False
    out_of_work: bool = False
    planned_stop: bool = False
    storage_error: str | None = None


@dataclass(frozen=True)
class Settlement:
    """The trial's new state and restart count; ``failed`` marks a run that counted as a
    failure, ``close`` a trial whose code finished its own training, ``pause_experiment`` an
    experiment to pause with the run's storage error."""

    state: str
    restarts: int
    failed: bool
    close: bool = False
    pause_experiment: bool = False


def settle(run: RunEnd) -> Settlement:
    """Decide the trial's state after one of its runs ended (see the module rules)."""
    if run.trial_state.startswith("STOPPING_"):
        failed = run.exit_code != 0 and not run.planned_stop
        return Settlement(run.trial_state, run.restarts, failed)
    if run.planned_stop:
        return Settlement(run.trial_state, run.restarts, False)
    if run.exit_code == 0:
        done = run.open_op and not run.stop_requested and not run.out_of_work
        return Settlement(run.trial_state, run.restarts, False, close=done)
    if run.storage_error:
        return Settlement("PAUSED", run.restarts, False, pause_experiment=True)
    if run.restarts >= run.max_restarts:
        return Settlement("ERROR", run.restarts, True)
    return Settlement(run.trial_state, run.restarts + 1, True)
