"""The interface each search method implements, and the behaviour most of them share.

A method is a stateless strategy built from the parsed config; everything it remembers lives
in ``SearchState.method_state`` (JSON). ``searcher_step`` calls ``initial`` once, then per
event ``interpret`` and ``on_validation`` / ``on_exit`` on what it means, and decides
``Shutdown`` itself.
"""

from abc import ABC, abstractmethod
from collections.abc import Mapping

from det.configs import ExperimentConfig
from det.reconciler.searchers.actions import (
    Action,
    Close,
    Event,
    ExitReason,
    ValidationReported,
)
from det.reconciler.searchers.state import SearchState, TrialRecord


class SearchMethod(ABC):
    """A search method over one experiment's config."""

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config

    @abstractmethod
    def initial(self, state: SearchState) -> list[Action]:
        """The actions of a new search (its first trials)."""

    @abstractmethod
    def on_exit(
        self, state: SearchState, trial: TrialRecord, reason: ExitReason | None
    ) -> list[Action]:
        """``trial`` ended for good (``reason`` None: ``TrialExited``); usually refills."""

    @abstractmethod
    def total_trials(self, state: SearchState) -> int:
        """How many trials the search will run in all, for ``progress``."""

    @abstractmethod
    def target_length(self) -> int:
        """The length every trial trains to, in the unit of ``searcher.max_length``."""

    def interpret(self, event: Event) -> Event | None:
        """What a recorded event means to this method; None: nothing (it is consumed all the
        same). By default a trial's result is its op's ``ValidationCompleted``
        (``det_task.complete_op``) and a validation report, which every validation row records, is
        none."""
        return None if isinstance(event, ValidationReported) else event

    def on_validation(
        self, state: SearchState, trial: TrialRecord, length: int, metric: float
    ) -> list[Action]:
        """Metric-blind default (single/random/grid, §1.2-1.5): close a trial that reached
        the target length."""
        if length >= self.target_length() and not trial.closed:
            trial.closed = True
            return [Close(trial.request_id)]
        return []

    def progress(self, state: SearchState) -> float:
        """Mean over the search's trials of 1.0 (closed or exited) or length/target (§1.4);
        invalid-HP trials don't count."""
        if state.shutdown:
            return 1.0
        done = 0.0
        for trial in state.trials:
            if trial.exit == ExitReason.INVALID_HP:
                continue
            if trial.closed or trial.exit is not None:
                done += 1.0
            else:
                done += min(trial.length / self.target_length(), 1.0)
        return min(done / max(self.total_trials(state), 1), 1.0)

    def trained_progress(self, state: SearchState, trained: Mapping[str, float]) -> float:
        """Of an ended search: the mean over the search's trials of 1.0 (the searcher closed
        it) or what it trained over the target length (``trained`` by request id, else its
        validated length); trials never created count 0, invalid-HP ones not at all."""
        done = 0.0
        for trial in state.trials:
            if trial.exit == ExitReason.INVALID_HP:
                continue
            if trial.closed:
                done += 1.0
            else:
                units = max(trained.get(trial.request_id, 0.0), trial.length)
                done += min(units / self.target_length(), 1.0)
        return min(done / max(self.total_trials(state), 1), 1.0)
