-- Checkpoint GC, archive and delete. The keep rule is one statement
-- (det_user.checkpoints_to_delete); the checkpoints never deleted are the view checkpoint_pins.

CREATE VIEW checkpoint_pins WITH (security_invoker = true) AS
-- Checkpoints that are not deleted, whatever the GC policy or a user asks: the versions of
-- the model registry, the checkpoints experiments warm-start from
-- (searcher.source_checkpoint_uuid, or the latest checkpoint of searcher.source_trial_id;
-- as Determined 0.38 keeps them), and while a trial lives its restart point (its latest
-- checkpoint: GC runs during runs). It is the one home of "pinned".
SELECT checkpoint_uuid FROM model_versions
UNION
SELECT e.source_checkpoint_uuid FROM experiments e WHERE e.source_checkpoint_uuid IS NOT NULL
UNION
SELECT t.latest_checkpoint
  FROM experiments e
  JOIN trials t ON t.id = e.source_trial_id
 WHERE t.latest_checkpoint IS NOT NULL
UNION
SELECT t.latest_checkpoint FROM trials t
 WHERE t.state < 'COMPLETED' AND t.latest_checkpoint IS NOT NULL;
GRANT SELECT ON checkpoint_pins TO det_user;

CREATE FUNCTION det_user.checkpoints_to_delete(
    p_experiment integer, p_save_experiment_best integer DEFAULT NULL,
    p_save_trial_best integer DEFAULT NULL, p_save_trial_latest integer DEFAULT NULL
) RETURNS TABLE (uuid uuid, trial_id integer, steps_completed bigint, size_bytes bigint,
                 metric double precision)
LANGUAGE sql STABLE AS $$
-- The GC keep rule (Determined 0.38's checkpoint GC policy), one statement. Of the experiment's
-- COMPLETED checkpoints keep the union of
--   * the save_experiment_best best by the searcher metric across the experiment,
--   * each trial's save_trial_best best,
--   * each trial's save_trial_latest latest (by steps_completed);
-- and return the rest, less the pinned ones (checkpoint_pins). A checkpoint's metric is the
-- searcher metric of its trial's validation at the checkpoint's step (the last one reported
-- there); without one it is never "best". Ties share a rank (rank()), so tied checkpoints are
-- all kept. The policy is the experiment's checkpoint_storage save_* values unless given; if
-- it has none, nothing is returned.
WITH x AS (
    SELECT e.id,
           CASE WHEN e.smaller_is_better THEN 1 ELSE -1 END
               AS sign,
           e.searcher_metric AS metric,
           coalesce(p_save_experiment_best,
                    e.save_experiment_best) AS seb,
           coalesce(p_save_trial_best,
                    e.save_trial_best) AS stb,
           coalesce(p_save_trial_latest,
                    e.save_trial_latest) AS stl
      FROM experiments e WHERE e.id = p_experiment
), scored AS (
    SELECT c.uuid, c.trial_id, c.steps_completed,
           (SELECT sum(r.value::bigint) FROM jsonb_each_text(c.resources) r)::bigint AS size_bytes,
           CASE WHEN jsonb_typeof(v."values" -> x.metric) = 'number'
                THEN (v."values" ->> x.metric)::double precision END AS metric,
           x.sign
      FROM x
      JOIN trials t ON t.experiment_id = x.id
      JOIN checkpoints c ON c.trial_id = t.id AND c.state = 'COMPLETED'
      LEFT JOIN LATERAL (
          SELECT m."values" FROM metrics m
           WHERE m.trial_id = c.trial_id AND m."group" = 'validation'
             AND m.steps_completed = c.steps_completed AND m.superseded_by IS NULL
           ORDER BY m.id DESC LIMIT 1) v ON true
), ranked AS (
    SELECT s.*,
           CASE WHEN s.metric IS NOT NULL
                THEN rank() OVER (ORDER BY s.sign * s.metric NULLS LAST) END AS experiment_rank,
           CASE WHEN s.metric IS NOT NULL
                THEN rank() OVER (PARTITION BY s.trial_id ORDER BY s.sign * s.metric NULLS LAST)
                END AS trial_rank,
           rank() OVER (PARTITION BY s.trial_id ORDER BY s.steps_completed DESC) AS latest_rank
      FROM scored s
)
SELECT r.uuid, r.trial_id, r.steps_completed, r.size_bytes, r.metric
  FROM ranked r, x
 WHERE x.seb IS NOT NULL AND x.stb IS NOT NULL AND x.stl IS NOT NULL
   AND NOT (coalesce(r.experiment_rank <= x.seb, false)
            OR coalesce(r.trial_rank <= x.stb, false)
            OR r.latest_rank <= x.stl)
   AND NOT EXISTS (SELECT 1 FROM checkpoint_pins p WHERE p.checkpoint_uuid = r.uuid)
 ORDER BY r.trial_id, r.steps_completed;
$$;
GRANT EXECUTE ON FUNCTION det_user.checkpoints_to_delete(integer, integer, integer,
    integer) TO det_user;

CREATE FUNCTION det_internal.unpin_deleting() RETURNS integer LANGUAGE plpgsql AS $$
-- A pinned checkpoint is never deleted: one that became pinned while a GC marked it DELETING
-- (the pin committed between the GC's snapshot and its write) goes back to COMPLETED. Run in
-- its own statement, so it sees pins committed up to now. Returns the checkpoints restored.
DECLARE
    v_n integer;
BEGIN
    UPDATE checkpoints c SET state = 'COMPLETED', delete_requested_at = NULL
      FROM checkpoint_pins p
     WHERE p.checkpoint_uuid = c.uuid AND c.state = 'DELETING';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END $$;

CREATE FUNCTION det_internal.checkpoint_gc(
    p_experiment integer, p_save_experiment_best integer DEFAULT NULL,
    p_save_trial_best integer DEFAULT NULL, p_save_trial_latest integer DEFAULT NULL
) RETURNS integer LANGUAGE plpgsql AS $$
-- Apply the keep rule: what det_user.checkpoints_to_delete returns becomes DELETING (the GC task
-- the reconciler then schedules removes the files). Returns how many were marked.
DECLARE
    v_n integer;
BEGIN
    UPDATE checkpoints c SET state = 'DELETING', delete_requested_at = now()
      FROM det_user.checkpoints_to_delete(p_experiment, p_save_experiment_best, p_save_trial_best,
                                     p_save_trial_latest) d
     WHERE c.uuid = d.uuid AND c.state = 'COMPLETED';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n - det_internal.unpin_deleting();
END $$;

CREATE FUNCTION det_user.set_gc_policy(
    p_experiment integer, p_save_experiment_best integer, p_save_trial_best integer,
    p_save_trial_latest integer
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment set gc-policy`: store the new save_* values in the experiment's config and,
-- if it has ended, apply them now (a running experiment applies them at its next checkpoint,
-- when the pass looks at its new checkpoints, or when it ends). Returns the checkpoints marked
-- DELETING.
DECLARE
    e experiments;
BEGIN
    PERFORM det_internal.require('edit', det_user.experiment_workspace(p_experiment),
                        format('set the GC policy of experiment %s', p_experiment));
    SELECT * INTO e FROM experiments WHERE id = p_experiment FOR UPDATE;
    IF least(p_save_experiment_best, p_save_trial_best, p_save_trial_latest) < 0 THEN
        RAISE EXCEPTION 'gc policy: save_experiment_best, save_trial_best and save_trial_latest must be 0 or more'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(e.config -> 'checkpoint_storage') IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'experiment %: it has no checkpoint_storage to set a GC policy on',
            p_experiment USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments
       SET config = jsonb_set(config, '{checkpoint_storage}', config -> 'checkpoint_storage'
                              || jsonb_build_object('save_experiment_best', p_save_experiment_best,
                                                    'save_trial_best', p_save_trial_best,
                                                    'save_trial_latest', p_save_trial_latest))
     WHERE id = p_experiment;
    PERFORM det_internal.audit('set_gc_policy', 'experiment', p_experiment::text,
                      jsonb_build_object('save_experiment_best', p_save_experiment_best,
                                         'save_trial_best', p_save_trial_best,
                                         'save_trial_latest', p_save_trial_latest));
    IF e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RETURN 0;
    END IF;
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'checkpoint_gc');
    RETURN det_internal.checkpoint_gc(p_experiment);
END $$;
GRANT EXECUTE ON FUNCTION det_user.set_gc_policy(integer, integer, integer, integer) TO det_user;

CREATE FUNCTION det_user.delete_checkpoints(p_uuids uuid[]) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det checkpoint delete`: the checkpoints become DELETING (one already DELETING is asked
-- again, so a GC that gave up tries again; a DELETED one is left as it is). All or none:
-- refused for an unknown or pinned checkpoint, or one of an experiment that has not ended.
-- Returns the checkpoints asked to be deleted. Editor of each checkpoint's workspace.
DECLARE
    v_missing uuid;
    v_bad record;
    v_n integer;
BEGIN
    SELECT u INTO v_missing FROM unnest(p_uuids) u
     WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.uuid = u) LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'checkpoint % not found', v_missing USING ERRCODE = 'no_data_found';
    END IF;
    FOR v_bad IN SELECT c.uuid, j.workspace_id FROM checkpoints c
                   JOIN trials t ON t.id = c.trial_id JOIN experiments e ON e.id = t.experiment_id
                   JOIN jobs j ON j.id = e.job_id WHERE c.uuid = ANY(p_uuids) LOOP
        PERFORM det_internal.require('edit', v_bad.workspace_id, format('delete checkpoint %s',
            v_bad.uuid));
    END LOOP;
    SELECT c.uuid INTO v_missing FROM checkpoints c JOIN checkpoint_pins p
        ON p.checkpoint_uuid = c.uuid
     WHERE c.uuid = ANY(p_uuids) LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'checkpoint % is pinned (registered in the model registry, or an experiment warm-starts from it): it cannot be deleted',
            v_missing USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.uuid, e.id, e.state INTO v_bad
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
      JOIN experiments e ON e.id = t.experiment_id
     WHERE c.uuid = ANY(p_uuids) AND e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'checkpoint %: experiment % is %; its checkpoints can be deleted once it has ended',
            v_bad.uuid, v_bad.id, v_bad.state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE checkpoints SET state = 'DELETING', delete_requested_at = now()
     WHERE uuid = ANY(p_uuids) AND state IN ('COMPLETED', 'DELETING');
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM det_internal.audit('delete', 'checkpoint', u::text) FROM unnest(p_uuids) u;
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'checkpoint_gc');
    RETURN v_n - det_internal.unpin_deleting();  -- pinned since the check above
END $$;
GRANT EXECUTE ON FUNCTION det_user.delete_checkpoints(uuid[]) TO det_user;

CREATE FUNCTION det_user.checkpoint_add_metadata(p_uuid uuid, p_metadata jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The SDK's Checkpoint.add_metadata (Determined 0.38): p_metadata's top-level keys replace or
-- join the checkpoint's metadata (its row, not the metadata.json in its storage, as in 0.38);
-- returns the metadata. Editor of the checkpoint's workspace. The result obeys a task's rule
-- (checkpoints_input_check, also on UPDATE OF metadata: at most 64 KiB, 32 levels deep).
DECLARE
    v_workspace integer;
    v_metadata jsonb;
BEGIN
    IF jsonb_typeof(p_metadata) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %',
            coalesce(jsonb_typeof(p_metadata), 'null') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT j.workspace_id INTO v_workspace
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
      JOIN experiments e ON e.id = t.experiment_id JOIN jobs j ON j.id = e.job_id
     WHERE c.uuid = p_uuid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'checkpoint % not found', p_uuid USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require('edit', v_workspace,
        format('add metadata to checkpoint %s', p_uuid));
    UPDATE checkpoints SET metadata = metadata || p_metadata WHERE uuid = p_uuid
    RETURNING metadata INTO v_metadata;
    RETURN v_metadata;
END $$;
GRANT EXECUTE ON FUNCTION det_user.checkpoint_add_metadata(uuid, jsonb) TO det_user;

CREATE FUNCTION det_user.experiment_archive(p_id integer, p_archived boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment archive | unarchive`: an archived experiment is hidden from default lists
-- (spec: experiment-lifecycle). Only an ended experiment can be archived (else a
-- check_violation: an illegal transition).
DECLARE
    v_state experiment_state;
BEGIN
    PERFORM det_internal.require('edit', det_user.experiment_workspace(p_id),
                        format('%s experiment %s', CASE WHEN p_archived THEN 'archive'
                                                        ELSE 'unarchive' END, p_id));
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    IF p_archived AND v_state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'experiment % is %: only an ended experiment can be archived', p_id,
            v_state USING ERRCODE = 'check_violation';
    END IF;
    UPDATE experiments SET archived = p_archived WHERE id = p_id;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END,
        'experiment',
                      p_id::text);
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_archive(integer, boolean) TO det_user;

CREATE FUNCTION det_internal.purge_experiment(p_id integer) RETURNS boolean LANGUAGE plpgsql AS $$
-- Remove an experiment whose deletion was asked for, with its trials, runs, metrics, logs,
-- checkpoint rows, searcher rows and job (its context too, if no other experiment shares it),
-- once none of its checkpoints is DELETING, none of its runs is live, and its TensorBoard files
-- are gone if a trial of it ever ran (a GC task removes them,
-- det_task.gc_task_tensorboards_deleted). Returns false (and removes nothing) while that is not yet
-- so.
DECLARE
    e experiments;
BEGIN
    SELECT * INTO e FROM experiments WHERE id = p_id AND delete_requested_at IS NOT NULL
       FOR UPDATE;
    IF NOT FOUND
       OR EXISTS (SELECT 1 FROM checkpoints c JOIN trials t ON t.id = c.trial_id
                   WHERE t.experiment_id = p_id AND c.state <> 'DELETED')
       OR EXISTS (SELECT 1 FROM allocations a
                   WHERE a.job_id = e.job_id AND a.state <> 'TERMINATED')
       OR (e.tensorboards_deleted_at IS NULL
           AND EXISTS (SELECT 1 FROM trials t WHERE t.experiment_id = p_id AND t.runs > 0)) THEN
        RETURN false;
    END IF;
    DELETE FROM task_logs l USING allocations a WHERE l.allocation_id = a.id
        AND a.job_id = e.job_id;
    DELETE FROM metrics m USING trials t WHERE m.trial_id = t.id AND t.experiment_id = p_id;
    DELETE FROM checkpoints c USING trials t WHERE c.trial_id = t.id AND t.experiment_id = p_id;
    DELETE FROM allocation_slots s USING allocations a
     WHERE s.allocation_id = a.id AND a.job_id = e.job_id;
    DELETE FROM allocations WHERE job_id = e.job_id;
    DELETE FROM searcher_events WHERE experiment_id = p_id;
    DELETE FROM searcher_ops o USING trials t WHERE o.trial_id = t.id AND t.experiment_id = p_id;
    DELETE FROM trials WHERE experiment_id = p_id;
    DELETE FROM experiments WHERE id = p_id;
    DELETE FROM jobs WHERE id = e.job_id;
    DELETE FROM context_blobs b WHERE b.id = e.context_id
       AND NOT EXISTS (SELECT 1 FROM experiments x WHERE x.context_id = b.id);
    RETURN true;
END $$;

CREATE FUNCTION det_user.experiment_delete(p_id integer) RETURNS boolean LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment delete`: for an ended experiment none of whose checkpoints is pinned. Its
-- checkpoints become DELETING (their files are removed by a GC task), and its rows go in one
-- transaction once that is done (det_internal.purge_experiment: here if nothing is left to remove,
-- else by the reconciler). Asking again retries a GC that gave up. Returns true when the
-- rows are already gone.
DECLARE
    v_state experiment_state;
    v_pinned uuid;
BEGIN
    PERFORM det_internal.require('edit', det_user.experiment_workspace(p_id),
                        format('delete experiment %s', p_id));
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    IF v_state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'experiment % is %: only an ended experiment can be deleted (kill it first)',
            p_id, v_state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.uuid INTO v_pinned
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
      JOIN checkpoint_pins p ON p.checkpoint_uuid = c.uuid
     WHERE t.experiment_id = p_id AND c.state <> 'DELETED' LIMIT 1;
    IF v_pinned IS NOT NULL THEN
        RAISE EXCEPTION 'experiment %: checkpoint % is pinned (registered in the model registry, or an experiment warm-starts from it); the experiment cannot be deleted',
            p_id, v_pinned USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments SET delete_requested_at = now(), checkpoint_gc_error = NULL WHERE id = p_id;
    UPDATE checkpoints c SET state = 'DELETING', delete_requested_at = now()
      FROM trials t
     WHERE t.id = c.trial_id AND t.experiment_id = p_id AND c.state IN ('COMPLETED', 'DELETING');
    PERFORM det_internal.unpin_deleting();  -- pinned since the check above: kept, and so is the experiment
    PERFORM det_internal.audit('delete', 'experiment', p_id::text);
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'checkpoint_gc');
    RETURN det_internal.purge_experiment(p_id);
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_delete(integer) TO det_user;

-- The GC task's API (det.harness.checkpoint_gc); it names its allocation by token.

CREATE FUNCTION det_internal.gc_auth(p_token text) RETURNS allocations LANGUAGE plpgsql STABLE AS $$
-- The live GC task holding this token (det_internal.auth), or an error: a trial's token cannot call
-- the GC task's functions.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    IF a.spec ->> 'kind' IS DISTINCT FROM 'checkpoint_gc' THEN
        RAISE EXCEPTION 'allocation %: only a checkpoint GC task may remove checkpoints', a.id
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    RETURN a;
END $$;

CREATE FUNCTION det_task.gc_task_checkpoints(p_token text, p_limit integer)
RETURNS TABLE (uuid uuid, storage jsonb, size_bytes bigint) LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Up to p_limit DELETING checkpoints of the GC task's experiment, in order, for the task to
-- remove their files. Pinned ones are first put back (det_internal.unpin_deleting), so a checkpoint
-- pinned since it was marked is never handed out.
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    PERFORM det_internal.unpin_deleting();
    RETURN QUERY
    SELECT c.uuid, c.storage,
           (SELECT sum(r.value::bigint) FROM jsonb_each_text(c.resources) r)::bigint
      FROM experiments e JOIN trials t ON t.experiment_id = e.id
      JOIN checkpoints c ON c.trial_id = t.id
     WHERE e.job_id = a.job_id AND c.state = 'DELETING'
     ORDER BY c.trial_id, c.steps_completed, c.uuid
     LIMIT p_limit;
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_checkpoints(text, integer) TO det_task;

CREATE FUNCTION det_task.gc_task_tensorboards(p_token text)
RETURNS TABLE (experiment_id integer, storage jsonb) LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task's experiment and its checkpoint storage when a user asked to delete it (its
-- TensorBoard files go too); no row otherwise.
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    RETURN QUERY
    SELECT e.id, e.config -> 'checkpoint_storage'
      FROM experiments e
     WHERE e.job_id = a.job_id AND e.delete_requested_at IS NOT NULL;
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_tensorboards(text) TO det_task;

CREATE FUNCTION det_task.gc_task_tensorboards_deleted(p_token text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task removed the TensorBoard files of its experiment being deleted: its rows may go
-- (det_internal.purge_experiment).
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    UPDATE experiments SET tensorboards_deleted_at = now()
     WHERE job_id = a.job_id AND delete_requested_at IS NOT NULL;
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_tensorboards_deleted(text) TO det_task;

CREATE FUNCTION det_task.gc_task_deleted(p_token text, p_uuids uuid[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task removed these checkpoints' files: they become DELETED, with the bytes freed.
-- Once none of the experiment's checkpoints is DELETING its GC error is cleared. Returns the
-- rows changed (a repeat changes none).
DECLARE
    a allocations := det_internal.gc_auth(p_token);
    v_exp integer;
    v_n integer;
BEGIN
    SELECT id INTO v_exp FROM experiments WHERE job_id = a.job_id;
    UPDATE checkpoints c
       SET state = 'DELETED', deleted_at = now(),
           freed_bytes = coalesce((SELECT sum(r.value::bigint)
                                     FROM jsonb_each_text(c.resources) r), 0)
      FROM trials t
     WHERE t.id = c.trial_id AND t.experiment_id = v_exp AND c.uuid = ANY(p_uuids)
       AND c.state = 'DELETING';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    UPDATE experiments SET checkpoint_gc_error = NULL
     WHERE id = v_exp AND checkpoint_gc_error IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM checkpoints c JOIN trials t ON t.id = c.trial_id
                        WHERE t.experiment_id = v_exp AND c.state = 'DELETING');
    RETURN v_n;
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_deleted(text, uuid[]) TO det_task;

CREATE FUNCTION det_task.gc_task_failed(p_token text, p_message text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task could not remove files (a storage error): the message is shown on the
-- experiment; the checkpoints stay DELETING.
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    UPDATE experiments SET checkpoint_gc_error = p_message WHERE job_id = a.job_id;
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_failed(text, text) TO det_task;

CREATE FUNCTION det_task.gc_task_unrecorded(p_token text, p_uuids uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Of p_uuids (checkpoint directories the GC task found in its experiment's storage), those no
-- checkpoint row names, of any experiment: files a crashed run published but never recorded
-- (det.harness.checkpoint_gc sweeps them once they are old enough).
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    RETURN QUERY
    SELECT u FROM unnest(p_uuids) AS u
     WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.uuid = u);
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_unrecorded(text, uuid[]) TO det_task;
