"""``adaptive_asha``: asynchronous successive halving in brackets (Determined 0.38's
``adaptive_asha.go`` and 0.37's promotion-based ASHA;
Li et al., "A System for Massively Parallel Hyperparameter Tuning", MLSys 2020, Algorithm 2).

The plan is a pure function of the searcher config (``asha_brackets``), with ``L`` =
``max_length`` and ``d`` = ``divisor``:

* ``R = min(max_rungs, int(ln L / ln d) + 1, int(ln max_trials / ln d) + 1)``, with float
  logs as the reference (``ln 1000 / ln 10`` is just under 3, so R is 3, not 4);
* bracket rung counts: aggressive ``[R]``; standard ``R`` down to ``(R-1)//2 + 1``;
  conservative ``R`` down to 1; or ``bracket_rungs`` as given, largest first;
* rung ``i`` of a bracket of ``r`` rungs trains to ``max(int(L / d**(r-1-i)), 1)`` units of
  ``max_length`` (absolute lengths, so the top rung is ``L``);
* ``max_trials`` and ``max_concurrent_trials`` are split over the brackets by the weight
  ``d**(r-1) / r``, rounded down, at least 1 each, the remainder to the first bracket (the
  reference splits ``max_concurrent_trials`` evenly instead).

det never exceeds ``max_trials``: where the reference's at-least-one rule would give more
trials than ``max_trials`` (more brackets than trials, or many small ones), brackets beyond
the ``max_trials``-th are dropped and the excess is taken back from the largest bracket.

The search, per bracket, with a trial "running" while it has an unanswered ``ValidateAfter``
and at most the bracket's share of ``max_concurrent_trials`` running (0 = no cap):

* ``stop_once: false`` (promotion, §1.9 and the paper): a trial that reports a rung is ranked
  there and gets no new work; its run checkpoints and exits, giving its slot back. Whenever a
  slot is free, the best waiting trial in the top ``int(n / d)`` of a rung of ``n`` results
  (highest rung first) is promoted with a ``ValidateAfter`` to the next rung and resumes from
  its checkpoint; if none, a new trial is created, until the bracket's trials are all created.
  Once none run and none can be created, the quota becomes ``max(int(n / d), 1)``, so each
  bracket trains its best trial to ``L`` (as the reference's preview assumes); when nothing
  is left to promote, the waiting trials are closed.
* ``stop_once: true`` (stopping, §1.7): a trial that reports a rung continues to the next one
  only if it ranks in the top ``max(int(n / d), 1)`` there (``n`` counting itself; earlier
  results win ties); otherwise it is closed. Freed slots get new trials.

* the reference's 0.38 form (``max_time`` + ``time_metric``, §1.7 "Per validation report"):
  ``L`` is ``max_time`` and rungs are values of the metric named ``time_metric``. A trial is
  created with one operation (of ``max_length`` when the time metric is batches, records or
  epochs, else unbounded) and trains as its own code decides; each validation it reports
  that carries a number ``t`` under the time metric is a result at length ``floor(t)``
  (``timed_result``; the database records every validation row), and its op's completion is
  none. From its current rung, while ``t`` reaches the rung's value,
  the trial is ranked there (a new result ahead of equal ones, as the reference) and goes on
  only if it ranks in the top ``max(int(n / d), 1)``; otherwise it is closed, which its run
  sees as ``should_preempt()`` (the trial's runs are desired STOPPED). One report can pass
  several rungs. Freed slots get new trials. A trial that ends by itself before its top rung
  is replaced too (0.38 replaces only stopped and early-exited ones, so it can run fewer
  than ``max_trials``); an early exit ranks worst at its rung, a clean one is not ranked.

Either way a trial that reports the top rung is closed. A trial that exits before reporting its
rung (errored, canceled, or its code ended its own training) ranks there with the worst
metric; an ``invalid_hp`` trial leaves the rungs and is replaced (it does not count against
``max_trials``). Metrics are ranked smaller-is-better (negated when ``smaller_is_better`` is
false); a NaN or infinite metric ranks worst (JSONB cannot store it).
"""

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from det.configs import AdaptiveAshaSearcher, ExperimentConfig, TPESearcher
from det.configs.length import UNBOUNDED
from det.configs.limits import INT64_MAX
from det.reconciler.searchers.actions import (
    Action,
    Close,
    Event,
    ExitReason,
    ValidateAfter,
    ValidationCompleted,
    ValidationReported,
)
from det.reconciler.searchers.method import SearchMethod
from det.reconciler.searchers.sampling import sample
from det.reconciler.searchers.state import COMPLETED, SearchState, TrialRecord


@dataclass(frozen=True)
class Bracket:
    """One bracket's plan: ``rungs`` are the absolute lengths (units of ``max_length``) of its
    rungs, lowest first; it creates ``max_trials`` trials, at most ``max_concurrent_trials``
    running at once (0 = no cap)."""

    rungs: tuple[int, ...]
    max_trials: int
    max_concurrent_trials: int


@dataclass(frozen=True)
class RungPreview:
    """One rung in a preview: its absolute ``length``, how many trials train to it, and how
    many of those stop there."""

    length: int
    trials: int
    stopped: int


@dataclass(frozen=True)
class BracketPreview:
    """A bracket's plan and the trials expected at each of its rungs."""

    bracket: Bracket
    rungs: tuple[RungPreview, ...]

    @property
    def units(self) -> int:
        """Training units the bracket is expected to run (each trial trains to the rung it
        stops at, resuming from checkpoints in between)."""
        return sum(rung.length * rung.stopped for rung in self.rungs)


def max_length(searcher: AdaptiveAshaSearcher) -> int:
    """The top rung length ``L``: ``max_time`` (in ``time_metric``) when set, else in the
    unit of ``searcher.max_length``."""
    if searcher.max_time is not None:
        return searcher.max_time
    assert searcher.max_length is not None, "the config model requires one of them"
    return searcher.max_length.value


def rung_count(length: int, max_trials: int, divisor: float, max_rungs: int) -> int:
    """``R``: the rungs of the most aggressive bracket (module docstring; float logs)."""
    by_length = int(math.log(length) / math.log(divisor)) + 1
    by_trials = int(math.log(max_trials) / math.log(divisor)) + 1
    return min(max_rungs, by_length, by_trials)


def bracket_rung_counts(searcher: AdaptiveAshaSearcher) -> list[int]:
    """Rungs per bracket, largest (most aggressive) first, at most ``max_trials`` brackets."""
    if searcher.bracket_rungs:
        counts = sorted(searcher.bracket_rungs, reverse=True)
    else:
        top = rung_count(
            max_length(searcher), searcher.max_trials, searcher.divisor, searcher.max_rungs
        )
        lowest = {"aggressive": top, "standard": (top - 1) // 2 + 1, "conservative": 1}
        counts = list(range(top, lowest[searcher.mode] - 1, -1))
    return counts[: searcher.max_trials]


def rung_lengths(length: int, divisor: float, rungs: int) -> tuple[int, ...]:
    """Absolute lengths of the rungs of a bracket of ``rungs`` rungs, lowest first."""
    return tuple(max(int(length / divisor ** (rungs - 1 - i)), 1) for i in range(rungs))


def split_by_weight(total: int, divisor: float, counts: list[int]) -> list[int]:
    """Share ``total`` (>= ``len(counts)``) over brackets of ``counts`` rungs by the weight
    ``divisor**(r-1) / r``: rounded down, at least 1 each, remainder to the first; the shares
    sum to ``total``."""
    weights = [divisor ** (r - 1) / r for r in counts]
    shares = [max(int(w / sum(weights) * total), 1) for w in weights]
    shares[0] += max(total - sum(shares), 0)
    while sum(shares) > total:  # the at-least-one rule overshot
        shares[shares.index(max(shares))] -= 1
    return shares


def asha_brackets(searcher: AdaptiveAshaSearcher) -> list[Bracket]:
    """The brackets of a search, most aggressive first (module docstring).

    With ``max_concurrent_trials`` below the number of brackets, each still gets 1 (the
    reference rounds it up the same way); 0 leaves every bracket uncapped.
    """
    length = max_length(searcher)
    counts = bracket_rung_counts(searcher)
    trials = split_by_weight(searcher.max_trials, searcher.divisor, counts)
    concurrent = searcher.max_concurrent_trials
    if concurrent == 0:
        caps = [0] * len(counts)
    else:
        caps = split_by_weight(max(concurrent, len(counts)), searcher.divisor, counts)
    return [
        Bracket(rung_lengths(length, searcher.divisor, r), n, cap)
        for r, n, cap in zip(counts, trials, caps, strict=True)
    ]


def asha_preview(searcher: AdaptiveAshaSearcher) -> list[BracketPreview]:
    """Each bracket with, per rung, the trials that train to it and stop there.

    As the reference's ``Simulate`` (§1.7): of ``n`` trials at a rung below the top,
    ``max(int(n / d), 1)`` continue; all stop at the top rung.
    """
    previews = []
    for bracket in asha_brackets(searcher):
        rungs = []
        n = bracket.max_trials
        for i, length in enumerate(bracket.rungs):
            top = i == len(bracket.rungs) - 1
            going_on = 0 if top else max(int(n / searcher.divisor), 1)
            rungs.append(RungPreview(length, n, n - going_on))
            n = going_on
        previews.append(BracketPreview(bracket, tuple(rungs)))
    return previews


@dataclass(frozen=True)
class TrialRung:
    """Where a trial stands in an adaptive ASHA search (``trial_rungs``).

    ``rung`` is the index (0 = lowest) of the rung it trains toward or last reported, in
    bracket ``bracket``, and ``length`` that rung's absolute length (units of
    ``max_length``). ``status``: ``running`` (toward its first rung), ``promoted`` (running
    toward a higher rung it was promoted to), ``waiting`` (reported its rung; may yet be
    promoted), ``stopped`` (closed or ended below the top rung), ``done`` (reported the top
    rung). ``metric`` is the ``searcher.metric`` value that decided it, as reported (not
    negated): for a promoted trial its result at the rung below, else its result at ``rung``;
    None before it reports, or when it ended without a result. ``exit`` is the searcher's exit
    record of the trial (``completed``, an early-exit reason, or None while it lives).
    """

    bracket: int
    rung: int
    length: int
    status: str
    metric: float | None
    exit: str | None


def trial_rungs(config: dict[str, Any], state: dict[str, Any] | None) -> dict[str, TrialRung]:
    """Each trial's rung and status, by request id (``trials.request_id``), read from the
    stored searcher state (``experiments.searcher_state``; the ``AdaptiveAsha`` docstring
    gives its shape). ``config`` is the expanded experiment config. An unstarted search
    (``state`` None) has no trials.

    Raises ``ValueError`` when the config's searcher is neither ``adaptive_asha`` nor ``tpe``
    (which keeps ASHA's state in one bracket).
    """
    searcher = ExperimentConfig.model_validate(config).searcher
    if isinstance(searcher, TPESearcher):
        searcher = searcher.as_asha()
    if not isinstance(searcher, AdaptiveAshaSearcher):
        raise ValueError(f"searcher {searcher.name!r} has no rungs; expected adaptive_asha")
    if state is None:
        return {}
    brackets = asha_brackets(searcher)
    sign = 1.0 if searcher.smaller_is_better else -1.0
    method = state["method_state"]
    out = {}
    for trial in state["trials"]:
        rid = trial["request_id"]
        info = method["trials"][rid]
        b, rung = info["bracket"], info["rung"]
        lengths = brackets[b].rungs
        results = method["brackets"][b]["rungs"]
        decided_at = rung - 1 if info["running"] and rung > 0 else rung
        entry = next((e for e in results[decided_at] if e["id"] == rid), None)
        if info["running"]:
            status = "promoted" if rung > 0 else "running"
        elif rung == len(lengths) - 1 and entry is not None and trial["exit"] in (None, COMPLETED):
            status = "done"
        elif trial["closed"] or trial["exit"] is not None:
            status = "stopped"
        else:
            status = "waiting"
        metric = None if entry is None or entry["metric"] is None else sign * entry["metric"]
        out[rid] = TrialRung(b, rung, lengths[rung], status, metric, trial["exit"])
    return out


def timed_result(report: ValidationReported, time_metric: str,
                 metric: str) -> ValidationCompleted | None:
    """A validation report read as 0.38's adaptive ASHA reads it (``adaptive_asha.go``, per
    validation report): a result at length ``floor(values[time_metric])``, kept within
    ``[0, INT64_MAX]`` (the unit of ``max_time``), with ``values[metric]`` when a number, else
    NaN (it ranks worst). None when the time metric is missing or not a number (a JSON
    boolean is none): the harness refuses such a report (TrainContext), a raw row is no
    result."""
    time = report.values.get(time_metric)
    if isinstance(time, bool) or not isinstance(time, int | float):
        return None
    # inf (1e400 in JSON) has no floor: clamp before taking it
    length = INT64_MAX if time >= INT64_MAX else max(math.floor(time), 0)
    value = report.values.get(metric)
    number = not isinstance(value, bool) and isinstance(value, int | float)
    return ValidationCompleted(report.request_id, length, float(value) if number else math.nan)


def _rank_key(entry: dict[str, Any]) -> tuple[bool, float]:
    """Sort key of a rung entry: smaller is better, a missing metric (None) last."""
    return (entry["metric"] is None, entry["metric"] or 0.0)


class AdaptiveAsha(SearchMethod):
    """``adaptive_asha``. ``method_state``::

        {"brackets": [{"created": n, "rungs": [[{"id": request_id, "metric": float | null,
                                                  "promoted": bool}, ...], ...]}, ...],
         "trials": {request_id: {"bracket": b, "rung": i, "running": bool}}}

    ``created`` counts the bracket's trials that count against its ``max_trials``; each rung
    lists the results reported there, best first; a trial's ``rung`` is the one it trains
    toward (``running``) or last reported. Decisions never depend on the order of JSON object
    keys (JSONB does not keep it): trials are visited in ``SearchState.trials`` order.
    """

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        if not isinstance(config.searcher, AdaptiveAshaSearcher):
            raise TypeError(f"AdaptiveAsha cannot run searcher {config.searcher.name!r}")
        self.searcher = config.searcher
        self.length = max_length(config.searcher)
        # 0.38's form: rungs are values of the time metric; trials are only ever stopped.
        self.timed = config.searcher.max_time is not None
        self.stopping = self.timed or config.searcher.stop_once
        self.op_length = (config.searcher.max_length.value if config.searcher.max_length
                          else UNBOUNDED)
        self.preview = asha_preview(config.searcher)
        self.brackets = [preview.bracket for preview in self.preview]

    def target_length(self) -> int:
        return self.length

    def total_trials(self, state: SearchState) -> int:
        invalid = sum(1 for t in state.trials if t.exit == ExitReason.INVALID_HP)
        return sum(b.max_trials for b in self.brackets) + invalid

    def progress(self, state: SearchState) -> float:
        """Units validated by the search's trials (invalid-HP ones aside) over the units the
        preview expects, capped at 1; 1.0 after shutdown."""
        if state.shutdown:
            return 1.0
        done = sum(t.length for t in state.trials if t.exit != ExitReason.INVALID_HP)
        expected = sum(preview.units for preview in self.preview)
        return min(done / expected, 1.0)

    def trained_progress(self, state: SearchState, trained: Mapping[str, float]) -> float:
        """Of an ended search: units the trials trained (``trained`` by request id, at least
        what each validated) over the units the preview expects, capped at 1."""
        done = sum(max(trained.get(t.request_id, 0.0), t.length) for t in state.trials
                   if t.exit != ExitReason.INVALID_HP)
        expected = sum(preview.units for preview in self.preview)
        return min(done / expected, 1.0)

    # --- events ---------------------------------------------------------------------------

    def initial(self, state: SearchState) -> list[Action]:
        state.method_state["brackets"] = [
            {"created": 0, "rungs": [[] for _ in bracket.rungs]} for bracket in self.brackets
        ]
        state.method_state["trials"] = {}
        return [action for b in range(len(self.brackets)) for action in self._fill(state, b)]

    def interpret(self, event: Event) -> Event | None:
        """Under ``time_metric`` (0.38's form) a trial's results are its validation reports
        (``timed_result``) and its op's completion is none; otherwise the default."""
        time_metric = self.searcher.time_metric  # set exactly when max_time is (the config's rule)
        if time_metric is None:
            return super().interpret(event)
        if isinstance(event, ValidationCompleted):
            return None
        if isinstance(event, ValidationReported):
            return timed_result(event, time_metric, self.searcher.metric)
        return event

    def on_validation(
        self, state: SearchState, trial: TrialRecord, length: int, metric: float
    ) -> list[Action]:
        if self.timed:
            return self._on_timed_validation(state, trial, length, metric)
        info = state.method_state["trials"][trial.request_id]
        bracket = self.brackets[info["bracket"]]
        rung = info["rung"]
        # Only the answer to the open ValidateAfter counts; repeats are ignored.
        if not info["running"] or length < bracket.rungs[rung]:
            return []
        info["running"] = False
        signed = metric if self.searcher.smaller_is_better else -metric
        entry = self._record(state, trial, signed if math.isfinite(signed) else None)
        actions: list[Action] = []
        if rung == len(bracket.rungs) - 1:
            actions += self._close(trial)
        elif self.searcher.stop_once:
            results = state.method_state["brackets"][info["bracket"]]["rungs"][rung]
            if results.index(entry) < max(int(len(results) / self.searcher.divisor), 1):
                actions += self._promote(state, info["bracket"], entry)
            else:
                actions += self._close(trial)
        return actions + self._fill(state, info["bracket"])

    def _on_timed_validation(
        self, state: SearchState, trial: TrialRecord, time: int, metric: float
    ) -> list[Action]:
        """0.38's stopping rule (module docstring): rank ``trial`` at each rung its time
        metric value ``time`` reaches, from its current one; stop it below a cut or at the
        top. Reports of a stopped trial are ignored."""
        info = state.method_state["trials"][trial.request_id]
        b = info["bracket"]
        rungs = self.brackets[b].rungs
        if not info["running"]:
            return []
        signed = metric if self.searcher.smaller_is_better else -metric
        value = signed if math.isfinite(signed) else None
        actions: list[Action] = []
        while time >= rungs[info["rung"]]:
            entry = self._record(state, trial, value, ahead=True)
            results = state.method_state["brackets"][b]["rungs"][info["rung"]]
            top = info["rung"] == len(rungs) - 1
            if top or results.index(entry) >= max(int(len(results) / self.searcher.divisor), 1):
                info["running"] = False
                actions += self._close(trial)
                break
            entry["promoted"] = True
            info["rung"] += 1
        return actions + self._fill(state, b)

    def on_exit(
        self, state: SearchState, trial: TrialRecord, reason: ExitReason | None
    ) -> list[Action]:
        info = state.method_state["trials"][trial.request_id]
        bracket = state.method_state["brackets"][info["bracket"]]
        if reason == ExitReason.INVALID_HP:
            bracket["created"] -= 1
            for results in bracket["rungs"]:
                results[:] = [e for e in results if e["id"] != trial.request_id]
        elif info["running"] and not (self.timed and reason is None):
            self._record(state, trial, None)
        info["running"] = False
        return self._fill(state, info["bracket"])

    # --- decisions ------------------------------------------------------------------------

    def _fill(self, state: SearchState, b: int) -> list[Action]:
        """Use bracket ``b``'s free slots: promote, else create; close out a finished bracket."""
        bracket = self.brackets[b]
        stored = state.method_state["brackets"][b]
        actions: list[Action] = []
        while True:
            running = self._running(state, b)
            if bracket.max_concurrent_trials and running >= bracket.max_concurrent_trials:
                break
            all_created = stored["created"] >= bracket.max_trials
            entry = None
            if not self.stopping:
                entry = self._promotable(state, b, finishing=all_created and running == 0)
            if entry is not None:
                actions += self._promote(state, b, entry)
            elif not all_created:
                actions += self._create(state, b)
            else:
                break
        if stored["created"] >= bracket.max_trials and self._running(state, b) == 0:
            for trial in self._trials(state, b):
                if self._waiting(state, trial):
                    actions += self._close(trial)
        return actions

    def _promotable(self, state: SearchState, b: int, finishing: bool) -> dict[str, Any] | None:
        """The best waiting trial's entry within its rung's quota, highest rung first;
        ``finishing`` (nothing runs or is left to create) raises an empty quota to 1."""
        waiting = {t.request_id for t in self._trials(state, b) if self._waiting(state, t)}
        for results in reversed(state.method_state["brackets"][b]["rungs"][:-1]):
            quota = int(len(results) / self.searcher.divisor)
            if finishing:
                quota = max(quota, 1)
            for entry in results[:quota]:
                if not entry["promoted"] and entry["id"] in waiting:
                    return entry
        return None

    # --- bookkeeping ----------------------------------------------------------------------

    def _trials(self, state: SearchState, b: int) -> list[TrialRecord]:
        """Bracket ``b``'s trials, in creation order."""
        info = state.method_state["trials"]
        return [t for t in state.trials if info[t.request_id]["bracket"] == b]

    def _running(self, state: SearchState, b: int) -> int:
        info = state.method_state["trials"]
        return sum(1 for t in self._trials(state, b) if info[t.request_id]["running"])

    def _waiting(self, state: SearchState, trial: TrialRecord) -> bool:
        """Alive, not closed, and without work: it waits at its rung for a promotion."""
        info = state.method_state["trials"][trial.request_id]
        return trial.exit is None and not trial.closed and not info["running"]

    def _record(
        self, state: SearchState, trial: TrialRecord, metric: float | None, ahead: bool = False
    ) -> dict[str, Any]:
        """Rank ``trial`` in the rung it trained toward, behind equal results: earlier reports
        win ties (the reference's promotion rule, §1.9); ``ahead`` puts it before them (its
        0.38 stopping rule, §1.7)."""
        info = state.method_state["trials"][trial.request_id]
        results = state.method_state["brackets"][info["bracket"]]["rungs"][info["rung"]]
        entry = {"id": trial.request_id, "metric": metric, "promoted": False}
        where = bisect.bisect_left if ahead else bisect.bisect_right
        results.insert(where(results, _rank_key(entry), key=_rank_key), entry)
        return entry

    def _promote(self, state: SearchState, b: int, entry: dict[str, Any]) -> list[Action]:
        """Send the trial of ``entry`` on to the next rung of bracket ``b``."""
        entry["promoted"] = True
        info = state.method_state["trials"][entry["id"]]
        info["rung"] += 1
        info["running"] = True
        return [ValidateAfter(entry["id"], self.brackets[b].rungs[info["rung"]])]

    def new_hparams(self, state: SearchState) -> dict[str, Any]:
        """The hyperparameters of a new trial: a random sample. Called once per created trial,
        just before it is appended to ``state.trials``; ``tpe`` overrides it."""
        return sample(self.config.hyperparameters, state.rng)

    def _create(self, state: SearchState, b: int) -> list[Action]:
        hparams = self.new_hparams(state)
        first = self.op_length if self.timed else self.brackets[b].rungs[0]
        actions = state.create(hparams, first)
        state.method_state["trials"][state.trials[-1].request_id] = {
            "bracket": b,
            "rung": 0,
            "running": True,
        }
        state.method_state["brackets"][b]["created"] += 1
        return actions

    def _close(self, trial: TrialRecord) -> list[Action]:
        trial.closed = True
        return [Close(trial.request_id)]
