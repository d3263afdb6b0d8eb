-- Issue 16: the model registry (models, model_versions: a version pins its checkpoint against
-- deletion) and configuration templates, with their user actions and reporting views.

-- =============================================================================================
-- Tables: the model registry and configuration templates (issue 16)

CREATE FUNCTION det_model_name_problem(p_name text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
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

CREATE FUNCTION det_label_problem(p_labels text[]) RETURNS text LANGUAGE sql IMMUTABLE AS $$
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

CREATE TABLE models (
    id                serial PRIMARY KEY,
    name              text NOT NULL CHECK (det_model_name_problem(name) IS NULL),
    description       text NOT NULL DEFAULT '' CHECK (length(description) <= 4096),
    notes             text NOT NULL DEFAULT '' CHECK (length(notes) <= 1048576),
    metadata          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    labels            text[] NOT NULL DEFAULT '{}' CHECK (det_label_problem(labels) IS NULL),
    owner             text NOT NULL,
    archived          boolean NOT NULL DEFAULT false,
    creation_time     timestamptz NOT NULL DEFAULT now(),
    last_updated_time timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE models IS
    'The model registry (spec: Model Registry): named groups of checkpoints, possibly from '
    'different experiments, with a description, labels, metadata and Markdown notes. An '
    'archived model takes no new versions and no changes until it is unarchived.';
-- Invariant: model names are unique regardless of case (Determined: "avoid names equal to
-- other models (case-insensitive)"); det_model_find looks names up the same way.
CREATE UNIQUE INDEX models_name_lower ON models (lower(name));

CREATE TABLE model_versions (
    id                serial PRIMARY KEY,
    model_id          integer NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    version           integer NOT NULL CHECK (version > 0),
    checkpoint_uuid   uuid NOT NULL REFERENCES checkpoints (uuid) ON DELETE RESTRICT,
    name              text NOT NULL DEFAULT '' CHECK (length(name) <= 255),
    notes             text NOT NULL DEFAULT '' CHECK (length(notes) <= 1048576),
    metadata          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    labels            text[] NOT NULL DEFAULT '{}' CHECK (det_label_problem(labels) IS NULL),
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

CREATE FUNCTION det_keep_pinned_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
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
    FOR EACH ROW WHEN (NEW.state <> 'COMPLETED') EXECUTE FUNCTION det_keep_pinned_checkpoint();

CREATE FUNCTION det_template_name_problem(p_name text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
-- Why p_name cannot name a configuration template, or NULL: non-blank, at most 255
-- characters, without control characters.
    SELECT CASE
        WHEN p_name IS NULL OR btrim(p_name) = '' THEN 'cannot be blank'
        WHEN length(p_name) > 255 THEN 'must be at most 255 characters'
        WHEN p_name ~ '[[:cntrl:]]' THEN 'cannot contain line breaks or control characters'
    END;
$$;

CREATE TABLE templates (
    name       text PRIMARY KEY CHECK (det_template_name_problem(name) IS NULL),
    config     jsonb NOT NULL CHECK (jsonb_typeof(config) = 'object'),
    original   text NOT NULL,
    owner      text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE templates IS
    'Configuration templates (spec: Configuration Templates): a partial experiment config that '
    '`det experiment create --template NAME` merges under the user''s config '
    '(det.configs.templates). Experiments store the merged config, so changing or removing a '
    'template later changes no experiment.';

-- =============================================================================================
-- User actions: the model registry and configuration templates (issue 16). Each is one
-- transaction. A model is named by its name (compared regardless of case) or by its id.

CREATE FUNCTION det_model_find(p_model text) RETURNS models LANGUAGE plpgsql STABLE AS $$
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

CREATE FUNCTION det_model_check(
    p_name text, p_description text, p_labels text[], p_metadata jsonb, p_except integer
) RETURNS void LANGUAGE plpgsql STABLE AS $$
-- Raise invalid_parameter_value, naming the field, if a model's new name, description, labels
-- or metadata (each NULL: unchanged) is unacceptable. p_except is the model being changed,
-- which may keep its own name.
DECLARE
    v_problem text := det_model_name_problem(p_name);
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
    v_problem := det_label_problem(p_labels);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'labels: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

CREATE FUNCTION det_model_create(
    p_name text, p_description text, p_labels text[], p_owner text
) RETURNS models LANGUAGE plpgsql AS $$
-- `det model create`: a new, empty model.
DECLARE
    m models;
BEGIN
    PERFORM det_model_check(p_name, p_description, p_labels, NULL, NULL);
    INSERT INTO models (name, description, labels, owner)
    VALUES (p_name, coalesce(p_description, ''), coalesce(p_labels, '{}'), p_owner)
    RETURNING * INTO m;
    RETURN m;
END $$;

CREATE FUNCTION det_model_update(
    p_model text, p_name text, p_description text, p_notes text, p_labels text[],
    p_metadata jsonb, p_remove_metadata text[]
) RETURNS models LANGUAGE plpgsql AS $$
-- `det model update`: each argument NULL leaves its field as it is. p_labels replaces the
-- labels; p_metadata is merged into the metadata (its top-level keys replace the model's),
-- then the keys in p_remove_metadata are removed. An archived model cannot change.
DECLARE
    m models := det_model_find(p_model);
BEGIN
    SELECT * INTO m FROM models WHERE id = m.id FOR UPDATE;
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to change it', to_jsonb(m.name)
            USING ERRCODE = 'check_violation';
    END IF;
    PERFORM det_model_check(p_name, p_description, p_labels, p_metadata, m.id);
    UPDATE models
       SET name = coalesce(p_name, name), description = coalesce(p_description, description),
           notes = coalesce(p_notes, notes), labels = coalesce(p_labels, labels),
           metadata = (metadata || coalesce(p_metadata, '{}')) - coalesce(p_remove_metadata, '{}'),
           last_updated_time = now()
     WHERE id = m.id
    RETURNING * INTO m;
    RETURN m;
END $$;

CREATE FUNCTION det_model_set_archived(p_model text, p_archived boolean) RETURNS models
LANGUAGE plpgsql AS $$
-- `det model archive | unarchive`: an archived model is hidden from `det model list` (unless
-- --all), takes no new versions and no changes; its versions still pin their checkpoints.
DECLARE
    m models := det_model_find(p_model);
BEGIN
    UPDATE models SET archived = p_archived, last_updated_time = now()
     WHERE id = m.id RETURNING * INTO m;
    RETURN m;
END $$;

CREATE FUNCTION det_model_delete(p_model text) RETURNS integer LANGUAGE plpgsql AS $$
-- `det model delete`: the model and all its versions; their checkpoints are no longer pinned.
-- Returns how many versions went with it.
DECLARE
    m models := det_model_find(p_model);
    v_versions integer;
BEGIN
    SELECT count(*) INTO v_versions FROM model_versions WHERE model_id = m.id;
    DELETE FROM models WHERE id = m.id;
    RETURN v_versions;
END $$;

CREATE FUNCTION det_model_register_version(
    p_model text, p_checkpoint text, p_name text, p_notes text, p_labels text[],
    p_metadata jsonb, p_owner text
) RETURNS model_versions LANGUAGE plpgsql AS $$
-- `det model register-version`: the model's next version (its highest number plus one; the
-- model's row lock serialises concurrent registrations) is the checkpoint p_checkpoint, which
-- must be COMPLETED (Determined: "checkpoints for model versions must be in a COMPLETED
-- state"). The version pins the checkpoint. An archived model takes no new versions.
DECLARE
    m models := det_model_find(p_model);
    v_uuid uuid;
    v_state text;
    v_problem text := det_label_problem(p_labels);
    r model_versions;
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
           coalesce(p_notes, ''), coalesce(p_labels, '{}'), coalesce(p_metadata, '{}'), p_owner
      FROM model_versions v WHERE v.model_id = m.id
    RETURNING * INTO r;
    UPDATE models SET last_updated_time = now() WHERE id = m.id;
    RETURN r;
END $$;

CREATE FUNCTION det_model_version_find(p_model text, p_version integer) RETURNS model_versions
LANGUAGE plpgsql STABLE AS $$
-- Version p_version of the model p_model names; NULL p_version: its latest version. Raises
-- no_data_found.
DECLARE
    m models := det_model_find(p_model);
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

CREATE FUNCTION det_model_version_update(
    p_model text, p_version integer, p_name text, p_notes text, p_labels text[],
    p_metadata jsonb, p_remove_metadata text[]
) RETURNS model_versions LANGUAGE plpgsql AS $$
-- `det model update NAME --version N`: as det_model_update, for one version (its name,
-- notes, labels and metadata). A version of an archived model cannot change.
DECLARE
    r model_versions := det_model_version_find(p_model, p_version);
    m models;
    v_problem text := det_label_problem(p_labels);
BEGIN
    SELECT * INTO m FROM models WHERE id = r.model_id FOR UPDATE;
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
    RETURN r;
END $$;

CREATE FUNCTION det_model_version_delete(p_model text, p_version integer) RETURNS uuid
LANGUAGE plpgsql AS $$
-- `det model delete-version`: remove one version; returns its checkpoint, no longer pinned by
-- it. The numbers of the other versions stay as they are.
DECLARE
    r model_versions := det_model_version_find(p_model, p_version);
BEGIN
    DELETE FROM model_versions WHERE id = r.id;
    UPDATE models SET last_updated_time = now() WHERE id = r.model_id;
    RETURN r.checkpoint_uuid;
END $$;

CREATE FUNCTION det_template_set(p_name text, p_config jsonb, p_original text, p_owner text)
RETURNS boolean LANGUAGE plpgsql AS $$
-- `det template set`: create or replace a template (p_config: its YAML as a JSON object,
-- checked by det.configs.templates). Returns true when it was created.
DECLARE
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
    INSERT INTO templates AS t (name, config, original, owner)
    VALUES (p_name, p_config, p_original, p_owner)
    ON CONFLICT (name) DO UPDATE
        SET config = excluded.config, original = excluded.original, owner = excluded.owner,
            updated_at = now()
    RETURNING (xmax = 0) INTO v_created;
    RETURN v_created;
END $$;

CREATE FUNCTION det_template_remove(p_name text) RETURNS void LANGUAGE plpgsql AS $$
-- `det template remove`: experiments created from it keep their merged configs.
BEGIN
    DELETE FROM templates WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'template % not found', to_jsonb(p_name) USING ERRCODE = 'no_data_found';
    END IF;
END $$;

CREATE VIEW reporting.models AS
-- The model registry: each model with its number of versions and its latest version.
SELECT m.id, m.name, m.description, m.labels, m.metadata, m.notes, m.owner, m.archived,
       m.creation_time, m.last_updated_time,
       count(v.id) AS num_versions, max(v.version) AS latest_version
FROM models m LEFT JOIN model_versions v ON v.model_id = m.id
GROUP BY m.id;

CREATE VIEW reporting.model_versions AS
-- Every model version with the checkpoint it pins: where it came from (trial, experiment,
-- batches), its size in bytes and the validation metrics reported at its step.
SELECT v.id, v.model_id, m.name AS model_name, v.version, v.name, v.notes, v.labels,
       v.metadata, v.owner, v.creation_time, v.last_updated_time, v.checkpoint_uuid,
       c.state AS checkpoint_state, c.trial_id, t.experiment_id, c.steps_completed,
       (SELECT sum(r.value::bigint)::bigint FROM jsonb_each_text(c.resources) r) AS size_bytes,
       (SELECT x."values" FROM metrics x
         WHERE x.trial_id = c.trial_id AND x."group" = 'validation'
           AND x.steps_completed = c.steps_completed
         ORDER BY x.id DESC LIMIT 1) AS validation_metrics
FROM model_versions v
JOIN models m ON m.id = v.model_id
JOIN checkpoints c ON c.uuid = v.checkpoint_uuid
JOIN trials t ON t.id = c.trial_id;
