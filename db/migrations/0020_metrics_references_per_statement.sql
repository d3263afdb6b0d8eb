-- Issue 11: the metrics table's two foreign keys checked every row on its own (a trigger
-- event queued per row, then one lookup of its trial and one of its allocation, each locking
-- the row): two thirds of PostgreSQL's time for a metrics row. A COPY of 50,000 rows into
-- metrics ran at 30,000-42,000 rows/s with them and 82,000-105,000 without, on a 2-core host
-- (bench/metric_rows.py). A task's batch names one allocation, so the same rule is now
-- checked once per statement over the statement's distinct (allocation, trial) pairs:
--   * inserting or updating metrics: each pair must be an allocation of that trial; those
--     allocations are locked FOR KEY SHARE until commit, as a foreign key's check locks them;
--   * deleting allocations, or changing an allocation's id or trial: refused while metrics
--     name it; truncating allocations: refused if metrics are left.
-- A trial with metrics cannot go either: its allocations (allocations.trial_id references
-- trials) cannot. The rule is stronger than the two keys it replaces: a row's trial must be
-- its allocation's.

ALTER TABLE metrics DROP CONSTRAINT metrics_trial_id_fkey,
                    DROP CONSTRAINT metrics_allocation_id_fkey;

CREATE FUNCTION det_metrics_reference_check() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- AFTER INSERT or UPDATE ON metrics, per statement: every new row's (allocation_id,
-- trial_id) is an allocation of that trial, locked until commit (SQLSTATE 23503 otherwise).
-- Runs as the owner, as a foreign key's check does.
DECLARE
    v_bad record;
BEGIN
    PERFORM 1 FROM allocations a
     WHERE a.id IN (SELECT DISTINCT allocation_id FROM new_rows)
       FOR KEY SHARE OF a;
    SELECT n.allocation_id, n.trial_id INTO v_bad
      FROM (SELECT DISTINCT allocation_id, trial_id FROM new_rows) n
     WHERE NOT EXISTS (SELECT 1 FROM allocations a
                        WHERE a.id = n.allocation_id AND a.trial_id = n.trial_id)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'metrics: allocation % of trial % does not exist',
            v_bad.allocation_id, v_bad.trial_id
            USING ERRCODE = 'foreign_key_violation', TABLE = 'metrics';
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION det_metrics_referenced_check() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- AFTER DELETE ON allocations (per statement, old_rows), BEFORE UPDATE OF id, trial_id (per
-- row) and AFTER TRUNCATE: no metrics row may be left naming an allocation that is gone
-- (SQLSTATE 23503). A metrics row's trial is its allocation's, so the trial index finds them.
DECLARE
    v_bad record;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        IF EXISTS (SELECT 1 FROM metrics) THEN
            RAISE EXCEPTION 'allocations: truncated while metrics still name them'
                USING ERRCODE = 'foreign_key_violation', TABLE = 'metrics',
                      HINT = 'Truncate metrics in the same statement.';
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        SELECT OLD.id AS id, OLD.trial_id AS trial_id INTO v_bad
         WHERE EXISTS (SELECT 1 FROM metrics m
                        WHERE m.trial_id = OLD.trial_id AND m.allocation_id = OLD.id);
    ELSE
        SELECT o.id, o.trial_id INTO v_bad
          FROM old_rows o
         WHERE o.trial_id IS NOT NULL
           AND EXISTS (SELECT 1 FROM metrics m
                        WHERE m.trial_id = o.trial_id AND m.allocation_id = o.id)
         LIMIT 1;
    END IF;
    IF FOUND THEN
        RAISE EXCEPTION 'allocation % of trial % is still named by metrics rows',
            v_bad.id, v_bad.trial_id
            USING ERRCODE = 'foreign_key_violation', TABLE = 'metrics';
    END IF;
    RETURN CASE TG_OP WHEN 'UPDATE' THEN NEW END;
END $$;

CREATE TRIGGER metrics_reference_insert AFTER INSERT ON metrics
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_metrics_reference_check();
CREATE TRIGGER metrics_reference_update AFTER UPDATE ON metrics
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_metrics_reference_check();
CREATE TRIGGER allocations_metrics_delete AFTER DELETE ON allocations
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_metrics_referenced_check();
CREATE TRIGGER allocations_metrics_update BEFORE UPDATE OF id, trial_id ON allocations
    FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.trial_id IS DISTINCT FROM NEW.trial_id)
    EXECUTE FUNCTION det_metrics_referenced_check();
CREATE TRIGGER allocations_metrics_truncate AFTER TRUNCATE ON allocations
    FOR EACH STATEMENT EXECUTE FUNCTION det_metrics_referenced_check();
