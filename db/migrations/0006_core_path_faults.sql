-- Issue 10: the core path survives faults and tells the truth.

CREATE FUNCTION det_stopped_state(p_state text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
-- The terminal state a STOPPING_* experiment or trial ends in (STOPPING_KILLED ends CANCELED);
-- any other state is returned as it is. The one home of this rule: the transition trigger,
-- the reconciler's finishing steps and reports all call it.
    SELECT CASE WHEN p_state LIKE 'STOPPING\_%'
                THEN replace(substr(p_state, 10), 'KILLED', 'CANCELED') ELSE p_state END;
$$;

CREATE OR REPLACE FUNCTION det_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
-- Experiments and trials: terminal states are final, and a STOPPING_* state only moves on to
-- its terminal state (det_stopped_state), or to a harsher STOPPING_* (a cancel may become a
-- kill). Allocations: the observed state only moves forward.
DECLARE
    old_s text := OLD.state::text;
    new_s text := NEW.state::text;
BEGIN
    IF old_s = new_s THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'allocations' THEN
        IF NEW.state < OLD.state THEN
            RAISE EXCEPTION 'allocation %: illegal state change % -> %', OLD.id, old_s, new_s
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF old_s IN ('COMPLETED', 'CANCELED', 'ERROR')
       OR (old_s LIKE 'STOPPING_%' AND new_s IN ('ACTIVE', 'PAUSED'))
       OR (old_s = 'STOPPING_KILLED' AND new_s LIKE 'STOPPING_%')
       OR (old_s = 'STOPPING_CANCELED' AND new_s IN ('STOPPING_COMPLETED', 'COMPLETED'))
       OR (old_s LIKE 'STOPPING_%' AND new_s NOT LIKE 'STOPPING_%'
           AND new_s <> det_stopped_state(old_s)) THEN
        RAISE EXCEPTION '% %: illegal state change % -> %', TG_TABLE_NAME, OLD.id, old_s, new_s
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TYPE early_exit_reason AS ENUM ('errored', 'invalid_hp', 'user_requested_stop');
COMMENT ON TYPE early_exit_reason IS
    'Why a trial ended early (Python: det.reasons.EarlyExitReason, kept equal by a test): '
    'errored (failed past its restarts), invalid_hp (its code rejected its hyperparameters), '
    'user_requested_stop (its code ended it on purpose).';

CREATE OR REPLACE FUNCTION det_report_early_exit(p_token text, p_reason text) RETURNS void
LANGUAGE plpgsql AS $$
-- The trial ends itself, for one of the early_exit_reason labels.
DECLARE
    a allocations := det_auth(p_token);
    v_reason early_exit_reason;
BEGIN
    BEGIN
        v_reason := p_reason::early_exit_reason;
    EXCEPTION WHEN invalid_text_representation THEN
        RAISE EXCEPTION 'early exit reason must be one of %, not "%"',
            array_to_string(enum_range(NULL::early_exit_reason)::text[], ', '), p_reason
            USING ERRCODE = 'invalid_parameter_value';
    END;
    UPDATE trials SET closed = true, exit_reason = v_reason::text WHERE id = a.trial_id;
    UPDATE searcher_ops SET completed = true WHERE trial_id = a.trial_id AND NOT completed;
END $$;

-- Agent ids become NOTIFY channel names and log keys: bounded and plain (det.db.channels).
ALTER TABLE agents ADD CONSTRAINT agents_id_check
    CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$');

-- Metrics in batches, each recorded once even when re-sent after a lost acknowledgement
-- (the harness writes them from a background thread; issue 10 item 4).
CREATE TABLE metric_batches (
    writer        uuid PRIMARY KEY,
    allocation_id bigint NOT NULL REFERENCES allocations (id) ON DELETE CASCADE,
    last_seq      bigint NOT NULL CHECK (last_seq > 0)
);
COMMENT ON TABLE metric_batches IS
    'The last metrics batch each harness writer recorded: one row per writer (a DbTransport, '
    'named by a uuid it draws at start), whose batches are numbered 1, 2, ... and each sent '
    'only once the one before was acknowledged. A batch re-sent after a lost commit '
    'acknowledgement carries a number not above last_seq and is skipped, so no metrics row is '
    'written twice. Rows of terminated allocations are no longer needed (their token is dead).';
CREATE INDEX metric_batches_allocation ON metric_batches (allocation_id);

CREATE FUNCTION det_report_metrics_batch(
    p_token text, p_writer uuid, p_seq bigint,
    p_groups text[], p_steps bigint[], p_values jsonb[]
) RETURNS integer LANGUAGE plpgsql AS $$
-- Append a batch of metrics rows in order: row i is (p_groups[i], p_steps[i], p_values[i]).
-- p_writer and p_seq name the batch (see metric_batches): a batch already recorded is
-- skipped; a NULL p_writer asks for no such check (det_report_metrics). Returns the rows
-- written (0 for a skipped batch). Validation rows update the trial's best searcher metric
-- (searcher.smaller_is_better decides "best"). The one home of the metrics-append rule.
DECLARE
    a allocations := det_auth(p_token);
    v_cfg jsonb;
    v_metric text;
    v_best double precision;
    v_rows integer;
BEGIN
    IF cardinality(p_groups) IS DISTINCT FROM cardinality(p_steps)
       OR cardinality(p_groups) IS DISTINCT FROM cardinality(p_values) THEN
        RAISE EXCEPTION 'metrics batch: groups, steps and values must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_groups) g WHERE g IS NULL OR g = '') THEN
        RAISE EXCEPTION 'metrics group must be a non-empty name'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_writer IS NOT NULL THEN
        IF p_seq IS NULL OR p_seq < 1 THEN
            RAISE EXCEPTION 'metrics batch number must be 1 or more, not %', p_seq
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        INSERT INTO metric_batches AS b (writer, allocation_id, last_seq)
        VALUES (p_writer, a.id, p_seq)
        ON CONFLICT (writer) DO UPDATE SET last_seq = excluded.last_seq
         WHERE b.last_seq < excluded.last_seq AND b.allocation_id = excluded.allocation_id;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
            RETURN 0;
        END IF;
    END IF;
    INSERT INTO metrics (trial_id, allocation_id, "group", steps_completed, "values")
    SELECT a.trial_id, a.id, u.g, u.s, u.v
      FROM unnest(p_groups, p_steps, p_values) WITH ORDINALITY AS u (g, s, v, i)
     ORDER BY u.i;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    SELECT e.config INTO v_cfg FROM trials t JOIN experiments e ON e.id = t.experiment_id
     WHERE t.id = a.trial_id;
    v_metric := v_cfg #>> '{searcher,metric}';
    SELECT CASE WHEN (v_cfg #>> '{searcher,smaller_is_better}')::boolean
                THEN min((u.v ->> v_metric)::double precision)
                ELSE max((u.v ->> v_metric)::double precision) END
      INTO v_best
      FROM unnest(p_groups, p_values) AS u (g, v)
     WHERE u.g = 'validation' AND jsonb_typeof(u.v -> v_metric) = 'number';
    IF v_best IS NOT NULL THEN
        UPDATE trials SET best_validation = CASE
            WHEN best_validation IS NULL THEN v_best
            WHEN (v_cfg #>> '{searcher,smaller_is_better}')::boolean
                THEN least(best_validation, v_best)
            ELSE greatest(best_validation, v_best) END
         WHERE id = a.trial_id;
    END IF;
    RETURN v_rows;
END $$;

CREATE OR REPLACE FUNCTION det_report_metrics(
    p_token text, p_group text, p_steps_completed bigint, p_metrics jsonb
) RETURNS void LANGUAGE sql AS $$
-- Append one metrics row (no re-send check: the harness uses det_report_metrics_batch).
    SELECT FROM det_report_metrics_batch(p_token, NULL, NULL, ARRAY[p_group],
                                         ARRAY[p_steps_completed], ARRAY[p_metrics]);
$$;

-- The expanded config has every default (det.configs); SQL reads it without supplying any again.
CREATE OR REPLACE FUNCTION det_experiment_best_validation(p_token text) RETURNS double precision
LANGUAGE sql AS $$
    SELECT CASE WHEN (e.config #>> '{searcher,smaller_is_better}')::boolean
                THEN min(t.best_validation) ELSE max(t.best_validation) END
    FROM allocations a
    JOIN trials me ON me.id = a.trial_id
    JOIN experiments e ON e.id = me.experiment_id
    JOIN trials t ON t.experiment_id = e.id
    WHERE a.id = (det_auth(p_token)).id
    GROUP BY e.config;
$$;

CREATE OR REPLACE VIEW reporting.experiments AS
SELECT e.id, e.name, e.state, e.owner, e.progress, e.start_time, e.end_time, e.archived,
       e.config #>> '{searcher,name}' AS searcher,
       e.config #>> '{searcher,metric}' AS metric,
       (SELECT count(*) FROM trials t WHERE t.experiment_id = e.id) AS trials,
       (SELECT CASE WHEN (e.config #>> '{searcher,smaller_is_better}')::boolean
                    THEN min(t.best_validation) ELSE max(t.best_validation) END
          FROM trials t WHERE t.experiment_id = e.id) AS best_validation,
       j.resource_pool, j.priority, j.weight
FROM experiments e JOIN jobs j ON j.id = e.job_id;

-- A job weight is a finite number > 0 and at most 1e6 (det.configs: resources.weight), in the
-- table and in det_job_update; a change to a finished experiment's job says so.
UPDATE jobs SET weight = 1000000 WHERE NOT (weight > 0 AND weight <= 1000000);
ALTER TABLE jobs DROP CONSTRAINT jobs_weight_check,
    ADD CONSTRAINT jobs_weight_check CHECK (weight > 0 AND weight <= 1000000);

CREATE OR REPLACE FUNCTION det_job_update(p_job bigint, p_field text, p_value text) RETURNS void
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
    v_weight double precision;
    v_exp integer;
    v_state experiment_state;
BEGIN
    SELECT * INTO j FROM jobs WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % not found', p_job USING ERRCODE = 'no_data_found';
    END IF;
    SELECT e.id, e.state INTO v_exp, v_state FROM experiments e WHERE e.job_id = p_job;
    IF v_state IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'job % (experiment %) is %: it is no longer queued', p_job, v_exp,
            v_state USING ERRCODE = 'invalid_parameter_value';
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
        v_weight := p_value::double precision;
        -- NOT (... AND ...) also refuses NaN, which PostgreSQL sorts above every number (so
        -- NaN > 0 holds), and Infinity; the same rule is the jobs.weight CHECK.
        IF NOT (v_weight > 0 AND v_weight <= 1000000) THEN
            RAISE EXCEPTION 'job %: weight must be a finite number > 0 and at most 1e6, not %',
                p_job, p_value USING ERRCODE = 'invalid_parameter_value';
        END IF;
        UPDATE jobs SET weight = v_weight WHERE id = p_job;
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
    WHEN invalid_text_representation OR numeric_value_out_of_range THEN
        RAISE EXCEPTION 'job %: % expects a number, not "%"', p_job, p_field, p_value
            USING ERRCODE = 'invalid_parameter_value';
END $$;

-- An active job with no run yet shows the slots it needs, not 0/0.
CREATE OR REPLACE VIEW reporting.job_queue AS
-- Active jobs in scheduling order per pool, with slots acquired / needed and the scheduler's
-- reasons for what still waits.
SELECT j.id AS job_id, j.type, j.resource_pool, j.priority, j.weight, j.owner, j.submitted_at,
       j.queue_position, e.id AS experiment_id, e.name, e.state::text AS experiment_state,
       coalesce(sum(a.slots_needed) FILTER (WHERE a.state > 'PENDING'), 0) AS slots_acquired,
       -- an active job with no run yet (the reconciler has not created one) still needs
       -- one trial's slots
       CASE WHEN count(a.id) = 0 AND e.state = 'ACTIVE'
            THEN (e.config #>> '{resources,slots_per_trial}')::bigint
            ELSE coalesce(sum(a.slots_needed), 0) END AS slots_needed,
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
-- Submit an experiment. p_config is the expanded config (validated by det.configs, every
-- default filled: nothing here supplies one again); p_context the packed model definition
-- (tar.gz), stored once per distinct content. The job's priority defaults to its pool
-- scheduler's default_priority (the pool's rule, not the config's).
DECLARE
    v_pools text[] := CASE jsonb_typeof(p_config #> '{resources,resource_pool}')
        WHEN 'array' THEN ARRAY(SELECT jsonb_array_elements_text(
                                    p_config #> '{resources,resource_pool}'))
        ELSE ARRAY[p_config #>> '{resources,resource_pool}'] END;
    v_pool text := v_pools[1];
    v_missing text;
    v_ctx bigint;
    v_job bigint;
    v_id integer;
BEGIN
    IF p_config #> '{resources,resource_pool}' IS NULL OR p_config #> '{resources,weight}' IS NULL
       OR p_config ->> 'name' IS NULL THEN
        RAISE EXCEPTION 'det_create_experiment: expected an expanded config (det.configs) with '
            'name, resources.resource_pool and resources.weight'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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
            (p_config #>> '{resources,weight}')::double precision,
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
