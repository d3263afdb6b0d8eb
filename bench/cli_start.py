"""Wall time and CPU of one ``det`` command, from exec to exit (issue 11).

A user submits from a shell, a script or a cron job: each ``det`` invocation is a new
interpreter, so what it imports before it acts is paid at every command. In a private
database (embedded PostgreSQL in a temporary DET_HOME, or the one DET_DB_URL names; no
reconciler, so nothing runs) this runs each command ``--repeats`` times, one after another, as
the database's owner (as ``det cluster up``'s user does on a local cluster), and prints the
median wall time and the median CPU (user + system) of the command's process. The first
``experiment create`` stores the model definition; later ones find it stored. Figures only.

    python bench/cli_start.py [--repeats 7]
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from private_db import private_database

CONFIG = """
name: cli
entrypoint: "true"
searcher: {name: single, metric: loss, max_length: {batches: 1}}
"""


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``det ARGV``; raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "det.cli.main", *argv], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with private_database() as db, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "exp.yaml"
        config.write_text(CONFIG)
        (Path(tmp) / "ctx").mkdir()
        env = {**os.environ, "DET_DB_URL": db.url}
        commands = [["--help"], ["job", "list"], ["experiment", "list"],
                    ["experiment", "create", str(config), str(Path(tmp) / "ctx")]]
        for argv in commands:
            runs = [timed(argv, env) for _ in range(args.repeats)]
            wall = statistics.median(w for w, _ in runs)
            cpu = statistics.median(c for _, c in runs)
            print(f"  det {' '.join(argv[:2]):<20} wall {wall:5.2f} s   CPU {cpu:5.2f} s")


if __name__ == "__main__":
    main()
