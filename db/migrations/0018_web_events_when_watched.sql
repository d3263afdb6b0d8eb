-- Issue 11: det serve's change events (NOTIFY det_web from statement triggers with transition
-- tables) cost ~1 ms of PostgreSQL time a trivial task, sent whether or not any page was
-- open. A det serve with open event streams now holds a lease (web_watchers, renewed every
-- second by its listener), and the triggers fire only while some lease is live. Events stay a
-- hint: a stream also reads on its own every second, so a page opened before its server's
-- first lease misses nothing.

CREATE UNLOGGED TABLE web_watchers (
    server text PRIMARY KEY,
    until  timestamptz NOT NULL
);
COMMENT ON TABLE web_watchers IS
    'det serve processes with open event streams, each until its lease runs out (det_web_watch). '
    'The det_web triggers fire only while one lease is live. Unlogged: after a crash the '
    'servers take their leases again within a second.';

CREATE FUNCTION det_web_watched() RETURNS boolean LANGUAGE sql STABLE AS $$
-- Whether some det serve streams pages now: the condition of every det_web trigger.
    SELECT EXISTS (SELECT 1 FROM web_watchers WHERE until > now());
$$;

CREATE FUNCTION det_web_watch(p_server text, p_seconds double precision) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve's listener ``p_server`` has open streams: send det_web events for the next
-- ``p_seconds`` seconds (0 ends its lease). Leases of servers gone for a minute are dropped.
    DELETE FROM web_watchers WHERE until < now() - interval '1 minute';
    INSERT INTO web_watchers AS w (server, until)
    VALUES (p_server, now() + make_interval(secs => p_seconds))
    ON CONFLICT (server) DO UPDATE SET until = excluded.until;
$$;

REVOKE EXECUTE ON FUNCTION det_web_watched(), det_web_watch(text, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION det_web_watch(text, double precision) TO det_web;

DROP TRIGGER experiments_web_insert ON experiments;
DROP TRIGGER experiments_web_update ON experiments;
DROP TRIGGER trials_web_insert ON trials;
DROP TRIGGER trials_web_update ON trials;
DROP TRIGGER allocations_web_insert ON allocations;
DROP TRIGGER allocations_web_update ON allocations;
DROP TRIGGER jobs_web_update ON jobs;
DROP TRIGGER agents_web_insert ON agents;
DROP TRIGGER agents_web_update ON agents;
DROP TRIGGER slots_web_update ON slots;
DROP TRIGGER metrics_web_insert ON metrics;
DROP TRIGGER task_logs_web_insert ON task_logs;

CREATE TRIGGER experiments_web_insert AFTER INSERT ON experiments
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_experiments();
CREATE TRIGGER experiments_web_update AFTER UPDATE ON experiments
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_experiments();
CREATE TRIGGER trials_web_insert AFTER INSERT ON trials
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_trials();
CREATE TRIGGER trials_web_update AFTER UPDATE ON trials
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_trials();
CREATE TRIGGER allocations_web_insert AFTER INSERT ON allocations
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_allocations();
CREATE TRIGGER allocations_web_update AFTER UPDATE ON allocations
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_allocations();
CREATE TRIGGER jobs_web_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_jobs();
CREATE TRIGGER agents_web_insert AFTER INSERT ON agents
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_cluster();
CREATE TRIGGER agents_web_update AFTER UPDATE ON agents
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_cluster();
CREATE TRIGGER slots_web_update AFTER UPDATE ON slots
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_cluster();
CREATE TRIGGER metrics_web_insert AFTER INSERT ON metrics
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_reports();
CREATE TRIGGER task_logs_web_insert AFTER INSERT ON task_logs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_web_watched()) EXECUTE FUNCTION det_web_on_reports();
