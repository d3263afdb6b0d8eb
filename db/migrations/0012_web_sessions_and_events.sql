-- Issue 15: the HTTP server (det serve). Login tokens stored hashed and expiring; the events
-- its server-sent-event streams wake on (NOTIFY det_web, tiny payloads, sparingly); an illegal
-- experiment action is a check_violation (a state error: HTTP 409), not a bad argument.

CREATE TABLE web_sessions (
    token_hash bytea PRIMARY KEY,
    username   text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    CHECK (expires_at > created_at)
);
COMMENT ON TABLE web_sessions IS
    'Login tokens of det serve (POST /api/v1/auth/login), by SHA-256 hash: the token itself is '
    'never stored. A token is good until expires_at; expired rows are removed at each login.';

CREATE UNLOGGED TABLE web_event_marks (
    topic   text PRIMARY KEY,
    sent_at timestamptz NOT NULL
);
COMMENT ON TABLE web_event_marks IS
    'When a throttled det_web event (new metrics or logs of a trial) was last sent, so that a '
    'trial reporting many batches a second wakes the servers at most every 0.2 s (the rest '
    'is picked up by their periodic look). Unlogged: losing it in a crash costs one event.';

CREATE FUNCTION det_web_login(p_token text, p_user text, p_ttl_seconds double precision)
RETURNS timestamptz LANGUAGE plpgsql AS $$
-- Record a login token (minted by det serve) for p_user, good for p_ttl_seconds; returns its
-- expiry. Expired tokens are removed here, so the table stays as small as the live logins.
DECLARE
    v_expires timestamptz;
BEGIN
    IF NOT (p_ttl_seconds > 0 AND p_ttl_seconds <= 366 * 86400) THEN
        RAISE EXCEPTION 'token lifetime: expected seconds > 0 and at most a year, not %',
            p_ttl_seconds USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_token IS NULL OR length(p_token) < 32 THEN
        RAISE EXCEPTION 'token: expected at least 32 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM web_sessions WHERE expires_at <= now();
    v_expires := now() + make_interval(secs => p_ttl_seconds);
    INSERT INTO web_sessions (token_hash, username, expires_at)
    VALUES (sha256(convert_to(p_token, 'UTF8')), p_user, v_expires);
    RETURN v_expires;
END $$;

CREATE FUNCTION det_web_auth(p_token text) RETURNS text LANGUAGE plpgsql STABLE AS $$
-- The user a live login token belongs to, or an error (SQLSTATE 28000). The identity issue
-- will SET LOCAL ROLE to this user for the rest of the request's transaction.
DECLARE
    v_user text;
BEGIN
    SELECT username INTO v_user FROM web_sessions
     WHERE token_hash = sha256(convert_to(p_token, 'UTF8')) AND expires_at > now();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invalid or expired token: log in again'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    RETURN v_user;
END $$;

CREATE FUNCTION det_web_logout(p_token text) RETURNS void LANGUAGE sql AS $$
-- End a login: its token is good no more.
    DELETE FROM web_sessions WHERE token_hash = sha256(convert_to(p_token, 'UTF8'));
$$;

CREATE FUNCTION det_web_event(p_topics text[]) RETURNS void LANGUAGE sql AS $$
-- Wake det serve's event streams with one NOTIFY det_web whose payload is the distinct
-- topics, space-separated (det.db.channels: "experiments", "experiment:<id>", "trial:<id>",
-- "queue", "cluster"), or "*" (every stream) when there are more than 200 of them. A hint
-- only: the servers also look on their own every second. Identical payloads in one
-- transaction are delivered once (PostgreSQL folds them).
    SELECT pg_notify('det_web', CASE WHEN count(*) > 200 THEN '*'
                                     ELSE string_agg(t, ' ' ORDER BY t) END)
      FROM (SELECT DISTINCT t FROM unnest(p_topics) t WHERE t IS NOT NULL) d
    HAVING count(*) > 0;
$$;

CREATE FUNCTION det_web_event_throttled(p_topics text[]) RETURNS void LANGUAGE plpgsql AS $$
-- det_web_event for the hot tables (metrics, task logs): at most one event per topic set
-- every 0.2 s (web_event_marks), so a busy trial costs a few NOTIFYs a second, not one per
-- batch. An event skipped here reaches the streams at the servers' next periodic look.
BEGIN
    INSERT INTO web_event_marks AS m (topic, sent_at)
    VALUES (array_to_string(p_topics, ' '), clock_timestamp())
    ON CONFLICT (topic) DO UPDATE SET sent_at = excluded.sent_at
     WHERE m.sent_at < excluded.sent_at - interval '0.2 seconds';
    IF FOUND THEN
        PERFORM det_web_event(p_topics);
    END IF;
END $$;

-- The triggers below fire once per statement (never per row: DESIGN.md) and send at most
-- one NOTIFY each, naming what changed in a way a page shows.

CREATE FUNCTION det_web_on_experiments() RETURNS trigger LANGUAGE plpgsql AS $$
-- Experiments submitted, or changed state, progress or archived.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_web_event('{experiments,queue}'::text[] || array_agg('experiment:' || n.id))
           FROM new_rows n;
    ELSE
        PERFORM det_web_event('{experiments,queue}'::text[] || array_agg('experiment:' || n.id))
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE (o.state, o.progress, o.archived) IS DISTINCT FROM
                (n.state, n.progress, n.archived)
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER experiments_web_insert AFTER INSERT ON experiments
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_experiments();
CREATE TRIGGER experiments_web_update AFTER UPDATE ON experiments
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_experiments();

CREATE FUNCTION det_web_on_trials() RETURNS trigger LANGUAGE plpgsql AS $$
-- Trials created, or changed state, restarts, batches, checkpoint or best validation.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_web_event(array_agg('experiment:' || n.experiment_id)
                              || array_agg('trial:' || n.id))
           FROM new_rows n;
    ELSE
        PERFORM det_web_event(array_agg('experiment:' || n.experiment_id)
                              || array_agg('trial:' || n.id))
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE (o.state, o.restarts, o.steps_completed, o.latest_checkpoint,
                 o.best_validation) IS DISTINCT FROM
                (n.state, n.restarts, n.steps_completed, n.latest_checkpoint,
                 n.best_validation)
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER trials_web_insert AFTER INSERT ON trials
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_trials();
CREATE TRIGGER trials_web_update AFTER UPDATE ON trials
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_trials();

CREATE FUNCTION det_web_on_allocations() RETURNS trigger LANGUAGE plpgsql AS $$
-- Runs created or changed state: the queue (slots acquired), the cluster (slots held) and
-- their trials.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_web_event('{queue,cluster}'::text[] || array_agg('experiment:' || t.experiment_id)
                              || array_agg('trial:' || t.id))
           FROM new_rows n LEFT JOIN trials t ON t.id = n.trial_id;
    ELSE
        PERFORM det_web_event('{queue,cluster}'::text[] || array_agg('experiment:' || t.experiment_id)
                              || array_agg('trial:' || t.id))
           FROM new_rows n JOIN old_rows o ON o.id = n.id
           LEFT JOIN trials t ON t.id = n.trial_id
          WHERE o.state IS DISTINCT FROM n.state
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER allocations_web_insert AFTER INSERT ON allocations
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_allocations();
CREATE TRIGGER allocations_web_update AFTER UPDATE ON allocations
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_allocations();

CREATE FUNCTION det_web_on_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
-- A job's priority, weight, position or pool changed (det_job_update).
BEGIN
    PERFORM det_web_event('{queue}')
       FROM new_rows n JOIN old_rows o ON o.id = n.id
      WHERE (o.priority, o.weight, o.queue_position, o.resource_pool) IS DISTINCT FROM
            (n.priority, n.weight, n.queue_position, n.resource_pool)
     HAVING count(*) > 0;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_web_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_jobs();

CREATE FUNCTION det_web_on_cluster() RETURNS trigger LANGUAGE plpgsql AS $$
-- Agents joined or changed state (enabled, disabled, lost); slots enabled or disabled.
-- Heartbeats (last_heartbeat) send nothing.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_web_event('{cluster,queue}');
    ELSIF TG_TABLE_NAME = 'agents' THEN
        PERFORM det_web_event('{cluster,queue}')
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE o.state IS DISTINCT FROM n.state
         HAVING count(*) > 0;
    ELSE
        PERFORM det_web_event('{cluster,queue}')
           FROM new_rows n JOIN old_rows o ON (o.agent_id, o.slot_id) = (n.agent_id, n.slot_id)
          WHERE o.enabled IS DISTINCT FROM n.enabled
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER agents_web_insert AFTER INSERT ON agents
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_cluster();
CREATE TRIGGER agents_web_update AFTER UPDATE ON agents
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_cluster();
CREATE TRIGGER slots_web_update AFTER UPDATE ON slots
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_cluster();

CREATE FUNCTION det_web_on_reports() RETURNS trigger LANGUAGE plpgsql AS $$
-- Metrics or log lines appended: one statement is one batch of a task's reports, and the
-- event per trial is throttled (det_web_event_throttled).
BEGIN
    PERFORM det_web_event_throttled(ARRAY['experiment:' || t.experiment_id, 'trial:' || t.id])
       FROM trials t WHERE t.id IN (SELECT DISTINCT trial_id FROM new_rows);
    RETURN NULL;
END $$;

CREATE TRIGGER metrics_web_insert AFTER INSERT ON metrics
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_reports();
CREATE TRIGGER task_logs_web_insert AFTER INSERT ON task_logs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_web_on_reports();

CREATE OR REPLACE FUNCTION det_experiment_action(p_id integer, p_action text) RETURNS experiment_state
LANGUAGE plpgsql AS $$
-- pause | activate | cancel | kill (spec: run-training-code, Pause and Activate). Returns the
-- new state. The reconciler turns the state into desired states of the trials' allocations.
-- An action the state does not allow is a check_violation (an illegal transition); an
-- unknown action a bad argument.
DECLARE
    v_state experiment_state;
    v_new experiment_state;
BEGIN
    IF p_action IS NULL OR p_action NOT IN ('pause', 'activate', 'cancel', 'kill') THEN
        RAISE EXCEPTION 'action: expected pause, activate, cancel or kill, not %', p_action
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'experiment % not found', p_id USING ERRCODE = 'no_data_found';
    END IF;
    v_new := CASE
        WHEN p_action = 'pause' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'PAUSED'
        WHEN p_action = 'activate' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'ACTIVE'
        WHEN p_action = 'cancel' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'STOPPING_CANCELED'
        WHEN p_action = 'cancel' AND v_state::text LIKE 'STOPPING_%' THEN v_state
        WHEN p_action = 'kill' AND (v_state IN ('ACTIVE', 'PAUSED')
                                    OR v_state::text LIKE 'STOPPING_%') THEN 'STOPPING_KILLED'
    END::experiment_state;
    IF v_new IS NULL THEN
        RAISE EXCEPTION 'experiment %: cannot % an experiment in state %', p_id, p_action, v_state
            USING ERRCODE = 'check_violation';
    END IF;
    UPDATE experiments SET state = v_new WHERE id = p_id;
    PERFORM pg_notify('det_reconciler', 'experiment');
    RETURN v_new;
END $$;

CREATE OR REPLACE FUNCTION det_experiment_archive(p_id integer, p_archived boolean) RETURNS void
LANGUAGE plpgsql AS $$
-- `det experiment archive | unarchive`: an archived experiment is hidden from default lists
-- (spec: experiment-lifecycle). Only an ended experiment can be archived (else a
-- check_violation: an illegal transition).
DECLARE
    v_state experiment_state;
BEGIN
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'experiment % not found', p_id USING ERRCODE = 'no_data_found';
    END IF;
    IF p_archived AND v_state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'experiment % is %: only an ended experiment can be archived', p_id,
            v_state USING ERRCODE = 'check_violation';
    END IF;
    UPDATE experiments SET archived = p_archived WHERE id = p_id;
END $$;
