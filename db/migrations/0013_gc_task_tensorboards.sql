-- The TensorBoard event files of an experiment being deleted are removed by its GC task, with
-- its checkpoints' files (issue 13: trials write them under
-- <checkpoint storage>/tensorboard/experiment/<id>/).

CREATE FUNCTION det_gc_task_tensorboards(p_token text)
RETURNS TABLE (experiment_id integer, storage jsonb) LANGUAGE plpgsql STABLE AS $$
-- The GC task's experiment and its checkpoint storage when a user asked to delete it (its
-- TensorBoard files go too); no row otherwise.
DECLARE
    a allocations := det_gc_auth(p_token);
BEGIN
    RETURN QUERY
    SELECT e.id, e.config -> 'checkpoint_storage'
      FROM experiments e
     WHERE e.job_id = a.job_id AND e.delete_requested_at IS NOT NULL;
END $$;
