"""The agent's loop: each wake-up is a small reconciliation of what the database assigns to
this agent against the tasks it runs (DESIGN.md, "Agents").

* assigned, desired RUNNING, not running here: fetch what the task needs (its image; state
  PULLING meanwhile), claim a token, unpack the context, launch through the runtime;
* running here, desired KILLED: SIGTERM, grace period, SIGKILL (desired STOPPED is the task's
  own business: the harness sees it through ``should_preempt()``, checkpoints and exits);
* assigned here but unknown to this process and not adopted at start (the agent restarted and
  its tasks died with it): report the run ended, so the reconciler restarts the trial from
  its checkpoint;
* ended here: flush its logs, report TERMINATED with exit code and reason, remove its remains.
It wakes on NOTIFY ``agent_<id>`` and also polls, so a lost notification only delays work.
"""

import logging
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from det import context
from det.agent.devices import Slot
from det.agent.logs import LogShipper
from det.agent.process import ProcessRuntime
from det.agent.runtime import Launch, Runtime, Task
from det.configs import entrypoint_argv, env_for_device
from det.db import connect
from det.errors import DetError

log = logging.getLogger("det.agent")

# Seconds a killed task gets between SIGTERM and SIGKILL.
KILL_GRACE = 10.0

ASSIGNMENTS = """
SELECT a.id, a.desired_state::text AS desired, a.state::text AS state, a.spec,
       array(SELECT h.slot_id FROM allocation_slots h
              WHERE h.allocation_id = a.id AND NOT h.released ORDER BY h.slot_id) AS slot_ids
  FROM allocations a
 WHERE a.agent_id = %(agent)s AND a.state <> 'TERMINATED'
 ORDER BY a.id
"""

# Live allocations of this agent with the time of their last shipped log line, for adoption.
LIVE_HERE = """
SELECT a.id, (SELECT l.ts FROM task_logs l WHERE l.allocation_id = a.id
               ORDER BY l.id DESC LIMIT 1) AS last_log
  FROM allocations a
 WHERE a.agent_id = %(agent)s AND a.state <> 'TERMINATED'
"""

CONTEXT_BLOB = "SELECT data FROM context_blobs WHERE id = %(id)s"


@dataclass
class AgentSettings:
    """``agent_id``: unique name (default: the hostname); ``pool``: its resource pool;
    ``work_dir``: where task directories live; ``runtime``: ``docker``, ``process``, or None
    for docker when an engine answers, else process; ``heartbeat``/``poll``: seconds."""

    agent_id: str
    pool: str
    work_dir: Path
    runtime: str | None = None
    heartbeat: float = 5.0
    poll: float = 1.0


def choose_runtime(name: str | None, logs: LogShipper, agent_id: str, url: str,
                   device_type: str) -> Runtime:
    """The runtime ``name`` asks for; raises ``RuntimeUnavailable`` when docker is asked for
    and no engine answers. With no name: docker if an engine answers, else process."""
    if name == "process":
        return ProcessRuntime(logs)
    from det.agent.containers import DockerRuntime, RuntimeUnavailable

    try:
        return DockerRuntime.connect(logs, agent_id, url, device_type)
    except RuntimeUnavailable as e:
        if name == "docker":
            raise
        log.info("%s; running tasks as processes", e)
        return ProcessRuntime(logs)


class Agent:
    """One agent process. ``url``: the database URL, also handed to its tasks."""

    def __init__(self, url: str, settings: AgentSettings, slots: list[Slot]) -> None:
        self.url = url
        self.s = settings
        self.slots = slots
        self.device_type = slots[0].type if slots else "cpu"
        self.tasks: dict[int, Task] = {}
        self.conn = connect(url, autocommit=True)
        self.logs = LogShipper(url)
        self.runtime = choose_runtime(settings.runtime, self.logs, settings.agent_id, url,
                                      self.device_type)
        self._last_heartbeat = 0.0

    def register(self) -> None:
        self.conn.execute(
            "SELECT det_agent_register(%s, %s, %s, %s, %s)",
            (self.s.agent_id, socket.gethostname(), self.s.pool, self.runtime.name,
             psycopg.types.json.Jsonb([s.as_row() for s in self.slots])))
        self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(f"agent_{self.s.agent_id}")))
        log.info("agent %s registered %d %s slot(s) in pool %s; runtime %s", self.s.agent_id,
                 len(self.slots), self.device_type, self.s.pool, self.runtime.name)

    def adopt(self) -> None:
        """Take over the tasks a previous run of this agent left running (containers)."""
        live = {r["id"]: r["last_log"]
                for r in self.conn.execute(LIVE_HERE, {"agent": self.s.agent_id})}
        for alloc_id, task in self.runtime.adopt(self.s.agent_id, live).items():
            self.tasks[alloc_id] = task
            self._report(alloc_id, "RUNNING")

    def run(self, stop_after: float | None = None) -> None:
        """Serve until interrupted (or for ``stop_after`` seconds, for tests)."""
        self.register()
        self.adopt()
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
            end = task.poll()
            if end is not None:
                self.logs.flush()
                self._report(alloc_id, "TERMINATED", end.code, end.reason)
                del self.tasks[alloc_id]
                task.remove()
                shutil.rmtree(self._task_dir(alloc_id), ignore_errors=True)

    def _launch(self, row: dict) -> None:
        alloc_id, spec = row["id"], row["spec"]
        try:
            fetching = self.runtime.fetch(alloc_id, spec)
        except Exception as e:  # the engine refused even to look
            self._report(alloc_id, "TERMINATED", None, f"launch failed: {e}")
            return
        if fetching is not None:
            if not fetching.done():
                if row["state"] == "ASSIGNED":
                    self._report(alloc_id, "PULLING")
                return
            if fetching.exception() is not None:
                self._report(alloc_id, "TERMINATED", None, str(fetching.exception()))
                return
        token = self.conn.execute("SELECT det_agent_claim(%s, %s) AS token",
                                  (self.s.agent_id, alloc_id)).fetchone()["token"]
        if token is None:
            return
        try:
            env = {**env_for_device(spec.get("environment") or {}, self.device_type),
                   "DET_DB_URL": self.url, "DET_ALLOCATION_ID": str(alloc_id),
                   "DET_ALLOCATION_TOKEN": token, "DET_AGENT_ID": self.s.agent_id,
                   "DET_TRIAL_ID": str(spec.get("trial_id", "")),
                   "DET_EXPERIMENT_ID": str(spec.get("experiment_id", "")),
                   "PYTHONUNBUFFERED": "1"}
            by_id = {s.slot_id: s for s in self.slots}
            launch = Launch(alloc_id, entrypoint_argv(spec["entrypoint"], self.runtime.python),
                            env, self._prepare_dir(alloc_id, spec.get("context_id")), spec,
                            [by_id[i] for i in row["slot_ids"] if i in by_id])
            self.tasks[alloc_id] = self.runtime.launch(launch)
        except Exception as e:  # any launch failure ends the run with a readable reason
            log.error("allocation %s: launch failed", alloc_id,
                      exc_info=not isinstance(e, DetError))
            self._report(alloc_id, "TERMINATED", None, f"launch failed: {e}")
            return
        self._report(alloc_id, "RUNNING")
        log.info("allocation %s: started %s", alloc_id, " ".join(launch.argv))

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
            while (end := task.poll()) is None:
                time.sleep(0.05)
                task.kill(0)
            self.logs.flush()
            self._report(alloc_id, "TERMINATED", end.code, "agent shut down")
            task.remove()
        self.tasks.clear()
        self.logs.close()
        self.conn.close()
