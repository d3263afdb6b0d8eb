"""``/api/v1/cluster/usage``: cluster historical usage, slot-hours per day by workspace, user,
label or pool, as JSON or CSV."""

from datetime import UTC, date, datetime
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from det.api.session import Session, session
from det.queries.usage import period, to_csv, totals, usage

router = APIRouter(prefix="/api/v1", tags=["cluster"])


@router.get("/cluster/usage", response_model=None)
def cluster_usage(
    s: Session = session,
    start: date | None = Query(None, description="First day (UTC); default: 14 days ending "
                                                 "at end."),
    end: date | None = Query(None, description="Last day, included (UTC); default: today."),
    group_by: Literal["workspace", "user", "label", "pool"] = Query("workspace"),
    format: Literal["json", "csv"] = Query("json", description="csv: a download, "
                                                               "day,<group_by>,slot_hours."),
) -> dict | Response:
    """Slot-hours the runs held per UTC day and group (det_user.cluster_usage: from a run's
    assignment to its end; a run with several labels counts in each label), for the
    workspaces the user may view. 400 naming start or end for a period that ends before it
    starts or spans over ten years."""
    first, last = period(start, end, datetime.now(UTC).date())
    rows = usage(s.conn, first, last, group_by)
    if format == "csv":
        return Response(to_csv(rows, group_by), media_type="text/csv", headers={
            "Content-Disposition":
                f'attachment; filename="det-usage-{group_by}-{first}-{last}.csv"'})
    return {"start": first, "end": last, "group_by": group_by, "usage": rows,
            "totals": [{"group": g, "slot_hours": h} for g, h in totals(rows).items()]}
