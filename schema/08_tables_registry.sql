-- Tables: the model registry and configuration templates

CREATE FUNCTION det_user.model_name_problem(p_name text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
-- Why p_name cannot name a model, or NULL. Determined's rules (master/internal/api_model.go):
-- not blank, no runs of spaces, no slashes, not only digits (a number names a model by its
-- id); det's: at most 255 characters, no control characters (a name is one table cell).
-- Names are also unique regardless of case (models_name_lower).
    SELECT CASE
        WHEN p_name IS NULL OR btrim(p_name) = '' THEN 'cannot be blank'
        WHEN length(p_name) > 255 THEN 'must be at most 255 characters'
        WHEN p_name ~ '[[:cntrl:]]' THEN 'cannot contain line breaks or control characters'
        WHEN strpos(p_name, '  ') > 0 THEN 'cannot have excessive spacing (two spaces in a row)'
        WHEN strpos(p_name, '/') > 0 OR strpos(p_name, '\') > 0 THEN 'cannot have slashes'
        WHEN p_name ~ '^[0-9]+$' THEN 'cannot be only numbers (a number names a model by id)'
    END;
$$;
GRANT EXECUTE ON FUNCTION det_user.model_name_problem(text) TO det_user;

CREATE FUNCTION det_user.label_problem(p_labels text[]) RETURNS text LANGUAGE sql IMMUTABLE AS $$
-- Why a list of labels (of a model or a model version) is not acceptable, or NULL: each label
-- is non-blank, at most 255 characters, without control characters.
    SELECT format('label %s %s', to_jsonb(l),
                  CASE WHEN btrim(l) = '' THEN 'cannot be blank'
                       WHEN length(l) > 255 THEN 'must be at most 255 characters'
                       ELSE 'cannot contain line breaks or control characters' END)
      FROM unnest(p_labels) l
     WHERE l IS NULL OR btrim(l) = '' OR length(l) > 255 OR l ~ '[[:cntrl:]]'
     LIMIT 1;
$$;
GRANT EXECUTE ON FUNCTION det_user.label_problem(text[]) TO det_user;

CREATE TABLE models (
    id                serial PRIMARY KEY,
    name              text NOT NULL CHECK (det_user.model_name_problem(name) IS NULL),
    description       text NOT NULL DEFAULT '' CHECK (length(description) <= 4096),
    notes             text NOT NULL DEFAULT '' CHECK (length(notes) <= 1048576),
    metadata          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    labels            text[] NOT NULL DEFAULT '{}' CHECK (det_user.label_problem(labels) IS NULL),
    owner             text NOT NULL,
    archived          boolean NOT NULL DEFAULT false,
    creation_time     timestamptz NOT NULL DEFAULT now(),
    last_updated_time timestamptz NOT NULL DEFAULT now(),
    workspace_id      integer NOT NULL DEFAULT 1 REFERENCES workspaces (id)
);
COMMENT ON TABLE models IS
    'The model registry (spec: Model Registry): named groups of checkpoints, possibly from '
    'different experiments, with a description, labels, metadata and Markdown notes. An '
    'archived model takes no new versions and no changes until it is unarchived.';
-- Invariant: model names are unique regardless of case (Determined: "avoid names equal to
-- other models (case-insensitive)"); det_user.model_find looks names up the same way.
CREATE UNIQUE INDEX models_name_lower ON models (lower(name));
GRANT SELECT ON models TO det_user;

CREATE TABLE model_versions (
    id                serial PRIMARY KEY,
    model_id          integer NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    version           integer NOT NULL CHECK (version > 0),
    checkpoint_uuid   uuid NOT NULL REFERENCES checkpoints (uuid) ON DELETE RESTRICT,
    name              text NOT NULL DEFAULT '' CHECK (length(name) <= 255),
    notes             text NOT NULL DEFAULT '' CHECK (length(notes) <= 1048576),
    metadata          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    labels            text[] NOT NULL DEFAULT '{}' CHECK (det_user.label_problem(labels) IS NULL),
    owner             text NOT NULL,
    creation_time     timestamptz NOT NULL DEFAULT now(),
    last_updated_time timestamptz NOT NULL DEFAULT now(),
    UNIQUE (model_id, version)
);
COMMENT ON TABLE model_versions IS
    'Versions of a model, numbered 1, 2, ... per model, each one checkpoint. A registered '
    'checkpoint is pinned: its row cannot be deleted while a version names it (ON DELETE '
    'RESTRICT), nor can it leave the COMPLETED state (checkpoints_keep_pinned), so checkpoint '
    'GC keeps it.';
-- The pin's lookup when a checkpoint row is deleted, and GC's keep rule.
CREATE INDEX model_versions_checkpoint ON model_versions (checkpoint_uuid);
GRANT SELECT ON model_versions TO det_user;

CREATE FUNCTION det_internal.keep_pinned_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
-- A checkpoint that a model version names stays COMPLETED: GC and deletion may not move it to
-- another state (the pin's second half; ON DELETE RESTRICT is the first). The check runs on
-- the row as it is when the update takes effect, with a fresh snapshot, so a version
-- registered while a GC statement waited for the row still stops it.
DECLARE
    v_model text;
    v_version integer;
BEGIN
    SELECT m.name, v.version INTO v_model, v_version
      FROM model_versions v JOIN models m ON m.id = v.model_id
     WHERE v.checkpoint_uuid = NEW.uuid ORDER BY v.id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'checkpoint % is registered in the model registry (model %, version %) '
            'and cannot be deleted; delete its model versions first (det model delete-version)',
            NEW.uuid, to_jsonb(v_model), v_version USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER checkpoints_keep_pinned BEFORE UPDATE OF state ON checkpoints
    FOR EACH ROW WHEN (NEW.state <> 'COMPLETED')
        EXECUTE FUNCTION det_internal.keep_pinned_checkpoint();

CREATE FUNCTION det_user.template_name_problem(p_name text) RETURNS text
    LANGUAGE sql IMMUTABLE AS $$
-- Why p_name cannot name a configuration template, or NULL: non-blank, at most 255
-- characters, without control characters.
    SELECT CASE
        WHEN p_name IS NULL OR btrim(p_name) = '' THEN 'cannot be blank'
        WHEN length(p_name) > 255 THEN 'must be at most 255 characters'
        WHEN p_name ~ '[[:cntrl:]]' THEN 'cannot contain line breaks or control characters'
    END;
$$;
GRANT EXECUTE ON FUNCTION det_user.template_name_problem(text) TO det_user;

CREATE FUNCTION det_user.secret_name(p_name text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
-- Whether a config key (or an environment variable's name) holds a secret: S3's access_key
-- and secret_key, registry_auth's password, auth and tokens, and their like (api_key,
-- credentials, AWS_SECRET_ACCESS_KEY, HF_TOKEN). Words are split at '_' and '-', so that
-- max_tokens or tokenizer are not secrets.
SELECT p_name ~* '^(auth|identitytoken|registrytoken|connection_string)$'
    OR p_name ~* '(^|[_-])(secrets?|passwords?|passwd|token|credentials?|access_key|private_key|api_key)([_-]|$)'
$$;
GRANT EXECUTE ON FUNCTION det_user.secret_name(text) TO det_user;

CREATE FUNCTION det_user.redact_secrets(p_value jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE AS $$
-- p_value with every secret replaced by '********': the value of each key that
-- det_user.secret_name calls a secret, at any depth, and the value of each 'NAME=VALUE' list item
-- (environment_variables) whose NAME is one. A null stays null: it hides nothing.
BEGIN
    CASE jsonb_typeof(p_value)
    WHEN 'object' THEN
        RETURN (SELECT coalesce(jsonb_object_agg(e.k, CASE
                    WHEN det_user.secret_name(e.k) AND jsonb_typeof(e.v) <> 'null' THEN '"********"'
                    ELSE det_user.redact_secrets(e.v) END), '{}')
                  FROM jsonb_each(p_value) AS e(k, v));
    WHEN 'array' THEN
        RETURN (SELECT coalesce(jsonb_agg(CASE
                    WHEN jsonb_typeof(e.v) = 'string' AND strpos(e.v #>> '{}', '=') > 1
                         AND det_user.secret_name(split_part(e.v #>> '{}', '=', 1))
                    THEN to_jsonb(split_part(e.v #>> '{}', '=', 1) || '=********')
                    ELSE det_user.redact_secrets(e.v) END ORDER BY e.i), '[]')
                  FROM jsonb_array_elements(p_value) WITH ORDINALITY AS e(v, i));
    ELSE
        RETURN p_value;
    END CASE;
END $$;
GRANT EXECUTE ON FUNCTION det_user.redact_secrets(jsonb) TO det_user;

CREATE TABLE templates (
    name              text NOT NULL CHECK (det_user.template_name_problem(name) IS NULL),
    config            jsonb NOT NULL CHECK (jsonb_typeof(config) = 'object'),
    original          text NOT NULL,
    owner             text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    workspace_id      integer NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    redacted_config   jsonb GENERATED ALWAYS AS (det_user.redact_secrets(config)) STORED,
    redacted_original text GENERATED ALWAYS AS (
        CASE WHEN det_user.redact_secrets(config) = config THEN original END) STORED,
    PRIMARY KEY (workspace_id, name)
);
COMMENT ON TABLE templates IS
    'Configuration templates (spec: Configuration Templates): a partial experiment config that '
    '`det experiment create --template NAME` merges under the user''s config '
    '(det.configs.templates). Experiments store the merged config, so changing or removing a '
    'template later changes no experiment. A template is its workspace''s: '
    'readable under the workspace''s row-level security, written by its Editors.';
COMMENT ON COLUMN templates.config IS
    'The template as set, secrets included: users may not select it (nor original); '
    'det_user.template_expand gives it to an Editor of the workspace submitting an experiment.';
COMMENT ON COLUMN templates.redacted_config IS
    'config with its secrets replaced by ''********'' (det_user.redact_secrets): what users read.';
COMMENT ON COLUMN templates.redacted_original IS
    'The YAML as set when it holds no secret, else NULL (its text cannot be redacted).';
-- templates without their secrets: config and original are read only through
-- det_user.template_expand, at submission
REVOKE ALL ON templates FROM PUBLIC;
GRANT SELECT (workspace_id, name, owner, created_at, updated_at, redacted_config,
              redacted_original)
    ON templates TO det_user;
