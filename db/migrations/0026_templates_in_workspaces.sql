-- Configuration templates live in a workspace (issue 32): readable under the workspace's
-- row-level security like experiments, written by its Editors, and read by users without their
-- secrets (S3 keys, registry passwords): config and original are selected only by
-- det_template_expand, at submission. Existing templates go to Uncategorized (workspace 1),
-- where every user is an Editor, so those who used them still can.

CREATE FUNCTION det_secret_name(p_name text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
-- Whether a config key (or an environment variable's name) holds a secret: S3's access_key
-- and secret_key, registry_auth's password, auth and tokens, and their like (api_key,
-- credentials, AWS_SECRET_ACCESS_KEY, HF_TOKEN). Words are split at '_' and '-', so that
-- max_tokens or tokenizer are not secrets.
SELECT p_name ~* '^(auth|identitytoken|registrytoken|connection_string)$'
    OR p_name ~* '(^|[_-])(secrets?|passwords?|passwd|token|credentials?|access_key|private_key|api_key)([_-]|$)'
$$;

CREATE FUNCTION det_redact_secrets(p_value jsonb) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
-- p_value with every secret replaced by '********' (issue 32): the value of each key that
-- det_secret_name calls a secret, at any depth, and the value of each 'NAME=VALUE' list item
-- (environment_variables) whose NAME is one. A null stays null: it hides nothing.
BEGIN
    CASE jsonb_typeof(p_value)
    WHEN 'object' THEN
        RETURN (SELECT coalesce(jsonb_object_agg(e.k, CASE
                    WHEN det_secret_name(e.k) AND jsonb_typeof(e.v) <> 'null' THEN '"********"'
                    ELSE det_redact_secrets(e.v) END), '{}')
                  FROM jsonb_each(p_value) AS e(k, v));
    WHEN 'array' THEN
        RETURN (SELECT coalesce(jsonb_agg(CASE
                    WHEN jsonb_typeof(e.v) = 'string' AND strpos(e.v #>> '{}', '=') > 1
                         AND det_secret_name(split_part(e.v #>> '{}', '=', 1))
                    THEN to_jsonb(split_part(e.v #>> '{}', '=', 1) || '=********')
                    ELSE det_redact_secrets(e.v) END ORDER BY e.i), '[]')
                  FROM jsonb_array_elements(p_value) WITH ORDINALITY AS e(v, i));
    ELSE
        RETURN p_value;
    END CASE;
END $$;

ALTER TABLE templates
    ADD COLUMN workspace_id integer NOT NULL DEFAULT 1 REFERENCES workspaces (id) ON DELETE CASCADE;
ALTER TABLE templates ALTER COLUMN workspace_id DROP DEFAULT;
ALTER TABLE templates
    ADD COLUMN redacted_config jsonb GENERATED ALWAYS AS (det_redact_secrets(config)) STORED;
ALTER TABLE templates
    ADD COLUMN redacted_original text GENERATED ALWAYS AS (
        CASE WHEN det_redact_secrets(config) = config THEN original END) STORED;
ALTER TABLE templates DROP CONSTRAINT templates_pkey;
ALTER TABLE templates ADD PRIMARY KEY (workspace_id, name);
COMMENT ON TABLE templates IS
    'Configuration templates (spec: Configuration Templates): a partial experiment config that '
    '`det experiment create --template NAME` merges under the user''s config '
    '(det.configs.templates). Experiments store the merged config, so changing or removing a '
    'template later changes no experiment. A template is its workspace''s (issue 32): '
    'readable under the workspace''s row-level security, written by its Editors.';
COMMENT ON COLUMN templates.config IS
    'The template as set, secrets included: users may not select it (nor original); '
    'det_template_expand gives it to an Editor of the workspace submitting an experiment.';
COMMENT ON COLUMN templates.redacted_config IS
    'config with its secrets replaced by ''********'' (det_redact_secrets): what users read.';
COMMENT ON COLUMN templates.redacted_original IS
    'The YAML as set when it holds no secret, else NULL (its text cannot be redacted).';

DROP FUNCTION det_template_set(text, jsonb, text);
DROP FUNCTION det_template_remove(text);

CREATE FUNCTION det_template_workspace(p_workspace text, p_permission text, p_action text)
RETURNS integer LANGUAGE plpgsql STABLE AS $$
-- The id of workspace p_workspace (NULL: Uncategorized, id 1) once det_require has let the
-- caller do p_action there with p_permission. A workspace that does not exist is refused as
-- one the caller may not view: 'cannot <p_action>: not found' (no_data_found).
DECLARE
    v_id integer := CASE WHEN p_workspace IS NULL THEN 1
                         ELSE (SELECT id FROM workspaces WHERE name = p_workspace) END;
BEGIN
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'cannot %: not found', p_action USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_require(p_permission, v_id, p_action);
    RETURN v_id;
END $$;

CREATE FUNCTION det_template_set(p_workspace text, p_name text, p_config jsonb,
                                 p_original text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det template set`: create or replace template p_name of workspace p_workspace (NULL:
-- Uncategorized), as an Editor there (issue 32: a template is its workspace's, not the
-- cluster's). p_config: its YAML (p_original) as a JSON object, checked by
-- det.configs.templates. Returns true when it was created.
DECLARE
    v_ws integer := det_template_workspace(
        p_workspace, 'edit', format('set template %s in workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
    v_problem text := det_template_name_problem(p_name);
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
    VALUES (v_ws, p_name, p_config, p_original, det_caller())
    ON CONFLICT (workspace_id, name) DO UPDATE
        SET config = excluded.config, original = excluded.original, updated_at = now()
    RETURNING (xmax = 0) INTO v_created;
    PERFORM det_audit(CASE WHEN v_created THEN 'create' ELSE 'update' END, 'template', p_name,
                      jsonb_build_object('workspace_id', v_ws));
    RETURN v_created;
END $$;

CREATE FUNCTION det_template_remove(p_workspace text, p_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det template remove` (an Editor of its workspace; NULL: Uncategorized): experiments
-- created from it keep their merged configs.
DECLARE
    v_ws integer := det_template_workspace(
        p_workspace, 'edit', format('remove template %s of workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
BEGIN
    DELETE FROM templates WHERE workspace_id = v_ws AND name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'template % not found in workspace %', to_jsonb(p_name),
            to_jsonb(coalesce(p_workspace, 'Uncategorized')) USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_audit('delete', 'template', p_name, jsonb_build_object('workspace_id', v_ws));
END $$;

CREATE FUNCTION det_template_expand(p_workspace text, p_name text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The config of template p_name of workspace p_workspace (NULL: Uncategorized), secrets
-- included, for `det experiment create --template` to merge under an experiment it submits
-- there: the one read of a template that is not redacted (issue 32). It takes what the
-- submission takes, Editor on the workspace, so the secrets go only to those who may run
-- experiments with them (and whose experiments' configs hold them).
DECLARE
    v_ws integer := det_template_workspace(
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

CREATE VIEW reporting.templates WITH (security_invoker = true) AS
-- Configuration templates with their secrets replaced by '********' (issue 32), and their
-- workspace's name.
SELECT t.workspace_id, w.name AS workspace, t.name, t.owner, t.created_at, t.updated_at,
       t.redacted_config AS config, t.redacted_original AS original
FROM templates t JOIN workspaces w ON w.id = t.workspace_id;

REVOKE SELECT ON templates FROM det_user;
GRANT SELECT (workspace_id, name, owner, created_at, updated_at, redacted_config,
              redacted_original)
    ON templates TO det_user;
GRANT SELECT ON reporting.templates TO det_user;
GRANT EXECUTE ON FUNCTION
    det_template_set(text, text, jsonb, text), det_template_remove(text, text),
    det_template_expand(text, text), det_secret_name(text), det_redact_secrets(jsonb)
TO det_user;

ALTER TABLE templates ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON templates FOR SELECT
    USING (workspace_id = ANY ((SELECT det_visible_workspaces())::integer[]));
