"""The agent's loop: each wake-up is a small reconciliation of what the database assigns to
this agent against the tasks it runs (DESIGN.md, "Agents").

* assigned, desired RUNNING, not running here: claim a token, unpack the context, launch;
* running here, desired KILLED: SIGTERM, grace period, SIGKILL (desired STOPPED is the task's
  own business: the harness sees it through ``should_preempt()``, checkpoints and exits);
* assigned here but unknown to this process (the agent restarted; its tasks died with it):
  report the run ended, so the reconciler restarts the trial from its checkpoint;
* ended here: flush its logs, report TERMINATED with exit code and reason.
It wakes on NOTIFY ``agent_<id>`` and also polls, so a lost notification only delays work.
"""

import logging
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from det import context
from det.agent.devices import Slot
from det.agent.logs import LogShipper
from det.agent.process import ProcessTask, exit_reason
from det.configs import entrypoint_argv, env_for_device
from det.db import connect

log = logging.getLogger("det.agent")

# Seconds a killed task gets between SIGTERM and SIGKILL.
KILL_GRACE = 10.0

ASSIGNMENTS = """
SELECT a.id, a.desired_state::text AS desired, a.state::text AS state, a.spec
  FROM allocations a
 WHERE a.agent_id = %(agent)s AND a.state <> 'TERMINATED'
 ORDER BY a.id
"""

CONTEXT_BLOB = "SELECT data FROM context_blobs WHERE id = %(id)s"


@dataclass
class AgentSettings:
    """``agent_id``: unique name (default: the hostname); ``pool``: its resource pool;
    ``work_dir``: where task directories live; ``heartbeat``/``poll``: seconds."""

    agent_id: str
    pool: str
    work_dir: Path
    heartbeat: float = 5.0
    poll: float = 1.0


class Agent:
    """One agent process. ``url``: the database URL, also handed to its tasks."""

    def __init__(self, url: str, settings: AgentSettings, slots: list[Slot]) -> None:
        self.url = url
        self.s = settings
        self.slots = slots
        self.device_type = slots[0].type if slots else "cpu"
        self.tasks: dict[int, ProcessTask] = {}
        self.conn = connect(url, autocommit=True)
        self.logs = LogShipper(url)
        self._last_heartbeat = 0.0

    def register(self) -> None:
        self.conn.execute(
            "SELECT det_agent_register(%s, %s, %s, 'process', %s)",
            (self.s.agent_id, socket.gethostname(), self.s.pool,
             psycopg.types.json.Jsonb([s.as_row() for s in self.slots])))
        self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(f"agent_{self.s.agent_id}")))
        log.info("agent %s registered %d %s slot(s) in pool %s", self.s.agent_id,
                 len(self.slots), self.device_type, self.s.pool)

    def run(self, stop_after: float | None = None) -> None:
        """Serve until interrupted (or for ``stop_after`` seconds, for tests)."""
        self.register()
        end = None if stop_after is None else time.monotonic() + stop_after
        try:
            while end is None or time.monotonic() < end:
                self._heartbeat()
                self.reconcile()
                for _ in self.conn.notifies(timeout=self.s.poll, stop_after=1):
                    pass
        finally:
            self.shutdown()

    def _heartbeat(self) -> None:
        if time.monotonic() - self._last_heartbeat < self.s.heartbeat:
            return
        row = self.conn.execute("SELECT det_agent_heartbeat(%s) AS state",
                                (self.s.agent_id,)).fetchone()
        self._last_heartbeat = time.monotonic()
        if row["state"] == "LOST":
            log.warning("the reconciler declared this agent lost; registering again")
            self.register()

    def reconcile(self) -> None:
        """One pass over this agent's assignments (see the module rules)."""
        assigned = self.conn.execute(ASSIGNMENTS, {"agent": self.s.agent_id}).fetchall()
        for row in assigned:
            task = self.tasks.get(row["id"])
            if task is not None:
                if row["desired"] == "KILLED":
                    task.kill(KILL_GRACE)
            elif row["desired"] != "RUNNING":
                self._report(row["id"], "TERMINATED", 0, "stopped before it started")
            elif row["state"] in ("ASSIGNED", "PULLING"):
                self._launch(row)
            else:
                self._report(row["id"], "TERMINATED", None,
                             "agent restarted; the task was lost with it")
        for alloc_id, task in list(self.tasks.items()):
            code = task.poll()
            if code is not None:
                self.logs.flush()
                self._report(alloc_id, "TERMINATED", code, exit_reason(code, task.killed))
                del self.tasks[alloc_id]
                shutil.rmtree(self._task_dir(alloc_id), ignore_errors=True)

    def _launch(self, row: dict) -> None:
        alloc_id, spec = row["id"], row["spec"]
        token = self.conn.execute("SELECT det_agent_claim(%s, %s) AS token",
                                  (self.s.agent_id, alloc_id)).fetchone()["token"]
        if token is None:
            return
        try:
            workdir = self._prepare_dir(alloc_id, spec.get("context_id"))
            env = {**os.environ,
                   **env_for_device(spec.get("environment") or {}, self.device_type),
                   "DET_DB_URL": self.url, "DET_ALLOCATION_ID": str(alloc_id),
                   "DET_ALLOCATION_TOKEN": token, "DET_AGENT_ID": self.s.agent_id,
                   "DET_TRIAL_ID": str(spec.get("trial_id", "")),
                   "DET_EXPERIMENT_ID": str(spec.get("experiment_id", "")),
                   "PYTHONUNBUFFERED": "1"}
            argv = entrypoint_argv(spec["entrypoint"], sys.executable)
            self.tasks[alloc_id] = ProcessTask(alloc_id, argv, env, workdir, self.logs)
        except Exception as e:  # any launch failure ends the run with a readable reason
            log.exception("allocation %s: launch failed", alloc_id)
            self._report(alloc_id, "TERMINATED", None, f"launch failed: {e}")
            return
        self._report(alloc_id, "RUNNING")
        log.info("allocation %s: started %s", alloc_id, " ".join(argv))

    def _task_dir(self, alloc_id: int) -> Path:
        return self.s.work_dir / "tasks" / str(alloc_id)

    def _prepare_dir(self, alloc_id: int, context_id: int | None) -> Path:
        """A fresh copy of the context for this run; contexts are unpacked once per agent."""
        dest = self._task_dir(alloc_id)
        shutil.rmtree(dest, ignore_errors=True)
        if context_id is None:
            dest.mkdir(parents=True)
            return dest
        cached = self.s.work_dir / "contexts" / str(context_id)
        if not cached.is_dir():
            blob = self.conn.execute(CONTEXT_BLOB, {"id": context_id}).fetchone()["data"]
            partial = cached.with_suffix(".partial")
            shutil.rmtree(partial, ignore_errors=True)
            context.unpack(blob, partial)
            partial.rename(cached)
        shutil.copytree(cached, dest)
        return dest

    def _report(self, alloc_id: int, state: str, code: int | None = None,
                reason: str | None = None) -> None:
        self.conn.execute("SELECT det_agent_report(%s, %s, %s, %s, %s)",
                          (self.s.agent_id, alloc_id, state, code, reason))

    def shutdown(self) -> None:
        """Kill the tasks (they cannot outlive the agent anyway) and report them ended."""
        for task in self.tasks.values():
            task.kill(0)
        for alloc_id, task in self.tasks.items():
            while (code := task.poll()) is None:
                time.sleep(0.05)
                task.kill(0)
            self.logs.flush()
            self._report(alloc_id, "TERMINATED", code, "agent shut down")
        self.tasks.clear()
        self.logs.close()
        self.conn.close()
