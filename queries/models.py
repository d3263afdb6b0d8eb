"""Reads of the model registry (reporting.models, reporting.model_versions), shared by
``det model`` and ``/api/v1/models``."""

MODELS = """
SELECT id, name, description, labels, metadata, notes, owner, archived, creation_time,
       last_updated_time, num_versions, latest_version
  FROM reporting.models WHERE %(all)s OR NOT archived ORDER BY id
"""

# The model a user named (by name or id); raises no_data_found.
FIND = "SELECT id FROM det_model_find(%(model)s)"

MODEL = """
SELECT id, name, description, labels, metadata, notes, owner, archived, creation_time,
       last_updated_time, num_versions, latest_version
  FROM reporting.models WHERE id = %(id)s
"""

VERSIONS = """
SELECT version, name, checkpoint_uuid::text AS checkpoint_uuid, checkpoint_state, trial_id,
       experiment_id, steps_completed, size_bytes, validation_metrics, labels, metadata, notes,
       owner, creation_time, last_updated_time
  FROM reporting.model_versions WHERE model_id = %(id)s
   AND (%(version)s::integer IS NULL OR version = %(version)s::integer)
 ORDER BY version
"""
