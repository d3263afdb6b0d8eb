"""``/api/v1``: agents and slots (with drain toggles), resource pools, the cluster config,
search previews."""

from typing import Literal

from fastapi import APIRouter, Query

from det.api.params import IntId
from det.api.session import Session, session
from det.configs.cluster import ClusterConfig
from det.reconciler import leader
from det.sql import named

Q = named("api")
READ = named("queries")

router = APIRouter(prefix="/api/v1", tags=["cluster"])


@router.get("/agents")
def agents(s: Session = session) -> dict:
    """Agents: pool, state, runtime, slots and how many are in use."""
    return {"agents": s.conn.execute(READ.agents).fetchall()}


Toggle = Literal["enable", "disable"]


@router.post("/agents/{agent_id}/{action}")
def set_agent(agent_id: str, action: Toggle, s: Session = session) -> dict:
    """enable | disable (drain: running work finishes, nothing new lands)."""
    enabled = action == "enable"
    state = s.conn.execute(Q.agent_set_enabled, (agent_id, enabled)).fetchone()["s"]
    return {"id": agent_id, "state": state}


@router.get("/slots")
def slots(s: Session = session,
          agent_id: str | None = Query(None, max_length=63)) -> dict:
    """Slots: device, enabled, and the allocation and trial holding each."""
    return {"slots": s.conn.execute(READ.slots, {"agent": agent_id}).fetchall()}


@router.post("/agents/{agent_id}/slots/{slot_id}/{action}")
def set_slot(agent_id: str, slot_id: IntId, action: Toggle, s: Session = session) -> dict:
    """enable | disable one slot (drain)."""
    enabled = action == "enable"
    s.conn.execute(Q.slot_set_enabled, (agent_id, slot_id, enabled))
    return {"agent_id": agent_id, "slot_id": slot_id, "enabled": enabled}


@router.get("/resource-pools")
def pools(s: Session = session) -> dict:
    """Pools with their schedulers, agents, slots used / total and queued jobs."""
    return {"resource_pools": s.conn.execute(READ.pools).fetchall()}


@router.get("/cluster")
def cluster(s: Session = session) -> dict:
    """The cluster config as applied (the default one if none was), the effective scheduler
    of each pool, and the leading reconciler."""
    row = s.conn.execute(READ.stored_cluster_config).fetchone()
    cfg = ClusterConfig.model_validate(row["config"]) if row else ClusterConfig()
    return {"config": cfg.model_dump(mode="json"),
            "effective": {p.name: cfg.effective_scheduler(p.name).model_dump(mode="json")
                          for p in cfg.resource_pools},
            "applied_at": row["applied_at"] if row else None,
            "leader": leader.current(s.conn)}
