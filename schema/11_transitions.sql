-- Transition rules

CREATE FUNCTION det_user.stopped_state(p_state text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
-- The terminal state a STOPPING_* experiment or trial ends in (STOPPING_KILLED ends CANCELED);
-- any other state is returned as it is. The one home of this rule: the transition trigger,
-- the reconciler's finishing steps and reports all call it.
    SELECT CASE WHEN p_state LIKE 'STOPPING\_%'
                THEN replace(substr(p_state, 10), 'KILLED', 'CANCELED') ELSE p_state END;
$$;
GRANT EXECUTE ON FUNCTION det_user.stopped_state(text) TO det_user;

CREATE FUNCTION det_internal.check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
-- Experiments and trials: terminal states are final (but an unmanaged one's, resumed), and a
-- STOPPING_* state only moves on to its terminal state (det_user.stopped_state), or to a harsher
-- STOPPING_* (a cancel may become a kill). Allocations: the observed state only moves forward.
DECLARE
    old_s text := OLD.state::text;
    new_s text := NEW.state::text;
BEGIN
    IF old_s = new_s THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'allocations' THEN
        IF NEW.state < OLD.state THEN
            RAISE EXCEPTION 'allocation %: illegal state change % -> %', OLD.id, old_s, new_s
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    -- A later start of an unmanaged script resumes its ended experiment and trial
    -- (det_user.unmanaged_start), as upstream reopens an unmanaged trial.
    IF old_s IN ('COMPLETED', 'CANCELED', 'ERROR') AND new_s = 'ACTIVE'
       AND EXISTS (SELECT 1 FROM experiments e
                    WHERE e.unmanaged AND e.id = CASE TG_TABLE_NAME
                        WHEN 'experiments' THEN OLD.id
                        ELSE (SELECT t.experiment_id FROM trials t WHERE t.id = OLD.id) END) THEN
        RETURN NEW;
    END IF;
    IF old_s IN ('COMPLETED', 'CANCELED', 'ERROR')
       OR (old_s LIKE 'STOPPING_%' AND new_s IN ('ACTIVE', 'PAUSED'))
       OR (old_s = 'STOPPING_KILLED' AND new_s LIKE 'STOPPING_%')
       OR (old_s = 'STOPPING_CANCELED' AND new_s IN ('STOPPING_COMPLETED', 'COMPLETED'))
       OR (old_s LIKE 'STOPPING_%' AND new_s NOT LIKE 'STOPPING_%'
           AND new_s <> det_user.stopped_state(old_s)) THEN
        RAISE EXCEPTION '% %: illegal state change % -> %', TG_TABLE_NAME, OLD.id, old_s, new_s
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER experiments_transition BEFORE UPDATE OF state ON experiments
    FOR EACH ROW EXECUTE FUNCTION det_internal.check_transition();
CREATE TRIGGER trials_transition BEFORE UPDATE OF state ON trials
    FOR EACH ROW EXECUTE FUNCTION det_internal.check_transition();
CREATE TRIGGER allocations_transition BEFORE UPDATE OF state ON allocations
    FOR EACH ROW EXECUTE FUNCTION det_internal.check_transition();

CREATE FUNCTION det_internal.instance_transition() RETURNS trigger LANGUAGE plpgsql AS $$
-- An instance's state only moves forward (instance_state's order): nothing comes back from
-- TERMINATING or GONE.
BEGIN
    IF NEW.state < OLD.state THEN
        RAISE EXCEPTION 'instance %: illegal state change % -> %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER instances_transition BEFORE UPDATE OF state ON instances
    FOR EACH ROW EXECUTE FUNCTION det_internal.instance_transition();
