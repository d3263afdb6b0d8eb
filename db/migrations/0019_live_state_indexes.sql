-- Issue 11: every reconciler pass looks for experiments and trials by live state (ACTIVE,
-- PAUSED, STOPPING_*), and with no index on state it read every experiment and trial ever
-- run: an idle pass took 220-340 ms over 100,000 ended experiments (bench/pass_history.py).
-- The live states sort before COMPLETED in both enums, so one partial index each holds the
-- live rows only, and a query naming live states (state IN (...), never state::text LIKE)
-- uses it.

CREATE INDEX experiments_live ON experiments (state) WHERE state < 'COMPLETED';
CREATE INDEX trials_live ON trials (state) WHERE state < 'COMPLETED';
