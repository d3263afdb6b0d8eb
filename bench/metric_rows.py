"""Training-metric rows one task reports per second, through the Core API into PostgreSQL.

Brings up a private embedded PostgreSQL in a temporary DET_HOME, creates a one-trial
experiment, lets a real reconciler pass (in this process) create and place its allocation on a
registered agent, and claims it as the agent does (``det_agent.claim`` gives the token). Then,
as a Core API script would, it calls ``ctx.train.report_training_metrics(step, {...})`` for
steps 1..N with ``--values`` floats each over a ``DbTransport``, and times from the first
report until the ``core.init`` block has closed the transport (every row flushed to the
``metrics`` table). It reads the rows back: their count must be N and their steps 1..N in
insertion order (a mismatch is printed loudly and the exit status is 1).

Anchor: the same N rows (the same dicts, JSON-encoded inside the timing) written by one
PostgreSQL ``COPY metrics ... FROM STDIN`` into the same table, then deleted.

``--profile FILE`` runs the report loop under cProfile (the main thread and the transport's
threads, each to ``FILE.<thread name>``, e.g. ``FILE.det-reports-1`` for the writer) and prints
the top functions by cumulative time; its rows/s are then not comparable. Figures only, no
timing assertions.

    python bench/metric_rows.py [--rows 50000] [--values 4] [--profile /tmp/metric_rows.prof]
"""

import argparse
import cProfile
import json
import pstats
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from private_db import postgres_cpu, private_database
from psycopg.types.json import Jsonb

from det.configs import load_experiment_config
from det.db import connect
from det.harness import core
from det.harness.transport import DbTransport
from det.reconciler.passes import Settings, run_pass

CONFIG = """
name: metric-rows
entrypoint: "true"
searcher: {name: single, metric: loss, max_length: {batches: 1}}
max_restarts: 0
"""


def claim(url: str, storage: Path) -> tuple[int, int, str]:
    """Create the experiment, place its allocation with reconciler passes, claim it as agent
    ``bench``. Returns (allocation id, trial id, token)."""
    config = load_experiment_config(CONFIG).expanded()
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(storage)}
    with connect(url, autocommit=True) as c:
        c.execute("SELECT det_agent.register('bench', 'localhost', 'default', 'process', %s)",
                  (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
        c.execute("SELECT det_user.create_experiment(%s, '', NULL)", (Jsonb(config),))
        for _ in range(5):
            run_pass(c, Settings(), "bench")
            row = c.execute("SELECT id, trial_id FROM allocations WHERE agent_id = 'bench' "
                            "AND state = 'ASSIGNED'").fetchone()
            if row:
                break
        else:
            raise SystemExit("the reconciler placed no allocation on the bench agent")
        token = c.execute("SELECT det_agent.claim('bench', %s) AS t",
                          (row["id"],)).fetchone()["t"]
    return int(row["id"]), int(row["trial_id"]), token


def metrics(step: int, width: int) -> dict[str, float]:
    """Step ``step``'s training metrics: ``width`` floats."""
    return {f"m{k}": 1.0 / (step + k) for k in range(width)}


@contextmanager
def profiled(path: str | None) -> Iterator[None]:
    """cProfile this thread and every thread started inside (the transport's writer and
    preemption watcher), each into ``path.<thread name>``, and print the top of each; nothing
    when ``path`` is None."""
    if path is None:
        yield
        return
    profiles: dict[str, cProfile.Profile] = {}
    original_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        profile = profiles.setdefault(self.name, cProfile.Profile())
        profile.runcall(original_run, self)

    threading.Thread.run = run  # type: ignore[method-assign]
    main = profiles.setdefault("main", cProfile.Profile())
    main.enable()
    try:
        yield
    finally:
        main.disable()
        threading.Thread.run = original_run  # type: ignore[method-assign]
        for name, profile in profiles.items():
            profile.dump_stats(f"{path}.{name}")
            print(f"\n--- profile of thread {name!r} (top 25 by cumulative time) ---")
            pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


def report_rows(url: str, alloc: int, token: str, n: int, width: int,
                profile: str | None, home: Path | None) -> float:
    """Report steps 1..n through the Core API; seconds from the first report until the
    transport is closed (every row written). Prints the CPU seconds the reporting process
    and the server spent meanwhile."""
    rows = [metrics(step, width) for step in range(1, n + 1)]
    cpu, server = time.process_time(), postgres_cpu(home)
    with profiled(profile):
        with core.init(transport=DbTransport(url, alloc, token)) as ctx:
            start = time.perf_counter()
            for step, values in enumerate(rows, start=1):
                ctx.train.report_training_metrics(step, values)
            reported = time.perf_counter()
        closed = time.perf_counter()  # core.init closed the transport: every row written
    print(f"  last report returned after {reported - start:.2f} s, close took "
          f"{closed - reported:.2f} s; CPU s: the task {time.process_time() - cpu:.2f}, "
          f"postgres {postgres_cpu(home) - server:.2f}")
    return closed - start


def check(url: str, trial: int, n: int) -> bool:
    """Print whether the trial's training rows are steps 1..n in insertion order."""
    with psycopg.connect(url) as c:
        steps = [r[0] for r in c.execute(
            "SELECT steps_completed FROM metrics WHERE trial_id = %s AND \"group\" = 'training' "
            "ORDER BY id", (trial,))]
    in_order = steps == list(range(1, n + 1))
    status = "ok" if in_order else "WRONG"
    print(f"  rows in the table: {len(steps):,} of {n:,}, steps 1..N in order: {in_order} "
          f"[{status}]")
    if not in_order:
        missing = n - len(set(steps) & set(range(1, n + 1)))
        print(f"  !!! ROWS LOST OR OUT OF ORDER: {missing:,} steps missing, "
              f"{len(steps) - len(set(steps)):,} duplicated !!!")
    return in_order


def copy_anchor(url: str, alloc: int, trial: int, n: int, width: int) -> float:
    """Seconds to COPY the same n rows (JSON encoded inside the timing) into ``metrics``; the
    rows are deleted afterwards."""
    rows = [metrics(step, width) for step in range(1, n + 1)]
    with psycopg.connect(url) as c:
        start = time.perf_counter()
        with c.cursor().copy('COPY metrics (trial_id, allocation_id, "group", steps_completed, '
                             '"values") FROM STDIN') as copy:
            for step, values in enumerate(rows, start=1):
                copy.write_row((trial, alloc, "copy", step, json.dumps(values)))
        c.commit()
        seconds = time.perf_counter() - start
        written = c.execute("DELETE FROM metrics WHERE trial_id = %s AND \"group\" = 'copy'",
                            (trial,)).rowcount
        c.commit()
    if written != n:
        print(f"  !!! COPY wrote {written:,} rows, not {n:,} !!!")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000, help="rows to report (default 50,000)")
    ap.add_argument("--values", type=int, default=4, help="floats per row (default 4)")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the report loop into FILE.*")
    args = ap.parse_args()
    with private_database() as db, tempfile.TemporaryDirectory() as storage:
        url = db.url
        alloc, trial, token = claim(url, Path(storage))
        print(f"{args.rows:,} training-metric rows of {args.values} floats, one task:")
        seconds = report_rows(url, alloc, token, args.rows, args.values, args.profile,
                              db.home)
        print(f"  report_training_metrics -> all rows written: {seconds:.2f} s, "
              f"{args.rows / seconds:,.0f} rows/s")
        ok = check(url, trial, args.rows)
        copy_seconds = copy_anchor(url, alloc, trial, args.rows, args.values)
        print(f"  anchor, one COPY of the same rows: {copy_seconds:.2f} s, "
              f"{args.rows / copy_seconds:,.0f} rows/s")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
