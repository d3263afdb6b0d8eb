"""det.reconciler.searchers: pure hyperparameter-search methods.

``searcher_step(config, state, events) -> (state, actions)`` and
``searcher_progress(config, state) -> float`` (and, once an experiment ended,
``ended_progress(config, state, trained) -> float``) are the whole interface the reconciler uses;
actions and events are the dataclasses of ``actions``. Implemented: ``single``, ``random``,
``grid``, ``adaptive_asha``, ``tpe``. New methods subclass ``SearchMethod`` and register in
``METHODS``.
``asha_preview(searcher)`` gives adaptive ASHA's brackets, rung lengths and expected trials
per rung without running anything (``det preview-search``); ``trial_rungs(config, state)``
where each trial of a running or finished adaptive ASHA search stands (``det experiment
describe``).
"""

from det.reconciler.searchers.actions import (
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
)
from det.reconciler.searchers.asha import (
    BracketPreview,
    RungPreview,
    TrialRung,
    asha_preview,
    trial_rungs,
)
from det.reconciler.searchers.method import SearchMethod
from det.reconciler.searchers.searcher import (
    METHODS,
    SearcherError,
    ended_progress,
    searcher_progress,
    searcher_step,
)

__all__ = [
    "METHODS",
    "Action",
    "BracketPreview",
    "Close",
    "Create",
    "Event",
    "RungPreview",
    "SearchMethod",
    "SearcherError",
    "Shutdown",
    "TrialExited",
    "TrialExitedEarly",
    "TrialRung",
    "ValidateAfter",
    "ValidationCompleted",
    "ValidationReported",
    "asha_preview",
    "ended_progress",
    "searcher_progress",
    "searcher_step",
    "trial_rungs",
]
