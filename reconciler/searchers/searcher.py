"""``searcher_step`` and ``searcher_progress``: the pure functions the reconciler calls.

Common machinery of every method (Determined 0.38's ``searcher.go``): bookkeeping of trials,
ignoring
repeated or late events, and the shutdown rule (when every requested trial has exited:
``Shutdown(failure=all errored, cancel=all canceled)``). Methods are looked up by
``searcher.name`` in ``METHODS``. A method's constructor raises ``ValueError`` for a valid
config it cannot run (``tpe`` hyperparameter names that collide once flattened); that
becomes a ``SearcherError``.
"""

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from det.configs import ExperimentConfig, parse_experiment_config
from det.errors import DetError
from det.reconciler.searchers.actions import (
    Action,
    Event,
    ExitReason,
    Shutdown,
    TrialExited,
    TrialExitedEarly,
    ValidationCompleted,
)
from det.reconciler.searchers.asha import AdaptiveAsha
from det.reconciler.searchers.grid import GridSearch
from det.reconciler.searchers.method import SearchMethod
from det.reconciler.searchers.random_search import RandomSearch
from det.reconciler.searchers.state import COMPLETED, SearchState
from det.reconciler.searchers.tpe import TPE

METHODS: dict[str, type[SearchMethod]] = {
    "single": RandomSearch,
    "random": RandomSearch,
    "grid": GridSearch,
    "adaptive_asha": AdaptiveAsha,
    "tpe": TPE,
}
"""``searcher.name`` -> its search method."""


class SearcherError(DetError):
    """The searcher cannot go on (an unimplemented method, a config its method cannot run, an
    event for an unknown trial). The reference stops the experiment with an error
    ("encountered error ...")."""


def _method(config: dict[str, Any]) -> SearchMethod:
    # A pass searches each experiment at every event, from the config it reads each time;
    # parsing and validating it (~0.3 ms) was most of a one-trial search's step. Methods keep
    # nothing but what their constructor derives from the config, so one serves every step.
    # Keys keep their order: hyperparameters are sampled in the order they are listed.
    return _method_of(json.dumps(config, separators=(",", ":")))


@functools.lru_cache(maxsize=256)
def _method_of(config_json: str) -> SearchMethod:
    parsed: ExperimentConfig = parse_experiment_config(json.loads(config_json))
    method = METHODS.get(parsed.searcher.name)
    if method is None:
        raise SearcherError(f"searcher {parsed.searcher.name!r} is not implemented")
    try:
        return method(parsed)
    except ValueError as e:
        raise SearcherError(f"searcher {parsed.searcher.name!r}: {e}") from None


def searcher_step(
    config: dict[str, Any], state: dict[str, Any] | None, events: Sequence[Event]
) -> tuple[dict[str, Any], list[Action]]:
    """Advance a search: ``(new_state, actions)`` after handling ``events`` in order.

    ``config`` is the expanded experiment config (``ExperimentConfig.expanded()``; its
    ``searcher``, ``hyperparameters`` and ``reproducibility.experiment_seed`` are used).
    ``state`` None starts a new search and returns its initial actions (then the events, if
    any, are handled). The result depends only on the arguments; ``state`` is not modified
    and the returned state is JSON-serialisable. Every ``Create`` is followed by its
    ``ValidateAfter``. Each event is what the method makes of it (``SearchMethod.interpret``:
    a validation report or an op's completion may mean nothing to it). Events for a trial
    that already exited, and all events after ``Shutdown``, are ignored; an event that means
    something and names a trial never created raises ``SearcherError``.
    """
    method = _method(config)
    actions: list[Action] = []
    if state is None:
        seed = config["reproducibility"]["experiment_seed"]
        if seed is None:
            raise SearcherError("reproducibility.experiment_seed: expected an expanded config")
        search = SearchState.new(config["searcher"]["name"], seed)
        actions += method.initial(search)
    else:
        # from_json copies: the 624-word RNG key made a deepcopy of the whole state ~0.5 ms
        search = SearchState.from_json(state)

    for recorded in events:
        if search.shutdown:
            break
        event = method.interpret(recorded)
        if event is None:
            continue
        trial = search.trial(event.request_id)
        if trial is None:
            raise SearcherError(f"searcher event for unknown trial {event.request_id!r}")
        if trial.exit is not None:
            continue
        if isinstance(event, ValidationCompleted):
            trial.length = max(trial.length, event.length)
            actions += method.on_validation(search, trial, event.length, event.metric)
            continue
        if isinstance(event, TrialExitedEarly):
            if event.reason not in set(ExitReason):
                raise SearcherError(f"unknown early-exit reason {event.reason!r}")
            trial.exit = event.reason
            actions += method.on_exit(search, trial, event.reason)
        elif isinstance(event, TrialExited):
            trial.exit = COMPLETED
            actions += method.on_exit(search, trial, None)
        if not search.alive():
            actions.append(_shutdown(search))
    return search.finish(), actions


def _shutdown(search: SearchState) -> Shutdown:
    """Every requested trial has exited: the search is over (§1.2 shutdown rule)."""
    search.shutdown = True
    requested = len(search.trials)
    failures = sum(1 for t in search.trials if t.exit == ExitReason.ERRORED)
    cancels = sum(1 for t in search.trials if t.exit == ExitReason.USER_REQUESTED_STOP)
    return Shutdown(failure=failures >= requested, cancel=cancels >= requested)


def searcher_progress(config: dict[str, Any], state: dict[str, Any]) -> float:
    """Search progress in [0, 1]: the mean over the planned trials of each trial's
    progress (1.0 once closed or exited); 1.0 after shutdown."""
    return _method(config).progress(SearchState.from_json(state))


def ended_progress(config: dict[str, Any], state: dict[str, Any] | None,
                   trained: Mapping[str, float]) -> float:
    """Progress in [0, 1] of an experiment that ended: what its trials trained over what the
    search planned (a killed or errored experiment showed 0 % or 100 %, not what it
    did). ``trained``: units (of ``searcher.max_length``) each trial trained, by request id
    (a trial not in it trained what it validated). A search that finished its plan (shut
    down with every trial closed by the searcher) is 1.0; one never begun (``state`` None)
    is 0.0."""
    if state is None:
        return 0.0
    search = SearchState.from_json(state)
    if search.shutdown and all(t.closed or t.exit == ExitReason.INVALID_HP
                               for t in search.trials):
        return 1.0
    return _method(config).trained_progress(search, trained)
