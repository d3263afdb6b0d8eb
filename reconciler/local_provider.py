"""The ``local`` provider: elastic agents as ``det agent run`` processes on the reconciler's
host, for development and the tests.

An instance is found by its name: the agent process's command line carries ``--id
det-instance-<row id>`` and its work directory, ``<log_dir>/<row id's name>``, so a restarted
reconciler finds the processes an earlier one launched (its pid recorded or not) by reading
``/proc``, and never another cluster's agent of the same name on this host (another det home's,
or one in a Slurm job). Launching spawns and returns (the agent
registers on its own), so a pass never waits for an agent to start.
"""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

AGENT_URL = "DET_AGENT_DB_URL"
"""The environment variable naming the URL the agents this provider starts connect with (the
det_agent role's: `det cluster up` sets it); without it they inherit the reconciler's
environment, DET_DB_URL and DET_TASK_DB_URL included (the deployer's choice)."""

def agent_env() -> dict[str, str]:
    """The environment of an agent a provider starts: the reconciler's, its database URL
    replaced by ``DET_AGENT_DB_URL``'s where that is set."""
    env = dict(os.environ)
    if env.get(AGENT_URL):  # never the reconciler's own (the owner's) login
        env["DET_DB_URL"] = env[AGENT_URL]
    return env


STOP_GRACE_SECONDS = 30.0
"""Seconds a stopped agent has after SIGTERM before SIGKILL: the agent gives its tasks 10 s
(det.agent.daemon.Agent.shutdown) and then deregisters."""


class LocalProvider:
    """Starts, finds and stops agent processes; their output goes to ``<log_dir>/<id>.log``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        # Children this process launched, reaped once they exit (an exited child that is not
        # waited for stays a zombie).
        self._children: list[subprocess.Popen] = []

    def work_dir(self, agent_id: str) -> Path:
        """The work directory of agent ``agent_id``, beside its log: it names this provider's
        agents apart from any other of the same id on the host."""
        return self.log_dir / agent_id

    def running(self) -> dict[str, int]:
        """This provider's live agent processes on this host: agent id -> pid (``/proc``)."""
        self._children = [p for p in self._children if p.poll() is None]
        found: dict[str, int] = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # it ended while we looked
            if b"agent" in argv and b"--id" in argv and b"--work-dir" in argv:
                name = argv[argv.index(b"--id") + 1] if argv.index(b"--id") + 1 < len(argv) \
                    else b""
                work = argv[argv.index(b"--work-dir") + 1] \
                    if argv.index(b"--work-dir") + 1 < len(argv) else b""
                if name.startswith(b"det-instance-") and \
                        work == bytes(self.work_dir(name.decode())):
                    found[name.decode()] = int(pid)
        return found

    def launch(self, agent_id: str, pool: str, slots: int) -> int:
        """Start ``det agent run`` for ``agent_id`` in ``pool`` with ``slots`` CPU slots (0: a
        host for zero-slot tasks only) in its own session, so it outlives the reconciler.
        Returns its pid.

        Raises:
            OSError: the process could not be started.
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "det.cli.main", "agent", "run", "--id", agent_id,
                "--resource-pool", pool, "--slots", str(slots),
                "--slot-type", "cpu" if slots else "none",
                "--work-dir", str(self.work_dir(agent_id))]
        env = agent_env()
        with open(self.log_dir / f"{agent_id}.log", "ab") as out:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, env=env,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        self._children.append(p)
        return p.pid

    def stop(self, pid: int, kill: bool = False) -> None:
        """Ask the agent at ``pid`` to stop (SIGTERM: a planned stop; sent once, as a second
        one would cut its shutdown short), or with ``kill``, SIGKILL it."""
        # One that is gone already is recorded GONE by the next look.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
