"""``determined.common``: the parts of 0.38.1's ``determined.common`` that user code touches.

``yaml`` is ``ruamel.yaml`` as upstream exports it; ``util`` holds the YAML helpers and small
utilities scripts call; ``storage`` builds a checkpoint storage manager from a
``checkpoint_storage`` section (det's own storage underneath); ``api`` has the master-address
helpers, the API errors and the state enums of ``api.bindings`` that scripts compare against.
Upstream's REST session, CLI plumbing and ``detignore`` are det's own business and not here.
"""

from ruamel import yaml

from determined.common import api, storage, util

__all__ = ["api", "storage", "util", "yaml"]
