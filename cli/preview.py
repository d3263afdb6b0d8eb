"""``det preview-search CONFIG``: the trials a search will run and how long they train, from
the config alone (the reference's ``det preview-search``, reference-facts §1.3, §1.7).

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
    load_experiment_config,
    read_config_file,
)
from det.reconciler.searchers import asha_preview
from det.reconciler.searchers.sampling import grid_axis


def preview_search(
    config_file: Path = typer.Argument(..., help="Experiment config (YAML).",
                                       metavar="CONFIG_FILE"),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show the trials a search will create and the training it will run."""
    text = read_config_file(config_file)
    config = load_experiment_config(text, source=str(config_file))
    searcher = config.searcher
    if isinstance(searcher, AdaptiveAshaSearcher | TPESearcher):
        asha = searcher if isinstance(searcher, AdaptiveAshaSearcher) else searcher.as_asha()
        brackets = asha_preview(asha)
        unit = searcher.max_length.unit if searcher.max_length else ""
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
        if not json_:
            print_table(
                rows,
                ["bracket", "rung", "length", "trials", "stopped", "units"],
                ["Bracket", "Rung", f"Trains to ({unit})", "Trials", "Stop here",
                 f"Units ({unit})"],
            )
        trials = sum(preview.bracket.max_trials for preview in brackets)
        units = sum(preview.units for preview in brackets)
    else:
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
        rows = [{"trials": trials, "length": length, "units": units}]
        if not json_:
            print_table(rows, ["trials", "length", "units"],
                        ["Trials", f"Trains to ({unit or 'set by the code'})",
                         f"Units ({unit or '-'})"])
    if json_:
        print_json({"searcher": searcher.name, "unit": unit, "trials": trials, "units": units,
                    "rungs" if "rung" in rows[0] else "plan": rows})
        return
    plural = "" if trials == 1 else "s"
    if units is None:
        typer.echo(f"{searcher.name}: {trials} trial{plural}, each as long as its code trains")
        return
    typer.echo(f"{searcher.name}: {trials} trial{plural}, {units} {unit} of training in all")
