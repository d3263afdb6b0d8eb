-- User actions: the model registry and configuration templates. Each is one
-- transaction. A model is named by its name (compared regardless of case) or by its id.

CREATE FUNCTION det_user.model_find(p_model text) RETURNS models LANGUAGE plpgsql STABLE AS $$
-- The model that p_model names: all digits is an id (names cannot be only numbers), anything
-- else a name, compared regardless of case. Raises no_data_found.
DECLARE
    m models;
BEGIN
    IF p_model ~ '^[0-9]{1,9}$' THEN
        SELECT * INTO m FROM models WHERE id = p_model::integer;
    ELSE
        SELECT * INTO m FROM models WHERE lower(name) = lower(p_model);
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'model % not found', to_jsonb(p_model) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN m;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_find(text) TO det_user;

CREATE FUNCTION det_internal.model_check(
    p_name text, p_description text, p_labels text[], p_metadata jsonb, p_except integer
) RETURNS void LANGUAGE plpgsql STABLE AS $$
-- Raise invalid_parameter_value, naming the field, if a model's new name, description, labels
-- or metadata (each NULL: unchanged) is unacceptable. p_except is the model being changed,
-- which may keep its own name.
DECLARE
    v_problem text := det_user.model_name_problem(p_name);
BEGIN
    IF p_name IS NOT NULL AND v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'model name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM models WHERE lower(name) = lower(p_name)
                                      AND id IS DISTINCT FROM p_except) THEN
        RAISE EXCEPTION 'model name %: a model of that name already exists (names are compared '
            'regardless of case)', to_jsonb(p_name) USING ERRCODE = 'unique_violation';
    END IF;
    IF length(p_description) > 4096 THEN
        RAISE EXCEPTION 'description: expected at most 4096 characters, got %',
            length(p_description) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_problem := det_user.label_problem(p_labels);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'labels: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

CREATE FUNCTION det_user.model_create(
    p_name text, p_description text, p_labels text[], p_workspace text
) RETURNS models LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model create`: a new, empty model of the caller's in workspace p_workspace (NULL:
-- Uncategorized), where the caller is an Editor.
DECLARE
    v_ws integer := CASE WHEN p_workspace IS NULL THEN 1
                         ELSE (det_user.workspace_find(p_workspace)).id END;
    v_user text := det_internal.require('edit', v_ws, format('create model %s', to_jsonb(p_name)));
    m models;
BEGIN
    PERFORM det_internal.model_check(p_name, p_description, p_labels, NULL, NULL);
    INSERT INTO models (name, description, labels, owner, workspace_id)
    VALUES (p_name, coalesce(p_description, ''), coalesce(p_labels, '{}'), v_user, v_ws)
    RETURNING * INTO m;
    PERFORM det_internal.audit('create', 'model', m.id::text, jsonb_build_object('name', m.name));
    RETURN m;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_create(text, text, text[], text) TO det_user;

CREATE FUNCTION det_user.model_update(
    p_model text, p_name text, p_description text, p_notes text, p_labels text[],
    p_metadata jsonb, p_remove_metadata text[]
) RETURNS models LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model update`: each argument NULL leaves its field as it is. p_labels replaces the
-- labels; p_metadata is merged into the metadata (its top-level keys replace the model's),
-- then the keys in p_remove_metadata are removed. An archived model cannot change.
DECLARE
    m models := det_user.model_find(p_model);
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id, format('change model %s',
        to_jsonb(m.name)));
    SELECT * INTO m FROM models WHERE id = m.id FOR UPDATE;
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to change it', to_jsonb(m.name)
            USING ERRCODE = 'check_violation';
    END IF;
    PERFORM det_internal.model_check(p_name, p_description, p_labels, p_metadata, m.id);
    UPDATE models
       SET name = coalesce(p_name, name), description = coalesce(p_description, description),
           notes = coalesce(p_notes, notes), labels = coalesce(p_labels, labels),
           metadata = (metadata || coalesce(p_metadata, '{}')) - coalesce(p_remove_metadata, '{}'),
           last_updated_time = now()
     WHERE id = m.id
    RETURNING * INTO m;
    PERFORM det_internal.audit('update', 'model', m.id::text);
    RETURN m;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_update(text, text, text, text, text[], jsonb, text[])
    TO det_user;

CREATE FUNCTION det_user.model_set_archived(p_model text, p_archived boolean) RETURNS models
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model archive | unarchive`: an archived model is hidden from `det model list` (unless
-- --all), takes no new versions and no changes; its versions still pin their checkpoints.
DECLARE
    m models := det_user.model_find(p_model);
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id,
                        format('%s model %s', CASE WHEN p_archived THEN 'archive'
                                                   ELSE 'unarchive' END, to_jsonb(m.name)));
    UPDATE models SET archived = p_archived, last_updated_time = now()
     WHERE id = m.id RETURNING * INTO m;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END, 'model',
                      m.id::text);
    RETURN m;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_set_archived(text, boolean) TO det_user;

CREATE FUNCTION det_user.model_delete(p_model text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model delete`: the model and all its versions; their checkpoints are no longer pinned.
-- Returns how many versions went with it.
DECLARE
    m models := det_user.model_find(p_model);
    v_versions integer;
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id, format('delete model %s',
        to_jsonb(m.name)));
    SELECT count(*) INTO v_versions FROM model_versions WHERE model_id = m.id;
    DELETE FROM models WHERE id = m.id;
    PERFORM det_internal.audit('delete', 'model', m.id::text, jsonb_build_object('name', m.name));
    RETURN v_versions;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_delete(text) TO det_user;

CREATE FUNCTION det_user.model_register_version(
    p_model text, p_checkpoint text, p_name text, p_notes text, p_labels text[],
    p_metadata jsonb
) RETURNS model_versions LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model register-version`: the model's next version (its highest number plus one; the
-- model's row lock serialises concurrent registrations) is the checkpoint p_checkpoint, which
-- must be COMPLETED (Determined: "checkpoints for model versions must be in a COMPLETED
-- state"). The version pins the checkpoint. An archived model takes no new versions. The
-- caller is an Editor of the model's workspace and of the checkpoint's: a pinned checkpoint
-- cannot be deleted by its owner, so viewing it is not enough (the same rule as
-- det_user.create_experiment's searcher.source_checkpoint_uuid).
DECLARE
    m models := det_user.model_find(p_model);
    v_uuid uuid;
    v_state text;
    v_problem text := det_user.label_problem(p_labels);
    r model_versions;
    v_user text := det_internal.require('edit', m.workspace_id,
                               format('register a version of model %s', to_jsonb(m.name)));
BEGIN
    SELECT * INTO m FROM models WHERE id = m.id FOR UPDATE;
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to register new versions',
            to_jsonb(m.name) USING ERRCODE = 'check_violation';
    END IF;
    BEGIN
        v_uuid := p_checkpoint::uuid;
    EXCEPTION WHEN invalid_text_representation THEN
        RAISE EXCEPTION 'checkpoint: expected a checkpoint UUID, got %', to_jsonb(p_checkpoint)
            USING ERRCODE = 'invalid_parameter_value';
    END;
    -- FOR SHARE: the checkpoint cannot change state or go away until this version commits.
    SELECT state INTO v_state FROM checkpoints WHERE uuid = v_uuid FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'checkpoint % not found', v_uuid USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require('edit', (SELECT j.workspace_id FROM checkpoints c
                                   JOIN trials t ON t.id = c.trial_id
                                   JOIN experiments e ON e.id = t.experiment_id
                                   JOIN jobs j ON j.id = e.job_id WHERE c.uuid = v_uuid),
                        format('register checkpoint %s, which pins it', v_uuid));
    IF v_state <> 'COMPLETED' THEN
        RAISE EXCEPTION 'checkpoint % is %: only a COMPLETED checkpoint can be registered',
            v_uuid, v_state USING ERRCODE = 'check_violation';
    END IF;
    IF length(p_name) > 255 THEN
        RAISE EXCEPTION 'version name: expected at most 255 characters, got %', length(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'labels: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO model_versions (model_id, version, checkpoint_uuid, name, notes, labels,
                                metadata, owner)
    SELECT m.id, coalesce(max(v.version), 0) + 1, v_uuid, coalesce(p_name, ''),
           coalesce(p_notes, ''), coalesce(p_labels, '{}'), coalesce(p_metadata, '{}'), v_user
      FROM model_versions v WHERE v.model_id = m.id
    RETURNING * INTO r;
    UPDATE models SET last_updated_time = now() WHERE id = m.id;
    PERFORM det_internal.audit('register_version', 'model', m.id::text,
                      jsonb_build_object('version', r.version, 'checkpoint', v_uuid));
    RETURN r;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_register_version(text, text, text, text, text[], jsonb)
    TO det_user;

CREATE FUNCTION det_user.model_version_find(p_model text, p_version integer) RETURNS model_versions
LANGUAGE plpgsql STABLE AS $$
-- Version p_version of the model p_model names; NULL p_version: its latest version. Raises
-- no_data_found.
DECLARE
    m models := det_user.model_find(p_model);
    r model_versions;
BEGIN
    SELECT * INTO r FROM model_versions
     WHERE model_id = m.id AND (p_version IS NULL OR version = p_version)
     ORDER BY version DESC LIMIT 1;
    IF NOT FOUND THEN
        IF p_version IS NULL THEN
            RAISE EXCEPTION 'model % has no versions', to_jsonb(m.name)
                USING ERRCODE = 'no_data_found';
        END IF;
        RAISE EXCEPTION 'model % has no version %', to_jsonb(m.name), p_version
            USING ERRCODE = 'no_data_found';
    END IF;
    RETURN r;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_version_find(text, integer) TO det_user;

CREATE FUNCTION det_user.model_version_update(
    p_model text, p_version integer, p_name text, p_notes text, p_labels text[],
    p_metadata jsonb, p_remove_metadata text[]
) RETURNS model_versions LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model update NAME --version N`: as det_user.model_update, for one version (its name,
-- notes, labels and metadata). A version of an archived model cannot change.
DECLARE
    r model_versions := det_user.model_version_find(p_model, p_version);
    m models;
    v_problem text := det_user.label_problem(p_labels);
BEGIN
    SELECT * INTO m FROM models WHERE id = r.model_id FOR UPDATE;
    PERFORM det_internal.require('edit', m.workspace_id, format('change model %s',
        to_jsonb(m.name)));
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to change its versions',
            to_jsonb(m.name) USING ERRCODE = 'check_violation';
    END IF;
    IF length(p_name) > 255 THEN
        RAISE EXCEPTION 'version name: expected at most 255 characters, got %', length(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'labels: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE model_versions
       SET name = coalesce(p_name, name), notes = coalesce(p_notes, notes),
           labels = coalesce(p_labels, labels),
           metadata = (metadata || coalesce(p_metadata, '{}')) - coalesce(p_remove_metadata, '{}'),
           last_updated_time = now()
     WHERE id = r.id
    RETURNING * INTO r;
    UPDATE models SET last_updated_time = now() WHERE id = r.model_id;
    PERFORM det_internal.audit('update_version', 'model', m.id::text,
                      jsonb_build_object('version', r.version));
    RETURN r;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_version_update(text, integer, text, text, text[],
    jsonb, text[]) TO det_user;

CREATE FUNCTION det_user.model_version_delete(p_model text, p_version integer) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model delete-version`: remove one version; returns its checkpoint, no longer pinned by
-- it. The numbers of the other versions stay as they are.
DECLARE
    r model_versions := det_user.model_version_find(p_model, p_version);
BEGIN
    PERFORM det_internal.require('edit', (SELECT workspace_id FROM models WHERE id = r.model_id),
                        format('delete a version of model %s', to_jsonb(p_model)));
    DELETE FROM model_versions WHERE id = r.id;
    UPDATE models SET last_updated_time = now() WHERE id = r.model_id;
    PERFORM det_internal.audit('delete_version', 'model', r.model_id::text,
                      jsonb_build_object('version', r.version));
    RETURN r.checkpoint_uuid;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_version_delete(text, integer) TO det_user;

CREATE FUNCTION det_internal.template_workspace(p_workspace text, p_permission text, p_action text)
RETURNS integer LANGUAGE plpgsql STABLE AS $$
-- The id of workspace p_workspace (NULL: Uncategorized, id 1) once det_internal.require has let the
-- caller do p_action there with p_permission. A workspace that does not exist is refused as
-- one the caller may not view: 'cannot <p_action>: not found' (no_data_found).
DECLARE
    v_id integer := CASE WHEN p_workspace IS NULL THEN 1
                         ELSE (SELECT id FROM workspaces WHERE name = p_workspace) END;
BEGIN
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'cannot %: not found', p_action USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require(p_permission, v_id, p_action);
    RETURN v_id;
END $$;

CREATE FUNCTION det_user.template_set(p_workspace text, p_name text, p_config jsonb,
                                 p_original text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det template set`: create or replace template p_name of workspace p_workspace (NULL:
-- Uncategorized), as an Editor there (a template is its workspace's, not the cluster's). p_config:
-- its YAML (p_original) as a JSON object, checked by det.configs.templates. Returns true when it
-- was created.
DECLARE
    v_ws integer := det_internal.template_workspace(
        p_workspace, 'edit', format('set template %s in workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
    v_problem text := det_user.template_name_problem(p_name);
    v_created boolean;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'template name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(p_config) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'template %: expected a mapping at the top level', to_jsonb(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO templates AS t (workspace_id, name, config, original, owner)
    VALUES (v_ws, p_name, p_config, p_original, det_user.caller())
    ON CONFLICT (workspace_id, name) DO UPDATE
        SET config = excluded.config, original = excluded.original, updated_at = now()
    RETURNING (xmax = 0) INTO v_created;
    PERFORM det_internal.audit(CASE WHEN v_created THEN 'create' ELSE 'update' END,
        'template', p_name,
                      jsonb_build_object('workspace_id', v_ws));
    RETURN v_created;
END $$;
GRANT EXECUTE ON FUNCTION det_user.template_set(text, text, jsonb, text) TO det_user;

CREATE FUNCTION det_user.template_remove(p_workspace text, p_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det template remove` (an Editor of its workspace; NULL: Uncategorized): experiments
-- created from it keep their merged configs.
DECLARE
    v_ws integer := det_internal.template_workspace(
        p_workspace, 'edit', format('remove template %s of workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
BEGIN
    DELETE FROM templates WHERE workspace_id = v_ws AND name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'template % not found in workspace %', to_jsonb(p_name),
            to_jsonb(coalesce(p_workspace, 'Uncategorized')) USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.audit('delete', 'template', p_name,
        jsonb_build_object('workspace_id', v_ws));
END $$;
GRANT EXECUTE ON FUNCTION det_user.template_remove(text, text) TO det_user;

CREATE FUNCTION det_user.template_expand(p_workspace text, p_name text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The config of template p_name of workspace p_workspace (NULL: Uncategorized), secrets
-- included, for `det experiment create --template` to merge under an experiment it submits
-- there: the one read of a template that is not redacted. It takes what the
-- submission takes, Editor on the workspace, so the secrets go only to those who may run
-- experiments with them (and whose experiments' configs hold them).
DECLARE
    v_ws integer := det_internal.template_workspace(
        p_workspace, 'edit', format('use template %s of workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
    v_config jsonb := (SELECT config FROM templates WHERE workspace_id = v_ws AND name = p_name);
BEGIN
    IF v_config IS NULL THEN
        RAISE EXCEPTION 'template % not found in workspace %', to_jsonb(p_name),
            to_jsonb(coalesce(p_workspace, 'Uncategorized')) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN v_config;
END $$;
GRANT EXECUTE ON FUNCTION det_user.template_expand(text, text) TO det_user;
