"""The agent's loop: each wake-up is a small reconciliation of what the database assigns to
this agent against the tasks it runs (docs/architecture.md).

* assigned, desired RUNNING, not running here: fetch what the task needs (its image; state
  PULLING meanwhile), claim a token, unpack the context, launch through the runtime;
* running here, desired KILLED: SIGKILL now, no checkpoint (desired STOPPED is the task's
  own business: the harness sees it through ``should_preempt()``, checkpoints and exits);
* assigned here but unknown to this process and not adopted at start (the agent restarted and
  its tasks died with it): report the run ended, so the reconciler restarts the trial from
  its checkpoint;
* running here but no longer assigned here (the reconciler declared this agent lost and ended
  its runs): kill it, as for desired KILLED;
* ended here (its main process exited; see the runtimes): flush its logs, report TERMINATED
  with exit code and reason, remove its remains;
* running here, state not yet RUNNING (the report was lost with the connection): report it.
A planned stop (SIGTERM: ``det cluster down``, a restart) stops the tasks the way pause does,
with no reconciler needed (:meth:`Agent.shutdown`), and an agent that cannot heartbeat for its
lease kills its tasks before the reconciler places them elsewhere (self-fencing,
:mod:`det.agent.heartbeat`).
The same rules hold for this agent's share of a gang allocation whose chief is another agent
(distributed training across agents, :mod:`det.agent.gang`); that share starts once the
chief's agent recorded the rendezvous endpoint, and ending badly it ends the whole run.
It wakes on NOTIFY on its channel (:func:`det.db.channels.agent`) and also polls, so a lost
notification only delays work.

Watching the tasks never waits on the database, and the database never waits on the tasks:
the heartbeat has a thread and a connection of its own (:mod:`det.agent.heartbeat`), output is
read by threads of the runtimes and shipped by :class:`det.agent.logs.LogShipper`, and a lost
connection is reopened with backoff (:mod:`det.db.retry`) while the tasks keep running; ends
that happen meanwhile are kept and reported once the database is back
(docs/architecture.md, "Riding out the database").
"""

import logging
import re
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from det import context
from det.agent import gang
from det.agent.devices import Slot
from det.agent.heartbeat import Heartbeat
from det.agent.logs import LogShipper
from det.agent.process import ProcessRuntime
from det.agent.runtime import Exit, Launch, Runtime, Task
from det.configs import env_for_device
from det.configs.allocation import AllocationSpec
from det.configs.environment import BindMount
from det.db import channels, retry
from det.db.reconnect import BULK_CALL_DEADLINE_SECONDS, open_connection, patience
from det.errors import ConfigError, DetError
from det.harness.interactive.tensorboard import event_dirs
from det.sql import named

log = logging.getLogger("det.agent")
Q = named("agent")

T = TypeVar("T")

# Seconds between two looks at the tasks while the database is away.
TEND_SECONDS = 0.2
# While a task launched less than FRESH_SECONDS ago runs, the agent looks at its tasks every
# END_TICK seconds as it waits for a NOTIFY, so that a short task's end is reported (and its
# slot freed) at once rather than at the next poll; long-running tasks cost no such ticks.
END_TICK = 0.01
FRESH_SECONDS = 5.0
# A batch of launches that takes longer reports, every BATCH_REPORT_SECONDS, the tasks it has
# started so far as RUNNING and the ends of tasks that ended meanwhile, so that their slots are
# placed again while the rest of the batch starts (32 tiny tasks take ~100 ms to
# start, longer than each runs).
BATCH_REPORT_SECONDS = 0.025
# A planned stop (SIGTERM) gives the tasks STOP_GRACE_SECONDS from the signal to checkpoint
# and exit, then kills them; it then tries for SHUTDOWN_RETRY_SECONDS to report their ends while
# the database is away. Both together stay within the supervisor's STOP_GRACE (15 s between its
# SIGTERM and SIGKILL of the agent, det.cli.supervisor), which `det cluster down` waits for:
# 10 + 3 s (tests/test_planned_stop.py checks the sum).
STOP_GRACE_SECONDS = 10.0
SHUTDOWN_RETRY_SECONDS = 3.0
# A share of a gang run that ended on the chief's agent may finish by itself this long
# (seconds) before it is killed: its workers end with the chief's.
NODE_GRACE_SECONDS = 10.0

AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
AGENT_ID_RULE = ("1 to 63 ASCII letters, digits, '.', '_' or '-', starting with a letter or "
                 "digit")


@dataclass
class AgentSettings:
    """``agent_id``: unique name (default: the hostname); ``pool``: its resource pool;
    ``work_dir``: where task directories live; ``runtime``: ``docker``, ``process``, or None
    for docker when an engine answers, else process; ``heartbeat``/``poll``: seconds;
    ``warm_start``: the process runtime forks Python tasks from a zygote; ``task_url``: the
    database URL its tasks get (a role that runs only task functions), None for its own;
    ``task_pooler``: the process runtime's tasks connect through a PgBouncer of the agent's
    (:mod:`det.agent.pooler`; directly where PgBouncer is not installed);
    ``stop_is_failure``: a SIGTERM is another resource manager ending the agent under its runs
    (an agent in a Slurm job: scancel, time limit, node drain; det cancels only idle ones), so
    its runs end as failed, counted against max_restarts, not as a planned stop;
    ``one_shot``: the agent serves one assignment and exits once it has none left (an agent
    that is one Slurm job for one run: the job ends with the run), retiring its row
    (``det_agent.retire``: agent lists hide it)."""

    agent_id: str
    pool: str
    work_dir: Path
    runtime: str | None = None
    heartbeat: float = 5.0
    poll: float = 1.0
    warm_start: bool = True
    task_url: str | None = None
    task_pooler: bool = True
    stop_is_failure: bool = False
    one_shot: bool = False


def check_agent_id(agent_id: str, field: str = "agent id") -> None:
    """Check ``agent_id`` against ``AGENT_ID_RULE`` (it names the agent's rows, containers and
    NOTIFY channel).

    Raises:
        DetError: ``{field}: expected <rule>, got <id>``.
    """
    if not AGENT_ID.fullmatch(agent_id):
        raise DetError(f"{field}: expected {AGENT_ID_RULE}, got {agent_id!r}")


def choose_runtime(name: str | None, logs: LogShipper, agent_id: str, url: str,
                   device_type: str, work_dir: Path, warm_start: bool = True,
                   pool_size: int = 0) -> Runtime:
    """The runtime ``name`` asks for; raises ``RuntimeUnavailable`` when docker is asked for
    and no engine answers. With no name: docker if an engine answers, else process
    (its tasks' environments in ``work_dir/envs``; ``warm_start``, ``pool_size`` with ``url``
    as the tasks' URL and ``agent_id``: see :class:`ProcessRuntime`)."""
    envs_dir = work_dir / "envs"
    if name == "process":
        return ProcessRuntime(logs, envs_dir, warm_start, url, pool_size, agent_id)
    from det.agent.containers import DockerRuntime, RuntimeUnavailable

    try:
        return DockerRuntime.connect(logs, agent_id, url, device_type)
    except RuntimeUnavailable as e:
        if name == "docker":
            raise
        log.info("%s; running tasks as processes", e)
        return ProcessRuntime(logs, envs_dir, warm_start, url, pool_size, agent_id)


class Agent:
    """One agent process. ``url``: its database URL, also its tasks' unless
    ``settings.task_url`` gives theirs.

    Raises:
        DetError: the agent id breaks the rule of :func:`check_agent_id`.
    """

    def __init__(self, url: str, settings: AgentSettings, slots: list[Slot]) -> None:
        check_agent_id(settings.agent_id)
        self.url = url
        self.s = settings
        self.slots = slots
        self.device_type = slots[0].type if slots else "cpu"
        self.tasks: dict[int, Task] = {}
        self.ended: dict[int, Exit] = {}  # ends not yet reported, in the order they happened
        self.killing: set[int] = set()  # tasks being killed (SIGKILL sent)
        self.claimed: set[int] = set()  # claims made by this process, not yet launched
        self.nodes: set[int] = set()  # allocations this agent runs a share of, not the chief
        self.orphaned: dict[int, float] = {}  # shares whose run ended elsewhere: since when
        # runs killed by a self-fence, until their ends are reported: why (their exit code
        # cannot say)
        self.fenced_runs: dict[int, str] = {}
        self.last_launch = float("-inf")  # time.monotonic() of the latest launch
        # one_shot: it has had an assignment, and (done) has none left: the loop ends
        self.served = False
        self.done = False
        self.conn: psycopg.Connection | None = None
        self.logs = LogShipper(url)
        self.task_url = settings.task_url or url
        # sessions the pooler expects at once: one a slot, and a few for 0-slot tasks
        pool_size = len(slots) + 4 if settings.task_pooler else 0
        self.runtime = choose_runtime(settings.runtime, self.logs, settings.agent_id,
                                      self.task_url, self.device_type, settings.work_dir,
                                      settings.warm_start, pool_size)
        self.heartbeat = Heartbeat(url, settings.agent_id, settings.heartbeat, self._register,
                                   self._fence)
        # A lost connection's backoff is spent watching the tasks (see _tend_for).
        self._retrying = retry.retrying("agent").copy(sleep=self._tend_for)

    # -- the database side --------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection:
        """The main connection, opened (and LISTENing) again after it was lost."""
        if self.conn is None or self.conn.closed:
            self.conn = open_connection(self.url, dict_row)
            channels.listen_agent(self.conn, self.s.agent_id)
        return self.conn

    def _with_db(self, fn: Callable[[], T]) -> T:
        """``fn()``, tried again after connection losses (with backoff, tending the tasks
        meanwhile) until it succeeds; other errors are raised."""
        for attempt in self._retrying:
            with attempt:
                return self._closing_if_lost(fn)
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _closing_if_lost(self, fn: Callable[[], T]) -> T:
        """``fn()``; a connection it lost is closed, to be opened again by the next try."""
        try:
            return fn()
        except psycopg.Error as e:
            if retry.is_connection_lost(e) and self.conn is not None:
                self.conn.close()
            raise

    def _register(self, conn: psycopg.Connection) -> None:
        conn.execute(Q.register, (
            self.s.agent_id, socket.gethostname(), self.s.pool, self.runtime.name,
            psycopg.types.json.Jsonb([s.as_row() for s in self.slots])))

    def _start(self) -> dict[int, Any]:
        """Register, and return the live allocations of this agent (for adoption)."""
        conn = self._connect()
        self._register(conn)
        log.info("agent %s registered %d %s slot(s) in pool %s; runtime %s", self.s.agent_id,
                 len(self.slots), self.device_type, self.s.pool, self.runtime.name)
        return {r["id"]: r["last_log"] for r in conn.execute(Q.live_here,
                                                             {"agent": self.s.agent_id})}

    def adopt(self, live: dict[int, Any]) -> None:
        """Take over the tasks a previous run of this agent left running (containers); the
        next pass reports them RUNNING."""
        self.tasks.update(self.runtime.adopt(self.s.agent_id, live))

    def run(self, stop_after: float | None = None) -> None:
        """Serve until interrupted (or for ``stop_after`` seconds, for tests). A lost database
        connection is waited out: tasks keep running and their ends are reported once the
        database is back (docs/architecture.md, "Riding out the database")."""
        end = None if stop_after is None else time.monotonic() + stop_after
        try:
            self.adopt(self._with_db(self._start))
            self.heartbeat.start()
            while (end is None or time.monotonic() < end) and not self.done:
                self.heartbeat.check()
                self._tend()
                self._with_db(self._sync)
        except psycopg.Error as e:
            if not retry.is_login_refused(e):
                raise
            # revoked (det_user.agent_revoke): its tasks are killed below, as the database is gone
            why = str(e).split("FATAL:")[-1].strip().splitlines()[0]
            raise DetError(f"agent {self.s.agent_id}: the database refused its login ({why}): "
                           "revoked (`det agent revoke`), or a wrong credential") from None
        finally:
            self.shutdown()

    def _sync(self) -> None:
        """Report what ended, reconcile the assignments, then wait (:meth:`_wait`)."""
        conn = self._connect()
        self._report_ends()
        self.reconcile()
        self._wait(conn)

    def _wait(self, conn: psycopg.Connection) -> None:
        """Wait for a NOTIFY or ``poll`` seconds; while fresh tasks run (see ``END_TICK``),
        look at the tasks every ``END_TICK`` seconds and return as soon as one ended."""
        deadline = time.monotonic() + self.s.poll
        while (left := deadline - time.monotonic()) > 0:
            fresh = self.tasks and time.monotonic() - self.last_launch < FRESH_SECONDS
            if any(True for _ in conn.notifies(timeout=min(left, END_TICK) if fresh else left,
                                               stop_after=1)):
                return
            self._tend()
            if self.ended:
                return

    def reconcile(self) -> None:
        """One pass over this agent's assignments (see the module rules)."""
        assigned = self._connect().execute(Q.assignments,
                                           {"agent": self.s.agent_id}).fetchall()
        if self.s.one_shot:
            self.served = self.served or bool(assigned)
            self.done = (self.served and not assigned and not self.tasks and not self.ended
                         and not self.claimed)
        to_launch: list[dict] = []
        for row in assigned:
            alloc_id = row["id"]
            task = self.tasks.get(alloc_id)
            if alloc_id in self.ended:
                continue  # reported before the next pass
            if row["chief"] != self.s.agent_id:
                self._reconcile_node(row, task)
            elif task is not None:
                if row["desired"] == "KILLED":
                    self._kill(alloc_id)
                elif row["state"] in ("ASSIGNED", "PULLING", "STARTING"):
                    self._report(alloc_id, "RUNNING")  # the first report was lost
            elif row["desired"] != "RUNNING":
                self._end(alloc_id, Exit(0, "stopped before it started"))
            elif row["state"] in ("ASSIGNED", "PULLING") or alloc_id in self.claimed:
                to_launch.append(row)
            else:
                self._end(alloc_id, Exit(None, "agent restarted; the task was lost with it"))
        self._launch(to_launch)
        # Ended without this agent (it was declared lost meanwhile): the run is over.
        for alloc_id in self.tasks.keys() - {row["id"] for row in assigned}:
            if alloc_id in self.nodes:
                # The chief's workers finished first: ours are finishing too (their exit
                # code is then the share's own); kill them only if they linger.
                since = self.orphaned.setdefault(alloc_id, time.monotonic())
                if time.monotonic() - since < NODE_GRACE_SECONDS:
                    continue
            if alloc_id not in self.killing:
                log.warning("allocation %s ended without this agent; killing its task",
                            alloc_id)
            self._kill(alloc_id)

    def _reconcile_node(self, row: dict, task: Task | None) -> None:
        """The same rules for a share of a gang allocation whose chief is another agent: it
        starts once the chief's agent recorded the rendezvous (until then the claim answers
        NULL and the next pass tries again)."""
        alloc_id = row["id"]
        self.nodes.add(alloc_id)
        if task is not None:
            if row["desired"] == "KILLED":
                self._kill(alloc_id)
            elif row["node_state"] == "STARTING":
                self._report(alloc_id, "RUNNING")  # the first report was lost
        elif row["node_state"] is None or alloc_id in self.claimed:
            if row["desired"] == "RUNNING":
                self._launch([row])
        elif row["node_state"] != "TERMINATED":
            self._end(alloc_id, Exit(None, "agent restarted; the task was lost with it"))

    def _report_ends(self) -> None:
        """Report the ends not yet reported, once the task logs are written."""
        if not self.ended:
            return
        self.logs.flush()
        ends = list(self.ended.items())
        fenced = sorted(self.fenced_runs.keys() & self.ended.keys())
        if fenced:  # before the end: the settle step must see the mark with it
            self._connect().execute(Q.mark_fenced, (self.s.agent_id, fenced))
            for alloc_id in fenced:
                del self.fenced_runs[alloc_id]
        self._report_each([a for a, _ in ends], "TERMINATED", [end.code for _, end in ends],
                          [end.reason for _, end in ends])
        for alloc_id, _ in ends:  # reported (a report lost with the connection is made again)
            del self.ended[alloc_id]

    def _end(self, alloc_id: int, end: Exit) -> None:
        """A run that ends here: its end is reported now, or once the database is back."""
        self.ended[alloc_id] = end
        self._report_ends()

    def _launch(self, rows: list[dict]) -> None:
        """Launch the assigned runs ``rows``: claim them (one round trip for those this agent
        runs alone), start each, then report them RUNNING (one round trip). 1,000 tiny tasks
        on 32 slots start in batches of 32."""
        if self.heartbeat.fenced:
            return  # killed its tasks for want of a heartbeat: starts nothing until it beats
        ready = [(row, spec) for row in rows if (spec := self._fetched(row)) is not None]
        # Recorded before the claim: its answer may be lost with the connection after the
        # claim committed (STARTING), and the next pass claims again rather than give up.
        self.claimed.update(row["id"] for row, _ in ready)
        claims = self._claim([row for row, _ in ready])
        started: list[int] = []
        reported_at = time.monotonic()
        for (row, spec), (token, gang_vars) in zip(ready, claims, strict=True):
            if token is None:
                self.claimed.discard(row["id"])
            elif self._start_task(row, spec, token, gang_vars):
                started.append(row["id"])
            if time.monotonic() - reported_at >= BATCH_REPORT_SECONDS:
                self._report_running(started)  # before their ends: a run's RUNNING comes first
                started = []
                self._tend()
                self._report_ends()
                reported_at = time.monotonic()
        self._report_running(started)

    def _report_running(self, alloc_ids: list[int]) -> None:
        if alloc_ids:
            self._report_each(alloc_ids, "RUNNING")

    def _fetched(self, row: dict) -> AllocationSpec | None:
        """The run's spec once what it needs is here (its image); None while fetching (state
        PULLING) or when the run ended here because it cannot start."""
        alloc_id = row["id"]
        try:
            spec = AllocationSpec.parse(row["spec"], alloc_id)
        except ConfigError as e:
            self._end(alloc_id, Exit(None, f"launch failed: {e}"))
            return None
        try:
            fetching = self.runtime.fetch(alloc_id, spec)
        except Exception as e:  # the engine refused even to look
            self._end(alloc_id, Exit(None, f"launch failed: {e}"))
            return None
        if fetching is not None:
            if not fetching.done():
                if row["state"] == "ASSIGNED":
                    self._report(alloc_id, "PULLING")
                return None
            if fetching.exception() is not None:
                self._end(alloc_id, Exit(None, str(fetching.exception())))
                return None
        return spec

    def _start_task(self, row: dict, spec: AllocationSpec, token: str,
               gang_vars: dict[str, Any]) -> bool:
        """Start a claimed run through the runtime; False when it could not start (its end is
        reported)."""
        alloc_id = row["id"]
        try:
            env = {**env_for_device(spec.environment, self.device_type),
                   "DET_DB_URL": self.task_url, "DET_ALLOCATION_ID": str(alloc_id),
                   "DET_ALLOCATION_TOKEN": token, "DET_AGENT_ID": self.s.agent_id,
                   # its sessions' application_name: who is who in pg_stat_activity
                   "PGAPPNAME": f"det-task-{alloc_id}", "PYTHONUNBUFFERED": "1"}
            if spec.experiment_id is not None:
                env["DET_EXPERIMENT_ID"] = str(spec.experiment_id)
            if spec.trial_id is not None:
                env["DET_TRIAL_ID"] = str(spec.trial_id)
            if spec.task is not None:  # an interactive task (det.harness.interactive reads it)
                env["DET_JOB_ID"] = str(spec.task.job_id)
                env["DET_TASK_SPEC"] = spec.task.model_dump_json()
            if spec.kind == "tensorboard":
                spec = self._with_event_dirs(spec, token)
            by_id = {s.slot_id: s for s in self.slots}
            held = [by_id[i] for i in row["slot_ids"] if i in by_id]
            env.update(gang.gang_env(self.s.agent_id, held, **gang_vars,
                                     interface=gang.cluster_interface(self.url)))
            launch = Launch(alloc_id, spec.argv(self.runtime.python),
                            env, self._prepare_dir(alloc_id, spec.context_id), spec, held)
            self.tasks[alloc_id] = self.runtime.launch(launch)
        except Exception as e:  # any launch failure ends the run with a readable reason
            if retry.is_connection_lost(e):
                raise  # the context could not be read: launched again once the database is back
            log.error("allocation %s: launch failed", alloc_id,
                      exc_info=not isinstance(e, DetError))
            self.claimed.discard(alloc_id)
            self._end(alloc_id, Exit(None, f"launch failed: {e}"))
            return False
        self.claimed.discard(alloc_id)
        self.last_launch = time.monotonic()
        log.info("allocation %s: started %s", alloc_id, " ".join(launch.argv))
        return True

    def _with_event_dirs(self, spec: AllocationSpec, token: str) -> AllocationSpec:
        """A TensorBoard's spec with the directories of its event files on ``shared_fs``
        storage (host paths, ``det_task.tensorboard_sources``) bind-mounted read-only at the
        same paths, so that the server in a container reads them; a missing one is made (an
        experiment that has not reported yet: a bind mount needs its source). The process
        runtime reads them where they are."""
        if self.runtime.name != "docker":
            return spec
        rows = [r for r in self._connect().execute(Q.tensorboard_sources, (token,))
                if (r["storage"] or {}).get("type") == "shared_fs"]
        mounts = []
        for _, path in event_dirs(rows)[0]:
            Path(path).mkdir(parents=True, exist_ok=True)
            mounts.append(BindMount(host_path=path, container_path=path, read_only=True))
        return spec.model_copy(update={"bind_mounts": [*spec.bind_mounts, *mounts]})

    def _claim(self, rows: list[dict]) -> list[tuple[str | None, dict[str, Any]]]:
        """Claim each run (the chief's agent) or this agent's share of it (another agent of a
        gang), in ``rows``' order: the task's token, or None when it is not to start (yet),
        and the gang's ``nodes``, ``node_rank`` and ``rendezvous`` for
        :func:`det.agent.gang.gang_env`. The runs this agent holds alone are claimed in one
        statement; the chief's agent of a gang records the rendezvous endpoint here."""
        conn, me = self._connect(), self.s.agent_id
        alone = [row["id"] for row in rows if row["chief"] == me and not row["spans"]]
        tokens: dict[int, str | None] = dict.fromkeys(alone)
        if alone:
            tokens.update((r["allocation_id"], r["token"])
                          for r in conn.execute(Q.claim_each, (me, alone)))
        return [(tokens[row["id"]], {}) if row["id"] in tokens else self._claim_gang(row)
                for row in rows]

    def _claim_gang(self, row: dict) -> tuple[str | None, dict[str, Any]]:
        conn, me, alloc_id = self._connect(), self.s.agent_id, row["id"]
        if row["chief"] != me:
            node = conn.execute(Q.claim_node, (me, alloc_id)).fetchone()["node"]
            if node is None:
                return None, {}
            return node["token"], {"nodes": node["nodes"], "node_rank": node["node_rank"],
                                   "rendezvous": node["rendezvous"]}
        token = conn.execute(Q.claim, (me, alloc_id)).fetchone()["token"]
        if token is None:
            return None, {}
        endpoint = f"{gang.host_address(self.url)}:{gang.free_port()}"
        conn.execute(Q.set_rendezvous, (me, alloc_id, endpoint))
        nodes = conn.execute(Q.gang_agents, (alloc_id,)).fetchone()["nodes"]
        return token, {"nodes": nodes, "node_rank": 0, "rendezvous": endpoint}

    def _prepare_dir(self, alloc_id: int, context_id: int | None) -> Path:
        """A fresh copy of the context for this run; contexts are unpacked once per agent."""
        dest = self._task_dir(alloc_id)
        shutil.rmtree(dest, ignore_errors=True)
        if context_id is None:
            dest.mkdir(parents=True)
            return dest
        cached = self.s.work_dir / "contexts" / str(context_id)
        if not cached.is_dir():
            conn = self._connect()
            with patience(conn, BULK_CALL_DEADLINE_SECONDS):
                blob = conn.execute(Q.context_blob, {"agent": self.s.agent_id,
                                                   "id": context_id}).fetchone()["data"]
            if blob is None:
                raise DetError(f"context {context_id}: no live allocation of agent "
                               f"{self.s.agent_id} launches it")
            partial = cached.with_suffix(".partial")
            shutil.rmtree(partial, ignore_errors=True)
            context.unpack(blob, partial, f"context {context_id}")
            partial.rename(cached)
        shutil.copytree(cached, dest, symlinks=True)  # the links stay links: checked inside
        return dest

    def _report(self, alloc_id: int, state: str, code: int | None = None,
                reason: str | None = None) -> None:
        report = Q.report_node if alloc_id in self.nodes else Q.report
        self._connect().execute(report, (self.s.agent_id, alloc_id, state, code, reason))
        if state == "TERMINATED":
            self.nodes.discard(alloc_id)

    def _report_each(self, alloc_ids: list[int], state: str, codes: list | None = None,
                     reasons: list | None = None) -> None:
        """Report ``alloc_ids`` in ``state`` (with their exit ``codes`` and ``reasons``, element
        by element): the runs this agent holds alone in one statement, each gang share on its
        own."""
        codes = codes or [None] * len(alloc_ids)
        reasons = reasons or [None] * len(alloc_ids)
        alone = [i for i, a in enumerate(alloc_ids) if a not in self.nodes]
        if alone:
            self._connect().execute(Q.report_each, (
                self.s.agent_id, [alloc_ids[i] for i in alone], state,
                [codes[i] for i in alone], [reasons[i] for i in alone]))
        for i, alloc_id in enumerate(alloc_ids):
            if alloc_id in self.nodes:
                self._report(alloc_id, state, codes[i], reasons[i])

    # -- the host side: never touches the database ------------------------------------------

    def _task_dir(self, alloc_id: int) -> Path:
        return self.s.work_dir / "tasks" / str(alloc_id)

    def _kill(self, alloc_id: int) -> None:
        self.killing.add(alloc_id)
        self.tasks[alloc_id].kill()

    def _tend(self) -> None:
        """Watch the tasks: carry kills on (repeat a SIGKILL the engine refused) and collect ends
        (to be reported), freeing what each ended task left on this host."""
        for alloc_id, task in list(self.tasks.items()):
            if alloc_id in self.killing:
                task.kill()  # again: a kill the engine refused is retried
            end = task.poll()
            if end is not None:
                why = self.fenced_runs.get(alloc_id)
                self.ended[alloc_id] = end if why is None else Exit(end.code, why)
                del self.tasks[alloc_id]
                self.killing.discard(alloc_id)
                self.orphaned.pop(alloc_id, None)
                task.remove()
                shutil.rmtree(self._task_dir(alloc_id), ignore_errors=True)

    def _tend_for(self, seconds: float) -> None:
        """Wait ``seconds`` (a backoff while the database is away), tending the tasks."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._tend()
            time.sleep(min(left, TEND_SECONDS))

    def _fence(self, silent: float) -> None:
        """Kill every task: this agent could not heartbeat for ``silent`` seconds, past its
        lease (:mod:`det.agent.heartbeat`). Called on the heartbeat's fence thread; it only
        signals, and the main loop collects the ends as usual. Their ends are reported as
        planned stops (``det_agent.mark_fenced``): a database outage longer than the lease
        fences every agent, and that is no failure of the trials (their restarts stay)."""
        why = (f"self-fenced: agent {self.s.agent_id} could not heartbeat for {silent:.0f} s "
               f"(the reconciler's agent timeout is {self.heartbeat.agent_timeout:.0f} s)")
        for alloc_id, task in list(self.tasks.items()):
            self.fenced_runs[alloc_id] = why
            self.killing.add(alloc_id)
            task.kill()

    def _stop_runs(self) -> bool:
        """Mark this agent's runs a planned stop and wake their tasks to checkpoint and exit
        (``det_agent.stop_runs``); False when the database stayed away for
        ``SHUTDOWN_RETRY_SECONDS`` (the tasks then cannot learn of the stop), or with
        ``stop_is_failure``, where the agent is only drained (``det_agent.leave``)."""
        def stop() -> None:
            self._connect().execute(Q.leave if self.s.stop_is_failure else Q.stop_runs,
                                    (self.s.agent_id,))

        try:
            retry.call("agent stop", lambda: self._closing_if_lost(stop),
                       give_up_after=SHUTDOWN_RETRY_SECONDS)
        except psycopg.Error as e:
            log.error("could not tell the tasks to checkpoint and stop: %s; killing them", e)
            return False
        return not self.s.stop_is_failure

    def shutdown(self) -> None:
        """Stop: a planned stop, not a failure. The runs are marked so
        (``det_agent.stop_runs``), so their tasks checkpoint and exit as on pause; those still
        running after ``STOP_GRACE_SECONDS`` are killed (they resume from their latest
        checkpoint all the same). Where the database cannot be reached, the tasks are killed
        at once (they cannot outlive the agent anyway). Then their ends are reported, trying
        for ``SHUTDOWN_RETRY_SECONDS`` while the database is away."""
        if self.conn is not None:  # possibly interrupted mid-statement by the signal
            self.conn.close()
        begun = time.monotonic()  # the grace counts from here, however long the marking took
        stopped = set(self.tasks)
        planned = self._stop_runs()  # with no task either: nothing new is placed here
        if planned and stopped:
            log.info("planned stop: allocation(s) %s checkpoint and exit (%.0f s grace)",
                     sorted(stopped), STOP_GRACE_SECONDS)
        deadline = begun + (STOP_GRACE_SECONDS if planned else 0.0)
        overdue: set[int] = set()
        while self.tasks:
            if time.monotonic() >= deadline:
                overdue |= self.tasks.keys()
                for alloc_id in self.tasks.keys() - self.killing:
                    self._kill(alloc_id)
            self._tend()
            time.sleep(TEND_SECONDS / 2)
        for alloc_id in stopped:
            self.ended[alloc_id] = self._stop_end(alloc_id, planned, alloc_id in overdue)
        if self.conn is not None:
            self.conn.close()
        try:
            retry.call("agent shutdown", lambda: self._closing_if_lost(self._report_ends),
                       give_up_after=SHUTDOWN_RETRY_SECONDS)
        except psycopg.Error as e:
            log.error("could not report the end of allocation(s) %s: %s; they are settled "
                      "when this agent is declared lost", sorted(self.ended), e)
        self.heartbeat.stop()
        if self.done:
            self._retire()
        self.logs.close()
        if self.conn is not None:
            self.conn.close()

    def _retire(self) -> None:
        """A one-shot agent that served its run and reported its end is gone for good
        (``det_agent.retire``), after its last heartbeat (one answered LOST would register it
        again). Where the database stays away for ``SHUTDOWN_RETRY_SECONDS`` the row is left
        as it is: the provisioner marks it gone once the agent's job has ended."""
        try:
            retry.call("agent retire", lambda: self._closing_if_lost(
                lambda: self._connect().execute(Q.retire, (self.s.agent_id,))),
                give_up_after=SHUTDOWN_RETRY_SECONDS)
        except psycopg.Error as e:
            log.error("could not retire agent %s: %s", self.s.agent_id, e)

    def _stop_end(self, alloc_id: int, planned: bool, overdue: bool) -> Exit:
        """The end to report for a task the agent's stop ended (``overdue``: killed at the
        grace's end)."""
        end = self.ended[alloc_id]
        if not planned:
            return Exit(end.code, "agent shut down")
        how = ("checkpointed and exited" if end.code == 0
               else f"killed after the {STOP_GRACE_SECONDS:.0f} s grace" if overdue
               else end.reason or f"exit code {end.code}")
        return Exit(end.code, f"preempted: planned stop (agent {self.s.agent_id} shut down), "
                              f"{how}")
