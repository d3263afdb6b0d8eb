"""The ``slurm`` provider: each run of a slurm pool is one Slurm job, so Slurm decides when
and where it runs.

Each instance is one batch job for one run, named after its row and the det cluster
(:func:`job_name`: ``det-<cluster>-instance-<id>``, ``sbatch -J``): a restarted reconciler
finds the jobs an earlier one submitted by that name (``squeue``) before it submits, so
nothing is queued twice, and never takes another det cluster's jobs on the same Slurm (its
instance ids count from 1 too) for its own. The job asks for one node with one
task per slot the run needs (``--ntasks-per-node``, and as many ``gres`` devices); its script
is a one-shot ``det agent run`` with those slots: the run is placed on it once it registers,
and the task launcher on the node is the agent's own (claim with the run's token, task
environment, harness and all its ranks, logs, metrics, checkpoints, preemption checks through
the database), so nothing of it is copied; the agent exits once the run ended, and the job
with it. The job gets the environment a local agent would
(:func:`det.reconciler.local_provider.agent_env`: det_agent's URL under ``det cluster up``).
Slurm's state and reason of a job not yet running are kept on the instance's row, for ``det
resource-pool describe`` and the job queue.
"""

import shlex
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from det.reconciler.aws_provider import ProviderError
from det.reconciler.local_provider import agent_env

SLURM_TIMEOUT_SECONDS = 30.0
"""How long one squeue / sbatch / scancel may take before the pass gives up on it."""


@dataclass(frozen=True)
class Job:
    """A Slurm job of an instance, as ``squeue`` shows it."""

    job_id: str
    state: str
    reason: str


CLUSTER_DIGITS = 8
"""Hex digits of the cluster's id in its job names: 32 bits, so two det clusters on one Slurm
share a prefix with a chance of 2^-32."""


def job_name(cluster: uuid.UUID, instance: str) -> str:
    """The Slurm job name of ``instance`` (its agent id, ``det-instance-<id>``) of the det
    cluster whose id (``cluster_identity.id``) is ``cluster``:
    ``det-<first CLUSTER_DIGITS hex digits>-instance-<id>``."""
    return f"det-{cluster.hex[:CLUSTER_DIGITS]}-{instance.removeprefix('det-')}"


def parse_squeue(text: str, cluster: uuid.UUID) -> dict[str, Job]:
    """``squeue -h -o '%j|%i|%T|%r'`` output -> the jobs of det cluster ``cluster``'s
    instances, by instance name (the inverse of :func:`job_name`); any other job, another det
    cluster's included, is skipped."""
    prefix = job_name(cluster, "det-instance-")
    jobs: dict[str, Job] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0].startswith(prefix) and parts[0][len(prefix):].isdigit():
            jobs["det-instance-" + parts[0][len(prefix):]] = Job(parts[1], parts[2], parts[3])
    return jobs


def sbatch_argv(config: dict, name: str, pool: str, slots: int, log_dir: Path) -> list[str]:
    """The ``sbatch`` command that queues the job named ``name`` (:func:`job_name`) of
    ``pool``, the job of a run of ``slots`` slots (its script on stdin): one node, a task per
    slot (one for a zero-slot task), as many ``gres`` devices, the pool's partition, account,
    qos and ``sbatch_args``; its output in ``log_dir/<name>.log``."""
    argv = ["sbatch", "--parsable", "--job-name", name, "--nodes", "1",
            "--ntasks-per-node", str(max(slots, 1)),
            "--output", str(log_dir / f"{name}.log")]
    for key, option in (("partition", "--partition"), ("account", "--account"),
                        ("qos", "--qos")):
        if config.get(key):
            argv += [option, config[key]]
    if config.get("gres") and slots:
        argv += ["--gres", f"{config['gres']}:{slots}"]
    return argv + list(config.get("sbatch_args") or [])


def job_script(name: str, pool: str, slots: int, gres: str | None) -> str:
    """The batch script: a one-shot agent of ``slots`` slots (the node's GPUs with ``gres``,
    else CPU slots), in the foreground, so the job lives as long as its run. det's pause and
    kill reach the run through the database as on any agent (the harness checkpoints and
    exits), and det cancels a job only before its agent took the run or after the run ended,
    so a SIGTERM under a run is Slurm's doing (scancel from outside, time limit, node drain):
    ``--stop-is-failure`` ends it as failed, restarted from its checkpoint per
    max_restarts."""
    slot_type = "none" if not slots else ("auto" if gres else "cpu")
    argv = [sys.executable, "-m", "det.cli.main", "agent", "run", "--id", name,
            "--resource-pool", pool, "--slots", str(slots), "--slot-type", slot_type,
            "--stop-is-failure", "--one-shot"]
    return "#!/bin/sh\nexec " + shlex.join(argv) + "\n"


class SlurmProvider:
    """Queues, finds and cancels a pool's jobs through Slurm's commands (``SLURM_CONF`` in the
    reconciler's environment names the cluster where it is not the host's); ``cluster``: the
    det cluster's id, which its job names carry (:func:`job_name`)."""

    def __init__(self, pool: str, config: dict, log_dir: Path, cluster: uuid.UUID) -> None:
        self.pool = pool
        self.config = config
        self.log_dir = log_dir
        self.cluster = cluster
        self.jobs: dict[str, Job] = {}

    def _run(self, argv: list[str], stdin: str | None = None,
             env: dict[str, str] | None = None) -> str:
        try:
            r = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env,
                               timeout=SLURM_TIMEOUT_SECONDS)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ProviderError(f"{argv[0]}: {e}") from None
        if r.returncode != 0:
            raise ProviderError(f"{argv[0]}: {(r.stderr or r.stdout).strip()}")
        return r.stdout

    def running(self) -> dict[str, str]:
        """Live jobs of this det cluster's instances: instance name -> Slurm job id (pending
        ones included: queued is launched).

        Raises:
            ProviderError: squeue failed (slurmctld down, no Slurm here).
        """
        self.jobs = parse_squeue(self._run(["squeue", "-h", "-o", "%j|%i|%T|%r"]),
                                 self.cluster)
        return {name: j.job_id for name, j in self.jobs.items()
                if j.state not in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
                                   "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY")}

    def launch(self, name: str, pool: str, slots: int) -> str:
        """Queue the job of instance ``name`` (the job's agent's id); returns its Slurm job
        id.

        Raises:
            ProviderError: sbatch refused it (no such partition, account or qos ...).
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = sbatch_argv(self.config, job_name(self.cluster, name), pool, slots,
                           self.log_dir)
        # sbatch's default --export=ALL: the job runs with this environment
        out = self._run(argv, job_script(name, pool, slots, self.config.get("gres")),
                        agent_env())
        return out.strip().split(";")[0]

    def stop(self, job_id: str, kill: bool = False) -> None:
        """Cancel the job: SIGTERM to its processes first (Slurm follows with SIGKILL after
        its KillWait), with ``kill`` SIGKILL at once."""
        self._run(["scancel", *(["--signal", "KILL", "--full"] if kill else []), job_id])
