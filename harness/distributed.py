"""``DistributedContext``: a worker's place among the processes of one trial, and the small
collectives the harness and user code need on top of ``torch.distributed``.

det launches the workers through torchrun (:mod:`det.launch.torch_distributed`), which sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node),
``MASTER_ADDR`` and ``MASTER_PORT`` (Determined 0.38's ``det.core``; Determined's
``core.DistributedContext.from_torch_distributed``). Objects travel through torch's own
object collectives over a gloo process group (a separate one when the training backend is
nccl), so det writes no transport of its own.

Before joining the process group every worker announces itself in torch's TCP store and waits
at most ``DET_RENDEZVOUS_TIMEOUT`` seconds for the others; a worker that never arrives fails
the run with :class:`RendezvousTimeout` naming its rank and agent, instead of the others
waiting on it for torch's default half hour.
"""

import atexit
import datetime
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from det.errors import DetError

__all__ = ["DistributedContext", "RendezvousTimeout"]

RENDEZVOUS_TIMEOUT_SECONDS = 300.0
"""Default of ``DET_RENDEZVOUS_TIMEOUT``: how long workers wait for one another to start."""

HAND_BUILT_PORT = 12360
"""Default ``pub_port`` of a hand-built context: 0.38.1's ``INTER_TRAIN_PROCESS_COMM_PORT_1``."""

_ARRIVED = "det/arrived/"  # store key prefix: rank -> the agent it runs on
_POLL_SECONDS = 0.05


class RendezvousTimeout(DetError):
    """Some workers of a distributed trial did not start within the rendezvous timeout."""


class DistributedContext:
    """This worker's ``rank`` among ``size`` workers, ``local_rank`` among the ``local_size``
    workers of its agent, ``cross_rank`` (its agent's index) among ``cross_size`` agents, and
    ``chief_ip`` (the address of rank 0's agent; ``None`` for one worker).

    ``DistributedContext()`` is the single-process context: every collective returns at once.
    Build the real one with :meth:`from_torch_distributed` inside launched workers.

    Built by hand with ``size`` > 1 outside any process group (0.38.1's constructor, whose
    collectives need no ``torch.distributed`` set up by the user), each worker joins a gloo
    group at ``tcp://<chief>:<pub_port + port_offset>`` here, where the chief is
    ``chief_ip``, or 127.0.0.1 when all workers are on one agent (``local_size == size``), as
    upstream's ZMQ server is reached; it waits at most ``DET_RENDEZVOUS_TIMEOUT`` seconds for
    the others. ``pull_port`` and ``force_tcp`` (upstream's second ZMQ port, its unix-socket
    switch) are accepted and unused.
    """

    def __init__(
        self,
        *,
        rank: int = 0,
        size: int = 1,
        local_rank: int = 0,
        local_size: int = 1,
        cross_rank: int = 0,
        cross_size: int = 1,
        chief_ip: str | None = None,
        pub_port: int = HAND_BUILT_PORT,
        pull_port: int = HAND_BUILT_PORT + 1,
        port_offset: int = 0,
        force_tcp: bool = False,
        group: Any = None,
        local_group: Any = None,
        owns_process_group: bool = False,
    ) -> None:
        if not 0 <= rank < size or not 0 <= local_rank < local_size:
            raise DetError(f"distributed context: rank {rank} of {size}, local rank "
                           f"{local_rank} of {local_size} is not a valid place")
        if size > 1 and group is None and not owns_process_group:
            import torch.distributed as dist

            if not dist.is_initialized():
                if local_size != size and not chief_ip:
                    raise DetError(
                        f"distributed context: chief_ip is required when the workers span "
                        f"agents (local_size {local_size} != size {size})")
                chief = chief_ip if local_size != size else "127.0.0.1"
                timeout = float(os.environ.get("DET_RENDEZVOUS_TIMEOUT",
                                               RENDEZVOUS_TIMEOUT_SECONDS))
                dist.init_process_group(
                    "gloo", init_method=f"tcp://{chief}:{pub_port + port_offset}", rank=rank,
                    world_size=size, timeout=datetime.timedelta(seconds=timeout))
                owns_process_group = True
                group, local_group = _subgroups(local_size, cross_size, cross_rank)
                # A hand-built context is the user's to close, and 0.38 code never does: a
                # gloo group left to the interpreter's teardown may abort the process
                # ("terminate called without an active exception") once its peer has gone.
                atexit.register(self.close)
        self.rank, self.size = rank, size
        self.local_rank, self.local_size = local_rank, local_size
        self.cross_rank, self.cross_size = cross_rank, cross_size
        self.chief_ip = chief_ip
        self._group = group
        self._local_group = local_group
        self._owns = owns_process_group

    @classmethod
    def from_torch_distributed(
        cls, env: Mapping[str, str] | None = None, backend: str | None = None
    ) -> "DistributedContext":
        """The context of a worker started by torchrun, read from its environment; joins the
        default process group first if nobody did (``backend``: ``nccl`` when CUDA is
        available, else ``gloo``), after the rendezvous check above.

        Raises ``DetError`` naming a missing variable, and ``RendezvousTimeout``.
        """
        import torch
        import torch.distributed as dist

        env = os.environ if env is None else env
        try:
            rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
            local_rank, local_size = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
        except KeyError as e:
            raise DetError(
                f"distributed context: environment variable {e.args[0]} is not set; start "
                "the workers with python -m det.launch.torch_distributed") from None
        cross_rank = int(env.get("GROUP_RANK", rank // local_size))
        cross_size = size // local_size
        owns = False
        if size > 1 and not dist.is_initialized():
            timeout = float(env.get("DET_RENDEZVOUS_TIMEOUT", RENDEZVOUS_TIMEOUT_SECONDS))
            _await_workers(env, rank, size, local_size, timeout)
            backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
            if backend == "nccl":
                torch.cuda.set_device(local_rank)
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
            owns = True
        group = local_group = None
        if size > 1:
            group, local_group = _subgroups(local_size, cross_size, cross_rank)
        return cls(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                   cross_rank=cross_rank, cross_size=cross_size,
                   chief_ip=env.get("MASTER_ADDR"), group=group, local_group=local_group,
                   owns_process_group=owns)

    # Determined's accessors
    def get_rank(self) -> int:
        """Global rank (0 is the chief)."""
        return self.rank

    def get_size(self) -> int:
        """Number of workers."""
        return self.size

    def get_local_rank(self) -> int:
        """Rank on this agent."""
        return self.local_rank

    def get_local_size(self) -> int:
        """Workers on this agent."""
        return self.local_size

    def get_cross_rank(self) -> int:
        """This agent's index among the trial's agents."""
        return self.cross_rank

    def get_cross_size(self) -> int:
        """Agents taking part."""
        return self.cross_size

    def get_num_agents(self) -> int:
        """Agents taking part (``cross_size``)."""
        return self.cross_size

    @property
    def is_chief(self) -> bool:
        """Whether this is rank 0, the worker that reports for the trial."""
        return self.rank == 0

    # collectives over every worker; each must be called by all workers, in the same order
    def allgather(self, obj: Any) -> list[Any]:
        """Every worker's ``obj`` (picklable) on every worker, in rank order."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def gather(self, obj: Any) -> list[Any] | None:
        """Every worker's ``obj`` at the chief, in rank order; ``None`` on the others."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self._group)
        return out

    def broadcast(self, obj: Any) -> Any:
        """The chief's ``obj`` on every worker (the others' argument is ignored)."""
        if self.size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def any_true_async(self, *flags: bool) -> Callable[[], tuple[bool, ...]]:
        """For each flag, whether it is true on any worker: one all-reduce of a small tensor,
        started now and answered by calling the result (which waits for it), so that it
        overlaps what the caller does meanwhile (the trainer's stop agreement)."""
        if self.size == 1:
            return lambda: tuple(bool(f) for f in flags)
        import torch
        import torch.distributed as dist

        t = torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32)
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group, async_op=True)

        def answer() -> tuple[bool, ...]:
            work.wait()
            return tuple(bool(v) for v in t.tolist())

        return answer

    # the same among the workers of one agent; local rank 0 plays the chief
    def allgather_local(self, obj: Any) -> list[Any]:
        """Every local worker's ``obj`` on every local worker, in local rank order."""
        if self.local_size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.local_size
        dist.all_gather_object(out, obj, group=self._local_group)
        return out

    def gather_local(self, obj: Any) -> list[Any] | None:
        """Every local worker's ``obj`` at local rank 0, in local rank order; ``None`` on the
        others."""
        if self.local_size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.local_size if self.local_rank == 0 else None
        dist.gather_object(obj, out, dst=self._local_root(), group=self._local_group)
        return out

    def broadcast_local(self, obj: Any) -> Any:
        """Local rank 0's ``obj`` on every worker of this agent."""
        if self.local_size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=self._local_root(), group=self._local_group)
        return box[0]

    def _local_root(self) -> int:
        """The global rank of this agent's local rank 0 (torch names sources globally)."""
        return self.cross_rank * self.local_size

    def close(self) -> None:
        """Leave the process group if this context joined it."""
        if self._owns:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns = False


def _subgroups(local_size: int, cross_size: int, cross_rank: int) -> tuple[Any, Any]:
    """The gloo groups of all workers (``None``: the default group, when it is gloo) and of
    this agent's workers, in the default process group of ``cross_size`` agents of
    ``local_size`` workers each."""
    import torch.distributed as dist

    # Object collectives need a CPU backend; nccl carries only CUDA tensors.
    group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
    local_group = group
    # Every worker must create every subgroup, in the same order.
    for node in range(cross_size if cross_size > 1 else 0):
        ranks = list(range(node * local_size, (node + 1) * local_size))
        made = dist.new_group(ranks, backend="gloo")
        if node == cross_rank:
            local_group = made
    return group, local_group


def _await_workers(env: Mapping[str, str], rank: int, size: int, local_size: int,
                   timeout: float) -> None:
    """Announce this worker in torchrun's TCP store and wait until all ``size`` did.

    Raises ``RendezvousTimeout`` after ``timeout`` seconds, naming the missing ranks and the
    agents they belong to (``DET_GANG_AGENTS``: the agents in node order, set by the
    launcher).
    """
    import torch.distributed as dist

    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=timeout))
    agents = [a for a in env.get("DET_GANG_AGENTS", "").split(",") if a]
    store.set(f"{_ARRIVED}{rank}", env.get("DET_AGENT_ID", ""))
    keys = [f"{_ARRIVED}{r}" for r in range(size)]
    deadline = time.monotonic() + timeout
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r in range(size) if not store.check([f"{_ARRIVED}{r}"])]
            where = ", ".join(f"rank {r} on agent {_agent_of(r // local_size, agents)}"
                              for r in missing)
            raise RendezvousTimeout(
                f"rendezvous: {where} did not start within {timeout:g} s "
                "(DET_RENDEZVOUS_TIMEOUT)")
        time.sleep(_POLL_SECONDS)


def _agent_of(node: int, agents: list[str]) -> str:
    return agents[node] if node < len(agents) else f"of node {node}"
