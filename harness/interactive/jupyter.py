"""JupyterLab's entry point in a notebook task: ``python -m det.harness.interactive.jupyter
ARGS`` is ``jupyter lab ARGS`` that starts in about 2 s instead of 5 (the goal is a
notebook answering within 3 s of ``det notebook start``).

Nearly 3 s of JupyterLab's start (``python -X importtime``: 2.0 to 3.0 s of 4.7 s to import
``jupyterlab.labapp`` on this project's 2-core machine) is one optional module:
jsonschema's check of the ``iri`` string format imports ``rfc3987_syntax``, which builds a
Lark grammar at import. jupyter_events pulls it in (``jsonschema[format-nongpl]``) to
validate its event schemas, none of which uses that format. Marking the module absent makes
jsonschema skip that one check, as it does wherever the package is not installed.
"""

import sys

sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  (import now raises ImportError)

from jupyterlab.labapp import main  # noqa: E402  (after the module is marked absent)

if __name__ == "__main__":
    sys.argv[0] = "jupyter-lab"
    sys.exit(main())
