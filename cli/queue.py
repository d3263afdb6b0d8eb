"""``det job list | update | update-batch | explain``: the job queue (spec: run-training-code,
View / Modify the Job Queue)."""

import typer

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.configs.job import JOB_FIELDS, job_change, parse_job_id
from det.errors import DetError, NotFoundError
from det.queries.queue import explain_reasons
from det.reconciler import leader
from det.sql import named

Q = named("cli")
READ = named("queries")

app = typer.Typer(no_args_is_help=True)

@app.command("list")
def list_jobs(
    resource_pool: str = typer.Option(None, "--resource-pool", help="Only this pool's queue."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Add why each job waits."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Active jobs in scheduling order: queued (no resources yet) or scheduled."""
    with db() as conn:
        rows = conn.execute(READ.job_queue, {"pool": resource_pool, "job": None}).fetchall()
        leading = leader.current(conn)
    for r in rows:
        r["reasons"] = explain_reasons(r, leading)
    if json_:
        print_json(rows)
        return
    for r in rows:
        r["slots"] = f"{r['slots_acquired']}/{r['slots_needed']}"
        r["priority_or_weight"] = r["weight"] if r["scheduler"] == "fair_share" else r["priority"]
    fair = {r["scheduler"] for r in rows} == {"fair_share"}
    cols = ["queue_order", "job_id", "type", "name", "priority_or_weight", "submitted_at",
            "slots", "status", "owner"]
    heads = ["#", "ID", "Type", "Job Name", "Weight" if fair else "Priority", "Submitted",
             "Slots (acquired/needed)", "Status", "User"]
    if resource_pool is None:
        cols.insert(1, "resource_pool")
        heads.insert(1, "Pool")
    if verbose:
        for r in rows:
            r["why"] = "; ".join(r["reasons"]) if r["status"] == "STATE_QUEUED" else ""
        cols.append("why")
        heads.append("Why waiting")
    print_table(rows, cols, heads)


app.command("ls", hidden=True)(list_jobs)


def _update(conn, job_id: int, field: str, value: str) -> None:
    """Apply one checked change (``value`` is what ``job_change`` returned)."""
    conn.execute(Q.job_update, (job_id, field, value))


@app.command("update")
def update(
    job_id: int = typer.Argument(..., metavar="JOB_ID"),
    priority: str = typer.Option(None, "--priority", metavar="N", help="1-99; lower runs first."),
    weight: str = typer.Option(None, "--weight", metavar="W",
                               help="Fair-share weight: a number > 0, at most 1e6."),
    resource_pool: str = typer.Option(None, "--resource-pool", metavar="POOL",
                                      help="Experiments only."),
    ahead_of: str = typer.Option(None, "--ahead-of", metavar="JOB_ID"),
    behind_of: str = typer.Option(None, "--behind-of", metavar="JOB_ID"),
) -> None:
    """Change one job: each option is checked against its pool's scheduler."""
    given = {"priority": priority, "weight": weight, "resource-pool": resource_pool,
             "ahead-of": ahead_of, "behind-of": behind_of}
    # Every value is checked before the transaction starts: a bad one changes nothing.
    job_id = parse_job_id(job_id)
    changes = {k: job_change(k, v, f"--{k}") for k, v in given.items() if v is not None}
    if not changes:
        raise DetError("nothing to update: give --priority, --weight, --resource-pool, "
                       "--ahead-of or --behind-of")
    with db() as conn, conn.transaction():
        for field, value in changes.items():
            _update(conn, job_id, field, value)
    typer.echo(f"Updated job {job_id}")


@app.command("update-batch")
def update_batch(
    changes: list[str] = typer.Argument(..., metavar="JOB_ID.FIELD=VALUE..."),
) -> None:
    """Several changes in one transaction: all apply or none
    (for example: 12.priority=1 13.resource-pool=gpu 14.ahead-of=12)."""
    parsed = []
    for change in changes:
        target, sep, value = change.partition("=")
        job, dot, field = target.partition(".")
        if not (sep and dot and value):
            raise DetError(f"{change!r}: expected JOB_ID.FIELD=VALUE, e.g. 12.priority=1")
        if field not in JOB_FIELDS:
            raise DetError(f"{change!r}: unknown job field {field!r}; expected one of "
                           f"{', '.join(JOB_FIELDS)}")
        value = job_change(field, value.strip('"'), target)
        parsed.append((parse_job_id(job, target), field, value))
    with db() as conn, conn.transaction():
        for job, field, value in parsed:
            _update(conn, job, field, value)
    typer.echo(f"Applied {len(parsed)} change(s)")


@app.command("explain")
def explain(
    job_id: int = typer.Argument(..., metavar="JOB_ID"),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Why is this job not (fully) running? The scheduler's own reasons from its last pass."""
    with db() as conn:
        job = conn.execute(READ.job_queue, {"pool": None, "job": job_id}).fetchone()
        leading = leader.current(conn)
        ended = conn.execute(READ.job_state, {"id": job_id}).fetchone() if job is None else None
    if job is None and ended is not None:
        typer.echo(f"Job {job_id} ({ended['what']}) is {ended['state']}: "
                   "it is no longer queued")
        return
    if job is None:
        raise NotFoundError(f"job {job_id} not found")
    reasons = explain_reasons(job, leading)
    if json_:
        print_json({"job_id": job_id, "status": job["status"], "reasons": reasons})
        return
    typer.echo(f"Job {job_id} ({job['name']}): {job['status']}, "
               f"{job['slots_acquired']}/{job['slots_needed']} slots, pool "
               f"{job['resource_pool']} ({job['scheduler']})")
    for r in reasons or ["nothing is waiting"]:
        typer.echo(f"  - {r}")
