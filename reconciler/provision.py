"""The provisioner's step of a pass (docs/architecture.md, "The reconciler pass"): elastic pools
get and lose agents, and a slurm pool's runs each get a Slurm job of their own.

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

A slurm pool has no agents of its own and no scheduler of det's: each run that waits in it
gets an instance tied to it (:func:`det.reconciler.provisioner.decide_runs`, in det's queue
order), submitted as one Slurm job whose script is a one-shot agent; once that agent
registers, the run is placed on it (``take_runs``), and the job ends with the run. A job that
leaves Slurm's queue before its run reported an end ends the run as failed (``gone``).
The jobs' names carry the det cluster's id (``cluster_identity``), so two det clusters on one
Slurm never see each other's jobs. The agent of an instance that is GONE is gone too (agent
lists hide it).
"""

import json
import logging
import os
import signal
import time
import uuid
from pathlib import Path

import psycopg

from det.reconciler.aws_provider import AwsProvider, ProviderError
from det.reconciler.contract import Result
from det.reconciler.local_provider import STOP_GRACE_SECONDS, LocalProvider
from det.reconciler.provisioner import (
    Demand,
    Instance,
    Provider,
    RunInstance,
    StartFailures,
    decide,
    decide_runs,
    list_due,
)
from det.reconciler.slurm_provider import SlurmProvider
from det.sql import named

log = logging.getLogger("det.reconciler")

KILL_AFTER_LAUNCH_ENV = "DET_TEST_KILL_AFTER_LAUNCH"
"""Fault injection (tests/test_provisioner.py): the path of a marker file; while it does not
exist, the reconciler creates it and SIGKILLs itself right after its first launch, before it
records it."""

Q = named("provision")


class Provisioner:
    """The provisioner step, with the providers it talks to (one per reconciler process)."""

    def __init__(self, home: Path) -> None:
        self.local = LocalProvider(home / "instances")
        self._aws: dict[tuple[str, str], AwsProvider] = {}
        self._slurm_logs = home / "slurm"
        # Per pool: (time.monotonic(), its live instances) when its provider was last asked.
        self._listed: dict[str, tuple[float, tuple]] = {}
        # The det cluster's id (its Slurm job names carry it), read once.
        self._cluster: uuid.UUID | None = None

    def step(self, conn: psycopg.Connection) -> Result:
        """Run the step on the leader's ``conn`` (autocommit: its own transactions); returns
        the rows it changed (a :class:`~det.reconciler.contract.Step`)."""
        stopping: list[int] = []
        with conn.transaction():
            changes = conn.execute(Q.arrived).rowcount + conn.execute(Q.idle).rowcount
            changes += conn.execute(Q.take_runs).rowcount
            pools = conn.execute(Q.provider_pools).fetchall()
            live = conn.execute(Q.live_instances).fetchall()
            waiting = (conn.execute(Q.runs_waiting).fetchall()
                       if any(p["provider"]["type"] == "slurm" for p in pools) else [])
            for pool in pools:
                rows = [i for i in live if i["resource_pool"] == pool["name"]]
                if pool["provider"]["type"] == "slurm":
                    changes += self._decide_runs(conn, pool, rows, [
                        w["id"] for w in waiting if w["resource_pool"] == pool["name"]],
                        stopping)
                else:
                    changes += self._decide(conn, pool, rows, stopping)
            if pools:
                live = conn.execute(Q.live_instances).fetchall()
        return Result(changes + self._act(conn, live, set(stopping)))

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
            changes += conn.execute(Q.request, {"n": d.launch, "pool": pool["name"],
                                              "provider": cfg["type"]}).rowcount
        return changes + _stop_and_say(conn, pool, d.terminate, d.status, stopping,
                                       "terminating")

    def _decide_runs(self, conn: psycopg.Connection, pool: dict, rows: list[dict],
                     waiting: list[int], stopping: list[int]) -> int:
        """A slurm pool: a job for each waiting run (``waiting``, queue order), and the
        jobs whose run no longer wants them cancelled."""
        instances = [RunInstance(r["id"], r["state"], r["run_wanted"], r["run_taken"],
                                 r["run_ended_for"], r["agent_lost"])
                     for r in rows if r["state"] != "TERMINATING"]
        d = decide_runs(pool["provider"]["max_instances"], waiting, instances,
                        StartFailures(pool["failures"], pool["failure_age"] or 0.0,
                                      pool["failure_reason"]))
        changes = 0
        if d.submit:
            changes += conn.execute(Q.request_runs, {"allocs": d.submit,
                                                     "pool": pool["name"]}).rowcount
        return changes + _stop_and_say(conn, pool, d.terminate, d.status, stopping,
                                       "cancelling")

    def _act(self, conn: psycopg.Connection, live: list[dict], stopping: set[int]) -> int:
        """Talk to the providers about ``live`` instances (outside a transaction), one pool
        at a time, each no more often than :func:`det.reconciler.provisioner.list_due` says."""
        changes = 0
        pools = sorted({r["resource_pool"] for r in live})
        self._listed = {p: self._listed[p] for p in pools if p in self._listed}
        for pool in pools:
            rows = [r for r in live if r["resource_pool"] == pool]
            seen = tuple((r["id"], r["state"], r["provider_id"]) for r in rows)
            now = time.monotonic()
            if not list_due(self._listed.get(pool), seen, now,
                            any(r["state"] == "TERMINATING" for r in rows)):
                continue
            # A listing that fails is tried again after the interval, not at every pass.
            self._listed[pool] = (now, seen)
            try:
                provider = self._provider(conn, rows[0])
                running = provider.running()
            except (ProviderError, KeyError) as e:
                log.error("pool %s: cannot list its instances: %s", pool, e)
                continue
            for row in rows:
                changes += self._act_one(conn, provider, running.get(row["agent_id"]), row,
                                         row["id"] in stopping)
        return changes

    def _provider(self, conn: psycopg.Connection,
                  row: dict) -> "LocalProvider | AwsProvider | SlurmProvider":
        if row["provider"] == "local":
            return self.local
        if row["provider"] == "slurm":
            if self._cluster is None:
                self._cluster = conn.execute(Q.cluster_id).fetchone()["id"]
            return SlurmProvider(row["resource_pool"], row["config"], self._slurm_logs,
                                 self._cluster)
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
            changes += conn.execute(Q.provider_state, {"id": row["id"], "said": said}).rowcount
        if row["state"] == "REQUESTED" and handle is None:
            try:
                handle = str(self._launch(provider, row))
            except (OSError, ProviderError) as e:
                # Counted as a start failure: the pool backs off before it launches again.
                log.error("instance %s: launch failed: %s", name, e)
                return conn.execute(Q.launch_failed, {"id": row["id"],
                                                    "reason": f"launch failed: {e}"}).rowcount
            return conn.execute(Q.launched, {"id": row["id"], "pid": handle}).rowcount
        if row["provider_id"] is None and handle is not None:
            # Launched by a reconciler killed before it recorded the launch.
            log.info("instance %s: adopted its running agent (%s)", name, handle)
            return changes + conn.execute(Q.launched, {"id": row["id"], "pid": handle}).rowcount
        if handle is None:
            # Its process or machine ended (stopped by us, or on its own).
            log.info("instance %s: gone", name)
            return conn.execute(Q.gone, {"id": row["id"]}).rowcount
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


def _stop_and_say(conn: psycopg.Connection, pool: dict, terminate: list[tuple[int, str]],
                  status: str, stopping: list[int], verb: str) -> int:
    """Mark ``terminate``'s instances (id, reason) TERMINATING, adding those it marked to
    ``stopping``, and write the pool's provider ``status`` where it changed; returns the
    instances marked. A changed status is no change: a countdown in it must not chain
    passes."""
    changes = 0
    for id_, reason in terminate:
        if conn.execute(Q.terminate, {"id": id_, "reason": reason}).fetchone():
            stopping.append(id_)
            changes += 1
            log.info("instance %s of pool %s: %s (%s)", id_, pool["name"], verb, reason)
    if status != pool["provider_status"]:
        conn.execute(Q.set_status, {"status": status, "pool": pool["name"]})
    return changes
