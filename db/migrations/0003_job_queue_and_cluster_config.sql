CREATE TABLE cluster_config (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    config     jsonb NOT NULL,
    original   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE cluster_config IS
    'The applied cluster config (`det cluster config apply`), validated by det.configs.cluster: '
    '{resource_manager: {scheduler, default_compute_resource_pool, default_aux_resource_pool}, '
    'resource_pools: [...]}.';

ALTER TABLE resource_pools
    ADD COLUMN scheduler jsonb,
    ADD COLUMN max_aux_containers_per_agent integer NOT NULL DEFAULT 100
        CHECK (max_aux_containers_per_agent >= 0);
COMMENT ON COLUMN resource_pools.scheduler IS
    'The pool''s own scheduler; NULL uses the cluster''s. A pool scheduler replaces the '
    'cluster''s as a whole (spec: Resource Pools).';

ALTER TABLE jobs
    ADD COLUMN max_slots integer CHECK (max_slots IS NULL OR max_slots >= 0),
    ADD COLUMN fallback_pools text[] NOT NULL DEFAULT '{}';
COMMENT ON COLUMN jobs.fallback_pools IS
    'Pools to try, in order, after resource_pool when it cannot take a waiting run now '
    '(resources.resource_pool given as a list).';
COMMENT ON COLUMN jobs.max_slots IS 'Caps the job''s demand under fair share (resources.max_slots).';

ALTER TABLE allocations
    ADD COLUMN preemptible boolean NOT NULL DEFAULT true,
    ADD COLUMN pending_reason text;
COMMENT ON COLUMN allocations.pending_reason IS
    'Why the allocation still waits, in the scheduler''s words from its latest pass.';

CREATE FUNCTION det_pool_scheduler(p_pool text) RETURNS jsonb LANGUAGE sql STABLE AS $$
-- The scheduler a pool really uses, every default filled in: the pool's own, else the
-- cluster's, else fair_share (the spec's default for a blank type: Resource Pools).
    SELECT jsonb_build_object('type', 'fair_share', 'preemption', false, 'fitting_policy', 'best',
                              'default_priority', 42)
           || coalesce((SELECT nullif(scheduler, 'null') FROM resource_pools WHERE name = p_pool),
                       (SELECT config #> '{resource_manager,scheduler}' FROM cluster_config),
                       '{}');
$$;

CREATE FUNCTION det_apply_cluster_config(p_config jsonb, p_original text) RETURNS void
LANGUAGE plpgsql AS $$
-- Store a validated cluster config and make resource_pools match it. A pool the config drops
-- is deleted only if nothing uses it; otherwise the whole apply is refused.
DECLARE
    v_gone text;
BEGIN
    INSERT INTO resource_pools (name, description, scheduler, max_aux_containers_per_agent)
    SELECT p ->> 'name', coalesce(p ->> 'description', ''), nullif(p -> 'scheduler', 'null'),
           coalesce((p ->> 'max_aux_containers_per_agent')::integer, 100)
    FROM jsonb_array_elements(p_config -> 'resource_pools') p
    ON CONFLICT (name) DO UPDATE
        SET description = excluded.description, scheduler = excluded.scheduler,
            max_aux_containers_per_agent = excluded.max_aux_containers_per_agent;
    SELECT name INTO v_gone FROM resource_pools r
     WHERE name NOT IN (SELECT p ->> 'name' FROM jsonb_array_elements(p_config -> 'resource_pools') p)
       AND (EXISTS (SELECT 1 FROM agents g WHERE g.resource_pool = r.name AND g.state <> 'LOST')
            OR EXISTS (SELECT 1 FROM jobs j JOIN experiments e ON e.job_id = j.id
                        WHERE j.resource_pool = r.name
                          AND e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR')))
     LIMIT 1;
    IF v_gone IS NOT NULL THEN
        RAISE EXCEPTION 'resource_pools: pool "%" still has agents or active jobs; keep it in the config or drain it first', v_gone
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM resource_pools r
     WHERE name NOT IN (SELECT p ->> 'name' FROM jsonb_array_elements(p_config -> 'resource_pools') p)
       AND NOT EXISTS (SELECT 1 FROM agents g WHERE g.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.resource_pool = r.name);
    INSERT INTO cluster_config (config, original) VALUES (p_config, p_original)
    ON CONFLICT (singleton) DO UPDATE
        SET config = excluded.config, original = excluded.original, applied_at = now();
    PERFORM pg_notify('det_reconciler', 'cluster');
END $$;

CREATE FUNCTION det_job_update(p_job bigint, p_field text, p_value text) RETURNS void
LANGUAGE plpgsql AS $$
-- One change to a queued job (spec: run-training-code, Modify the Job Queue): priority only
-- under the priority scheduler, weight only under fair share, ahead-of / behind-of only under
-- priority, resource-pool only for experiments. Several calls in one transaction are
-- `det job update-batch`: all apply or none.
DECLARE
    j jobs;
    other jobs;
    v_type text;
    v_neighbour numeric;
    v_int integer;
BEGIN
    SELECT * INTO j FROM jobs WHERE id = p_job FOR UPDATE;
    IF NOT FOUND OR NOT EXISTS (
        SELECT 1 FROM experiments e
         WHERE e.job_id = p_job AND e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR')) THEN
        RAISE EXCEPTION 'job % not found among active jobs', p_job USING ERRCODE = 'no_data_found';
    END IF;
    v_type := det_pool_scheduler(j.resource_pool) ->> 'type';
    CASE p_field
    WHEN 'priority' THEN
        IF v_type <> 'priority' THEN
            RAISE EXCEPTION 'job %: priority applies only under the priority scheduler; pool "%" uses %',
                p_job, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_int := p_value::integer;
        IF v_int NOT BETWEEN 1 AND 99 THEN
            RAISE EXCEPTION 'job %: priority must be between 1 and 99, not %', p_job, p_value
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- A new priority puts the job back at its submission time within that priority.
        UPDATE jobs SET priority = v_int,
               queue_position = extract(epoch FROM submitted_at) * 1000000
         WHERE id = p_job;
    WHEN 'weight' THEN
        IF v_type <> 'fair_share' THEN
            RAISE EXCEPTION 'job %: weight applies only under the fair_share scheduler; pool "%" uses %',
                p_job, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF p_value::double precision <= 0 THEN
            RAISE EXCEPTION 'job %: weight must be > 0, not %', p_job, p_value
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        UPDATE jobs SET weight = p_value::double precision WHERE id = p_job;
    WHEN 'resource-pool' THEN
        IF j.type <> 'EXPERIMENT' THEN
            RAISE EXCEPTION 'job %: only experiments can change resource pool; cancel and resubmit a %',
                p_job, lower(j.type) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p_value) THEN
            RAISE EXCEPTION 'job %: no resource pool named "%"', p_job, p_value
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        UPDATE jobs SET resource_pool = p_value, fallback_pools = '{}' WHERE id = p_job;
        UPDATE allocations SET resource_pool = p_value
         WHERE job_id = p_job AND state = 'PENDING';
        UPDATE experiments SET config = jsonb_set(config, '{resources,resource_pool}', to_jsonb(p_value))
         WHERE job_id = p_job;
    WHEN 'ahead-of', 'behind-of' THEN
        IF v_type <> 'priority' THEN
            RAISE EXCEPTION 'job %: % applies only under the priority scheduler; pool "%" uses %',
                p_job, p_field, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT * INTO other FROM jobs WHERE id = p_value::bigint;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'job %: no job % to move %', p_job, p_value, replace(p_field, '-of', '')
                USING ERRCODE = 'no_data_found';
        END IF;
        IF other.resource_pool <> j.resource_pool THEN
            RAISE EXCEPTION 'job %: job % is in pool "%", not "%"', p_job, other.id,
                other.resource_pool, j.resource_pool USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- Take the other job's priority and a position just before (after) it: the midpoint
        -- with its neighbour, so no other job moves.
        IF p_field = 'ahead-of' THEN
            SELECT max(queue_position) INTO v_neighbour FROM jobs
             WHERE resource_pool = other.resource_pool AND priority = other.priority
               AND queue_position < other.queue_position AND id <> p_job;
            v_neighbour := coalesce(v_neighbour, other.queue_position - 2);
        ELSE
            SELECT min(queue_position) INTO v_neighbour FROM jobs
             WHERE resource_pool = other.resource_pool AND priority = other.priority
               AND queue_position > other.queue_position AND id <> p_job;
            v_neighbour := coalesce(v_neighbour, other.queue_position + 2);
        END IF;
        UPDATE jobs SET priority = other.priority,
               queue_position = (other.queue_position + v_neighbour) / 2
         WHERE id = p_job;
    ELSE
        RAISE EXCEPTION 'unknown job field "%"; expected priority, weight, resource-pool, ahead-of or behind-of',
            p_field USING ERRCODE = 'invalid_parameter_value';
    END CASE;
    PERFORM pg_notify('det_reconciler', 'job');
EXCEPTION
    WHEN invalid_text_representation THEN
        RAISE EXCEPTION 'job %: % expects a number, not "%"', p_job, p_field, p_value
            USING ERRCODE = 'invalid_parameter_value';
END $$;

DROP VIEW reporting.job_queue;
CREATE VIEW reporting.job_queue AS
-- Active jobs in scheduling order per pool, with slots acquired / needed and the scheduler's
-- reasons for what still waits.
SELECT j.id AS job_id, j.type, j.resource_pool, j.priority, j.weight, j.owner, j.submitted_at,
       j.queue_position, e.id AS experiment_id, e.name, e.state::text AS experiment_state,
       coalesce(sum(a.slots_needed) FILTER (WHERE a.state > 'PENDING'), 0) AS slots_acquired,
       coalesce(sum(a.slots_needed), 0) AS slots_needed,
       CASE WHEN bool_or(a.state > 'PENDING') THEN 'STATE_SCHEDULED'
            ELSE 'STATE_QUEUED' END AS status,
       string_agg(DISTINCT a.pending_reason, ' | ') FILTER (WHERE a.state = 'PENDING')
           AS pending_reason,
       row_number() OVER (PARTITION BY j.resource_pool
                          ORDER BY j.priority, j.queue_position, j.id) - 1 AS queue_order
FROM jobs j
JOIN experiments e ON e.job_id = j.id
LEFT JOIN allocations a ON a.job_id = j.id AND a.state <> 'TERMINATED'
WHERE e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR')
GROUP BY j.id, e.id;

CREATE OR REPLACE FUNCTION det_create_experiment(
    p_config jsonb, p_original_config text, p_context bytea, p_owner text
) RETURNS integer LANGUAGE plpgsql AS $$
-- Submit an experiment. p_config is the expanded config (validated by det.configs);
-- p_context the packed model definition (tar.gz), stored once per distinct content. The
-- job's priority defaults to its pool scheduler's default_priority.
DECLARE
    v_pools text[] := CASE jsonb_typeof(p_config #> '{resources,resource_pool}')
        WHEN 'array' THEN ARRAY(SELECT jsonb_array_elements_text(
                                    p_config #> '{resources,resource_pool}'))
        ELSE ARRAY[coalesce(p_config #>> '{resources,resource_pool}', 'default')] END;
    v_pool text := v_pools[1];
    v_missing text;
    v_ctx bigint;
    v_job bigint;
    v_id integer;
BEGIN
    SELECT p INTO v_missing FROM unnest(v_pools) p
     WHERE NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p) LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'resources.resource_pool: no resource pool named "%"', v_missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF p_context IS NOT NULL THEN
        INSERT INTO context_blobs (sha256, size_bytes, data)
        VALUES (sha256(p_context), length(p_context), p_context)
        ON CONFLICT (sha256) DO NOTHING;
        SELECT id INTO v_ctx FROM context_blobs WHERE sha256 = sha256(p_context);
    END IF;
    INSERT INTO jobs (type, resource_pool, fallback_pools, priority, weight, max_slots,
                      queue_position, owner)
    VALUES ('EXPERIMENT', v_pool, v_pools[2:],
            coalesce((p_config #>> '{resources,priority}')::integer,
                     (det_pool_scheduler(v_pool) ->> 'default_priority')::integer),
            coalesce((p_config #>> '{resources,weight}')::double precision, 1),
            (p_config #>> '{resources,max_slots}')::integer,
            extract(epoch FROM clock_timestamp()) * 1000000, p_owner)
    RETURNING id INTO v_job;
    INSERT INTO experiments (job_id, name, description, config, original_config, context_id,
                             owner)
    VALUES (v_job, p_config ->> 'name', coalesce(p_config ->> 'description', ''), p_config,
            p_original_config, v_ctx, p_owner)
    RETURNING id INTO v_id;
    PERFORM pg_notify('det_reconciler', 'experiment');
    RETURN v_id;
END $$;
