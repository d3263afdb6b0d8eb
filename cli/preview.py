"""``det preview-search CONFIG``: the trials a search will run and how long they train, from
the config alone (:func:`det.reconciler.searchers.preview.search_preview`).
"""

from pathlib import Path

import typer

from det.cli.output import print_json, print_table
from det.configs import read_config_file
from det.reconciler.searchers.preview import search_preview


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
