-- Types

CREATE TYPE experiment_state AS ENUM (
    'ACTIVE', 'PAUSED',
    'STOPPING_COMPLETED', 'STOPPING_CANCELED', 'STOPPING_KILLED', 'STOPPING_ERROR',
    'COMPLETED', 'CANCELED', 'ERROR'
);
COMMENT ON TYPE experiment_state IS
    'Experiment lifecycle (spec: experiment-lifecycle). STOPPING_* wait for the trials to end.';

-- Trial lifecycle: the same states as an experiment's, with the same transition rules
-- (det_internal.check_transition). A trial's STOPPING_* waits for its live allocation to end.
CREATE TYPE trial_state AS ENUM (
    'ACTIVE', 'PAUSED',
    'STOPPING_COMPLETED', 'STOPPING_CANCELED', 'STOPPING_KILLED', 'STOPPING_ERROR',
    'COMPLETED', 'CANCELED', 'ERROR'
);

CREATE TYPE desired_state AS ENUM ('RUNNING', 'STOPPED', 'KILLED');
COMMENT ON TYPE desired_state IS
    'What the reconciler wants of an allocation: RUNNING; STOPPED = checkpoint and exit '
    '(preemption, pause, cancel); KILLED = terminate now.';

CREATE TYPE allocation_state AS ENUM (
    'PENDING', 'ASSIGNED', 'PULLING', 'STARTING', 'RUNNING', 'TERMINATING', 'TERMINATED'
);
COMMENT ON TYPE allocation_state IS
    'Observed state of one run of a task. Only moves forward (enum order); any state may jump '
    'to TERMINATED.';

-- An agent's state: ACTIVE takes new work; DISABLED (drained by `det agent disable`) finishes
-- its running work and takes none; LOST (heartbeat timed out) until it registers again.
CREATE TYPE agent_state AS ENUM ('ACTIVE', 'DISABLED', 'LOST');

-- An elastic agent's machine (det.reconciler.provision).
CREATE TYPE instance_state AS ENUM ('REQUESTED', 'STARTING', 'RUNNING', 'TERMINATING', 'GONE');
COMMENT ON TYPE instance_state IS
    'An elastic agent''s machine: REQUESTED (row written, not yet launched), STARTING '
    '(launched, its agent not yet registered), RUNNING (its agent registered), TERMINATING '
    '(asked to stop), GONE. Only moves forward (enum order; det_internal.instance_transition).';

CREATE TYPE early_exit_reason AS ENUM ('errored', 'invalid_hp', 'user_requested_stop');
COMMENT ON TYPE early_exit_reason IS
    'Why a trial ended early (Python: det.reasons.EarlyExitReason, kept equal by a test): '
    'errored (failed past its restarts), invalid_hp (its code rejected its hyperparameters), '
    'user_requested_stop (its code ended it on purpose).';
