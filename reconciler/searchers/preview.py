"""The plan of a search from its config alone: the trials it will run and how long they
train, as Determined 0.38's ``det preview-search`` shows it (its ``random.go`` and
``adaptive_asha.go``). `det preview-search` and ``POST /api/v1/preview-search`` show it; it
reads and writes nothing.

``single``, ``random`` and ``grid`` train every trial to ``max_length``; ``adaptive_asha``
shows, per bracket and rung, the rung's length, how many trials train to it and how many stop
there (``asha_preview``); so does ``tpe``, whose plan is one such bracket. Invalid-HP
replacements and failures are not foreseen.
"""

import math

from det.configs import (
    AdaptiveAshaSearcher,
    GridSearcher,
    RandomSearcher,
    TPESearcher,
    iter_leaves,
)
from det.configs.load import parse_yaml
from det.reconciler.searchers.asha import asha_preview
from det.reconciler.searchers.sampling import grid_axis


def search_preview(text: str, source: str) -> dict:
    """The plan of the search the config ``text`` describes: ``searcher``, ``unit``,
    ``trials``, ``units`` (of training in all) and, per bracket and rung, ``rungs``
    (adaptive_asha, tpe), else ``plan``. `det preview-search` and
    ``POST /api/v1/preview-search`` show it.

    Raises:
        ConfigError: an invalid config, naming the field, validated as ``det experiment
            create`` validates it (:func:`det.submission.validated_config`).
    """
    # here, not above: det.submission brings the database driver, which no search method needs
    from det.submission import validated_config

    config = validated_config(parse_yaml(text, source), source)
    searcher = config.searcher
    if isinstance(searcher, AdaptiveAshaSearcher | TPESearcher):
        asha = searcher if isinstance(searcher, AdaptiveAshaSearcher) else searcher.as_asha()
        brackets = asha_preview(asha)
        # 0.38's form counts rungs in its time metric, which may be any metric's name.
        unit = asha.time_metric or (searcher.max_length.unit if searcher.max_length else "")
        rows = [
            {
                "bracket": b + 1,
                "rung": i + 1,
                "length": rung.length,
                "trials": rung.trials,
                "stopped": rung.stopped,
                "units": rung.length * rung.stopped,
            }
            for b, preview in enumerate(brackets)
            for i, rung in enumerate(preview.rungs)
        ]
        trials = sum(preview.bracket.max_trials for preview in brackets)
        units = sum(preview.units for preview in brackets)
        return {"searcher": searcher.name, "unit": unit, "trials": trials, "units": units,
                "rungs": rows}
    if isinstance(searcher, GridSearcher):
        trials = math.prod(len(grid_axis(hp)) for _, hp in iter_leaves(config.hyperparameters))
    elif isinstance(searcher, RandomSearcher):
        trials = searcher.max_trials
    else:
        trials = 1
    if searcher.max_length is None:  # each trial's code decides its length
        unit, length, units = "", None, None
    else:
        unit, length = searcher.max_length.unit, searcher.max_length.value
        units = trials * length
    return {"searcher": searcher.name, "unit": unit, "trials": trials, "units": units,
            "plan": [{"trials": trials, "length": length, "units": units}]}
