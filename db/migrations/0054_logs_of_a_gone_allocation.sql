-- det_append_logs drops the lines of an allocation that no longer exists instead of failing
-- on log_batches' foreign key: the agent's log shipper stopped on that error, and every
-- other allocation's lines with it.

CREATE OR REPLACE FUNCTION det_append_logs(
    p_allocation bigint, p_streams text[], p_lines text[], p_ranks integer[] DEFAULT NULL,
    p_writer uuid DEFAULT NULL, p_seqs bigint[] DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Append a batch of task output lines (one call per batch, never per line), each with the
-- rank that wrote it (p_ranks, NULL where untagged). An untagged stdout / stderr line of a
-- trial run on at most one slot is its one worker's, rank 0 (only a trial on more slots runs
-- under det.launch.torch_distributed, which tags each worker's lines).
-- p_writer and p_seqs (each line's number, ascending) name the lines (see log_batches): a line
-- numbered at or below its writer's last_seq was written before and is skipped; a NULL
-- p_writer asks for no such check. invalid_parameter_value when p_seqs does not match; an
-- enrolled agent's login writes only for allocations it runs a part of (det_agent_check_allocation).
-- Lines of an allocation that no longer exists are dropped without an error: a shipper stops on
-- errors, and its other allocations' lines would stop with it.
DECLARE
    v_last bigint := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM allocations WHERE id = p_allocation) THEN
        RETURN;  -- gone (its experiment deleted): nothing to keep, and no error to stop on
    END IF;
    PERFORM det_agent_check_allocation(p_allocation);
    IF p_writer IS NOT NULL THEN
        IF cardinality(p_seqs) IS DISTINCT FROM cardinality(p_lines)
           OR EXISTS (SELECT FROM unnest(p_seqs) WITH ORDINALITY AS s (n, i)
                       WHERE n IS NULL OR n < 1 OR n <= p_seqs[i - 1]) THEN
            RAISE EXCEPTION 'log batch: p_seqs must number each line, ascending from 1 or more'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT b.last_seq INTO v_last FROM log_batches b
         WHERE b.writer = p_writer AND b.allocation_id = p_allocation FOR UPDATE;
        v_last := coalesce(v_last, 0);
        IF cardinality(p_seqs) > 0 AND p_seqs[cardinality(p_seqs)] > v_last THEN
            INSERT INTO log_batches AS b (writer, allocation_id, last_seq)
            VALUES (p_writer, p_allocation, p_seqs[cardinality(p_seqs)])
            ON CONFLICT (allocation_id, writer) DO UPDATE SET last_seq = excluded.last_seq;
        END IF;
    END IF;
    INSERT INTO task_logs (allocation_id, trial_id, stream, line, rank)
    SELECT p_allocation, a.trial_id, u.s, u.l,
           coalesce(u.r, CASE WHEN a.trial_id IS NOT NULL AND u.s <> 'det'
                               AND a.slots_needed <= 1 THEN 0 END)
    FROM allocations a,
         unnest(p_streams, p_lines, coalesce(p_ranks, '{}'::integer[]),
                coalesce(p_seqs, '{}'::bigint[])) WITH ORDINALITY AS u (s, l, r, n, i)
    WHERE a.id = p_allocation AND (p_writer IS NULL OR u.n > v_last)
    ORDER BY u.i;
END $$;
