-- SQL the harness' buffered metrics need (h-harness, issue 10 item 4 / issue 11). To be folded
-- into schema.sql as a migration; until then tests/test_harness_db_faults.py applies this file.
-- It is written to apply cleanly twice (IF NOT EXISTS, CREATE OR REPLACE).
-- det_report_metrics becomes a one-row call of det_report_metrics_batch, so the append and
-- best-validation rules live in one function.

CREATE TABLE IF NOT EXISTS metric_batches (
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
CREATE INDEX IF NOT EXISTS metric_batches_allocation ON metric_batches (allocation_id);

CREATE OR REPLACE FUNCTION det_report_metrics_batch(
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
    SELECT CASE WHEN coalesce((v_cfg #>> '{searcher,smaller_is_better}')::boolean, true)
                THEN min((u.v ->> v_metric)::double precision)
                ELSE max((u.v ->> v_metric)::double precision) END
      INTO v_best
      FROM unnest(p_groups, p_values) AS u (g, v)
     WHERE u.g = 'validation' AND jsonb_typeof(u.v -> v_metric) = 'number';
    IF v_best IS NOT NULL THEN
        UPDATE trials SET best_validation = CASE
            WHEN best_validation IS NULL THEN v_best
            WHEN coalesce((v_cfg #>> '{searcher,smaller_is_better}')::boolean, true)
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
