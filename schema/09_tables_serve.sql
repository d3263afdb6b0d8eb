-- Tables: det serve, the HTTP server

CREATE TABLE web_sessions (
    token_hash bytea PRIMARY KEY,
    username   text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    CHECK (expires_at > created_at),
    password_stamp bytea
);
COMMENT ON TABLE web_sessions IS
    'Login tokens of det serve (POST /api/v1/auth/login), by SHA-256 hash: the token itself is '
    'never stored. A token is good until expires_at; expired rows are removed at each login.';
COMMENT ON COLUMN web_sessions.password_stamp IS
    'det_internal.password_stamp of the user''s password when the token was minted: the token is '
    'good only while it is still the user''s password. NULL where det cannot read verifiers.';

CREATE TABLE login_throttle (
    kind         text NOT NULL CHECK (kind IN ('user', 'address')),
    key          text NOT NULL,
    failures     integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    locked_until timestamptz,
    forget_at    timestamptz NOT NULL,
    PRIMARY KEY (kind, key)
);
COMMENT ON TABLE login_throttle IS
    'Failed logins to det serve per user name tried (kind user) and per client address (kind '
    'address), and until when further attempts are refused (det_web.login_begin: the rule). A row '
    'is forgotten at forget_at, 15 minutes after its last failure or the end of its lock.';
CREATE INDEX login_throttle_forget ON login_throttle (forget_at);

CREATE UNLOGGED TABLE web_event_marks (
    topic   text PRIMARY KEY,
    sent_at timestamptz NOT NULL
);
COMMENT ON TABLE web_event_marks IS
    'When a throttled det_web event (new metrics or logs of a trial) was last sent, so that a '
    'trial reporting many batches a second wakes the servers at most every 0.2 s (the rest '
    'is picked up by their periodic look). Unlogged: losing it in a crash costs one event.';

CREATE UNLOGGED TABLE web_watchers (
    server text PRIMARY KEY,
    until  timestamptz NOT NULL
);
COMMENT ON TABLE web_watchers IS
    'det serve processes with open event streams, each until its lease runs out (det_web.watch). '
    'The det_web triggers fire only while one lease is live. Unlogged: after a crash the '
    'servers take their leases again within a second.';
