"""The agent's side of a gang launch: what each agent of a distributed trial
tells its share of the workers (the statements it needs beyond a one-agent run are in
``sql/agent.sql``: ``claim_node``, ``set_rendezvous``, ``gang_agents``, ``report_node``).

Every agent holding slots of an allocation launches one task, det's launcher, with the slots
it holds there (``DET_SLOT_IDS``); :mod:`det.launch.torch_distributed` turns it into one
worker per slot. When the allocation spans agents, the chief's agent (``allocations.
agent_id``) picks a free port on its host and records ``host:port`` in the allocation's row
(``det_agent.set_rendezvous``) before it starts its workers; each other agent waits until
that is recorded, then claims its node (``det_agent.claim_node``: its own token, its node
rank) and starts its workers pointing at the chief's endpoint. Coordination goes through
the database, data through torch.
"""

import json
import socket

from psycopg.conninfo import conninfo_to_dict

from det.agent.devices import Slot


def host_address(db_url: str | None = None) -> str:
    """The address other hosts reach this one at: where ``db_url`` names a database on a TCP
    host (agents on other hosts), the local address of this host's route to it
    (the network the cluster's hosts share; the hostname's address may be on another one);
    else the hostname's, else loopback."""
    host = (conninfo_to_dict(db_url).get("host") or "").split(",")[0] if db_url else ""
    if host and not host.startswith("/"):
        try:
            family, kind, _, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, kind) as s:
                s.connect(address)  # a datagram socket's connect sends nothing
                return s.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def cluster_interface(db_url: str) -> str | None:
    """The network interface holding :func:`host_address` where ``db_url`` names a database
    on a TCP host, else None. Gloo binds its sockets there (``GLOO_SOCKET_IFNAME``): by
    default it takes the hostname's address, which another host may not reach."""
    host = (conninfo_to_dict(db_url).get("host") or "").split(",")[0]
    if not host or host.startswith("/"):
        return None
    import psutil

    mine = host_address(db_url)
    return next((name for name, addrs in psutil.net_if_addrs().items()
                 if any(a.address == mine for a in addrs)), None)


def free_port() -> int:
    """A TCP port free on this host now, for torchrun's store on the chief."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def gang_env(agent_id: str, slots: list[Slot], nodes: list[str] | None = None,
             node_rank: int = 0, rendezvous: str | None = None,
             interface: str | None = None) -> dict[str, str]:
    """The variables the launcher reads (:mod:`det.launch.gang`) for the slots this agent
    holds of one allocation; ``nodes`` (the agents in node order), ``node_rank`` and
    ``rendezvous`` (``host:port``) when it spans agents; ``interface``: the one Gloo binds
    to then (:func:`cluster_interface`)."""
    env = {"DET_SLOT_IDS": json.dumps([s.slot_id for s in slots]),
           "DET_GANG_AGENTS": ",".join(nodes or [agent_id])}
    if nodes and len(nodes) > 1 and rendezvous:
        host, port = rendezvous.rsplit(":", 1)
        env.update({"DET_NNODES": str(len(nodes)), "DET_NODE_RANK": str(node_rank),
                    "DET_MASTER_ADDR": host, "DET_MASTER_PORT": port})
        if interface:
            env["GLOO_SOCKET_IFNAME"] = interface
    return env
