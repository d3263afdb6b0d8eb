"""``det cluster usage``: slot-hours per day by workspace, user, label or pool."""

from datetime import UTC, date, datetime

import typer

from det.cli.output import number, print_json, print_table
from det.cli.session import db
from det.errors import DetError
from det.queries.usage import DEFAULT_DAYS, period, to_csv, totals, usage


def _day(value: str | None, option: str) -> date | None:
    """``value`` (YYYY-MM-DD) as a date; None when not given.

    Raises:
        typer.BadParameter: not a date in that form (names ``option``).
    """
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"expected a date YYYY-MM-DD, got {value!r}",
                                 param_hint=option) from None


def cluster_usage(
    start: str = typer.Option(None, "--start", help=f"First day, YYYY-MM-DD (UTC; default: "
                                                    f"{DEFAULT_DAYS} days ending at --end)."),
    end: str = typer.Option(None, "--end", help="Last day, included (default: today, UTC)."),
    group_by: str = typer.Option("workspace", "--group-by",
                                 help="workspace, user, label (an experiment's labels; a run "
                                      "with several counts in each) or pool."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
    csv_: bool = typer.Option(False, "--csv", help="Print CSV: day,<group>,slot_hours."),
) -> None:
    """Cluster historical usage: the slot-hours runs held (from their assignment to their
    end) per UTC day and group, for the workspaces you may view."""
    if json_ and csv_:
        raise DetError("--json and --csv: choose one")
    first, last = period(_day(start, "--start"), _day(end, "--end"), datetime.now(UTC).date())
    with db() as conn:
        rows = usage(conn, first, last, group_by)
    if json_:
        print_json({"start": first, "end": last, "group_by": group_by, "usage": rows,
                    "totals": [{"group": g, "slot_hours": h} for g, h in totals(rows).items()]})
        return
    if csv_:
        typer.echo(to_csv(rows, group_by), nl=False)
        return
    typer.echo(f"Slot-hours from {first} to {last} (UTC) by {group_by}")
    if not rows:
        typer.echo("No usage in this period.")
        return
    table = [{"day": r["day"].isoformat(), "group": r["group"] or "(none)",
              "slot_hours": r["slot_hours"]} for r in rows]
    print_table(table, ["day", "group", "slot_hours"], ["Day", group_by.capitalize(),
                                                        "Slot-hours"])
    typer.echo("")
    typer.echo("Total: " + ", ".join(f"{g or '(none)'} {number(h)}"
                                     for g, h in totals(rows).items()))
