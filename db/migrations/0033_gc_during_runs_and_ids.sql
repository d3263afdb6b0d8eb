-- Issue 39, items 5 and 7.
--
-- Ids users type (experiments, trials, jobs) come from counter rows updated in the creating
-- transaction, not from sequences: PostgreSQL WAL-logs a sequence 32 values ahead, so after
-- every crash of the postmaster the next experiment id jumped by ~32 (CACHE 1 does not stop
-- it). A counter row is gapless: rolled back with its transaction, and never ahead of it.
CREATE TABLE id_counters (
    name       text PRIMARY KEY,
    last_value bigint NOT NULL CHECK (last_value >= 0)
);
COMMENT ON TABLE id_counters IS
    'The last id given to each kind of object users type the id of (det_next_id): a row '
    'updated in the creating transaction, so ids are consecutive across crashes and '
    'rollbacks (a sequence jumps by 32 after a crash).';

-- Where each sequence had got to, so no id is given twice (rows of deleted experiments are
-- gone, but their ids may still be in audit rows and users' notes).
INSERT INTO id_counters (name, last_value)
SELECT 'experiments', CASE WHEN is_called THEN last_value ELSE 0 END FROM experiments_id_seq
UNION ALL
SELECT 'jobs', CASE WHEN is_called THEN last_value ELSE 0 END FROM jobs_id_seq
UNION ALL
SELECT 'trials', CASE WHEN is_called THEN last_value ELSE 0 END FROM trials_id_seq;

CREATE FUNCTION det_next_id(p_name text) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
-- The next id of p_name (a row of id_counters), the default of experiments.id, trials.id and
-- jobs.id. The row stays locked until the caller's transaction ends, so concurrent creates
-- take ids one after the other (the second waits for the first to commit or roll back; both
-- succeed under READ COMMITTED). Returns NULL for an unknown name (the NOT NULL of the id
-- column then names the table).
    UPDATE id_counters SET last_value = last_value + 1 WHERE name = p_name RETURNING last_value;
$$;

ALTER TABLE experiments ALTER COLUMN id SET DEFAULT det_next_id('experiments');
ALTER TABLE trials ALTER COLUMN id SET DEFAULT det_next_id('trials');
ALTER TABLE jobs ALTER COLUMN id SET DEFAULT det_next_id('jobs');
DROP SEQUENCE experiments_id_seq;
DROP SEQUENCE trials_id_seq;
DROP SEQUENCE jobs_id_seq;

-- Checkpoint GC during a run (item 5): the pass applies the experiment's policy to live
-- experiments whose checkpoints are new since it last looked (gc_pending).
ALTER TABLE checkpoints ADD COLUMN gc_pending boolean NOT NULL DEFAULT false;
ALTER TABLE checkpoints ALTER COLUMN gc_pending SET DEFAULT true;
COMMENT ON COLUMN checkpoints.gc_pending IS
    'Reported since the reconciler last applied its experiment''s GC policy: the pass applies '
    'it to the live experiments that have such checkpoints, then clears the flag.';
CREATE INDEX checkpoints_gc_pending ON checkpoints (trial_id) WHERE gc_pending;

CREATE OR REPLACE VIEW checkpoint_pins WITH (security_invoker = true) AS
-- Checkpoints that are not deleted, whatever the GC policy or a user asks: the versions of
-- the model registry, the checkpoints experiments warm-start from
-- (searcher.source_checkpoint_uuid, or the latest checkpoint of searcher.source_trial_id;
-- reference-facts §1.1, §5), and while a trial lives its restart point (its latest
-- checkpoint: GC runs during runs, issue 39). It is the one home of "pinned".
SELECT checkpoint_uuid FROM model_versions
UNION
SELECT (e.config #>> '{searcher,source_checkpoint_uuid}')::uuid AS checkpoint_uuid
  FROM experiments e
 WHERE e.config #>> '{searcher,source_checkpoint_uuid}'
       ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
UNION
SELECT t.latest_checkpoint
  FROM experiments e
  JOIN trials t ON t.id = (e.config #>> '{searcher,source_trial_id}')::bigint
 WHERE t.latest_checkpoint IS NOT NULL
UNION
SELECT t.latest_checkpoint FROM trials t
 WHERE t.state < 'COMPLETED' AND t.latest_checkpoint IS NOT NULL;
