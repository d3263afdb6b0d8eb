"""A task's own Python environment under the ``process`` runtime.

A container gives each task its own file system, so a startup hook's ``pip install`` stays in
the task's container. A process task shares the host with det: run with det's own interpreter,
its ``pip install`` would change det's environment, and every later task's. So each
process task runs in a virtual environment of its context: its own site-packages first, det's
packages after them (a ``.pth`` file, :data:`_DET_SITE`, adds det's site-packages directories
as ``site`` does, so det's own ``.pth`` files, its editable install's included, work too), its
``bin/`` first on ``PATH`` with ``pip`` scripts that run this environment's interpreter. A
package det already has can be installed again in it: pip leaves det's copy alone ("Not
uninstalling ... outside environment") and the task sees its own.

One environment per context (``contexts.id``, the unit the agent already unpacks once): a
startup hook may install what its context ships (``pip install ./pkg``, ``-r
requirements.txt``), so two contexts with the same hook can need different packages. Tasks
without a context share one (``none``). Environments are made once (~10 ms: no pip of their
own, see :func:`ensure_env`) and kept under the agent's work directory, beside the unpacked
contexts, for as long as those are.
"""

import fcntl
import os
import site
import sys
import sysconfig
import time
import venv
from dataclasses import dataclass
from pathlib import Path

from det.errors import DetError
from det.host_user import PRIVATE_UMASK

_READY = "det-env-ready"  # written last: an environment without it is half made
_DET_SITE = "_det_site.pth"
_PIP = '#!/bin/sh\nexec "{python}" -m pip "$@"\n'


class TaskEnvError(DetError):
    """A task's environment could not be made (the task cannot start)."""


@dataclass(frozen=True)
class TaskEnv:
    """A virtual environment at ``path``; ``created``: made by this call of
    :func:`ensure_env`, not found ready."""

    path: Path
    created: bool = False

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    @property
    def site_packages(self) -> Path:
        return Path(sysconfig.get_path("purelib", vars={"base": str(self.path),
                                                        "platbase": str(self.path)}))

    def is_bare(self) -> bool:
        """True while nothing is installed in it: a task then sees exactly det's packages."""
        try:
            return all(e.name == _DET_SITE for e in os.scandir(self.site_packages))
        except FileNotFoundError:
            return True

    def environ(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with this environment active, as its ``bin/activate`` would make it.

        Jupyter reads its extensions' settings and data under ``sys.prefix``, now this
        environment's: ``JUPYTER_CONFIG_PATH`` and ``JUPYTER_PATH`` (jupyter_core.paths) also
        name det's, or a notebook's JupyterLab would start without its terminals."""
        out = {k: v for k, v in env.items() if k != "PYTHONHOME"}
        out["VIRTUAL_ENV"] = str(self.path)
        out["PATH"] = _joined(str(self.path / "bin"), env.get("PATH"))
        out["JUPYTER_CONFIG_PATH"] = _joined(env.get("JUPYTER_CONFIG_PATH"),
                                             os.path.join(sys.prefix, "etc", "jupyter"))
        out["JUPYTER_PATH"] = _joined(env.get("JUPYTER_PATH"),
                                      os.path.join(sys.prefix, "share", "jupyter"))
        return out


def _joined(*paths: str | None) -> str:
    return os.pathsep.join(p for p in paths if p)


def ensure_env(root: Path, key: str) -> TaskEnv:
    """The environment ``root/key``, made first if it is not ready (under an exclusive lock on
    ``root/key.lock``, so agents sharing ``root`` make it once; one left half made by a crash
    is made again).

    It is made from det's base interpreter without pip of its own (``venv --without-pip``:
    ~10 ms where ensurepip takes seconds); its ``pip`` scripts run det's pip under its
    interpreter, which installs into it.

    Raises:
        TaskEnvError: ``root`` or the environment cannot be written, or det's base
            interpreter cannot make one (names the path and the cause).
    """
    path = root / key
    if (path / _READY).exists():
        return TaskEnv(path)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (path / _READY).exists():
                return TaskEnv(path)
            _make(path)
    except (OSError, RuntimeError) as e:
        raise TaskEnvError(f"task environment {path}: cannot create it: {e}") from e
    return TaskEnv(path, created=True)


def _make(path: Path) -> None:
    # clear: what a crash left half made is made again from scratch
    venv.EnvBuilder(symlinks=True, with_pip=False, clear=True).create(path)
    env = TaskEnv(path)
    # "import" lines of a .pth file are run by site: addsitedir also reads det's .pth files
    dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
    (env.site_packages / _DET_SITE).write_text(
        f"import site; list(map(site.addsitedir, {dirs!r}))\n")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for name in ("pip", "pip3", f"pip{version}"):
        script = path / "bin" / name
        script.write_text(_PIP.format(python=env.python))
        script.chmod(0o700)
    # venv makes its interpreter's files 0o755 whatever the umask: private, as det's are
    for entry in [path, *path.rglob("*")]:
        if not entry.is_symlink():
            entry.chmod(entry.stat().st_mode & ~PRIVATE_UMASK)
    (path / _READY).write_text(f"{time.time()}\n")
