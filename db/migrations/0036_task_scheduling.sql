-- Issue 33: the reconciler settles interactive tasks' runs and ends idle or unanswering ones
-- (det.reconciler.tasks). Its look for the running ones starts from this index, not from
-- every live run.

-- The running runs without a trial still wanted (interactive tasks, GC tasks): what the pass
-- checks for idleness and an unanswering server (LIVE_TASK_RUNS).
CREATE INDEX allocations_tasks_running ON allocations (job_id)
    WHERE trial_id IS NULL AND state = 'RUNNING' AND desired_state = 'RUNNING';

COMMENT ON COLUMN tasks.end_reason IS
    'Why the task ended: det''s reason when det ended it ("killed by alice", "idle for 10m0s", '
    '"the task''s server did not answer within 2m0s"), else its run''s end as the pass settled '
    'it ("exited with code 3", "agent lost"). NULL while it runs.';
