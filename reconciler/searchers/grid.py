"""``grid`` search (Determined 0.38's ``grid.go``).

The whole grid is built when the search starts; points are taken from the END of the list
(the reference pops them, so the last grid point starts first), at most
``max_concurrent_trials`` at a time (0 = no cap), one more per exited trial. An ``invalid_hp``
trial is not replaced: it was its grid point's only trial.
"""

from det.configs import ExperimentConfig, GridSearcher
from det.configs.length import UNBOUNDED
from det.reconciler.searchers.actions import Action, ExitReason
from det.reconciler.searchers.method import SearchMethod
from det.reconciler.searchers.sampling import grid_points
from det.reconciler.searchers.state import SearchState, TrialRecord


class GridSearch(SearchMethod):
    """``method_state = {"remaining": [hparams, ...], "grid_size": n}``."""

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        if not isinstance(config.searcher, GridSearcher):
            raise TypeError(f"GridSearch cannot run searcher {config.searcher.name!r}")
        self.searcher = config.searcher

    def target_length(self) -> int:
        length = self.searcher.max_length
        return length.value if length else UNBOUNDED

    def total_trials(self, state: SearchState) -> int:
        return int(state.method_state["grid_size"])

    def _create_next(self, state: SearchState) -> list[Action]:
        hparams = state.method_state["remaining"].pop()
        return state.create(hparams, self.target_length())

    def initial(self, state: SearchState) -> list[Action]:
        points = grid_points(self.config.hyperparameters)
        state.method_state["remaining"] = points
        state.method_state["grid_size"] = len(points)
        count = len(points)
        if self.searcher.max_concurrent_trials > 0:
            count = min(count, self.searcher.max_concurrent_trials)
        return [action for _ in range(count) for action in self._create_next(state)]

    def on_exit(
        self, state: SearchState, trial: TrialRecord, reason: ExitReason | None
    ) -> list[Action]:
        if state.method_state["remaining"]:
            return self._create_next(state)
        return []
