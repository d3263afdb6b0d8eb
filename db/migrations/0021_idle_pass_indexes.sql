-- Issue 11: with a thousand runs queued, a pass that had nothing to do still read every
-- queued run several times over: to find the experiments to search (an OR over every live
-- experiment), the runs to stop (every live run joined to its trial), the runs stopped
-- before they started or past their preemption timeout (every pending run). Each of those
-- looks for rows in a rare state; a partial index of that state makes the look cost what
-- it finds (bench/queued_pass.py).

-- Experiments not yet searched (the pass fills searcher_state at once).
CREATE INDEX experiments_unsearched ON experiments (id)
    WHERE searcher_state IS NULL AND state IN ('ACTIVE', 'PAUSED');
-- Trials the searcher closed while they still live (their runs are told to stop).
CREATE INDEX trials_closed_live ON trials (id) WHERE closed AND state < 'COMPLETED';
-- Live runs told to stop (by a pause, a stop, a closed trial or a preemption).
CREATE INDEX allocations_stopping ON allocations (id)
    WHERE desired_state <> 'RUNNING' AND state <> 'TERMINATED';
