-- The model registry's versions join checkpoint_pins, the one list of checkpoints that GC and
-- deletion never remove (0008 made the view, 0009 the versions; issue 16).

CREATE OR REPLACE VIEW checkpoint_pins AS
-- Checkpoints that are never deleted, whatever the GC policy or a user asks: the versions of
-- the model registry, and the checkpoints experiments warm-start from
-- (searcher.source_checkpoint_uuid, or the latest checkpoint of searcher.source_trial_id;
-- reference-facts §1.1, §5). It is the one home of "pinned".
SELECT checkpoint_uuid FROM model_versions
UNION
SELECT (e.config #>> '{searcher,source_checkpoint_uuid}')::uuid AS checkpoint_uuid
  FROM experiments e
 WHERE e.config #>> '{searcher,source_checkpoint_uuid}'
       ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
UNION
SELECT t.latest_checkpoint
  FROM experiments e
  JOIN trials t ON t.id = (e.config #>> '{searcher,source_trial_id}')::bigint
 WHERE t.latest_checkpoint IS NOT NULL;
