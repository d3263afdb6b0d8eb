-- Schemas: the functions of each actor in its own
--
-- public holds the tables and types; each function lives in the schema of the actor that calls
-- it (pgmq's layout): det_user (a user's actions, and the readers row-level security calls),
-- det_agent, det_task, det_web (det serve's logins), det_enroll (an enrollment token's one
-- call), det (what every actor asks: the schema's version) and det_internal (called only by
-- other functions, triggers and the schema's owner: the reconciler). A schema groups and names;
-- who may call a function is still its own GRANT EXECUTE, so USAGE is everyone's.

CREATE SCHEMA det;
GRANT USAGE ON SCHEMA det TO PUBLIC;

CREATE SCHEMA det_user;
GRANT USAGE ON SCHEMA det_user TO PUBLIC;

CREATE SCHEMA det_agent;
GRANT USAGE ON SCHEMA det_agent TO PUBLIC;

CREATE SCHEMA det_task;
GRANT USAGE ON SCHEMA det_task TO PUBLIC;

CREATE SCHEMA det_web;
GRANT USAGE ON SCHEMA det_web TO PUBLIC;

CREATE SCHEMA det_enroll;
GRANT USAGE ON SCHEMA det_enroll TO PUBLIC;

CREATE SCHEMA det_internal;
GRANT USAGE ON SCHEMA det_internal TO PUBLIC;
