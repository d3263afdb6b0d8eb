"""``det preview-search CONFIG``: the trials a search will run and how long they train, from
the config alone (the reference's ``det preview-search``, Determined 0.38's ``random.go`` and
``adaptive_asha.go``).

``single``, ``random`` and ``grid`` train every trial to ``max_length``; ``adaptive_asha``
shows, per bracket and rung, the rung's length, how many trials train to it and how many stop
there (``asha_preview``); so does ``tpe``, whose plan is one such bracket. Invalid-HP
replacements and failures are not foreseen.
"""

import math
from pathlib import Path

import typer

from det.cli.output import print_json, print_table
from det.configs import (
    AdaptiveAshaSearcher,
    GridSearcher,
    RandomSearcher,
    TPESearcher,
    iter_leaves,
    read_config_file,
)
from det.configs.load import parse_yaml
from det.reconciler.searchers import asha_preview
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


def preview_search(
    config_file: Path = typer.Argument(..., help="Experiment config (YAML).",
                                       metavar="CONFIG_FILE"),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show the trials a search will create and the training it will run."""
    data = search_preview(read_config_file(config_file), str(config_file))
    if json_:
        print_json(data)
        return
    unit, trials, units = data["unit"], data["trials"], data["units"]
    if "rungs" in data:
        print_table(
            data["rungs"],
            ["bracket", "rung", "length", "trials", "stopped", "units"],
            ["Bracket", "Rung", f"Trains to ({unit})", "Trials", "Stop here",
             f"Units ({unit})"],
        )
    else:
        print_table(data["plan"], ["trials", "length", "units"],
                    ["Trials", f"Trains to ({unit or 'set by the code'})",
                     f"Units ({unit or '-'})"])
    plural = "" if trials == 1 else "s"
    if units is None:
        typer.echo(f"{data['searcher']}: {trials} trial{plural}, each as long as its code "
                   "trains")
        return
    typer.echo(f"{data['searcher']}: {trials} trial{plural}, {units} {unit} of training in all")
