-- Issue 10: the core path survives faults and tells the truth.

CREATE FUNCTION det_stopped_state(p_state text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
-- The terminal state a STOPPING_* experiment or trial ends in (STOPPING_KILLED ends CANCELED);
-- any other state is returned as it is. The one home of this rule: the transition trigger,
-- the reconciler's finishing steps and reports all call it.
    SELECT CASE WHEN p_state LIKE 'STOPPING\_%'
                THEN replace(substr(p_state, 10), 'KILLED', 'CANCELED') ELSE p_state END;
$$;

CREATE OR REPLACE FUNCTION det_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
-- Experiments and trials: terminal states are final, and a STOPPING_* state only moves on to
-- its terminal state (det_stopped_state), or to a harsher STOPPING_* (a cancel may become a
-- kill). Allocations: the observed state only moves forward.
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
    IF old_s IN ('COMPLETED', 'CANCELED', 'ERROR')
       OR (old_s LIKE 'STOPPING_%' AND new_s IN ('ACTIVE', 'PAUSED'))
       OR (old_s = 'STOPPING_KILLED' AND new_s LIKE 'STOPPING_%')
       OR (old_s = 'STOPPING_CANCELED' AND new_s IN ('STOPPING_COMPLETED', 'COMPLETED'))
       OR (old_s LIKE 'STOPPING_%' AND new_s NOT LIKE 'STOPPING_%'
           AND new_s <> det_stopped_state(old_s)) THEN
        RAISE EXCEPTION '% %: illegal state change % -> %', TG_TABLE_NAME, OLD.id, old_s, new_s
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TYPE early_exit_reason AS ENUM ('errored', 'invalid_hp', 'user_requested_stop');
COMMENT ON TYPE early_exit_reason IS
    'Why a trial ended early (Python: det.reasons.EarlyExitReason, kept equal by a test): '
    'errored (failed past its restarts), invalid_hp (its code rejected its hyperparameters), '
    'user_requested_stop (its code ended it on purpose).';

CREATE OR REPLACE FUNCTION det_report_early_exit(p_token text, p_reason text) RETURNS void
LANGUAGE plpgsql AS $$
-- The trial ends itself, for one of the early_exit_reason labels.
DECLARE
    a allocations := det_auth(p_token);
    v_reason early_exit_reason;
BEGIN
    BEGIN
        v_reason := p_reason::early_exit_reason;
    EXCEPTION WHEN invalid_text_representation THEN
        RAISE EXCEPTION 'early exit reason must be one of %, not "%"',
            array_to_string(enum_range(NULL::early_exit_reason)::text[], ', '), p_reason
            USING ERRCODE = 'invalid_parameter_value';
    END;
    UPDATE trials SET closed = true, exit_reason = v_reason::text WHERE id = a.trial_id;
    UPDATE searcher_ops SET completed = true WHERE trial_id = a.trial_id AND NOT completed;
END $$;

-- Agent ids become NOTIFY channel names and log keys: bounded and plain (det.db.channels).
ALTER TABLE agents ADD CONSTRAINT agents_id_check
    CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$');

-- A weight of NaN or infinity starves every other job (or the job itself) forever.
ALTER TABLE jobs DROP CONSTRAINT jobs_weight_check,
    ADD CONSTRAINT jobs_weight_check CHECK (weight > 0 AND weight < 'Infinity');
