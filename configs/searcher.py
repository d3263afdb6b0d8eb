"""The ``searcher`` section: a union on ``name`` (Determined 0.38's searcher config defaults).

``single``, ``random`` and ``grid`` run every trial to ``max_length``; without one (optional
since the reference's 0.38) each trial gets one op of ``length.UNBOUNDED`` and its own code
decides when it is done (``Trainer.fit(max_length=)`` or its own loop); ``adaptive_asha`` trains
trials to rung lengths up to ``max_length`` (``reconciler/searchers/asha.py``), or, in the
reference's 0.38 form (``max_time`` + ``time_metric``), stops trials whose validation metrics,
which carry the time metric, rank below a rung's cut.
``tpe`` (det's own, not in the reference) proposes hyperparameters from the results so far,
with adaptive ASHA's early stopping optional (``reconciler/searchers/tpe.py``).
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from det.configs.length import UNITS, Length
from det.configs.limits import MAX_TRIALS, Int64, MetricName

MAX_RUNGS = 64
"""Bound on ASHA's ``max_rungs`` and each ``bracket_rungs`` entry."""

MAX_DIVISOR = 1024.0
"""Bound on ASHA's ``divisor``. With ``MAX_RUNGS`` it keeps every ``divisor ** rung`` the
searcher computes a finite float (1024 ** 63 = 2 ** 630); rung lengths that shrink by more
than 1024 per rung, or more than 64 rungs, are no search anyone runs."""

Divisor = Annotated[float, Field(gt=1, le=MAX_DIVISOR)]
Rungs = Annotated[int, Field(ge=1, le=MAX_RUNGS)]


class _SearcherBase(BaseModel):
    """Keys common to every searcher."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    metric: MetricName
    smaller_is_better: bool = True
    source_trial_id: Int64 | None = None
    source_checkpoint_uuid: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "_SearcherBase":
        if self.source_trial_id is not None and self.source_checkpoint_uuid is not None:
            raise PydanticCustomError(
                "searcher_source",
                "expected at most one of source_trial_id, source_checkpoint_uuid",
            )
        return self


class SingleSearcher(_SearcherBase):
    """One trial trained to ``max_length`` (random with max_trials=1, §1.3)."""

    name: Literal["single"]
    max_length: Length | None = None


class RandomSearcher(_SearcherBase):
    """``max_trials`` trials with sampled hyperparameters, at most ``max_concurrent_trials``
    alive at once (0 = no cap), each trained to ``max_length`` (§1.4)."""

    name: Literal["random"]
    max_length: Length | None = None
    max_trials: Annotated[int, Field(ge=1, le=MAX_TRIALS)]
    max_concurrent_trials: Annotated[int, Field(ge=0)] = 16


class GridSearcher(_SearcherBase):
    """One trial per grid point, at most ``max_concurrent_trials`` alive (0 = no cap), §1.5."""

    name: Literal["grid"]
    max_length: Length | None = None
    max_concurrent_trials: Annotated[int, Field(ge=0)] = 16


class AdaptiveAshaSearcher(_SearcherBase):
    """Adaptive ASHA (§1.7, §1.9): brackets of successive-halving rungs up to ``max_length``.

    ``divisor`` > 1 is the halving rate; ``mode`` (or an explicit ``bracket_rungs``) picks the
    brackets; ``stop_once`` false promotes waiting trials later, true only stops them.
    ``max_time`` and ``time_metric`` go together; one of them or ``max_length`` is required.
    With them the search is the reference's 0.38 one: rungs are values of the metric named
    ``time_metric`` (any name), trials are only stopped, and ``stop_once`` is ignored.
    """

    name: Literal["adaptive_asha"]
    max_trials: Annotated[int, Field(ge=1, le=MAX_TRIALS)]
    max_concurrent_trials: Annotated[int, Field(ge=0)] = 16
    divisor: Divisor = 4.0
    max_rungs: Rungs = 5
    mode: Literal["aggressive", "standard", "conservative"] = "standard"
    bracket_rungs: list[Rungs] = Field(default_factory=list)
    stop_once: bool = False
    max_length: Length | None = None
    max_time: Annotated[Int64, Field(ge=1)] | None = None
    time_metric: MetricName | None = None

    @model_validator(mode="before")
    @classmethod
    def _time_as_length(cls, data: Any) -> Any:
        """``max_time: N`` with ``time_metric`` batches, records or epochs also fills
        ``max_length`` with ``{time_metric: N}``, so that det's own trainer, which follows
        searcher operations, knows how long to train (§1.7: 0.38's ``Length()``). Any other
        time metric leaves ``max_length`` unset: the trial's code decides its length."""
        if not isinstance(data, dict) or data.get("max_time") is None:
            return data
        metric = data.get("time_metric")
        if metric is None:
            return data  # the after-validator names the missing key
        length = {metric: data["max_time"]} if metric in UNITS else None
        if data.get("max_length") is not None and data["max_length"] != length:
            raise PydanticCustomError(
                "asha_time", "give max_length or max_time with time_metric, not both",
                {"dotted_path": "searcher.max_length"})
        return data if length is None else {**data, "max_length": length}

    @model_validator(mode="after")
    def _needs_a_length(self) -> "AdaptiveAshaSearcher":
        for key, other in (("max_time", "time_metric"), ("time_metric", "max_time")):
            if getattr(self, key) is not None and getattr(self, other) is None:
                raise PydanticCustomError(
                    "asha_time",
                    "required when searcher.{key} is set",
                    {"key": key, "dotted_path": f"searcher.{other}"},
                )
        if self.max_length is None and self.max_time is None:
            raise PydanticCustomError(
                "asha_length", "expected max_length, or both max_time and time_metric"
            )
        return self


class TPESearcher(_SearcherBase):
    """Tree-structured Parzen Estimator (Bergstra et al., "Algorithms for Hyper-Parameter
    Optimization", NeurIPS 2011) through Optuna's ``TPESampler``.

    ``max_trials`` trials (``invalid_hp`` ones replaced), at most ``max_concurrent_trials``
    training at once (0 = no cap). The first ``startup_trials`` with a result are sampled at
    random, later ones from the TPE model of the results reported so far; a trial created while
    others train does not see their results, hence a smaller default concurrency than the other
    searchers. ``max_rungs`` 1 (the default) trains every trial to ``max_length``; above 1 it
    adds adaptive ASHA's early stopping in one bracket of up to that many rungs, with
    ``divisor`` and ``stop_once`` as in ``adaptive_asha``.
    """

    name: Literal["tpe"]
    max_length: Length
    max_trials: Annotated[int, Field(ge=1, le=MAX_TRIALS)]
    max_concurrent_trials: Annotated[int, Field(ge=0)] = 4
    startup_trials: Annotated[int, Field(ge=0)] = 10
    divisor: Divisor = 4.0
    max_rungs: Rungs = 1
    stop_once: bool = False

    def as_asha(self) -> AdaptiveAshaSearcher:
        """The adaptive ASHA searcher whose rungs and decisions ``tpe`` uses: one bracket
        (``aggressive``) of up to ``max_rungs`` rungs."""
        return AdaptiveAshaSearcher(
            name="adaptive_asha", metric=self.metric, smaller_is_better=self.smaller_is_better,
            max_trials=self.max_trials, max_concurrent_trials=self.max_concurrent_trials,
            divisor=self.divisor, max_rungs=self.max_rungs, mode="aggressive",
            stop_once=self.stop_once, max_length=self.max_length)


def _name(value: Any) -> Any:
    if isinstance(value, dict):
        return value.get("name")
    return getattr(value, "name", None)


SearcherConfig = Annotated[
    Annotated[SingleSearcher, Tag("single")]
    | Annotated[RandomSearcher, Tag("random")]
    | Annotated[GridSearcher, Tag("grid")]
    | Annotated[AdaptiveAshaSearcher, Tag("adaptive_asha")]
    | Annotated[TPESearcher, Tag("tpe")],
    Discriminator(
        _name,
        custom_error_type="bad_union_tag:name",
        custom_error_message="expected one of single|random|grid|adaptive_asha|tpe",
    ),
]
"""The ``searcher`` section, tagged by ``name``."""
