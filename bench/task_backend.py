"""The database server's CPU for one trial run's calls, on a fresh server process (as each det
task opens one) and on a warm one (as a connection pooler would hand out), issue 11.

Brings up a private embedded PostgreSQL, claims one trial's allocation (as bench/metric_rows.py
does) and replays, N times, what a toy-search run sends as ``det_task``: LISTEN on its channel,
``det_task.info``, ``det_task.should_preempt``, ``det_task.current_op``, a batch of 27 training
rows and one of a validation row (``det_task.report_metrics_batch``), ``det_task.complete_op`` of a
new searcher op, ``det_task.current_op``. Modes, alternated: **connect** (open and close a
connection, nothing sent), **fresh** (a new connection a run, as tasks connect directly), **warm**
(one connection for all runs, ``DISCARD ALL`` between them, the usual reset of a session-mode
pooler), **pooled** (the same with the agent's pooler's reset, ``det.agent.pooler.RESET_QUERY``,
which keeps the server's cached plans).
Printed: the server's CPU ms per run (its processes' user + system time, clock ticks of 10 ms
summed over N runs). Figures only.

    python bench/task_backend.py [--runs 100] [--rounds 2]
"""

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from metric_rows import claim
from private_db import postgres_cpu, private_database

from det.agent.pooler import RESET_QUERY
from det.db import channels, connect, roles

TRAINING_ROWS = 27


def run_calls(conn: psycopg.Connection, alloc: int, token: str, op: int) -> None:
    """One run's calls, in the order a Core API task makes them."""
    channels.listen_task(conn, token)
    conn.execute("SELECT det_task.info(%s)", (token,)).fetchone()
    conn.execute("SELECT det_task.should_preempt(%s)", (token,)).fetchone()
    conn.execute("SELECT det_task.current_op(%s)", (token,)).fetchone()
    writer = uuid.uuid4()
    values = [json.dumps({"loss": 1.0 / step}) for step in range(1, TRAINING_ROWS + 1)]
    conn.execute("SELECT det_task.report_metrics_batch(%s, %s, 1, %s, %s, %b::jsonb[])",
                 (token, writer, ["training"] * TRAINING_ROWS,
                  list(range(1, TRAINING_ROWS + 1)), values)).fetchone()
    conn.execute("SELECT det_task.report_metrics_batch(%s, %s, 2, %s, %s, %b::jsonb[])",
                 (token, writer, ["validation"], [TRAINING_ROWS],
                  [json.dumps({"loss": 0.5})])).fetchone()
    conn.execute("SELECT det_task.complete_op(%s, %s, 0.5)", (token, op)).fetchone()
    conn.execute("SELECT det_task.current_op(%s)", (token,)).fetchone()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with private_database(embedded_only=True) as db, tempfile.TemporaryDirectory() as storage:
        alloc, trial, token = claim(db.url, Path(storage))
        task_url = roles.task_url(db.home)
        with connect(db.url, autocommit=True) as owner:
            def new_op() -> int:
                return owner.execute("INSERT INTO searcher_ops (trial_id, length) "
                                     "VALUES (%s, %s) RETURNING id",
                                     (trial, TRAINING_ROWS)).fetchone()["id"]

            def measure(mode: str) -> float:
                ops = [new_op() for _ in range(args.runs)]
                # prepare_threshold=None: a reset drops prepared statements, and each of
                # the pooler's clients would be a new psycopg connection with none of its own
                warm = (psycopg.connect(task_url, autocommit=True, prepare_threshold=None)
                        if mode in ("warm", "pooled") else None)
                reset = "DISCARD ALL" if mode == "warm" else RESET_QUERY
                if warm is not None:
                    run_calls(warm, alloc, token, new_op())  # the pooler's first client
                    warm.execute(reset)
                time.sleep(0.2)
                before = postgres_cpu(db.home)
                for op in ops:
                    if mode == "connect":
                        psycopg.connect(task_url, autocommit=True).close()
                    elif mode == "fresh":
                        with psycopg.connect(task_url, autocommit=True) as conn:
                            run_calls(conn, alloc, token, op)
                    else:
                        run_calls(warm, alloc, token, op)
                        warm.execute(reset)
                time.sleep(0.2)  # exited server processes are counted once reaped
                spent = postgres_cpu(db.home) - before
                if warm is not None:
                    warm.close()
                return spent * 1000 / args.runs

            print(f"server CPU ms per run, {args.runs} runs each (one trial run's calls as "
                  f"det_task):")
            for _ in range(args.rounds):
                print("  " + "   ".join(f"{mode} {measure(mode):5.2f}"
                                        for mode in ("connect", "fresh", "warm", "pooled")))


if __name__ == "__main__":
    main()
