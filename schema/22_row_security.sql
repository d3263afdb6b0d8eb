-- Row-level security
--
-- A user sees a workspace's rows when a role of theirs (or of a group of theirs) lets
-- them view it. The workspace is read from the row's job (jobs, allocations and
-- what hangs off them) or project (experiments and what hangs off them); a constraint
-- trigger keeps the two in agreement. `(SELECT det_user.visible_workspaces())` (and
-- det_user.visible_projects) is computed once per query.
ALTER TABLE workspaces ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON workspaces FOR SELECT
    USING (id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE workspace_pools ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON workspace_pools FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE projects ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON projects FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE role_assignments ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON role_assignments FOR SELECT
    USING (workspace_id IS NULL
        OR workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON jobs FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE experiments ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON experiments FOR SELECT
    USING (project_id = ANY ((SELECT det_user.visible_projects())::integer[]));
ALTER TABLE context_blobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON context_blobs FOR SELECT
    USING (id IN (SELECT context_id FROM experiments));
ALTER TABLE trials ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON trials FOR SELECT
    USING (experiment_id IN (SELECT id FROM experiments));
ALTER TABLE searcher_ops ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON searcher_ops FOR SELECT
    USING (trial_id IN (SELECT id FROM trials));
ALTER TABLE allocations ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON allocations FOR SELECT
    USING (job_id IN (SELECT id FROM jobs));
ALTER TABLE metrics ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON metrics FOR SELECT
    USING (trial_id IN (SELECT id FROM trials));
ALTER TABLE checkpoints ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON checkpoints FOR SELECT
    USING (trial_id IN (SELECT id FROM trials));
ALTER TABLE task_logs ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON task_logs FOR SELECT
    USING (allocation_id IN (SELECT id FROM allocations));
ALTER TABLE tasks ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON tasks FOR SELECT USING (job_id IN (SELECT id FROM jobs));
ALTER TABLE models ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON models FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE model_versions ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON model_versions FOR SELECT
    USING (model_id IN (SELECT id FROM models));
ALTER TABLE templates ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON templates FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE audit_log ENABLE ROW LEVEL SECURITY;
CREATE POLICY cluster_admins ON audit_log FOR SELECT
    USING ((SELECT det_user.permitted(det_user.caller(), 'admin_cluster', NULL)));

-- Reads of the agent: det_agent holds no table privileges.
CREATE FUNCTION det_agent.assignments(p_agent text)
RETURNS TABLE (id bigint, desired text, state text, spec jsonb, chief text, node_state text,
               slot_ids integer[], spans boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent's work: the live allocations it is the chief of, and those it holds slots of as
-- another node of a gang (node_state: its share's state once claimed, else NULL). slot_ids:
-- the slots it holds there; spans: whether the allocation holds slots of other agents too.
#variable_conflict use_column
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    RETURN QUERY
    SELECT a.id, a.desired_state::text, a.state::text, a.spec, a.agent_id, NULL::text,
           array(SELECT h.slot_id FROM allocation_slots h
                  WHERE h.allocation_id = a.id AND h.agent_id = p_agent AND NOT h.released
                  ORDER BY h.slot_id),
           a.slots_needed > (SELECT count(*) FROM allocation_slots h
                             WHERE h.allocation_id = a.id AND h.agent_id = p_agent)
      FROM allocations a
     WHERE a.agent_id = p_agent AND a.state <> 'TERMINATED'
    UNION ALL
    SELECT a.id, a.desired_state::text, a.state::text, a.spec, a.agent_id, n.state::text,
           array(SELECT h.slot_id FROM allocation_slots h
                  WHERE h.allocation_id = a.id AND h.agent_id = p_agent AND NOT h.released
                  ORDER BY h.slot_id),
           true
      FROM allocations a
      LEFT JOIN allocation_nodes n ON n.allocation_id = a.id AND n.agent_id = p_agent
     WHERE a.agent_id <> p_agent AND a.state <> 'TERMINATED'
       AND a.id IN (SELECT h.allocation_id FROM allocation_slots h
                     WHERE h.agent_id = p_agent AND NOT h.released)
     ORDER BY 1;
END $$;
GRANT EXECUTE ON FUNCTION det_agent.assignments(text) TO det_agent;

CREATE FUNCTION det_agent.live_allocations(p_agent text)
RETURNS TABLE (id bigint, last_log timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The live allocations an agent is the chief of, with the time of their last shipped log
-- line: what a restarted agent adopts and where its log shipping resumes.
SELECT det_internal.agent_check_self(p_agent);
SELECT a.id, (SELECT l.ts FROM task_logs l WHERE l.allocation_id = a.id
               ORDER BY l.id DESC LIMIT 1)
  FROM allocations a
 WHERE a.agent_id = p_agent AND a.state <> 'TERMINATED';
$$;
GRANT EXECUTE ON FUNCTION det_agent.live_allocations(text) TO det_agent;

CREATE FUNCTION det_agent.context(p_agent text, p_context bigint) RETURNS bytea
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The packed model definition an agent unpacks for a run: only a context that a live
-- allocation of this agent (its chief's, or one it holds slots of) launches; NULL otherwise.
SELECT det_internal.agent_check_self(p_agent);
SELECT b.data
  FROM context_blobs b
 WHERE b.id = p_context
   AND EXISTS (SELECT 1 FROM allocations a
                WHERE a.state <> 'TERMINATED' AND (a.spec ->> 'context_id')::bigint = b.id
                  AND (a.agent_id = p_agent
                       OR a.id IN (SELECT h.allocation_id FROM allocation_slots h
                                    WHERE h.agent_id = p_agent AND NOT h.released)));
$$;
GRANT EXECUTE ON FUNCTION det_agent.context(text, bigint) TO det_agent;

CREATE FUNCTION det.schema_version() RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The newest migration this database applied (db/migrate.py records them): a client that
-- knows a newer one tells its user to run `det cluster up`, which migrates.
BEGIN
    RETURN (SELECT max(version) FROM det_migrations);
END $$;
GRANT EXECUTE ON FUNCTION det.schema_version() TO det_user, det_agent, det_web;

-- Permission to create an experiment, checked before its context is unpacked.
CREATE FUNCTION det_user.experiment_create_check(p_workspace text, p_project text) RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Check that the caller may create an experiment in project p_project of workspace
-- p_workspace (both NULL: Uncategorized): Editor of the workspace, neither it nor the project
-- archived, the rules det_user.create_experiment applies when it stores one. det serve calls it
-- before it unpacks a byte of the context (so a refused Viewer's context is never
-- unpacked). Returns the project's id. Raises insufficient_privilege, no_data_found (a
-- workspace or project the caller cannot see), check_violation (archived) or
-- invalid_parameter_value (only one of the two named).
DECLARE
    p projects;
BEGIN
    IF (p_workspace IS NULL) <> (p_project IS NULL) THEN
        RAISE EXCEPTION 'workspace and project: give both or neither (neither: Uncategorized)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_workspace IS NULL THEN
        SELECT * INTO p FROM projects WHERE id = 1;
    ELSE
        p := det_user.project_find(p_workspace, p_project);
    END IF;
    PERFORM det_internal.require('edit', p.workspace_id,
                        format('create an experiment in project %s', to_jsonb(p.name)));
    IF p.archived OR (SELECT archived FROM workspaces WHERE id = p.workspace_id) THEN
        RAISE EXCEPTION 'project %: it (or its workspace) is archived', to_jsonb(p.name)
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN p.id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_create_check(text, text) TO det_user;

-- Validation rows are recorded for the searcher, which decides what each means
-- (det.reconciler.searchers: under adaptive ASHA's time_metric, Determined 0.38's form, a
-- result at the time metric's value; otherwise nothing).

CREATE FUNCTION det_internal.validation_reported() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A validation row of a trial of a searched experiment (not an unmanaged one: it has no
-- searcher) is a validation_reported event naming the row ({"metrics_id": id}): the pass
-- reads the row's values with the event rather than a copy, as consumed events are kept and
-- most searches read nothing of them.
BEGIN
    INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
    SELECT t.experiment_id, t.id, 'validation_reported', jsonb_build_object('metrics_id', NEW.id)
      FROM trials t JOIN experiments e ON e.id = t.experiment_id
     WHERE t.id = NEW.trial_id AND NOT e.unmanaged;
    IF FOUND THEN
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'searcher');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER metrics_validation_reported AFTER INSERT ON metrics
    FOR EACH ROW WHEN (NEW."group" = 'validation')
        EXECUTE FUNCTION det_internal.validation_reported();

-- Trial metadata (Determined 0.38's TrainContext.set_metadata / get_metadata).

CREATE FUNCTION det_internal.merge_metadata(p_current jsonb, p_addition jsonb,
    p_path text DEFAULT '')
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE SET search_path = public, pg_temp AS $$
-- p_addition merged into p_current (both objects): objects merge key by key, a new key is
-- added, and a key that already holds another value is refused, naming its dotted path (the
-- reference's run metadata never overwrites a key). Setting a key to the value it holds is a
-- no-op, so a call retried after a lost commit acknowledgement succeeds.
DECLARE
    k text;
    v jsonb;
    v_path text;
BEGIN
    FOR k, v IN SELECT * FROM jsonb_each(p_addition) LOOP
        v_path := CASE WHEN p_path = '' THEN k ELSE p_path || '.' || k END;
        IF NOT p_current ? k OR p_current -> k = v THEN
            p_current := jsonb_set(p_current, ARRAY[k], v);
        ELSIF jsonb_typeof(v) = 'object' AND jsonb_typeof(p_current -> k) = 'object' THEN
            p_current := jsonb_set(p_current, ARRAY[k],
                                   det_internal.merge_metadata(p_current -> k, v, v_path));
        ELSE
            RAISE EXCEPTION 'metadata key "%" is already set (to %); a key cannot be changed',
                v_path, p_current -> k USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    RETURN p_current;
END $$;

CREATE FUNCTION det_task.set_trial_metadata(p_token text, p_metadata jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Merge p_metadata (an object) into the calling trial's metadata (det_internal.merge_metadata);
-- returns the trial's metadata after it. Refused (invalid_parameter_value): p_metadata not
-- an object, over 64 KiB or nested deeper than 32 levels (det_internal.json_problem), or a merged
-- metadata over 1 MiB.
DECLARE
    a allocations := det_internal.auth(p_token);
    v_problem text := det_internal.json_problem(p_metadata, 65536);
    v_merged jsonb;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'metadata %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE trials SET metadata = det_internal.merge_metadata(metadata, p_metadata)
     WHERE id = a.trial_id RETURNING metadata INTO v_merged;
    IF octet_length(v_merged::text) > 1048576 THEN
        RAISE EXCEPTION 'metadata: the trial''s metadata would be % bytes of JSON, more than '
            'the % allowed', octet_length(v_merged::text), 1048576
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN v_merged;
END $$;
GRANT EXECUTE ON FUNCTION det_task.set_trial_metadata(text, jsonb) TO det_task;

CREATE FUNCTION det_task.trial_metadata(p_token text) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling trial's metadata.
    SELECT metadata FROM trials WHERE id = (det_internal.auth(p_token)).trial_id;
$$;
GRANT EXECUTE ON FUNCTION det_task.trial_metadata(text) TO det_task;
