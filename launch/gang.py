"""Where this launcher stands in its trial's gang, from the environment its agent gave it.

The agent of each node of an allocation sets (``det.agent.gang``):
``DET_SLOT_IDS`` (JSON list of the slots it holds: one worker each), ``DET_NNODES``,
``DET_NODE_RANK``, ``DET_GANG_AGENTS`` (the agents in node order, comma-separated) and the
rendezvous endpoint ``DET_MASTER_ADDR`` / ``DET_MASTER_PORT`` that the chief's agent recorded
in the allocation's row. Outside an agent (a launcher run by hand) it is one node on this
host with one worker per visible GPU, else one, and a free local port.
"""

import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from det.errors import DetError
from det.harness.distributed import RENDEZVOUS_TIMEOUT_SECONDS


@dataclass(frozen=True)
class GangPlan:
    """This node's share: ``nproc_per_node`` workers as node ``node_rank`` of ``nnodes``,
    meeting at ``master_addr:master_port`` within ``timeout`` seconds; ``agents`` names the
    agent of each node (for error messages)."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    timeout: float
    agents: tuple[str, ...]

    def worker_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """Variables the workers read beyond torchrun's (``det.harness.distributed``), and
        one intra-op thread per worker unless ``env`` sets ``OMP_NUM_THREADS``: a worker per
        slot, a core per CPU slot (torchrun does the same, but only for several workers per
        node; one per node would otherwise take every core of its host)."""
        return {"DET_GANG_AGENTS": ",".join(self.agents),
                "DET_RENDEZVOUS_TIMEOUT": f"{self.timeout:g}",
                "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS") or "1"}

    def describe_failure(self, error: BaseException) -> str:
        """A one-line reason for a failed launch: a rendezvous that timed out names the
        agents whose nodes never joined the chief's."""
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if "timed out" in text.lower() or "timeout" in type(error).__name__.lower():
            others = [a for i, a in enumerate(self.agents) if i != self.node_rank]
            who = f" (agents of the other nodes: {', '.join(others)})" if others else ""
            return (f"rendezvous at {self.master_addr}:{self.master_port} timed out after "
                    f"{self.timeout:g} s: not every node of the trial arrived{who}: {text}")
        return f"launch failed: {text}"

    def close(self) -> None:
        """Nothing held today; kept so the launcher's cleanup has one place."""


def free_port(host: str = "") -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise DetError(f"{name}: expected an integer, got {raw!r}") from None


def plan_gang(env: Mapping[str, str]) -> GangPlan:
    """Read the plan from ``env`` (see the module doc).

    Raises ``DetError`` naming a malformed variable.
    """
    raw_slots = env.get("DET_SLOT_IDS")
    if raw_slots:
        try:
            slots = json.loads(raw_slots)
        except ValueError:
            raise DetError(f"DET_SLOT_IDS: expected a JSON list, got {raw_slots!r}") from None
        nproc = max(1, len(slots)) if isinstance(slots, list) else 1
    else:
        import torch

        nproc = max(1, torch.cuda.device_count())
    nnodes = _int(env, "DET_NNODES", 1)
    node_rank = _int(env, "DET_NODE_RANK", 0)
    if not 0 <= node_rank < nnodes:
        raise DetError(f"DET_NODE_RANK: expected 0 to {nnodes - 1}, got {node_rank}")
    addr = env.get("DET_MASTER_ADDR") or "127.0.0.1"
    port = _int(env, "DET_MASTER_PORT", 0) or free_port()
    timeout = float(env.get("DET_RENDEZVOUS_TIMEOUT") or RENDEZVOUS_TIMEOUT_SECONDS)
    agents = tuple(a for a in env.get("DET_GANG_AGENTS", "").split(",") if a) or (
        env.get("DET_AGENT_ID") or socket.gethostname(),)
    return GangPlan(nnodes, node_rank, nproc, addr, port, timeout, agents)
