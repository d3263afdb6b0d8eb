"""What searchers emit (actions) and what they are told (events).

The reconciler applies actions (create a trial, tell a trial how far to train, stop asking a
trial for work, end the search) and feeds back events from the trials. Mirrors the reference's
``Create``/``Stop``/``Shutdown`` actions and ``validationCompleted``/``trialExited``/
``trialExitedEarly`` callbacks (Determined 0.38's ``searcher.go``). The events are what the
database recorded; what one means to a search is its method's call
(``SearchMethod.interpret``): a ``ValidationReported`` is a result only under adaptive ASHA's
``time_metric``, where an op's ``ValidationCompleted`` is none.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from det.reasons import EarlyExitReason as ExitReason


@dataclass(frozen=True)
class Create:
    """Create a trial. ``seed`` is the trial's own seed, in ``[0, 2**31)``."""

    request_id: str
    hparams: dict[str, Any]
    seed: int


@dataclass(frozen=True)
class ValidateAfter:
    """Train the trial until ``length`` (absolute, in the unit of ``searcher.max_length``),
    then validate and report ``ValidationCompleted``."""

    request_id: str
    length: int


@dataclass(frozen=True)
class Close:
    """The searcher wants no more work from this trial; it may finish and exit."""

    request_id: str


@dataclass(frozen=True)
class Shutdown:
    """The search is over. ``failure``: every trial errored; ``cancel``: every trial was
    canceled by a user. Otherwise the experiment completed."""

    failure: bool = False
    cancel: bool = False


@dataclass(frozen=True)
class ValidationCompleted:
    """The trial validated at ``length`` (same unit as ``ValidateAfter``); ``metric`` is the
    value of ``searcher.metric``."""

    request_id: str
    length: int
    metric: float


@dataclass(frozen=True)
class ValidationReported:
    """The trial reported validation metrics (a ``validation`` row of ``metrics``):
    ``values`` as stored, JSON (any value may be any JSON type, or missing)."""

    request_id: str
    values: Mapping[str, Any]


@dataclass(frozen=True)
class TrialExited:
    """The trial ended for good after finishing its work (completed or closed).

    A trial that failed past its restarts should be reported as ``TrialExitedEarly(errored)``
    instead: only the first exit event of a trial counts, later ones are ignored.
    """

    request_id: str


@dataclass(frozen=True)
class TrialExitedEarly:
    """The trial ended for good before finishing: ``errored`` (failed past its restarts),
    ``invalid_hp`` (user code rejected its hyperparameters) or ``user_requested_stop``."""

    request_id: str
    reason: ExitReason


Action = Create | ValidateAfter | Close | Shutdown
Event = ValidationCompleted | ValidationReported | TrialExited | TrialExitedEarly
