-- det serve: login tokens and the events its streams wake on

CREATE FUNCTION det_internal.web_end_stale_logins(p_user text, p_stamp bytea) RETURNS integer
LANGUAGE plpgsql AS $$
-- End p_user's det serve logins made under another password than the one whose stamp is
-- p_stamp (det_internal.password_stamp, read now); returns how many ended. det's own
-- change-password ends them all itself, so a login left to end here saw a password changed outside
-- det (the user's own ALTER ROLE ... PASSWORD in psql, or a superuser's): the first look after it
-- writes the audit row det's change-password would have written.
DECLARE
    v_ended integer;
BEGIN
    DELETE FROM web_sessions
     WHERE username = p_user AND password_stamp IS DISTINCT FROM p_stamp;
    GET DIAGNOSTICS v_ended = ROW_COUNT;
    IF v_ended > 0 THEN
        INSERT INTO audit_log (actor, action, object_type, object_id, detail)
        VALUES (p_user, 'change_password', 'user', p_user,
                jsonb_build_object('outside_det', true, 'logins_ended', v_ended));
    END IF;
    RETURN v_ended;
END $$;

CREATE FUNCTION det_web.login(p_token text, p_user text, p_ttl_seconds double precision,
                              p_address text)
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Record a login token (minted by det serve once PostgreSQL accepted p_user's password) for
-- active user p_user, good for p_ttl_seconds; returns its expiry. The token keeps the stamp
-- of the password it was minted under (det_internal.password_stamp): det_web.auth refuses it once
-- the password changes. The login is audited (outcome success, client address p_address) and
-- clears p_user's failed attempts (det_web.login_begin counted this one as failed until now).
-- Expired tokens are removed here, so the table stays as small as the live logins.
DECLARE
    v_expires timestamptz;
    v_stamp bytea := det_internal.password_stamp(p_user);
    v_address text := coalesce(p_address, 'unknown');
BEGIN
    IF NOT EXISTS (SELECT 1 FROM users WHERE username = p_user AND active) THEN
        RAISE EXCEPTION 'invalid username or password'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF NOT (p_ttl_seconds > 0 AND p_ttl_seconds <= 366 * 86400) THEN
        RAISE EXCEPTION 'token lifetime: expected seconds > 0 and at most a year, not %',
            p_ttl_seconds USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_token IS NULL OR length(p_token) < 32 THEN
        RAISE EXCEPTION 'token: expected at least 32 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM web_sessions WHERE expires_at <= now();
    PERFORM det_internal.web_end_stale_logins(p_user, v_stamp);
    v_expires := now() + make_interval(secs => p_ttl_seconds);
    INSERT INTO web_sessions (token_hash, username, expires_at, password_stamp)
    VALUES (sha256(convert_to(p_token, 'UTF8')), p_user, v_expires, v_stamp);
    UPDATE login_throttle SET failures = 0, locked_until = NULL
     WHERE kind = 'user' AND key = p_user;
    UPDATE login_throttle
       SET failures = greatest(failures - 1, 0),
           locked_until = CASE WHEN failures - 1 >= 20 THEN locked_until END
     WHERE kind = 'address' AND key = v_address;
    INSERT INTO audit_log (actor, action, object_type, object_id, detail)
    VALUES (p_user, 'login', 'user', p_user,
            jsonb_build_object('outcome', 'success', 'address', v_address));
    RETURN v_expires;
END $$;
GRANT EXECUTE ON FUNCTION det_web.login(text, text, double precision, text) TO det_web;

CREATE FUNCTION det_web.auth(p_token text) RETURNS text LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The active user a live login token belongs to, or an error (SQLSTATE 28000). It becomes the
-- transaction's caller (det_user.caller reads det.web_user); det serve then SETs LOCAL ROLE to it,
-- so row-level security applies to the request as to that user's own psql. NULL, with the
-- user's logins ended (det_internal.web_end_stale_logins), when the token's password is no longer
-- the user's: det serve commits that and answers 401.
DECLARE
    v_user text;
    v_stamp bytea;
BEGIN
    SELECT s.username, s.password_stamp INTO v_user, v_stamp
      FROM web_sessions s JOIN users u ON u.username = s.username
     WHERE s.token_hash = sha256(convert_to(p_token, 'UTF8')) AND s.expires_at > now()
       AND u.active;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invalid or expired token: log in again'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF v_stamp IS DISTINCT FROM det_internal.password_stamp(v_user) THEN
        PERFORM det_internal.web_end_stale_logins(v_user, det_internal.password_stamp(v_user));
        RETURN NULL;
    END IF;
    PERFORM set_config('det.web_user', v_user, true);
    RETURN v_user;
END $$;
GRANT EXECUTE ON FUNCTION det_web.auth(text) TO det_web;

CREATE FUNCTION det_web.logout(p_token text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- End a login: its token is good no more.
    DELETE FROM web_sessions WHERE token_hash = sha256(convert_to(p_token, 'UTF8'));
$$;
-- a request logs out after det serve took its user's role: ending a login takes its token
GRANT EXECUTE ON FUNCTION det_web.logout(text) TO det_web, det_user;

CREATE FUNCTION det_web.login_begin(p_user text, p_address text) RETURNS double precision
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve, before it has PostgreSQL check a password for POST /api/v1/auth/login (so a
-- throttled attempt costs no SCRAM work): the seconds the client must wait (429, Retry-After),
-- or 0 to go on. The rule: 5 failures for one user name p_user (from any address),
-- or 20 from one client address p_address (for any names), each within 15 minutes of the
-- last, lock further attempts for 30 s, doubling with each failure after (at most an hour);
-- a right password is refused too until the lock ends. Going on counts the attempt as failed
-- until det_web.login records its success, so parallel guesses cannot all pass before the
-- first failure is counted; a refused attempt counts nothing and is audited. The counters are
-- rows of login_throttle, shared by every det serve process and locked in one order (the
-- user's, then the address's).
DECLARE
    v_address text := coalesce(p_address, 'unknown');
    v_until timestamptz;
BEGIN
    DELETE FROM login_throttle WHERE forget_at <= now();
    INSERT INTO login_throttle AS t (kind, key, forget_at)
    VALUES ('user', p_user, now() + interval '15 minutes'),
           ('address', v_address, now() + interval '15 minutes')
    ON CONFLICT (kind, key) DO UPDATE SET forget_at = t.forget_at;
    SELECT max(locked_until) INTO v_until FROM login_throttle
     WHERE (kind, key) IN (('user', p_user), ('address', v_address));
    IF v_until > now() THEN
        INSERT INTO audit_log (actor, action, object_type, object_id, detail)
        VALUES (det_user.caller(), 'login', 'user', p_user,
                jsonb_build_object('outcome', 'throttled', 'address', v_address,
                                   'locked_until', v_until));
        RETURN extract(epoch FROM v_until - now());
    END IF;
    WITH counted AS (
        SELECT kind, key, failures + 1 AS failures,
               CASE kind WHEN 'user' THEN 5 ELSE 20 END AS lim
          FROM login_throttle
         WHERE (kind, key) IN (('user', p_user), ('address', v_address))
    ), locked AS (
        SELECT kind, key, failures,
               CASE WHEN failures >= lim
                    THEN now() + make_interval(secs => least(30 * 2 ^ (failures - lim), 3600))
               END AS until
          FROM counted
    )
    UPDATE login_throttle t
       SET failures = l.failures, locked_until = l.until,
           forget_at = coalesce(l.until, now()) + interval '15 minutes'
      FROM locked l
     WHERE t.kind = l.kind AND t.key = l.key;
    RETURN 0;
END $$;
GRANT EXECUTE ON FUNCTION det_web.login_begin(text, text) TO det_web;

CREATE FUNCTION det_web.login_failed(p_user text, p_address text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve: PostgreSQL refused the password (or the user) of an attempt det_web.login_begin let
-- through, already counted as failed there. Audited with the name tried and the client's
-- address, never the password.
    INSERT INTO audit_log (actor, action, object_type, object_id, detail)
    VALUES (det_user.caller(), 'login', 'user', p_user,
            jsonb_build_object('outcome', 'failure', 'address', coalesce(p_address, 'unknown')));
$$;
GRANT EXECUTE ON FUNCTION det_web.login_failed(text, text) TO det_web;

CREATE FUNCTION det_internal.web_event(p_topics text[]) RETURNS void LANGUAGE sql AS $$
-- Wake det serve's event streams with one NOTIFY on the web channel (det_internal.channel) whose
-- payload is the distinct topics, space-separated (det.db.channels: "experiments",
-- "experiment:<id>", "trial:<id>", "queue", "cluster"), or "*" (every stream) when there are
-- more than 200 of them. A hint only: the servers also look on their own every second.
-- Identical payloads in one transaction are delivered once (PostgreSQL folds them).
    SELECT pg_notify(det_internal.channel('web', ''), CASE WHEN count(*) > 200 THEN '*'
                                     ELSE string_agg(t, ' ' ORDER BY t) END)
      FROM (SELECT DISTINCT t FROM unnest(p_topics) t WHERE t IS NOT NULL) d
    HAVING count(*) > 0;
$$;

CREATE FUNCTION det_internal.web_event_throttled(p_topics text[]) RETURNS void
    LANGUAGE plpgsql AS $$
-- det_internal.web_event for the hot tables (metrics, task logs): at most one event per topic set
-- every 0.2 s (web_event_marks), so a busy trial costs a few NOTIFYs a second, not one per
-- batch. An event skipped here reaches the streams at the servers' next periodic look.
BEGIN
    INSERT INTO web_event_marks AS m (topic, sent_at)
    VALUES (array_to_string(p_topics, ' '), clock_timestamp())
    ON CONFLICT (topic) DO UPDATE SET sent_at = excluded.sent_at
     WHERE m.sent_at < excluded.sent_at - interval '0.2 seconds';
    IF FOUND THEN
        PERFORM det_internal.web_event(p_topics);
    END IF;
END $$;

CREATE FUNCTION det_internal.web_watched() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
-- Whether some det serve streams pages now: the condition of every det_web trigger.
BEGIN
    RETURN EXISTS (SELECT 1 FROM web_watchers WHERE until > now());
END $$;

CREATE FUNCTION det_web.watch(p_server text, p_seconds double precision) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve's listener ``p_server`` has open streams: send det_web events for the next
-- ``p_seconds`` seconds (0 ends its lease). Leases of servers gone for a minute are dropped.
    DELETE FROM web_watchers WHERE until < now() - interval '1 minute';
    INSERT INTO web_watchers AS w (server, until)
    VALUES (p_server, now() + make_interval(secs => p_seconds))
    ON CONFLICT (server) DO UPDATE SET until = excluded.until;
$$;
GRANT EXECUTE ON FUNCTION det_web.watch(text, double precision) TO det_web;

-- The triggers below fire once per statement (never per row: docs/architecture.md,
-- "The HTTP server") and send at most
-- one NOTIFY each, naming what changed in a way a page shows.
-- They fire only while a det serve streams pages (det_internal.web_watched): events no one reads
-- cost a trivial task ~1 ms of PostgreSQL time.

CREATE FUNCTION det_internal.web_on_experiments() RETURNS trigger LANGUAGE plpgsql AS $$
-- Experiments submitted, or changed state, progress or archived.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event('{experiments,queue}'::text[] || array_agg('experiment:' || n.id))
           FROM new_rows n;
    ELSE
        PERFORM det_internal.web_event('{experiments,queue}'::text[] || array_agg('experiment:' || n.id))
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE (o.state, o.progress, o.archived) IS DISTINCT FROM
                (n.state, n.progress, n.archived)
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER experiments_web_insert AFTER INSERT ON experiments
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_experiments();
CREATE TRIGGER experiments_web_update AFTER UPDATE ON experiments
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_experiments();

CREATE FUNCTION det_internal.web_on_trials() RETURNS trigger LANGUAGE plpgsql AS $$
-- Trials created, or changed state, restarts, batches, checkpoint or best validation.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event(array_agg('experiment:' || n.experiment_id)
                              || array_agg('trial:' || n.id))
           FROM new_rows n;
    ELSE
        PERFORM det_internal.web_event(array_agg('experiment:' || n.experiment_id)
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
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_trials();
CREATE TRIGGER trials_web_update AFTER UPDATE ON trials
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_trials();

CREATE FUNCTION det_internal.web_on_allocations() RETURNS trigger LANGUAGE plpgsql AS $$
-- Runs created or changed state: the queue (slots acquired), the cluster (slots held) and
-- their trials.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event('{queue,cluster}'::text[] || array_agg('experiment:' || t.experiment_id)
                              || array_agg('trial:' || t.id))
           FROM new_rows n LEFT JOIN trials t ON t.id = n.trial_id;
    ELSE
        PERFORM det_internal.web_event('{queue,cluster}'::text[] || array_agg('experiment:' || t.experiment_id)
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
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_allocations();
CREATE TRIGGER allocations_web_update AFTER UPDATE ON allocations
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_allocations();

CREATE FUNCTION det_internal.web_on_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
-- A job's priority, weight, position or pool changed (det_user.job_update).
BEGIN
    PERFORM det_internal.web_event('{queue}')
       FROM new_rows n JOIN old_rows o ON o.id = n.id
      WHERE (o.priority, o.weight, o.queue_position, o.resource_pool) IS DISTINCT FROM
            (n.priority, n.weight, n.queue_position, n.resource_pool)
     HAVING count(*) > 0;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_web_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_jobs();

CREATE FUNCTION det_internal.web_on_cluster() RETURNS trigger LANGUAGE plpgsql AS $$
-- Agents joined or changed state (enabled, disabled, lost); slots enabled or disabled.
-- Heartbeats (last_heartbeat) send nothing.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event('{cluster,queue}');
    ELSIF TG_TABLE_NAME = 'agents' THEN
        PERFORM det_internal.web_event('{cluster,queue}')
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE o.state IS DISTINCT FROM n.state
         HAVING count(*) > 0;
    ELSE
        PERFORM det_internal.web_event('{cluster,queue}')
           FROM new_rows n JOIN old_rows o ON (o.agent_id, o.slot_id) = (n.agent_id, n.slot_id)
          WHERE o.enabled IS DISTINCT FROM n.enabled
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER agents_web_insert AFTER INSERT ON agents
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_cluster();
CREATE TRIGGER agents_web_update AFTER UPDATE ON agents
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_cluster();
CREATE TRIGGER slots_web_update AFTER UPDATE ON slots
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_cluster();

CREATE FUNCTION det_internal.web_on_reports() RETURNS trigger LANGUAGE plpgsql AS $$
-- Metrics or log lines appended: one statement is one batch of a task's reports, and the
-- event per trial is throttled (det_internal.web_event_throttled).
BEGIN
    PERFORM det_internal.web_event_throttled(ARRAY['experiment:' || t.experiment_id,
        'trial:' || t.id])
       FROM trials t WHERE t.id IN (SELECT DISTINCT trial_id FROM new_rows);
    RETURN NULL;
END $$;

CREATE TRIGGER metrics_web_insert AFTER INSERT ON metrics
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_reports();
CREATE TRIGGER task_logs_web_insert AFTER INSERT ON task_logs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_reports();
