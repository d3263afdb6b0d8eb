"""The provisioner's decisions for one pool with a provider: pure functions of what waits in
it, its live instances and its provider config.

:func:`decide` (elastic pools: agents sized by demand) and :func:`decide_runs` (slurm pools:
one Slurm job per run) return which instances to launch and which to terminate, and why the
pool waits or refuses; :mod:`det.reconciler.provision` loads their input and applies the
result.
"""

import math
from dataclasses import dataclass, field

BOOTING = ("REQUESTED", "STARTING")
"""Instance states before its agent registers."""


@dataclass(frozen=True)
class Provider:
    """A pool's ``provider`` (det.configs.cluster.ProviderConfig); durations in seconds."""

    min_instances: int
    max_instances: int
    slots_per_instance: int
    max_idle_agent_period: float
    agent_startup_timeout: float


@dataclass(frozen=True)
class Instance:
    """A live instance (not TERMINATING or GONE). ``age``: seconds since it was requested;
    ``agent_lost``: its agent registered and then stopped heartbeating; ``idle_for``: seconds
    its registered agent has held no run and no task (None while busy or not yet
    registered)."""

    id: int
    state: str
    age: float
    agent_lost: bool = False
    idle_for: float | None = None


@dataclass(frozen=True)
class Demand:
    """What waits in the pool: ``slots`` wanted by runs not placed, and ``aux`` zero-slot tasks
    not placed."""

    slots: int = 0
    aux: int = 0


@dataclass(frozen=True)
class StartFailures:
    """Instances that ended without their agent ever registering (or whose launch the
    provider refused), since the last one whose agent did: ``count``; ``age``, seconds since
    the latest of them ended; ``reason``, why it ended."""

    count: int = 0
    age: float = 0.0
    reason: str = ""


BACKOFF_BASE_SECONDS = 10.0
"""After a start failure the pool launches nothing for this long, doubled at each further
failure in a row up to :data:`BACKOFF_MAX_SECONDS` (no endless loop launching
instances that never come up)."""
BACKOFF_MAX_SECONDS = 600.0


def backoff(failures: int) -> float:
    """Seconds to wait before launching after ``failures`` start failures in a row."""
    return 0.0 if failures == 0 else min(BACKOFF_BASE_SECONDS * 2 ** (failures - 1),
                                         BACKOFF_MAX_SECONDS)


LIST_INTERVAL_SECONDS = 5.0
"""How often a pool's provider is asked what runs (a read of ``/proc``, an ``squeue``, an EC2
call) while the pool's instances stay as they were; a change to them (one requested, launched,
registered or stopping) asks at the next pass, and so does each pass while one is stopping."""


def list_due(last: tuple[float, tuple] | None, instances: tuple, now: float,
             stopping: bool = False, interval: float = LIST_INTERVAL_SECONDS) -> bool:
    """Whether to ask the provider now: ``last`` is (when, ``instances``) of the last time it
    was asked (None: never), ``instances`` what the pool's live instances are now (any value
    that changes when they do), ``now`` and ``interval`` seconds on one clock. While an
    instance is ``stopping`` (TERMINATING), at every pass: its end is what the pool waits for
    (a start failure's back-off counts from it)."""
    return (stopping or last is None or last[1] != instances
            or now - last[0] >= interval)


@dataclass
class Decision:
    """``launch`` new instances (:func:`decide`), or ``submit`` one for each of these runs
    (allocation ids, :func:`decide_runs`); ``terminate`` (instance id, reason) pairs;
    ``status``: why the pool waits or refuses, shown by ``det resource-pool list`` ('' when
    nothing to say)."""

    launch: int = 0
    terminate: list[tuple[int, str]] = field(default_factory=list)
    status: str = ""
    submit: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RunInstance:
    """A live instance of a slurm pool, tied to one run. ``state``, ``agent_lost``: as
    :class:`Instance`; ``run_wanted``: its run still waits (PENDING, desired RUNNING) or
    lives; ``run_taken``: its agent took the run; ``run_ended_for``: seconds since the run
    ended (None while it lives)."""

    id: int
    state: str
    run_wanted: bool
    run_taken: bool = False
    run_ended_for: float | None = None
    agent_lost: bool = False


ONE_SHOT_EXIT_SECONDS = 30.0
"""How long a run's Slurm job may outlive the run its agent took (it reports the end, then
exits, ending the job) before det cancels it."""


def decide_runs(max_instances: int, waiting: list[int], instances: list[RunInstance],
                failures: StartFailures = StartFailures()) -> Decision:
    """The Slurm jobs to submit and to cancel now in a slurm pool: one job per run.

    ``waiting``: the pool's waiting runs with no live job, in det's queue order; a job is
    submitted for each in that order while fewer than ``max_instances`` jobs live (Slurm then
    decides when and where each starts), none for :func:`backoff` seconds after a start
    failure (a job refused, or ended before its agent registered). A job is cancelled when its
    run no longer wants it: paused, killed or ended before its agent took it, or ended
    :data:`ONE_SHOT_EXIT_SECONDS` ago and the job still lives; and when its agent was lost.
    A job waiting in Slurm's queue is never timed out: Slurm decides when it runs.
    """
    d = Decision()
    live = 0
    for i in instances:
        if i.state == "RUNNING" and i.agent_lost:
            d.terminate.append((i.id, "agent lost"))
        elif not i.run_wanted and not i.run_taken:
            d.terminate.append((i.id, "its run no longer waits for it"))
        elif (not i.run_wanted and i.run_ended_for is not None
              and i.run_ended_for >= ONE_SHOT_EXIT_SECONDS):
            d.terminate.append((i.id, f"its run ended {i.run_ended_for:.0f} s ago"))
        else:
            live += 1
    d.submit = waiting[:max(0, max_instances - live)]
    wait = backoff(failures.count) - failures.age
    if d.submit and wait > 0:
        d.submit = []
        why = f" ({failures.reason})" if failures.reason else ""
        d.status = (f"{failures.count} Slurm job(s) in a row failed to start{why}; next "
                    f"submission in {math.ceil(wait)} s")
    elif len(waiting) > len(d.submit):
        d.status = (f"at max_instances {max_instances}: {len(waiting) - len(d.submit)} "
                    f"run(s) wait for a Slurm job")
    return d


def decide(provider: Provider, demand: Demand, instances: list[Instance],
           failures: StartFailures = StartFailures()) -> Decision:
    """The instances to launch and terminate now.

    Rules: an instance whose agent has not registered ``agent_startup_timeout``
    seconds after it was requested is terminated, as is one whose agent was lost; waiting runs
    want ``ceil(slots / slots_per_instance)`` instances, and waiting zero-slot tasks one, beyond
    those still booting; never more than ``max_instances`` live, never fewer than
    ``min_instances``; nothing is launched for :func:`backoff` seconds after a start failure
    (``failures``, and this pass's); with nothing waiting, instances idle for
    ``max_idle_agent_period`` are terminated down to ``min_instances``, longest idle first.
    Only an idle instance (or one with no agent) is ever terminated, so none holding a run is.
    """
    d = Decision()
    live = []
    failed = 0
    for i in instances:
        if i.state in BOOTING and i.age > provider.agent_startup_timeout:
            failed += 1
            d.terminate.append((i.id, f"agent did not register within "
                                      f"{provider.agent_startup_timeout:g} s"))
            failures = StartFailures(failures.count, 0.0, d.terminate[-1][1])
        elif i.state == "RUNNING" and i.agent_lost:
            d.terminate.append((i.id, "agent lost"))
        else:
            live.append(i)
    booting = sum(i.state in BOOTING for i in live)
    if failed:
        failures = StartFailures(failures.count + failed, 0.0, failures.reason)
    per = provider.slots_per_instance
    wanted = math.ceil(demand.slots / per) if per else 0
    if demand.aux and not live:
        wanted = max(wanted, 1)
    target = max(len(live) + max(0, wanted - booting), provider.min_instances)
    d.launch = max(0, min(target, provider.max_instances) - len(live))
    wait = backoff(failures.count) - failures.age
    if d.launch and wait > 0:
        d.launch = 0
        why = f" ({failures.reason})" if failures.reason else ""
        d.status = (f"{failures.count} instance(s) in a row failed to start{why}; next launch "
                    f"in {math.ceil(wait)} s")
    elif target > provider.max_instances:
        d.status = (f"at max_instances {provider.max_instances}: "
                    f"{demand.slots} slot(s) and {demand.aux} task(s) wait")
    elif booting + d.launch:
        d.status = f"waiting for {booting + d.launch} instance(s) to start"
    if demand.slots == 0 and demand.aux == 0:
        idle = sorted((i for i in live if i.idle_for is not None
                       and i.idle_for >= provider.max_idle_agent_period),
                      key=lambda i: -i.idle_for)
        spare = max(0, len(live) - provider.min_instances)
        for i in idle[:spare]:
            d.terminate.append((i.id, f"idle for {provider.max_idle_agent_period:g} s"))
    return d
