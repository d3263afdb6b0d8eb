"""What the end of a run means for its trial: a pure function.

Rules (spec: experiment-lifecycle, Pausing and Activating; notes §3.2 ``max_restarts``):
a run that exits 0 leaves the trial as it was (it checkpointed; it runs again while the
searcher has work for it, or is finished once the searcher closed it); a failed run (non-zero
exit, or its agent was lost) restarts the trial from its latest checkpoint while its failures
do not exceed ``max_restarts``, else the trial errors. A trial that was being stopped
(STOPPING_*) ends in the matching terminal state whatever the exit code.
"""

from dataclasses import dataclass

TERMINAL = {"STOPPING_COMPLETED": "COMPLETED", "STOPPING_CANCELED": "CANCELED",
            "STOPPING_KILLED": "CANCELED", "STOPPING_ERROR": "ERROR"}


@dataclass(frozen=True)
class RunEnd:
    """A terminated allocation of a trial, as the settle step sees it."""

    trial_state: str
    restarts: int
    max_restarts: int
    exit_code: int | None
    exit_reason: str | None


@dataclass(frozen=True)
class Settlement:
    """The trial's new state and restart count; ``failed`` marks a run that counted as a
    failure."""

    state: str
    restarts: int
    failed: bool


def settle(run: RunEnd) -> Settlement:
    """Decide the trial's state after one of its runs ended (see the module rules)."""
    if run.trial_state in TERMINAL:
        return Settlement(TERMINAL[run.trial_state], run.restarts, run.exit_code != 0)
    if run.exit_code == 0:
        return Settlement(run.trial_state, run.restarts, False)
    restarts = run.restarts + 1
    if restarts > run.max_restarts:
        return Settlement("ERROR", restarts, True)
    return Settlement(run.trial_state, restarts, True)
