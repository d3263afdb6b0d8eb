"""det: a deep-learning training platform whose control plane is PostgreSQL.

Sub-packages: ``det.db`` (connections, migrations, embedded server), ``det.configs``
(experiment config models), ``det.reconciler`` (the control loop), ``det.agent`` (per-host
daemon), ``det.harness`` (the library user code imports), ``det.cli`` (the ``det`` command).
"""

__version__ = "0.1.0"
