-- NOTIFY channels
--
-- PostgreSQL has no privilege on LISTEN or NOTIFY: any role may listen or notify on any
-- channel it can name. So det's channels have names no user or task can know: each is built
-- by det_internal.channel from a random cluster secret that only the schema's owner reads. det's
-- own processes LISTEN through functions that never hand the name to a caller outside det's
-- roles (det_internal.listen for the owner, det_web.listen, det_agent.listen, det_task.listen), and
-- the LISTEN runs inside the function, so the name never appears in a statement's text
-- (pg_stat_activity shows a session's last statement to every session of its role). NOTIFY
-- stays a hint: every listener also polls, and det serve reads what changed under the
-- request's user's row-level security.

CREATE TABLE channel_key (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- 32 bytes (244 random bits) of two v4 UUIDs: gen_random_uuid draws from the server's
    -- strong random source and needs no extension
    secret    bytea NOT NULL DEFAULT decode(replace(gen_random_uuid()::text
                                                    || gen_random_uuid()::text, '-', ''), 'hex')
);
COMMENT ON TABLE channel_key IS
    'The secret det_internal.channel builds NOTIFY channel names from (one row, made with the '
    'schema). Granted to no role: only the owner and its SECURITY DEFINER functions read it.';
INSERT INTO channel_key DEFAULT VALUES;

CREATE FUNCTION det_internal.channel(p_kind text, p_key text) RETURNS text LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The channel of kind ``p_kind`` ("reconciler", "web": p_key ''; "agent": the agent's id;
-- "alloc": the allocation's id) for this cluster: det_<kind>_<40 hex digits of
-- SHA-256(secret || kind:key)>, at most 55 bytes (a channel name is an identifier of 63).
-- The secret is of fixed length and a key is text (never a NUL byte), so no name derives from
-- another's (SHA-256's length extension appends padding with NUL bytes). Executable by the
-- owner alone (det.db.channels).
DECLARE
    v_secret bytea := (SELECT secret FROM channel_key);
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('reconciler', 'web', 'agent', 'alloc') THEN
        RAISE EXCEPTION 'det_internal.channel: kind must be reconciler, web, agent or alloc, got %',
            coalesce(p_kind, 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_key IS NULL THEN
        RAISE EXCEPTION 'det_internal.channel: key of a % channel must not be NULL', p_kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_secret IS NULL THEN
        RAISE EXCEPTION 'det_internal.channel: table channel_key has no secret (the schema made one)'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN 'det_' || p_kind || '_'
        || left(encode(sha256(v_secret || convert_to(p_kind || ':' || p_key, 'UTF8')), 'hex'), 40);
END $$;

CREATE FUNCTION det_internal.listen(p_kind text, p_key text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- This session LISTENs on det_internal.channel(p_kind, p_key) from its transaction's commit on (as
-- a LISTEN statement would). Executable by the owner alone: the reconciler's own channel.
BEGIN
    EXECUTE format('LISTEN %I', det_internal.channel(p_kind, p_key));
END $$;

CREATE FUNCTION det_web.listen() RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve's event listener (det_web) LISTENs on the web channel (det_internal.web_event).
    SELECT det_internal.listen('web', '');
$$;
-- each of det's roles LISTENs on its own NOTIFY channel, never learning another's
GRANT EXECUTE ON FUNCTION det_web.listen() TO det_web;

CREATE FUNCTION det_internal.agent_check_self(p_agent text) RETURNS void LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Every agent function that names an agent first calls this: a login enrolled as an agent
-- (agent_logins) acts only for its own agent id, and not at all once revoked. Sessions of
-- other roles (the shared det_agent login of the single-host mode, the owner) pass. Raises
-- insufficient_privilege naming both agents; invalid_authorization_specification (28000)
-- for a revoked login (a session that slipped in before det_user.agent_revoke committed).
DECLARE
    l agent_logins;
BEGIN
    SELECT * INTO l FROM agent_logins WHERE role_name = session_user;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF l.revoked_at IS NOT NULL THEN
        RAISE EXCEPTION 'agent %: its login % was revoked at %', l.agent_id, l.role_name,
            l.revoked_at USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF p_agent IS DISTINCT FROM l.agent_id THEN
        RAISE EXCEPTION 'agent %: login % acts only for agent %', coalesce(p_agent, 'NULL'),
            l.role_name, l.agent_id USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;


CREATE FUNCTION det_internal.agent_check_allocation(p_allocation bigint) RETURNS void
    LANGUAGE plpgsql
STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent function that names an allocation rather than an agent calls this: a login enrolled
-- as an agent (agent_logins) acts only for allocations it is the chief of or holds (or held:
-- logs are flushed after a run ends) slots of; otherwise det_internal.agent_check_self refuses it
-- as acting for the allocation's chief. Sessions of other roles pass.
DECLARE
    l agent_logins;
    v_chief text;
BEGIN
    SELECT * INTO l FROM agent_logins WHERE role_name = session_user;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT a.agent_id INTO v_chief FROM allocations a WHERE a.id = p_allocation;
    IF v_chief IS DISTINCT FROM l.agent_id
       AND NOT EXISTS (SELECT 1 FROM allocation_slots h
                        WHERE h.allocation_id = p_allocation AND h.agent_id = l.agent_id) THEN
        PERFORM det_internal.agent_check_self(v_chief);
    END IF;
    PERFORM det_internal.agent_check_self(l.agent_id);
END $$;


CREATE FUNCTION det_agent.listen(p_agent text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent (det_agent) LISTENs on its own channel: the reconciler wakes it there when its
-- assignments or their desired states change. An agent names itself, as in every function
-- of det_agent's.
SELECT det_internal.agent_check_self(p_agent);
    SELECT det_internal.listen('agent', p_agent);
$$;
-- each of det's roles LISTENs on its own NOTIFY channel, never learning another's
GRANT EXECUTE ON FUNCTION det_agent.listen(text) TO det_agent;

CREATE FUNCTION det_task.listen(p_token text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A task (det_task) LISTENs on its own allocation's channel, named by its token: woken there
-- when it should preempt (empty payload) or its trial's next searcher op is decided ("op").
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    PERFORM det_internal.listen('alloc', a.id::text);
END $$;
-- each of det's roles LISTENs on its own NOTIFY channel, never learning another's
GRANT EXECUTE ON FUNCTION det_task.listen(text) TO det_task;
