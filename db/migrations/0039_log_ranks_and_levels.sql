-- Issue 34: logs that say what ran. Each stored line carries its worker's rank (its run is its
-- allocation's); reads tell each line's level and a stopping run why it is stopped.

ALTER TABLE task_logs ADD COLUMN rank integer CHECK (rank >= 0);
COMMENT ON COLUMN task_logs.rank IS
    'The worker (torch rank) that wrote the line: from det.launch.wrap_rank''s [rank=N] tag, '
    'which the agent takes off the line; 0 for the one process of a trial run on at most one '
    'slot; NULL for det''s own notes and lines of no worker (a launcher, a command).';

DROP FUNCTION det_append_logs(bigint, text[], text[]);
CREATE FUNCTION det_append_logs(
    p_allocation bigint, p_streams text[], p_lines text[], p_ranks integer[] DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Append a batch of task output lines (one call per batch, never per line), each with the
-- rank that wrote it (p_ranks, NULL where untagged). An untagged stdout / stderr line of a
-- trial run on at most one slot is its one worker's, rank 0 (only a trial on more slots runs
-- under det.launch.torch_distributed, which tags each worker's lines).
BEGIN
    INSERT INTO task_logs (allocation_id, trial_id, stream, line, rank)
    SELECT p_allocation, a.trial_id, u.s, u.l,
           coalesce(u.r, CASE WHEN a.trial_id IS NOT NULL AND u.s <> 'det'
                               AND a.slots_needed <= 1 THEN 0 END)
    FROM allocations a,
         unnest(p_streams, p_lines, coalesce(p_ranks, '{}'::integer[])) AS u (s, l, r)
    WHERE a.id = p_allocation;
END $$;
GRANT EXECUTE ON FUNCTION det_append_logs(bigint, text[], text[], integer[]) TO det_agent;

CREATE FUNCTION det_log_level(p_stream text, p_line text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
-- The level of a log line, read from its text, for the log viewer's filter: 'error',
-- 'warning', 'info' or 'debug'. Python logging's level names at the start (Determined's
-- LOG_FORMAT 'INFO: [pid] name: message', logging's default 'WARNING:root:message'), a
-- traceback's first and last lines and '...Error: ' are errors; Python's warnings
-- ('file.py:3: UserWarning: ...') and det's 'warning:' notes are warnings; anything else info.
SELECT CASE
    WHEN p_line ~ '^\s*(CRITICAL|FATAL|ERROR)\M' OR p_line ~ '^Traceback \(most recent call last\)'
         OR p_line ~ '^[A-Za-z_.]*(Error|Exception)(: |$)' THEN 'error'
    WHEN p_line ~ '^\s*(WARNING|WARN)\M' OR p_line ~ '[A-Za-z]Warning: '
         OR p_line ~ '^det\.[a-z_.]+: warning:' THEN 'warning'
    WHEN p_line ~ '^\s*DEBUG\M' THEN 'debug'
    ELSE 'info'
END
$$;
GRANT EXECUTE ON FUNCTION det_log_level(text, text) TO det_user;

CREATE FUNCTION det_stop_reason(p_token text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Why det asks the run holding p_token to stop, for the harness's preemption line: the
-- run's stop_reason (written with its desired state, migration 0040: 'paused: its experiment
-- was paused', 'preempted: slots given to experiment 3 (fair share)'); NULL while it is not
-- asked to stop.
DECLARE
    a allocations := det_auth(p_token);
BEGIN
    IF a.desired_state = 'RUNNING' THEN
        RETURN NULL;
    END IF;
    RETURN coalesce(a.stop_reason, 'det asked the run to stop');
END $$;
GRANT EXECUTE ON FUNCTION det_stop_reason(text) TO det_task;
