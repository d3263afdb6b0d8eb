"""The searcher's persistent state: trials requested so far, their progress and exits, the
RNG, and the search method's own fields. Stored as JSONB on the experiment row.

JSON form (``SearchState.to_json``)::

    {"method": "random", "rng": {...}, "shutdown": false,
     "trials": [{"request_id": "...", "length": 0, "closed": false, "exit": null}, ...],
     "method_state": {...}}

``trials`` is a list in creation order (JSONB does not keep object key order). ``exit`` is
null while the trial lives, then ``"completed"`` (``TrialExited``) or an early-exit reason.
The reconciler stores ``"rng"`` apart (``experiments.searcher_rng``), written only at the
steps that draw from it.
"""

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from det.reconciler.searchers.actions import Action, Create, ValidateAfter
from det.reconciler.searchers.rng import (
    draw_request_id,
    draw_trial_seed,
    new_rng,
    recycle,
    rng_from_json,
    rng_to_json,
)

COMPLETED = "completed"


@dataclass
class TrialRecord:
    """One requested trial: the longest length it validated at, whether the searcher closed
    it, and how it exited (None while alive)."""

    request_id: str
    length: int = 0
    closed: bool = False
    exit: str | None = None


@dataclass
class SearchState:
    """Mutable working copy of the state during one ``searcher_step``. Its random source
    (:attr:`rng`) is rebuilt from the stored one only when the step draws from it: most steps
    (a validation, a trial's end) draw nothing, and rebuilding and storing it again was
    ~0.4 ms of a step."""

    method: str
    stored_rng: dict[str, Any] | None
    """The RNG as stored (``rng_to_json``), until :attr:`rng` is first used."""
    trials: list[TrialRecord] = field(default_factory=list)
    shutdown: bool = False
    method_state: dict[str, Any] = field(default_factory=dict)
    _rng: np.random.RandomState | None = field(default=None, init=False, repr=False)

    @classmethod
    def new(cls, method: str, seed: int) -> "SearchState":
        """A search not yet begun, its RNG seeded with ``seed`` (0 <= seed < 2**32)."""
        search = cls(method=method, stored_rng=None)
        search._rng = new_rng(seed)
        return search

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "SearchState":
        """A working copy of ``data`` (``to_json``'s form): ``data`` is left as it was (its
        RNG is only read, the rest is copied). Without ``"rng"`` (the state as stored in
        ``experiments.searcher_state``, which keeps it apart) the copy can be read but not
        drawn from: what progress and rungs need."""
        return cls(
            method=data["method"],
            stored_rng=data.get("rng"),
            trials=[TrialRecord(**trial) for trial in data["trials"]],
            shutdown=data["shutdown"],
            # the method's own fields may nest lists and dicts, which it changes in place
            method_state=copy.deepcopy(data["method_state"]),
        )

    @property
    def rng(self) -> np.random.RandomState:
        """The search's random source (numpy's legacy MT19937, Determined 0.38's ``searcher.go``).

        Raises RuntimeError after :meth:`finish`."""
        if self._rng is None:
            if self.stored_rng is None:
                raise RuntimeError("search state already finished: its RNG was given back")
            self._rng = rng_from_json(self.stored_rng)
        return self._rng

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "rng": dict(self.stored_rng) if self._rng is None else rng_to_json(self._rng),
            "trials": [asdict(trial) for trial in self.trials],
            "shutdown": self.shutdown,
            "method_state": self.method_state,
        }

    def finish(self) -> dict[str, Any]:
        """``to_json()``, then give the RNG back for other steps to reuse (see
        :mod:`det.reconciler.searchers.rng`): the end of this working copy's step."""
        data = self.to_json()
        if self._rng is not None:
            recycle(self._rng)
            self._rng = None
            self.stored_rng = None
        return data

    def trial(self, request_id: str) -> TrialRecord | None:
        return next((t for t in self.trials if t.request_id == request_id), None)

    def alive(self) -> list[TrialRecord]:
        return [t for t in self.trials if t.exit is None]

    def create(self, hparams: dict[str, Any], length: int) -> list[Action]:
        """Request a trial with ``hparams`` trained to ``length``: draws its request id, then
        its seed (the reference's draw order, §1.2), and returns ``[Create, ValidateAfter]``."""
        request_id = draw_request_id(self.rng)
        seed = draw_trial_seed(self.rng)
        self.trials.append(TrialRecord(request_id))
        return [Create(request_id, hparams, seed), ValidateAfter(request_id, length)]
