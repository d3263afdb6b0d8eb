"""The provisioner's step of a pass (docs/architecture.md, "The reconciler pass"): elastic pools
get and lose agents.

In one transaction it records what it sees (agents that registered, since when each is idle),
asks :func:`det.reconciler.provisioner.decide` per pool, writes new instances as REQUESTED,
marks the ones to stop TERMINATING (draining their agent in the same statement, which checks
again that the agent holds nothing), and the pool's status. Only then, outside any
transaction, it talks to each pool's provider (:mod:`det.reconciler.local_provider`,
:mod:`det.reconciler.aws_provider`, :mod:`det.reconciler.slurm_provider`): launches each
REQUESTED instance under its row's name, unless one of that name already runs (a reconciler
killed between the launch and its record), then records it STARTING; a launch the provider
refuses ends the instance as a start failure, which the pool backs off from; stops TERMINATING
ones and records GONE those whose process or machine has ended. Every step reads its work
from the table, so a pass cut short anywhere leaves what the next one carries on from, and
nothing is launched twice.
"""

import json
import logging
import os
import signal
from pathlib import Path

import psycopg

from det.reconciler.aws_provider import AwsProvider, ProviderError
from det.reconciler.local_provider import STOP_GRACE_SECONDS, LocalProvider
from det.reconciler.provisioner import Demand, Instance, Provider, StartFailures, decide
from det.reconciler.slurm_provider import SlurmProvider

log = logging.getLogger("det.reconciler")

KILL_AFTER_LAUNCH_ENV = "DET_TEST_KILL_AFTER_LAUNCH"
"""Fault injection (tests/test_provisioner.py): the path of a marker file; while it does not
exist, the reconciler creates it and SIGKILLs itself right after its first launch, before it
records it."""

# Instances whose agent registered (not lost) are RUNNING.
ARRIVED = """
UPDATE instances i SET state = 'RUNNING', running_at = now()
  FROM agents g
 WHERE g.id = i.agent_id AND g.state <> 'LOST' AND i.state IN ('REQUESTED', 'STARTING')
"""

# A RUNNING instance is busy while its agent holds a live run or a slot of one (a gang's
# share); idle_since is when that last stopped being so.
BUSY = """
EXISTS (SELECT 1 FROM allocations a WHERE a.agent_id = i.agent_id AND a.state <> 'TERMINATED')
OR EXISTS (SELECT 1 FROM allocation_slots h WHERE h.agent_id = i.agent_id AND NOT h.released)
"""
IDLE = f"""
UPDATE instances i SET idle_since = CASE WHEN {BUSY} THEN NULL ELSE coalesce(idle_since, now()) END
 WHERE state = 'RUNNING'
   AND (idle_since IS NULL) <> ({BUSY})
"""

PROVIDER_POOLS = """
SELECT r.name, r.provider, r.provider_status,
       (SELECT coalesce(sum(a.slots_needed), 0) FROM allocations a
         WHERE a.resource_pool = r.name AND a.state = 'PENDING' AND a.desired_state = 'RUNNING'
           AND a.slots_needed > 0)::int AS slots,
       (SELECT count(*) FROM allocations a
         WHERE a.resource_pool = r.name AND a.state = 'PENDING' AND a.desired_state = 'RUNNING'
           AND a.slots_needed = 0)::int AS aux,
       f.failures, f.failure_age, f.failure_reason
  FROM resource_pools r
  CROSS JOIN LATERAL (
    -- Start failures in a row: ended instances whose agent never registered, since the
    -- latest instance whose agent did.
    SELECT count(*)::int AS failures,
           extract(epoch FROM now() - max(coalesce(i.terminating_at, i.gone_at)))::float
               AS failure_age,
           coalesce((array_agg(i.reason ORDER BY i.id DESC))[1], '') AS failure_reason
      FROM instances i
     WHERE i.resource_pool = r.name AND i.running_at IS NULL AND i.state >= 'TERMINATING'
       AND i.id > coalesce((SELECT max(id) FROM instances
                             WHERE resource_pool = r.name AND running_at IS NOT NULL), 0)
  ) f
 WHERE r.provider IS NOT NULL ORDER BY r.name
"""

LIVE_INSTANCES = """
SELECT i.id, i.resource_pool, i.state::text AS state, i.agent_id, i.provider_id, i.provider,
       r.provider AS config,
       extract(epoch FROM now() - i.requested_at)::float AS age,
       coalesce(g.state = 'LOST', false) AS agent_lost,
       extract(epoch FROM now() - i.idle_since)::float AS idle_for,
       extract(epoch FROM now() - i.terminating_at)::float AS stopping_for,
       coalesce((r.provider ->> 'slots_per_instance')::int, 1) AS slots
  FROM instances i JOIN resource_pools r ON r.name = i.resource_pool
  LEFT JOIN agents g ON g.id = i.agent_id
 WHERE i.state <> 'GONE' ORDER BY i.id
"""

# Row ids first, so the agent id (the instance's name) is written with the row.
REQUEST = """
WITH n AS (SELECT nextval(pg_get_serial_sequence('instances', 'id')) AS id
             FROM generate_series(1, %(n)s))
INSERT INTO instances (id, resource_pool, provider, agent_id)
OVERRIDING SYSTEM VALUE
SELECT id, %(pool)s, %(provider)s, 'det-instance-' || id FROM n
"""

# Only an instance with no agent yet, or whose agent holds nothing, is stopped; its agent is
# drained in the same statement so nothing is placed on it meanwhile.
TERMINATE = f"""
WITH t AS (
    UPDATE instances i SET state = 'TERMINATING', reason = %(reason)s, terminating_at = now()
     WHERE i.id = %(id)s AND i.state < 'TERMINATING'
       AND (i.state <> 'RUNNING' OR NOT ({BUSY}) OR %(reason)s = 'agent lost')
    RETURNING i.id, i.agent_id
), drained AS (
    UPDATE agents g SET state = 'DISABLED' FROM t WHERE g.id = t.agent_id AND g.state = 'ACTIVE'
)
SELECT id FROM t
"""

SET_STATUS = """
UPDATE resource_pools SET provider_status = %(status)s
 WHERE name = %(pool)s AND provider_status <> %(status)s
"""

# Launched, or found running under its name: its pid (an instance whose agent registered
# before a restarted reconciler found its process is RUNNING already).
LAUNCHED = """
UPDATE instances
   SET state = greatest(state, 'STARTING'), provider_id = %(pid)s,
       launched_at = coalesce(launched_at, now())
 WHERE id = %(id)s AND provider_id IS NULL
"""

# A launch the provider refused: the instance is GONE without having started (a start
# failure: det.reconciler.provisioner.backoff).
LAUNCH_FAILED = """
UPDATE instances SET state = 'GONE', gone_at = now(), reason = %(reason)s
 WHERE id = %(id)s AND state = 'REQUESTED'
"""

# What the provider says of an instance not yet running (slurm: the job's state and reason).
PROVIDER_STATE = """
UPDATE instances SET provider_state = %(said)s WHERE id = %(id)s AND provider_state <> %(said)s
"""

# An instance whose process ended: GONE; a reason is kept, or the exit is the reason.
GONE = """
UPDATE instances
   SET state = 'GONE', gone_at = now(),
       reason = CASE WHEN reason = '' THEN 'agent process exited' ELSE reason END
 WHERE id = %(id)s AND state <> 'GONE'
"""


class Provisioner:
    """The provisioner step, with the providers it talks to (one per reconciler process)."""

    def __init__(self, home: Path) -> None:
        self.local = LocalProvider(home / "instances")
        self._aws: dict[tuple[str, str], AwsProvider] = {}
        self._slurm_logs = home / "slurm"

    def step(self, conn: psycopg.Connection) -> int:
        """Run the step on the leader's ``conn`` (autocommit: its own transactions); returns
        the number of rows it changed."""
        stopping: list[int] = []
        with conn.transaction():
            changes = conn.execute(ARRIVED).rowcount + conn.execute(IDLE).rowcount
            pools = conn.execute(PROVIDER_POOLS).fetchall()
            live = conn.execute(LIVE_INSTANCES).fetchall()
            for pool in pools:
                changes += self._decide(conn, pool, [i for i in live
                                                     if i["resource_pool"] == pool["name"]],
                                        stopping)
            if pools:
                live = conn.execute(LIVE_INSTANCES).fetchall()
        return changes + self._act(conn, live, set(stopping))

    def _decide(self, conn: psycopg.Connection, pool: dict, rows: list[dict],
                stopping: list[int]) -> int:
        cfg = pool["provider"]
        provider = Provider(cfg["min_instances"], cfg["max_instances"],
                            cfg["slots_per_instance"], cfg["max_idle_agent_period"],
                            cfg["agent_startup_timeout"])
        instances = [Instance(r["id"], r["state"], r["age"], r["agent_lost"], r["idle_for"])
                     for r in rows if r["state"] != "TERMINATING"]
        d = decide(provider, Demand(pool["slots"], pool["aux"]), instances,
                   StartFailures(pool["failures"], pool["failure_age"] or 0.0,
                                 pool["failure_reason"]))
        changes = 0
        if d.launch:
            changes += conn.execute(REQUEST, {"n": d.launch, "pool": pool["name"],
                                              "provider": cfg["type"]}).rowcount
        for id_, reason in d.terminate:
            if conn.execute(TERMINATE, {"id": id_, "reason": reason}).fetchone():
                stopping.append(id_)
                changes += 1
                log.info("instance %s of pool %s: terminating (%s)", id_, pool["name"], reason)
        # Not a change: a countdown in the status must not chain passes.
        conn.execute(SET_STATUS, {"status": d.status, "pool": pool["name"]})
        return changes

    def _act(self, conn: psycopg.Connection, live: list[dict], stopping: set[int]) -> int:
        """Talk to the providers about ``live`` instances (outside a transaction), one pool
        at a time."""
        changes = 0
        for pool in sorted({r["resource_pool"] for r in live}):
            rows = [r for r in live if r["resource_pool"] == pool]
            try:
                provider = self._provider(rows[0])
                running = provider.running()
            except (ProviderError, KeyError) as e:
                log.error("pool %s: cannot list its instances: %s", pool, e)
                continue
            for row in rows:
                changes += self._act_one(conn, provider, running.get(row["agent_id"]), row,
                                         row["id"] in stopping)
        return changes

    def _provider(self, row: dict) -> "LocalProvider | AwsProvider | SlurmProvider":
        if row["provider"] == "local":
            return self.local
        if row["provider"] == "slurm":
            return SlurmProvider(row["resource_pool"], row["config"], self._slurm_logs)
        key = (row["resource_pool"], json.dumps(row["config"], sort_keys=True))
        if key not in self._aws:
            self._aws[key] = AwsProvider(row["resource_pool"], row["config"])
        return self._aws[key]

    def _act_one(self, conn: psycopg.Connection, provider, handle: int | str | None, row: dict,
                 stopping: bool) -> int:
        """One instance; ``handle``: the provider's id of what runs under its name, if any."""
        name = row["agent_id"]
        handle = None if handle is None else str(handle)
        changes = 0
        if isinstance(provider, SlurmProvider) and handle is not None:
            job = provider.jobs[name]
            said = "" if job.state == "RUNNING" else f"slurm job {job.job_id} {job.state}" + (
                f" ({job.reason})" if job.reason not in ("", "None") else "")
            changes += conn.execute(PROVIDER_STATE, {"id": row["id"], "said": said}).rowcount
        if row["state"] == "REQUESTED" and handle is None:
            try:
                handle = str(self._launch(provider, row))
            except (OSError, ProviderError) as e:
                # Counted as a start failure: the pool backs off before it launches again.
                log.error("instance %s: launch failed: %s", name, e)
                return conn.execute(LAUNCH_FAILED, {"id": row["id"],
                                                    "reason": f"launch failed: {e}"}).rowcount
            return conn.execute(LAUNCHED, {"id": row["id"], "pid": handle}).rowcount
        if row["provider_id"] is None and handle is not None:
            # Launched by a reconciler killed before it recorded the launch.
            log.info("instance %s: adopted its running agent (%s)", name, handle)
            return changes + conn.execute(LAUNCHED, {"id": row["id"], "pid": handle}).rowcount
        if handle is None:
            # Its process or machine ended (stopped by us, or on its own).
            log.info("instance %s: gone", name)
            return conn.execute(GONE, {"id": row["id"]}).rowcount
        if row["state"] == "TERMINATING" and (stopping or row["stopping_for"]
                                              > STOP_GRACE_SECONDS):
            try:
                provider.stop(handle if not isinstance(provider, LocalProvider) else int(handle),
                              kill=not stopping)
            except ProviderError as e:
                log.error("instance %s: stop failed (tried again): %s", name, e)
        return changes

    def _launch(self, provider, row: dict) -> int | str:
        handle = provider.launch(row["agent_id"], row["resource_pool"], row["slots"])
        log.info("instance %s: launched agent process %s", row["agent_id"], handle)
        marker = os.environ.get(KILL_AFTER_LAUNCH_ENV)
        if marker and not Path(marker).exists():
            Path(marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return handle
