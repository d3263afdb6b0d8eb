"""``random`` and ``single`` search (Determined 0.38's ``random.go``).

Keeps ``min(max_trials, max_concurrent_trials)`` trials alive (``max_concurrent_trials: 0``
means no cap) and creates one more whenever a trial exits, until ``max_trials`` have been
created. For ``random``, a trial that exits with ``invalid_hp`` does not count against
``max_trials``; ``single`` (one trial, never replaced) does not replace it.
"""

from det.configs import ExperimentConfig, RandomSearcher, SingleSearcher
from det.configs.length import UNBOUNDED
from det.reconciler.searchers.actions import Action, ExitReason
from det.reconciler.searchers.method import SearchMethod
from det.reconciler.searchers.sampling import sample
from det.reconciler.searchers.state import SearchState, TrialRecord


class RandomSearch(SearchMethod):
    """Sampled hyperparameters; ``method_state = {"created_trials": n}`` (n counts toward
    ``max_trials``)."""

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        searcher = config.searcher
        if isinstance(searcher, RandomSearcher):
            self.max_trials = searcher.max_trials
            self.max_concurrent = searcher.max_concurrent_trials
            self.replace_invalid_hp = True
        elif isinstance(searcher, SingleSearcher):
            self.max_trials = 1
            self.max_concurrent = 1
            self.replace_invalid_hp = False
        else:
            raise TypeError(f"RandomSearch cannot run searcher {searcher.name!r}")
        self.length = searcher.max_length.value if searcher.max_length else UNBOUNDED

    def target_length(self) -> int:
        return self.length

    def total_trials(self, state: SearchState) -> int:
        return self.max_trials

    def _create(self, state: SearchState) -> list[Action]:
        state.method_state["created_trials"] += 1
        hparams = sample(self.config.hyperparameters, state.rng)
        return state.create(hparams, self.length)

    def initial(self, state: SearchState) -> list[Action]:
        state.method_state["created_trials"] = 0
        count = self.max_trials
        if self.max_concurrent > 0:
            count = min(count, self.max_concurrent)
        return [action for _ in range(count) for action in self._create(state)]

    def on_exit(
        self, state: SearchState, trial: TrialRecord, reason: ExitReason | None
    ) -> list[Action]:
        if reason == ExitReason.INVALID_HP and self.replace_invalid_hp:
            state.method_state["created_trials"] -= 1
        if state.method_state["created_trials"] < self.max_trials:
            return self._create(state)
        return []
