-- The aws provider (det.reconciler.aws_provider): what it asks of the database for an EC2
-- instance it launches.

-- name: enrollment_token
-- A one-time enrollment token for the agent of one instance (det_user.agent_token_create, as
-- `det agent token create` makes one): the role named here, whose password's SCRAM verifier
-- is the first parameter, may enroll one agent in the pool given, until the interval ends.
SELECT role_name FROM det_user.agent_token_create(%s, %s, %s::interval)
