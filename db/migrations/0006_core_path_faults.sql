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

-- A weight of NaN or infinity starves every other job (or the job itself) forever.
ALTER TABLE jobs DROP CONSTRAINT jobs_weight_check,
    ADD CONSTRAINT jobs_weight_check CHECK (weight > 0 AND weight < 'Infinity');

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
