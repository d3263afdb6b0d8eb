-- Issue 35: a control plane that survives losing its database server. A log batch re-sent
-- after its commit acknowledgement was lost in a failover is written once: each shipper
-- numbers its lines per allocation and det_append_logs skips those it already holds.

CREATE TABLE log_batches (
    writer        uuid NOT NULL,
    allocation_id bigint NOT NULL REFERENCES allocations (id) ON DELETE CASCADE,
    last_seq      bigint NOT NULL CHECK (last_seq > 0),
    PRIMARY KEY (allocation_id, writer)
);
COMMENT ON TABLE log_batches IS
    'The last log line each shipper wrote per allocation: one row per writer (an agent''s '
    'LogShipper, named by a uuid it draws at start) and allocation, whose lines are numbered '
    '1, 2, ... and sent in order. A batch re-sent after a lost commit acknowledgement (a '
    'failover) holds lines numbered not above last_seq, which are skipped, so no line is '
    'written twice.';

DROP FUNCTION det_append_logs(bigint, text[], text[], integer[]);
CREATE FUNCTION det_append_logs(
    p_allocation bigint, p_streams text[], p_lines text[], p_ranks integer[] DEFAULT NULL,
    p_writer uuid DEFAULT NULL, p_seqs bigint[] DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Append a batch of task output lines (one call per batch, never per line), each with the
-- rank that wrote it (p_ranks, NULL where untagged). An untagged stdout / stderr line of a
-- trial run on at most one slot is its one worker's, rank 0 (only a trial on more slots runs
-- under det.launch.torch_distributed, which tags each worker's lines).
-- p_writer and p_seqs (each line's number, ascending) name the lines (see log_batches): a line
-- numbered at or below its writer's last_seq was written before and is skipped; a NULL
-- p_writer asks for no such check. invalid_parameter_value when p_seqs does not match.
DECLARE
    v_last bigint := 0;
BEGIN
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
GRANT EXECUTE ON FUNCTION
    det_append_logs(bigint, text[], text[], integer[], uuid, bigint[]) TO det_agent;
