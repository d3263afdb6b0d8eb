"""What row-level security costs: `det experiment list` and the scheduling pass with
``--workspaces`` workspaces x ``--per-workspace`` experiments (issue 14).

In a private embedded PostgreSQL, each experiment gets a job with one queued allocation, a
trial and a validation metric (rows inserted directly). Three users: a Viewer of one
workspace, a ClusterAdmin (row-level security on, every row visible) and the schema's owner
(which bypasses row-level security, as the reconciler does). Printed, medians of
``--repeats``:
  * the list query of `det experiment list` (queries.experiments.list_experiments), as each
    user, for the whole list and for one workspace's (the Viewer's own rows, which the owner
    selects with the workspace filter instead of row security);
  * `det experiment list` end to end (a CLI process) as the Viewer and as the ClusterAdmin;
  * one scheduling pass over the queue (read, decide, write) as the owner, which is what the
    reconciler runs, with the tables' row-level security on and (in a rolled-back
    transaction) off: policies do not apply to the owner, so the two should match.

    python bench/row_security.py [--workspaces 100] [--per-workspace 100] [--repeats 7]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import psycopg
from private_db import private_database
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.cli.users import password_verifier
from det.configs.cluster import SchedulerConfig
from det.queries.experiments import ListFilter, list_experiments
from det.reconciler.placement import apply, load_pool
from det.reconciler.schedulers import schedule

PASSWORD = "bench password"

POLICY_TABLES = ["workspaces", "projects", "jobs", "experiments", "trials", "allocations"]

SETUP = """
INSERT INTO workspaces (name, created_by)
SELECT 'ws-' || lpad(w::text, 4, '0'), 'bench' FROM generate_series(1, %(w)s) w;
INSERT INTO projects (workspace_id, name, created_by)
SELECT id, 'p', 'bench' FROM workspaces WHERE id > 1;
INSERT INTO agents (id, hostname, resource_pool, runtime)
SELECT 'agent-' || lpad(i::text, 5, '0'), 'host' || i, 'default', 'process'
  FROM generate_series(1, 100) i;
INSERT INTO slots (agent_id, slot_id, type)
SELECT g.id, s, 'cpu' FROM agents g, generate_series(0, 7) s;
INSERT INTO jobs (type, resource_pool, priority, weight, queue_position, owner, workspace_id)
SELECT 'EXPERIMENT', 'default', 1 + (i * 37) %% 99, 1, i, 'bench', p.workspace_id
  FROM projects p, generate_series(1, %(n)s) i WHERE p.id > 1;
INSERT INTO experiments (job_id, name, config, original_config, owner, project_id)
SELECT j.id, 'exp-' || j.id, %(config)s, '', 'bench', p.id
  FROM jobs j JOIN projects p ON p.workspace_id = j.workspace_id;
INSERT INTO trials (experiment_id, request_id, hparams, seed, best_validation)
SELECT id, gen_random_uuid(), '{}', 0, random() FROM experiments;
INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec)
SELECT e.job_id, t.id, 1, 'default', 1, '{}' FROM experiments e JOIN trials t
    ON t.experiment_id = e.id
"""

CONFIG = {"name": "x", "entrypoint": "true",
          "resources": {"slots_per_trial": 1, "resource_pool": "default", "weight": 1.0},
          "searcher": {"name": "single", "metric": "loss", "smaller_is_better": True,
                       "max_length": {"batches": 1}}}


def timed(f, repeats: int) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls of ``f``, and its last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workspaces", type=int, default=100)
    p.add_argument("--per-workspace", type=int, default=100)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    with (private_database(embedded_only=True) as db,
          psycopg.connect(db.url, row_factory=dict_row, autocommit=True) as owner):
        with owner.transaction():
            for stmt in SETUP.split(";"):
                owner.execute(stmt, {"w": args.workspaces, "n": args.per_workspace,
                                     "config": Jsonb(CONFIG)})
            for name, admin in (("viewer", False), ("admin", True)):
                owner.execute("SELECT det_user.user_create(%s, %s, %s)",
                              (name, password_verifier(owner, name, PASSWORD), admin))
            owner.execute("SELECT det_user.role_assign('Viewer', 'viewer', NULL, 'ws-0001', true)")
            # the Uncategorized Editor role every user gets would show nothing here anyway
        owner.execute("ANALYZE")
        n = owner.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"]
        print(f"{args.workspaces} workspaces x {args.per_workspace} experiments = {n}; "
              f"median of {args.repeats} (ms)")
        conns = {"owner (no row security)": owner}
        for name in ("admin", "viewer"):
            conns[f"{name} ({'ClusterAdmin' if name == 'admin' else 'Viewer of ws-0001'})"] = \
                psycopg.connect(make_conninfo(db.url, user=name, password=PASSWORD),
                                row_factory=dict_row, autocommit=True)
        print(f"{'list query as':<32} {'rows':>6} {'all':>8} {'ws-0001':>8}")
        for label, conn in conns.items():
            whole, rows = timed(lambda c=conn: list_experiments(c, ListFilter()), args.repeats)
            one, _ = timed(lambda c=conn: list_experiments(c, ListFilter(workspace="ws-0001")),
                           args.repeats)
            print(f"{label:<32} {len(rows):>6} {whole * 1e3:>8.1f} {one * 1e3:>8.1f}")
        env = {**os.environ}
        print(f"{'det experiment list (process) as':<32} {'':>6} {'ms':>8}")
        for name in ("admin", "viewer"):
            env["DET_DB_URL"] = make_conninfo(db.url, user=name, password=PASSWORD)
            t, _ = timed(lambda: subprocess.run(
                [sys.executable, "-m", "det.cli.main", "experiment", "list"], env=env,
                check=True, capture_output=True), max(3, args.repeats // 2))
            print(f"{name:<32} {'':>6} {t * 1e3:>8.0f}")
        config = SchedulerConfig.model_validate({"type": "priority"})

        def one_pass(policies: bool) -> None:
            with owner.transaction(force_rollback=True):
                if not policies:
                    for table in POLICY_TABLES:
                        owner.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
                state = load_pool(owner, "default")
                apply(owner, schedule(config, state.agents, state.tasks), set(), set(),
                      state.reasons)

        for policies in (True, False, True, False):
            t, _ = timed(lambda p=policies: one_pass(p), args.repeats)
            print(f"scheduling pass as the owner (the reconciler), {n} queued jobs, 800 slots, "
                  f"row security {'on ' if policies else 'off'}: {t * 1e3:.1f} ms")
        for c in conns.values():
            if c is not owner:
                c.close()


if __name__ == "__main__":
    main()
