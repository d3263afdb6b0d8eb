"""A notebook task's server: JupyterLab behind det serve's proxy, and its use by idle type."""

import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from det.configs.task import NotebookIdleType
from det.harness.interactive.common import Server, http_get


def base_url(job_id: int) -> str:
    """Where det serve proxies the task (``/proxy/<job id>/``); Jupyter serves under it, so
    its pages' links and WebSockets go through the proxy."""
    return f"/proxy/{job_id}/"


def jupyter_argv(python: str, host: str, port: int, token: str, job_id: int,
                 root_dir: str) -> list[str]:
    """The JupyterLab command line.

    Behind det serve: ``base_url`` is the proxy's path; the proxy sends the token upstream
    (``Authorization: token ...``, which Jupyter also takes as its XSRF check, so that stays
    on); ``allow_origin`` ``*`` because the browser's Origin is det serve's, not this host's
    (det serve refuses WebSockets from other origins, and nothing else gets in without the
    token); ``trust_xheaders`` for the proxy's X-Forwarded-* headers;
    ``port_retries`` 0 because the port reported is the one asked for; ``--allow-root`` where
    the task runs as root (det's image). Started through :mod:`.jupyter` (2 s, not 5), with
    what a cluster without internet access cannot use turned off: the news feed and update
    check (the page's requests for them would wait on the network) and the language-server
    extension (no language server is installed)."""
    root = ["--allow-root"] if os.geteuid() == 0 else []
    return [python, "-m", "det.harness.interactive.jupyter", "--no-browser", f"--ip={host}",
            f"--port={port}", "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--ServerApp.jpserver_extensions={'jupyter_lsp': False}",
            "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
            f"--ServerApp.base_url={base_url(job_id)}", f"--ServerApp.root_dir={root_dir}",
            "--ServerApp.allow_origin=*", "--ServerApp.allow_remote_access=True",
            "--ServerApp.trust_xheaders=True", *root]


def _when(text: str | None) -> datetime | None:
    """A Jupyter timestamp (ISO 8601, ``Z`` for UTC), or None."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def notebook_activity(idle_type: NotebookIdleType, kernels: Sequence[Mapping[str, Any]],
                      terminals: Sequence[Mapping[str, Any]], now: datetime) -> datetime | None:
    """The latest sign of use of a notebook by ``idle_type`` (seed: notebook_idle_type), from
    Jupyter's ``/api/kernels`` and ``/api/terminals`` models, or None when nothing counts:

    - ``kernels_or_terminals``: any kernel or terminal open is use ``now``;
    - ``kernel_connections``: any kernel with a connection (a browser tab on it) is use now;
    - ``activity``: a busy kernel is use now; else the latest ``last_activity`` of a kernel
      (its last message) or terminal (its last I/O). Jupyter's ``/api/status`` last_activity
      is not used: it also counts API requests, which an open JupyterLab page makes every few
      seconds (det serve's proxy counts those as traffic anyway)."""
    if idle_type == "kernels_or_terminals":
        return now if kernels or terminals else None
    if idle_type == "kernel_connections":
        return now if any(k.get("connections", 0) > 0 for k in kernels) else None
    if any(k.get("execution_state") == "busy" for k in kernels):
        return now
    times = [t for m in [*kernels, *terminals] if (t := _when(m.get("last_activity")))]
    return max(times, default=None)


def notebook_server(python: str, host: str, port: int, token: str, job_id: int,
                    root_dir: Path, idle_type: NotebookIdleType,
                    env: dict[str, str]) -> Server:
    """JupyterLab for job ``job_id`` on ``host:port``, answering at ``/api/status`` with the
    token; its use read as :func:`notebook_activity` says."""
    api = f"http://{host}:{port}{base_url(job_id)}api"
    auth = {"Authorization": f"token {token}"}

    def answers() -> bool:
        return http_get(f"{api}/status", auth) is not None

    def activity() -> datetime | None:
        # no_track_activity: these reads are not use of the server
        kernels = http_get(f"{api}/kernels?no_track_activity=1", auth)
        terminals = http_get(f"{api}/terminals?no_track_activity=1", auth)
        if kernels is None:
            return None  # not answering now: nothing to say
        return notebook_activity(idle_type, kernels, terminals or [], datetime.now(UTC))

    return Server("JupyterLab", jupyter_argv(python, host, port, token, job_id, str(root_dir)),
                  env, f"{host}:{port}", answers, activity, cwd=str(root_dir))

