ALTER TABLE allocations ADD COLUMN out_of_work boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN allocations.out_of_work IS
    'The task asked for its next searcher operation and was told there was none '
    '(det_current_op returned NULL). A clean exit then means the run finished its work, even '
    'if the searcher opened an op for the trial meanwhile (an adaptive ASHA promotion): the '
    'trial''s next run takes that op. Without it, a clean exit with an op open means the code '
    'ended its own training.';

CREATE OR REPLACE FUNCTION det_current_op(p_token text) RETURNS jsonb LANGUAGE plpgsql AS $$
-- The trial's oldest open searcher operation as {id, length}; {"wait": true} while the
-- searcher has not yet read the trial's events (its next op is not decided yet: ask again);
-- NULL when the searcher wants nothing more from it, which marks the allocation out_of_work
-- (the task then checkpoints and exits so its slots go back).
DECLARE
    a allocations := det_auth(p_token);
    v_op jsonb;
BEGIN
    SELECT jsonb_build_object('id', o.id, 'length', o.length) INTO v_op
      FROM searcher_ops o WHERE o.trial_id = a.trial_id AND NOT o.completed
     ORDER BY o.id LIMIT 1;
    IF v_op IS NOT NULL THEN
        RETURN v_op;
    END IF;
    IF EXISTS (SELECT 1 FROM searcher_events v JOIN trials t ON t.experiment_id = v.experiment_id
                WHERE t.id = a.trial_id AND v.trial_id = t.id AND NOT v.consumed) THEN
        RETURN jsonb_build_object('wait', true);
    END IF;
    UPDATE allocations SET out_of_work = true WHERE id = a.id;
    RETURN NULL;
END $$;
