-- What an agent sends (det.agent), as det_agent: calls of the det_agent.* functions of
-- schema.sql, in the order of an agent's life (register, beat, claim, report, stop), and the
-- reset PgBouncer runs between two tasks' sessions on its task pooler.

-- name: register
-- The agent (re)registers its slots: id, hostname, pool, runtime, slots as JSON.
SELECT det_agent.register(%s, %s, %s, %s, %s)

-- name: live_here
-- Live allocations of this agent with the time of their last shipped log line, for adoption.
SELECT id, last_log FROM det_agent.live_allocations(%(agent)s)

-- name: beat
-- The agent's heartbeat: its state (LOST: register again) and the leader's agent timeout in
-- seconds (NULL before any reconciler ran a pass), from which the agent's lease follows.
SELECT det_agent.heartbeat(%s), det_agent.timeout()

-- name: assignments
-- An agent's work: the allocations it is the chief of, and those it holds slots of as another
-- node of a gang (node_state: its share's state once claimed, else NULL).
SELECT * FROM det_agent.assignments(%(agent)s)

-- name: claim_each
-- The tokens of the runs this agent holds alone, claimed in one statement; runs no longer to
-- start are left out.
SELECT allocation_id, token FROM det_agent.claim_each(%s, %s::bigint[])

-- name: claim
-- One run's token (the chief's agent of a gang), NULL when it is not to start.
SELECT det_agent.claim(%s, %s) AS token

-- name: claim_node
-- Another agent of a gang claims its share: its token, node rank, the gang's nodes and the
-- rendezvous; NULL until the chief's agent has recorded the rendezvous.
SELECT det_agent.claim_node(%s, %s) AS node

-- name: set_rendezvous
-- The chief's agent records where the gang's workers meet (host:port) before it starts its own.
SELECT det_agent.set_rendezvous(%s, %s, %s)

-- name: gang_agents
-- The agents holding slots of an allocation, in node order (the chief's first).
SELECT det_agent.gang_agents(%s) AS nodes

-- name: context_blob
-- A context a live allocation of this agent launches (NULL for any other).
SELECT det_agent.context(%(agent)s, %(id)s) AS data

-- name: tensorboard_sources
-- A TensorBoard task's sources, read with its token to mount them into its container.
SELECT experiment_id, trial_id, storage FROM det_task.tensorboard_sources(%s)

-- name: report
-- What the agent observed of one run it holds alone or is the chief of: agent, allocation,
-- state, exit code, reason.
SELECT det_agent.report(%s, %s, %s, %s, %s)

-- name: report_each
-- The runs this agent holds alone, all in one state, in one statement: exit codes and reasons
-- go with the allocations element by element.
SELECT det_agent.report_each(%s, %s::bigint[], %s, %s::integer[], %s::text[])

-- name: report_node
-- What an agent other than the chief's observed of its share of a gang run.
SELECT det_agent.report_node(%s, %s, %s, %s, %s)

-- name: mark_fenced
-- Runs this agent killed by self-fencing: no failure of their trials (see Agent._fence).
SELECT det_agent.mark_fenced(%s, %s::bigint[])

-- name: append_logs
-- A batch of one allocation's task output lines: streams, texts, ranks, the writer and the
-- lines' numbers (a line shipped again after a lost answer is skipped).
SELECT det_agent.append_logs(%s, %s, %s, %s::integer[], %s, %s::bigint[])

-- name: stop_runs
-- A planned stop (SIGTERM): the agent's runs checkpoint and exit, no reconciler needed.
SELECT det_agent.stop_runs(%s)

-- name: leave
-- Ended under its runs by another resource manager: drained, the runs left to fail.
SELECT det_agent.leave(%s)

-- name: retire
-- A one-shot agent whose run ended and was reported exits for good: gone from agent lists.
SELECT det_agent.retire(%s)

-- name: server_reset_query
-- What PgBouncer runs on a server process when a task's session ends: DISCARD ALL but for
-- DISCARD PLANS (det.agent.pooler.RESET_QUERY). One line: it is a value of PgBouncer's ini.
CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; DEALLOCATE ALL; UNLISTEN *; SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES
