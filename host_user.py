"""det's processes on their host: files private to their OS user, and a warning as root.

``DET_HOME`` was once 0755 and everything under it (checkpoints, contexts, TensorBoard
files, logs) world-readable, from the usual umask 022. det's long-running processes (``det
cluster up`` and its supervisor, the reconciler, the agent, ``det serve``) set
:data:`PRIVATE_UMASK` when they start (:func:`private_files`), and the agent starts its tasks
with it: what they create is 0700 (directories) and 0600 (files), readable by their own user
(and root) alone. docker containers run as root, or as the agent's user under rootless
docker, so they still read the contexts and write the checkpoints the agent's directories
hold.

Run as root, det serve and the agent reach every file of the host; :func:`warn_if_root` says
so once at their start (docs/architecture.md, "Running as root").
"""

import os
import sys

PRIVATE_UMASK = 0o077
"""What det's processes and tasks create is their user's alone: 0700 directories, 0600 files."""

_warned: set[str] = set()


def private_files() -> None:
    """Set this process's umask to :data:`PRIVATE_UMASK` (its children inherit it)."""
    os.umask(PRIVATE_UMASK)


def warn_if_root(process: str, reach: str) -> bool:
    """Print to stderr, once per ``process`` name, that ``process`` runs as root and
    what ``reach`` a task or user then has; True when it runs as root (effective uid 0)."""
    if os.geteuid() != 0:
        return False
    if process not in _warned:
        _warned.add(process)
        message = (f"warning: {process} runs as root: {reach}. Run it as an unprivileged "
                   "user (docs/architecture.md, \"Running as root\").")
        print(message, file=sys.stderr, flush=True)
    return True


AGENT_AS_ROOT = ("its process-runtime tasks run as root too, so user code reads and writes "
                 "every file of this host (det's password file and database among them); "
                 "docker-runtime tasks run in containers of a root docker daemon, with the "
                 "bind mounts their configs name")
"""What a task can reach when the agent runs as root."""

SERVE_AS_ROOT = ("every request is handled by a root process, so a flaw in reading an upload "
                 "or a checkpoint reaches every file of this host, and the checkpoints it "
                 "serves are read with root's rights")
"""What a user can reach when det serve runs as root."""
