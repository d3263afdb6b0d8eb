"""``det job simulate``: what a scheduler would do, without writing anything.

``--scenario FILE`` runs one pass over a scenario file (format: :mod:`det.reconciler.schedulers
.scenario`); otherwise the current queue and agents of each pool are replayed under the pool's
scheduler, or under the one ``--scheduler`` names.
"""

from pathlib import Path
from typing import Literal

import typer

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.configs import read_config_file
from det.configs.cluster import SchedulerConfig
from det.errors import ConfigError
from det.queries.cluster import pool_schedulers
from det.reconciler.placement import load_pool
from det.reconciler.schedulers import Agent, Decision, Task, schedule
from det.reconciler.schedulers.scenario import load_scenario


def outcome_rows(pool: str, tasks: list[Task], d: Decision) -> list[dict]:
    """One row per task: what the pass would do with it."""
    released = set(d.release)
    rows = []
    for t in tasks:
        if t.id in d.allocate:
            what = "start on " + ", ".join(
                f"{a}" + (f"[{','.join(map(str, s))}]" if s else "")
                for a, s in d.allocate[t.id].items())
        elif t.id in released:
            what = "preempt"
        elif t.running:
            what = "keep running" + (" (stopping)" if t.stopping else "")
        else:
            what = "wait: " + d.reasons.get(t.id, "")
        rows.append({"pool": pool, "task": t.id, "job": t.job, "slots": t.slots,
                     "priority": t.priority, "weight": t.weight, "outcome": what})
    return rows


def _replay(pool: str | None, override: dict) -> list[tuple[str, SchedulerConfig,
                                                            list[Agent], list[Task]]]:
    out = []
    with db() as conn:
        for row in pool_schedulers(conn):
            if pool is not None and row["name"] != pool:
                continue
            config = SchedulerConfig.model_validate({**row["scheduler"], **override})
            state = load_pool(conn, row["name"])
            out.append((row["name"], config, state.agents, state.tasks))
    if pool is not None and not out:
        raise ConfigError("--resource-pool", f"no resource pool named {pool!r}")
    return out


def simulate(
    scenario: Path = typer.Option(None, "--scenario", help="A scenario file (YAML)."),
    scheduler: Literal["priority", "fair_share", "round_robin"] = typer.Option(
        None, "--scheduler", help="Replay under this scheduler instead of the pool's."),
    preemption: bool = typer.Option(None, "--preemption/--no-preemption",
                                    help="Priority scheduler: preempt or not."),
    fitting_policy: Literal["best", "worst"] = typer.Option(None, "--fitting-policy"),
    resource_pool: str = typer.Option(None, "--resource-pool", help="Only this pool."),
    json_: bool = typer.Option(False, "--json",
                               help="Print JSON: the ids to allocate and to release."),
) -> None:
    """One scheduling pass, printed and not applied: what would start, what would be
    preempted, and why the rest would wait."""
    override = {k: v for k, v in (("type", scheduler), ("preemption", preemption),
                                  ("fitting_policy", fitting_policy)) if v is not None}
    if scenario is not None:
        text = read_config_file(scenario)
        sc = load_scenario(text, str(scenario))
        config = SchedulerConfig.model_validate({**sc.scheduler.model_dump(), **override})
        runs = [("scenario", config, *sc.to_model())]
    else:
        runs = _replay(resource_pool, override)
    allocate, release, rows = [], [], []
    for pool, config, agents, tasks in runs:
        d = schedule(config, agents, tasks)
        allocate += [t.id for t in tasks if t.id in d.allocate]
        release += [t.id for t in tasks if t.id in set(d.release)]
        rows += outcome_rows(f"{pool} ({config.type})", tasks, d)
    if json_:
        print_json({"allocate": allocate, "release": release})
        return
    print_table(rows, ["pool", "task", "job", "slots", "priority", "weight", "outcome"],
                ["Pool (scheduler)", "Task", "Job", "Slots", "Priority", "Weight", "Outcome"])
