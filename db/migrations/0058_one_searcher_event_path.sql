-- One searcher event path: the database records facts and the searcher (Python,
-- det.reconciler.searchers) decides what each means. det_complete_op records every op's
-- completion, also under adaptive ASHA's time_metric (the searcher ignores it there), and
-- every validation row of a searched trial is a validation_reported event naming the row,
-- which the searcher reads under time_metric as a result at the time metric's value (the
-- SQL read the experiment's config to decide both before).

ALTER TABLE searcher_events DROP CONSTRAINT searcher_events_kind_check,
    ADD CONSTRAINT searcher_events_kind_check CHECK (kind IN (
        'validation_completed', 'validation_reported', 'trial_exited', 'trial_exited_early'));

CREATE OR REPLACE FUNCTION det_complete_op(p_token text, p_op_id bigint, p_metric double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial trained to the op's length and validated: record the searcher metric and a
-- validation_completed event, which the searcher reads as it decides (under adaptive ASHA's
-- time_metric, as nothing: the trial's validation rows are its results). Completing an op
-- twice is a no-op.
DECLARE
    a allocations := det_auth(p_token);
    o searcher_ops;
BEGIN
    UPDATE searcher_ops SET completed = true, metric = p_metric, progress = length
     WHERE id = p_op_id AND trial_id = a.trial_id AND NOT completed
    RETURNING * INTO o;
    IF FOUND THEN
        INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
        SELECT t.experiment_id, t.id, 'validation_completed',
               jsonb_build_object('length', o.length, 'metric', p_metric)
        FROM trials t WHERE t.id = a.trial_id;
        PERFORM pg_notify(det_channel('reconciler', ''), 'searcher');
    END IF;
END $$;

DROP TRIGGER metrics_timed_validation ON metrics;
DROP FUNCTION det_timed_validation();

CREATE FUNCTION det_validation_reported() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A validation row of a trial of a searched experiment (not an unmanaged one: it has no
-- searcher) is a validation_reported event naming the row ({"metrics_id": id}): the pass
-- reads the row's values with the event rather than a copy, as consumed events are kept and
-- most searches read nothing of them.
BEGIN
    INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
    SELECT t.experiment_id, t.id, 'validation_reported', jsonb_build_object('metrics_id', NEW.id)
      FROM trials t JOIN experiments e ON e.id = t.experiment_id
     WHERE t.id = NEW.trial_id AND NOT e.unmanaged;
    IF FOUND THEN
        PERFORM pg_notify(det_channel('reconciler', ''), 'searcher');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER metrics_validation_reported AFTER INSERT ON metrics
    FOR EACH ROW WHEN (NEW."group" = 'validation') EXECUTE FUNCTION det_validation_reported();

REVOKE ALL ON FUNCTION det_validation_reported() FROM PUBLIC;
