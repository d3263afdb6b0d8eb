"""``tpe``: hyperparameters proposed by a Tree-structured Parzen Estimator (Bergstra et al.,
"Algorithms for Hyper-Parameter Optimization", NeurIPS 2011, section 4) through Optuna's
``TPESampler``, with adaptive ASHA's early stopping optional.

The search is adaptive ASHA (``asha.py``) in one bracket: ``mode: aggressive`` with the
config's ``max_trials``, ``max_concurrent_trials``, ``divisor``, ``max_rungs``, ``stop_once``
and ``max_length``, so rungs, promotions, stops, ``invalid_hp`` replacement and the shutdown
rule are exactly adaptive ASHA's. ``max_rungs: 1`` (the default) leaves one rung at
``max_length``: every trial trains to the end, as in the paper. Only the choice of a new
trial's hyperparameters differs (``TPE.new_hparams``):

1. every trial created so far with a result becomes an Optuna trial, in creation order: one
   that reported the top rung is ``COMPLETE`` with that metric; one with results at lower rungs
   only (stopped, or waiting for a promotion) is ``PRUNED`` with its rung results as
   intermediate values (Optuna's TPE ranks those below every complete trial, higher rungs
   first); trials without a finite result yet (running, or errored before reporting) are left
   out, and so are ``invalid_hp`` trials (adaptive ASHA drops their results);
2. a fresh in-memory study (minimize, metrics negated when ``smaller_is_better`` is false)
   gets those trials and a ``TPESampler`` seeded with one draw from the search's RNG;
3. ``study.ask(distributions)`` proposes the values. Below ``startup_trials`` results it
   samples at random (Optuna's ``RandomSampler``), as the paper's initial random points.

The sampler is the paper's independent TPE (``multivariate=False``) without the constant liar
(running trials are not modelled); both are set explicitly, as Optuna 5 defaults to the
multivariate TPE. Nothing of Optuna is stored: the state holds the proposed values, so a stored
search replays bit-exactly with the same Optuna version.

Hyperparameters map to Optuna distributions by dotted name (``optimizer.lr`` for a nested
map): ``int`` -> ``IntDistribution(minval, maxval)``; ``double`` ->
``FloatDistribution(minval, maxval)``; ``log`` -> ``FloatDistribution(minval, maxval)`` over
the exponent (the value is ``base ** x``, as det's random sampling draws it); ``categorical``
-> ``CategoricalDistribution`` over the indices of ``vals`` (any JSON value may be a choice);
``const`` and empty nested maps are not searched.

Optuna is imported inside the functions that use it: the ``det`` CLI imports every searcher at
start-up, and importing Optuna costs about a quarter of a second.
"""

import copy
from typing import TYPE_CHECKING, Any

from det.configs import (
    CategoricalHP,
    ConstHP,
    DoubleHP,
    ExperimentConfig,
    IntHP,
    LogHP,
    TPESearcher,
    iter_leaves,
)
from det.configs.hyperparameters import Leaf
from det.reconciler.searchers.actions import Action
from det.reconciler.searchers.asha import AdaptiveAsha
from det.reconciler.searchers.state import SearchState

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.trial import FrozenTrial


def distributions(config: ExperimentConfig) -> dict[str, "BaseDistribution"]:
    """Dotted name -> Optuna distribution of every searched hyperparameter, names sorted.

    Raises ``ValueError`` when two routes give the same dotted name (a name holding a dot).
    """
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    result: dict[str, BaseDistribution] = {}
    routes: set[str] = set()
    for route, hp in iter_leaves(config.hyperparameters):
        name = ".".join(route)
        if name in routes:
            raise ValueError(f"hyperparameters: two names read {name!r} once flattened")
        routes.add(name)
        if isinstance(hp, IntHP):
            result[name] = IntDistribution(hp.minval, hp.maxval)
        elif isinstance(hp, DoubleHP | LogHP):
            result[name] = FloatDistribution(hp.minval, hp.maxval)
        elif isinstance(hp, CategoricalHP):
            result[name] = CategoricalDistribution(list(range(len(hp.vals))))
    return result


def hparams_from_params(config: ExperimentConfig, params: dict[str, Any]) -> dict[str, Any]:
    """The trial's hyperparameters (nested, names sorted) from Optuna's ``params`` (dotted
    name -> int, float exponent or category index)."""
    hparams: dict[str, Any] = {}
    for route, hp in iter_leaves(config.hyperparameters):
        node = hparams
        for key in route[:-1]:
            node = node.setdefault(key, {})
        node[route[-1]] = _value(hp, params.get(".".join(route)))
    return hparams


def _value(hp: Leaf | None, param: Any) -> Any:
    if hp is None:
        return {}
    if isinstance(hp, ConstHP):
        return copy.deepcopy(hp.val)
    if isinstance(hp, IntHP):
        return int(param)
    if isinstance(hp, DoubleHP):
        return float(param)
    if isinstance(hp, LogHP):
        return float(hp.base**param)
    return copy.deepcopy(hp.vals[int(param)])


class TPE(AdaptiveAsha):
    """``tpe``. ``method_state`` is adaptive ASHA's (one bracket) plus::

        {"params": [{dotted_name: int | float | category_index, ...}, ...]}

    the Optuna values proposed for each trial, parallel to ``SearchState.trials`` (every trial
    is created by ``new_hparams``, in order).
    """

    def __init__(self, config: ExperimentConfig) -> None:
        if not isinstance(config.searcher, TPESearcher):
            raise TypeError(f"TPE cannot run searcher {config.searcher.name!r}")
        self.tpe = config.searcher
        super().__init__(config.model_copy(update={"searcher": self.tpe.as_asha()}))
        self.distributions = distributions(config)

    def initial(self, state: SearchState) -> list[Action]:
        state.method_state["params"] = []
        return super().initial(state)

    def new_hparams(self, state: SearchState) -> dict[str, Any]:
        """Values proposed by TPE from the results so far (module docstring); one draw from
        ``state.rng`` seeds the sampler."""
        import optuna

        stored = state.method_state["params"]
        if len(stored) != len(state.trials):
            raise AssertionError("tpe: params and trials are out of step")
        seed = int(state.rng.randint(0, 2**31))
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no INFO line per study
        study = optuna.create_study(
            study_name="det-tpe",
            direction="minimize",
            sampler=optuna.samplers.TPESampler(
                seed=seed,
                n_startup_trials=self.tpe.startup_trials,
                multivariate=False,
                constant_liar=False,
            ),
        )
        for trial in self.observations(state):
            study.add_trial(trial)
        params = dict(study.ask(self.distributions).params)
        stored.append(params)
        return hparams_from_params(self.config, params)

    def observations(self, state: SearchState) -> list["FrozenTrial"]:
        """The finished and stopped trials as Optuna trials, in creation order (module
        docstring, step 1); intermediate values are keyed by rung length."""
        from optuna.trial import TrialState, create_trial

        rungs = self.brackets[0].rungs
        results: dict[str, dict[int, float]] = {}
        for length, entries in zip(rungs, state.method_state["brackets"][0]["rungs"], strict=True):
            for entry in entries:
                if entry["metric"] is not None:  # None: exited early, or not finite
                    results.setdefault(entry["id"], {})[length] = entry["metric"]
        trials = []
        for record, params in zip(state.trials, state.method_state["params"], strict=True):
            values = results.get(record.request_id)
            if not values:
                continue
            top = values.get(rungs[-1])
            trials.append(
                create_trial(
                    state=TrialState.PRUNED if top is None else TrialState.COMPLETE,
                    value=top,
                    params=params,
                    distributions=self.distributions,
                    intermediate_values=values,
                )
            )
        return trials
