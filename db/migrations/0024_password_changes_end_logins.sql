-- Issue 32: sessions, passwords and login. A password change ends the user's det serve logins
-- and is audited, however it was made: each login token keeps a stamp of the password it was
-- minted under (det_password_stamp), and det_web_auth refuses it once the role's password
-- differs, so a user's own ALTER ROLE ... PASSWORD in psql (which PostgreSQL always allows,
-- and no trigger sees) ends them too. A minimum password policy (det_password_policy). Logins
-- are audited and throttled per user name and per client address (login_throttle), before
-- PostgreSQL is asked to check a password.
CREATE TABLE login_throttle (
    kind         text NOT NULL CHECK (kind IN ('user', 'address')),
    key          text NOT NULL,
    failures     integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    locked_until timestamptz,
    forget_at    timestamptz NOT NULL,
    PRIMARY KEY (kind, key)
);
COMMENT ON TABLE login_throttle IS
    'Failed logins to det serve per user name tried (kind user) and per client address (kind '
    'address), and until when further attempts are refused (det_login_begin: the rule). A row '
    'is forgotten at forget_at, 15 minutes after its last failure or the end of its lock.';
CREATE INDEX login_throttle_forget ON login_throttle (forget_at);

-- The logins made before this migration carry no stamp: they end (their users log in again).
DELETE FROM web_sessions;
ALTER TABLE web_sessions ADD COLUMN password_stamp bytea;
COMMENT ON COLUMN web_sessions.password_stamp IS
    'det_password_stamp of the user''s password when the token was minted: the token is good '
    'only while it is still the user''s password. NULL where det cannot read verifiers.';

CREATE FUNCTION det_password_stamp(p_user text) RETURNS bytea LANGUAGE plpgsql STABLE AS $$
-- A digest (SHA-256) of the verifier PostgreSQL keeps for role p_user's password
-- (pg_authid.rolpassword): it changes whenever the password does, however it was changed
-- (a role may always ALTER ROLE its own PASSWORD, and no trigger sees that). NULL when the
-- role has no password, or when the caller may not read pg_authid (a superuser's table;
-- det's SECURITY DEFINER functions call this as det's owner, which the embedded cluster's is:
-- an owner that is not a superuser leaves det blind to a change made outside det). Only
-- det's owner may call it.
BEGIN
    IF NOT has_table_privilege('pg_catalog.pg_authid', 'SELECT') THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT sha256(convert_to(a.rolpassword, 'UTF8'))
              FROM pg_catalog.pg_authid a WHERE a.rolname = p_user);
END $$;

CREATE FUNCTION det_password_policy(p_password_length integer, p_weak_ok boolean,
                                    p_action text) RETURNS void LANGUAGE plpgsql STABLE AS $$
-- The minimum password policy (issue 32): a new password has at least 8 characters, unless a
-- ClusterAdmin sets p_weak_ok (`--weak-ok`) for p_action ('set the password of user "bob"').
-- det sees a password only as its client-made SCRAM verifier (det_check_verifier), so the
-- client states its length in characters (det's CLI counts it); the cluster's own session,
-- which may ALTER ROLE any password anyway, may leave it unstated (NULL). Raises
-- invalid_parameter_value (too short, or unstated), insufficient_privilege (p_weak_ok by a
-- caller who is no ClusterAdmin).
BEGIN
    IF p_weak_ok THEN
        PERFORM det_require('admin_cluster', NULL, format('%s with --weak-ok', p_action));
        RETURN;
    END IF;
    IF p_password_length IS NULL AND NOT det_is_owner_session() THEN
        RAISE EXCEPTION 'password length: expected the new password''s length in characters '
                        '(det requires at least 8)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_password_length < 8 THEN
        RAISE EXCEPTION 'password: expected at least 8 characters, got %; a ClusterAdmin may '
                        'allow a shorter one with --weak-ok', p_password_length
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

DROP FUNCTION det_user_create(text, text, boolean);
DROP FUNCTION det_user_set_password(text, text);
CREATE FUNCTION det_user_create(p_username text, p_password_verifier text, p_admin boolean,
                                p_password_length integer DEFAULT NULL,
                                p_weak_ok boolean DEFAULT false)
RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user create` (ClusterAdmin): a det user is a new LOGIN role of the same name, member
-- of det_user (and of det_web, so det serve can act as it), Editor in Uncategorized, and
-- ClusterAdmin too if p_admin. p_password_verifier: see det_check_verifier; NULL leaves the
-- user unable to log in until a password is set. p_password_length, p_weak_ok: the password
-- policy (det_password_policy). Returns the user's id.
DECLARE
    v_problem text := det_name_problem(p_username, 63);
    v_id integer;
BEGIN
    PERFORM det_require('admin_cluster', NULL, format('create user %s', to_jsonb(p_username)));
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'username %: %', to_jsonb(p_username), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_check_verifier(p_password_verifier);
    IF p_password_verifier IS NOT NULL THEN
        PERFORM det_password_policy(p_password_length, p_weak_ok,
                                    format('create user %s', to_jsonb(p_username)));
    END IF;
    IF EXISTS (SELECT 1 FROM users WHERE username = p_username) THEN
        RAISE EXCEPTION 'username %: a user of that name exists', to_jsonb(p_username)
            USING ERRCODE = 'unique_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_username)
       OR p_username ~* '^pg_' OR lower(p_username) IN ('public', 'none', 'current_user',
                                                       'current_role', 'session_user') THEN
        RAISE EXCEPTION 'username %: the name of a PostgreSQL role of the server (not a det user)',
            to_jsonb(p_username) USING ERRCODE = 'unique_violation';
    END IF;
    EXECUTE format('CREATE ROLE %I LOGIN IN ROLE det_user PASSWORD %L', p_username,
                   p_password_verifier);
    EXECUTE format('GRANT %I TO det_web', p_username);
    INSERT INTO users (username, created_by) VALUES (p_username, det_caller())
    RETURNING id INTO v_id;
    INSERT INTO role_assignments (role, user_id, workspace_id) VALUES ('Editor', v_id, 1);
    IF p_admin THEN
        INSERT INTO role_assignments (role, user_id) VALUES ('ClusterAdmin', v_id);
    END IF;
    PERFORM det_audit('create', 'user', p_username,
                      jsonb_build_object('admin', p_admin, 'weak_ok', coalesce(p_weak_ok, false)));
    RETURN v_id;
END $$;

CREATE FUNCTION det_user_set_password(p_username text, p_password_verifier text,
                                      p_password_length integer DEFAULT NULL,
                                      p_weak_ok boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user change-password`: a user's own, or anyone's by a ClusterAdmin (issue 32: the CLI
-- asks a user who is no ClusterAdmin for the current password first). p_password_length,
-- p_weak_ok: the password policy (det_password_policy). Every det serve login of the user
-- ends (a token minted under the old password is refused), and the change is audited with how
-- many logins it ended.
DECLARE
    u users := det_user_find(p_username);
    v_ended integer;
BEGIN
    IF u.username <> det_caller() THEN
        PERFORM det_require('admin_cluster', NULL,
                            format('change the password of user %s', to_jsonb(p_username)));
    END IF;
    IF p_password_verifier IS NULL THEN
        RAISE EXCEPTION 'password: expected a SCRAM-SHA-256 verifier, got nothing'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_check_verifier(p_password_verifier);
    PERFORM det_password_policy(p_password_length, p_weak_ok,
                                format('change the password of user %s', to_jsonb(p_username)));
    EXECUTE format('ALTER ROLE %I PASSWORD %L', u.username, p_password_verifier);
    DELETE FROM web_sessions WHERE username = u.username;
    GET DIAGNOSTICS v_ended = ROW_COUNT;
    PERFORM det_audit('change_password', 'user', u.username,
                      jsonb_build_object('logins_ended', v_ended,
                                         'weak_ok', coalesce(p_weak_ok, false)));
END $$;


CREATE FUNCTION det_web_end_stale_logins(p_user text, p_stamp bytea) RETURNS integer
LANGUAGE plpgsql AS $$
-- End p_user's det serve logins made under another password than the one whose stamp is
-- p_stamp (det_password_stamp, read now); returns how many ended. det's own change-password
-- ends them all itself, so a login left to end here saw a password changed outside det (the
-- user's own ALTER ROLE ... PASSWORD in psql, or a superuser's): the first look after it
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

DROP FUNCTION det_web_login(text, text, double precision);
CREATE FUNCTION det_web_login(p_token text, p_user text, p_ttl_seconds double precision,
                              p_address text)
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Record a login token (minted by det serve once PostgreSQL accepted p_user's password) for
-- active user p_user, good for p_ttl_seconds; returns its expiry. The token keeps the stamp
-- of the password it was minted under (det_password_stamp): det_web_auth refuses it once the
-- password changes. The login is audited (outcome success, client address p_address) and
-- clears p_user's failed attempts (det_login_begin counted this one as failed until now).
-- Expired tokens are removed here, so the table stays as small as the live logins.
DECLARE
    v_expires timestamptz;
    v_stamp bytea := det_password_stamp(p_user);
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
    PERFORM det_web_end_stale_logins(p_user, v_stamp);
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

CREATE OR REPLACE FUNCTION det_web_auth(p_token text) RETURNS text LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The active user a live login token belongs to, or an error (SQLSTATE 28000). It becomes the
-- transaction's caller (det_caller reads det.web_user); det serve then SETs LOCAL ROLE to it,
-- so row-level security applies to the request as to that user's own psql. NULL, with the
-- user's logins ended (det_web_end_stale_logins), when the token's password is no longer the
-- user's: det serve commits that and answers 401.
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
    IF v_stamp IS DISTINCT FROM det_password_stamp(v_user) THEN
        PERFORM det_web_end_stale_logins(v_user, det_password_stamp(v_user));
        RETURN NULL;
    END IF;
    PERFORM set_config('det.web_user', v_user, true);
    RETURN v_user;
END $$;

CREATE FUNCTION det_login_begin(p_user text, p_address text) RETURNS double precision
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve, before it has PostgreSQL check a password for POST /api/v1/auth/login (so a
-- throttled attempt costs no SCRAM work): the seconds the client must wait (429, Retry-After),
-- or 0 to go on. The rule (issue 32): 5 failures for one user name p_user (from any address),
-- or 20 from one client address p_address (for any names), each within 15 minutes of the
-- last, lock further attempts for 30 s, doubling with each failure after (at most an hour);
-- a right password is refused too until the lock ends. Going on counts the attempt as failed
-- until det_web_login records its success, so parallel guesses cannot all pass before the
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
        VALUES (det_caller(), 'login', 'user', p_user,
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

CREATE FUNCTION det_login_failed(p_user text, p_address text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve: PostgreSQL refused the password (or the user) of an attempt det_login_begin let
-- through, already counted as failed there. Audited with the name tried and the client's
-- address, never the password.
    INSERT INTO audit_log (actor, action, object_type, object_id, detail)
    VALUES (det_caller(), 'login', 'user', p_user,
            jsonb_build_object('outcome', 'failure', 'address', coalesce(p_address, 'unknown')));
$$;

GRANT EXECUTE ON FUNCTION
    det_web_login(text, text, double precision, text), det_login_begin(text, text),
    det_login_failed(text, text)
TO det_web;
GRANT EXECUTE ON FUNCTION
    det_user_create(text, text, boolean, integer, boolean),
    det_user_set_password(text, text, integer, boolean)
TO det_user;
