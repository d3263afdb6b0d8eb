"""Reading the cluster: agents, slots (and what holds each), resource pools, the cluster
config."""

AGENTS = """
SELECT g.id, g.hostname, g.resource_pool, g.state::text AS state, g.runtime, g.last_heartbeat,
       count(s.slot_id) AS slots,
       count(h.slot_id) AS used
  FROM agents g
  LEFT JOIN slots s ON s.agent_id = g.id
  LEFT JOIN allocation_slots h ON h.agent_id = s.agent_id AND h.slot_id = s.slot_id
                              AND NOT h.released
 GROUP BY g.id ORDER BY g.id
"""

SLOTS = """
SELECT agent_id, slot_id, type, device_name, device_uuid, memory_mb, enabled, resource_pool,
       agent_state::text, allocation_id, trial_id
  FROM reporting.slot_usage
 WHERE %(agent)s::text IS NULL OR agent_id = %(agent)s
 ORDER BY agent_id, slot_id
"""

STORED = "SELECT config, original, applied_at FROM cluster_config"

POOLS = """
SELECT r.name, r.description, det_pool_scheduler(r.name) AS scheduler,
       r.max_aux_containers_per_agent,
       (SELECT count(*) FROM agents g WHERE g.resource_pool = r.name AND g.state <> 'LOST')
           AS agents,
       (SELECT count(*) FROM slots s JOIN agents g ON g.id = s.agent_id
         WHERE g.resource_pool = r.name AND g.state = 'ACTIVE' AND s.enabled) AS slots_total,
       (SELECT count(*) FROM allocation_slots h JOIN agents g ON g.id = h.agent_id
         WHERE g.resource_pool = r.name AND NOT h.released) AS slots_used,
       (SELECT count(*) FROM reporting.job_queue q
         WHERE q.resource_pool = r.name AND q.status = 'STATE_QUEUED') AS queued_jobs,
       r.provider, r.provider_status,
       (SELECT count(*) FROM instances i WHERE i.resource_pool = r.name AND i.state <> 'GONE')
           AS instances
  FROM resource_pools r ORDER BY r.name
"""

# A pool's instances (elastic pools), the live ones first, then the latest gone.
POOL_INSTANCES = """
SELECT id, agent_id, state::text AS state, provider_id, provider_state, reason, requested_at,
       running_at, gone_at
  FROM instances WHERE resource_pool = %(pool)s
 ORDER BY state = 'GONE', id DESC LIMIT %(limit)s
"""
