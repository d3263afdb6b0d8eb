-- Issue 11: the searcher's random generator (MT19937: a 3.3 KB key) moves out of
-- searcher_state into its own column. The state is saved at every step of a search, the
-- generator only at the steps that draw from it (a trial created): an UPDATE that leaves
-- searcher_rng alone keeps its stored value where it is, while rewriting it inside the state
-- cost each save a 3.6 KB out-of-line value, written and compressed again (~0.3 ms of a
-- one-trial experiment's two saves, bench/task_throughput.py).
ALTER TABLE experiments ADD COLUMN searcher_rng jsonb;
COMMENT ON COLUMN experiments.searcher_rng IS
    'The searcher''s random generator (det.reconciler.searchers.rng), written with '
    'searcher_state at the steps that drew from it. NULL until the searcher has begun.';
COMMENT ON COLUMN experiments.searcher_state IS
    'The searcher''s state (JSON) but its random generator (searcher_rng), written in the same '
    'transaction that consumed the events which changed it. NULL until the searcher has made '
    'its initial decisions.';
UPDATE experiments
   SET searcher_rng = searcher_state -> 'rng', searcher_state = searcher_state - 'rng'
 WHERE searcher_state ? 'rng';
