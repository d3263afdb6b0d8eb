-- The provisioner's step of a pass (det.reconciler.provision): elastic pools get and lose
-- agents. Its transaction records what it sees and decides; the provider calls come after it.

-- name: arrived
-- Instances whose agent registered (not lost) are RUNNING.
UPDATE instances i SET state = 'RUNNING', running_at = now()
  FROM agents g
 WHERE g.id = i.agent_id AND g.state <> 'LOST' AND i.state IN ('REQUESTED', 'STARTING')

-- name: idle
-- A RUNNING instance is busy while its agent holds a live run or a slot of one (a gang's
-- share); idle_since is when that last stopped being so.
UPDATE instances i SET idle_since = CASE WHEN
EXISTS (SELECT 1 FROM allocations a WHERE a.agent_id = i.agent_id AND a.state <> 'TERMINATED')
OR EXISTS (SELECT 1 FROM allocation_slots h WHERE h.agent_id = i.agent_id AND NOT h.released)
 THEN NULL ELSE coalesce(idle_since, now()) END
 WHERE state = 'RUNNING'
   AND (idle_since IS NULL) <> (
EXISTS (SELECT 1 FROM allocations a WHERE a.agent_id = i.agent_id AND a.state <> 'TERMINATED')
OR EXISTS (SELECT 1 FROM allocation_slots h WHERE h.agent_id = i.agent_id AND NOT h.released)
)

-- name: provider_pools
-- Each pool with a provider: its config and status, the slots and zero-slot tasks waiting in
-- it, and its start failures in a row.
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
    -- latest instance whose agent did; a run's Slurm job that det cancelled (its run no
    -- longer waited) is none.
    SELECT count(*)::int AS failures,
           extract(epoch FROM now() - max(coalesce(i.terminating_at, i.gone_at)))::float
               AS failure_age,
           coalesce((array_agg(i.reason ORDER BY i.id DESC))[1], '') AS failure_reason
      FROM instances i
     WHERE i.resource_pool = r.name AND i.running_at IS NULL AND i.state >= 'TERMINATING'
       AND (i.allocation_id IS NULL OR i.terminating_at IS NULL)
       AND i.id > coalesce((SELECT max(id) FROM instances
                             WHERE resource_pool = r.name AND running_at IS NOT NULL), 0)
  ) f
 WHERE r.provider IS NOT NULL ORDER BY r.name

-- name: cluster_id
-- This det cluster's id, which its Slurm jobs' names carry (slurm_provider.job_name).
SELECT id FROM cluster_identity

-- name: live_instances
-- Instances not GONE, with their pool's provider config and the ages the decisions read; an
-- instance of a slurm pool with its run: whether the run still wants it (waiting, or live),
-- whether its agent took the run and since when the run ended, and the run's slots. An agent
-- that retired (det_agent.retire: its run ended, it exits) is not lost.
SELECT i.id, i.resource_pool, i.state::text AS state, i.agent_id, i.provider_id, i.provider,
       r.provider AS config, i.allocation_id,
       extract(epoch FROM now() - i.requested_at)::float AS age,
       coalesce(g.state = 'LOST' AND g.gone_at IS NULL, false) AS agent_lost,
       extract(epoch FROM now() - i.idle_since)::float AS idle_for,
       extract(epoch FROM now() - i.terminating_at)::float AS stopping_for,
       coalesce(a.state NOT IN ('PENDING', 'TERMINATED')
                OR (a.state = 'PENDING' AND a.desired_state = 'RUNNING'), false) AS run_wanted,
       coalesce(a.agent_id = i.agent_id, false) AS run_taken,
       extract(epoch FROM now() - a.ended_at)::float AS run_ended_for,
       CASE WHEN i.allocation_id IS NOT NULL THEN coalesce(a.slots_needed, 0)
            ELSE coalesce((r.provider ->> 'slots_per_instance')::int, 1) END AS slots
  FROM instances i JOIN resource_pools r ON r.name = i.resource_pool
  LEFT JOIN agents g ON g.id = i.agent_id
  LEFT JOIN allocations a ON a.id = i.allocation_id
 WHERE i.state <> 'GONE' ORDER BY i.id

-- name: runs_waiting
-- Runs waiting in slurm pools with no live Slurm job yet, in det's queue order (priority,
-- then queue position): each is submitted as a job of its own, in this order.
SELECT a.resource_pool, a.id
  FROM allocations a
  JOIN jobs j ON j.id = a.job_id
  JOIN resource_pools r ON r.name = a.resource_pool
 WHERE r.provider ->> 'type' = 'slurm' AND a.state = 'PENDING' AND a.desired_state = 'RUNNING'
   AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.allocation_id = a.id AND i.state <> 'GONE')
 ORDER BY j.priority, j.queue_position, a.id

-- name: request_runs
-- One instance (one Slurm job) per run: row ids first, so the job's name is written with the
-- row; the unique index on live instances' allocation_id keeps a run from a second one.
WITH n AS (SELECT nextval(pg_get_serial_sequence('instances', 'id')) AS id, x AS allocation_id
             FROM unnest(%(allocs)s::bigint[]) AS x)
INSERT INTO instances (id, resource_pool, provider, agent_id, allocation_id)
OVERRIDING SYSTEM VALUE
SELECT id, %(pool)s, 'slurm', 'det-instance-' || id, allocation_id FROM n

-- name: take_runs
-- The agent of a run's Slurm job registered: the run is placed on it, with as many of its
-- slots as the run needs (det's scheduler places nothing in a slurm pool), and the agent is
-- woken. Slurm chose the node; the agent takes no other run.
WITH x AS (
    SELECT a.id, i.agent_id, a.slots_needed
      FROM instances i
      JOIN allocations a ON a.id = i.allocation_id
      JOIN agents g ON g.id = i.agent_id
     WHERE i.state = 'RUNNING' AND a.state = 'PENDING' AND a.desired_state = 'RUNNING'
       AND g.state = 'ACTIVE' AND NOT g.stopping
       AND (SELECT count(*) FROM slots s WHERE s.agent_id = g.id AND s.enabled)
           >= a.slots_needed
), taken AS (
    UPDATE allocations a SET state = 'ASSIGNED', agent_id = x.agent_id, assigned_at = now(),
           pending_reason = NULL
      FROM x WHERE a.id = x.id AND a.state = 'PENDING'
    RETURNING a.id, a.agent_id, a.slots_needed
), held AS (
    INSERT INTO allocation_slots (allocation_id, agent_id, slot_id)
    SELECT id, agent_id, slot_id
      FROM (SELECT t.id, s.agent_id, s.slot_id, t.slots_needed,
                   row_number() OVER (PARTITION BY t.id ORDER BY s.slot_id) AS n
              FROM taken t JOIN slots s ON s.agent_id = t.agent_id AND s.enabled) h
     WHERE n <= slots_needed
)
SELECT id, pg_notify(det_internal.channel('agent', agent_id), '') FROM taken

-- name: request
-- New instances: row ids first, so the agent id (the instance's name) is written with the row.
WITH n AS (SELECT nextval(pg_get_serial_sequence('instances', 'id')) AS id
             FROM generate_series(1, %(n)s))
INSERT INTO instances (id, resource_pool, provider, agent_id)
OVERRIDING SYSTEM VALUE
SELECT id, %(pool)s, %(provider)s, 'det-instance-' || id FROM n

-- name: terminate
-- Only an instance with no agent yet, or whose agent holds nothing, is stopped; its agent is
-- drained in the same statement so nothing is placed on it meanwhile.
WITH t AS (
    UPDATE instances i SET state = 'TERMINATING', reason = %(reason)s, terminating_at = now()
     WHERE i.id = %(id)s AND i.state < 'TERMINATING'
       AND (i.state <> 'RUNNING' OR NOT (
EXISTS (SELECT 1 FROM allocations a WHERE a.agent_id = i.agent_id AND a.state <> 'TERMINATED')
OR EXISTS (SELECT 1 FROM allocation_slots h WHERE h.agent_id = i.agent_id AND NOT h.released)
) OR %(reason)s = 'agent lost')
    RETURNING i.id, i.agent_id
), drained AS (
    UPDATE agents g SET state = 'DISABLED' FROM t WHERE g.id = t.agent_id AND g.state = 'ACTIVE'
)
SELECT id FROM t

-- name: set_status
-- Why the pool waits or refuses (det resource-pool list).
UPDATE resource_pools SET provider_status = %(status)s
 WHERE name = %(pool)s AND provider_status <> %(status)s

-- name: launched
-- Launched, or found running under its name: its pid (an instance whose agent registered
-- before a restarted reconciler found its process is RUNNING already).
UPDATE instances
   SET state = greatest(state, 'STARTING'), provider_id = %(pid)s,
       launched_at = coalesce(launched_at, now())
 WHERE id = %(id)s AND provider_id IS NULL

-- name: launch_failed
-- A launch the provider refused: the instance is GONE without having started (a start
-- failure: det.reconciler.provisioner.backoff).
UPDATE instances SET state = 'GONE', gone_at = now(), reason = %(reason)s
 WHERE id = %(id)s AND state = 'REQUESTED'

-- name: provider_state
-- What the provider says of an instance not yet running (slurm: the job's state and reason).
UPDATE instances SET provider_state = %(said)s WHERE id = %(id)s AND provider_state <> %(said)s

-- name: gone
-- An instance whose process, machine or Slurm job ended: GONE, a reason kept or the end the
-- reason; its agent, which ended with it, LOST (its runs, if any, end as a lost agent's) and
-- gone (agent lists hide it). A run's Slurm job ending before the run it took reported an end
-- (the job killed or failed, its node lost) ends that run now with no exit code, the job
-- named: a failure that restarts the trial per max_restarts. A run it never took waits for a
-- job of its own again.
WITH i AS (
    UPDATE instances
       SET state = 'GONE', gone_at = now(),
           reason = CASE WHEN reason <> '' THEN reason
                         WHEN allocation_id IS NULL THEN 'agent process exited'
                         ELSE 'slurm job ended' END
     WHERE id = %(id)s AND state <> 'GONE'
    RETURNING agent_id, allocation_id, provider_id
), lost AS (
    UPDATE agents g SET state = 'LOST', gone_at = now()
      FROM i WHERE g.id = i.agent_id AND g.gone_at IS NULL
), ended AS (
    UPDATE allocations a
       SET state = 'TERMINATED', ended_at = now(),
           exit_reason = 'slurm job ' || coalesce(i.provider_id, '?') || ' ended before its '
                         || 'run reported an end (cancelled, failed or its node lost)'
      FROM i WHERE a.id = i.allocation_id AND a.agent_id = i.agent_id
       AND a.state <> 'TERMINATED'
)
SELECT 1 FROM i
