-- Issue 36: slurm pools. An elastic pool's instances may be Slurm jobs
-- (det.reconciler.slurm_provider), and an instance keeps what its provider says of it while
-- it waits (Slurm's state and reason).

ALTER TABLE instances DROP CONSTRAINT instances_provider_check;
ALTER TABLE instances ADD CONSTRAINT instances_provider_check
    CHECK (provider IN ('local', 'aws', 'slurm'));
ALTER TABLE instances ADD COLUMN provider_state text NOT NULL DEFAULT '';
COMMENT ON COLUMN instances.provider_state IS
    'What the provider says of it while it is not running (slurm: ''slurm job 12 PENDING '
    '(Resources)'', squeue''s state and reason); empty once it runs.';
COMMENT ON COLUMN instances.provider_id IS
    'The provider''s handle once launched (local: the agent process''s pid, slurm: the job '
    'id).';

CREATE FUNCTION det_agent_leave(p_agent text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent is being ended by another resource manager under its runs (an agent in a Slurm
-- job: scancel, time limit, node drain): marked stopping, so nothing new is placed on it, but
-- its runs are not a planned stop: they end as the failures they are (max_restarts).
BEGIN
    PERFORM det_agent_check_self(p_agent);
    UPDATE agents SET stopping = true WHERE id = p_agent;
END $$;
GRANT EXECUTE ON FUNCTION det_agent_leave(text) TO det_agent;
