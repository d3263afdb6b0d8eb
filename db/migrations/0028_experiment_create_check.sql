-- Issue 32: det serve checks that the caller may create an experiment in the target project
-- before it unpacks the context (a Viewer's refused upload was unpacked first).
CREATE FUNCTION det_experiment_create_check(p_workspace text, p_project text) RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Check that the caller may create an experiment in project p_project of workspace
-- p_workspace (both NULL: Uncategorized): Editor of the workspace, neither it nor the project
-- archived, the rules det_create_experiment applies when it stores one. det serve calls it
-- before it unpacks a byte of the context (issue 32: a refused Viewer's context was unpacked
-- first). Returns the project's id. Raises insufficient_privilege, no_data_found (a
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
        p := det_project_find(p_workspace, p_project);
    END IF;
    PERFORM det_require('edit', p.workspace_id,
                        format('create an experiment in project %s', to_jsonb(p.name)));
    IF p.archived OR (SELECT archived FROM workspaces WHERE id = p.workspace_id) THEN
        RAISE EXCEPTION 'project %: it (or its workspace) is archived', to_jsonb(p.name)
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN p.id;
END $$;

REVOKE EXECUTE ON FUNCTION det_experiment_create_check(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION det_experiment_create_check(text, text) TO det_user;
