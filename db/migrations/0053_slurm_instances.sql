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
