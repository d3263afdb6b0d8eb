"""``python -m det.harness.interactive {notebook,tensorboard,shell}`` (see the package
docstring). Exit codes: the server's own once it ran; 0 when stopped; 1 when the server could
not start or never answered; 2 when the task's environment is incomplete."""

import argparse
import os
import sys
from pathlib import Path

from det.agent.gang import host_address
from det.configs.task import TaskSpec
from det.errors import DetError, one_line
from det.harness.errors import TaskEnvironmentError
from det.harness.interactive.common import (
    Server,
    ServerError,
    TaskTransport,
    free_port,
    say,
    serve,
    start_timeout,
    task_spec,
)
from det.harness.interactive.notebook import notebook_server
from det.harness.interactive.shell import login_user, prepare, shell_server, sshd_path
from det.harness.interactive.tensorboard import event_dirs, tensorboard_server

KINDS = ("notebook", "tensorboard", "shell")


def build(kind: str, spec: TaskSpec, transport: TaskTransport, env: dict[str, str]) -> Server:
    """The server of a ``kind`` task, its files written, on a free port of this host.

    Raises:
        ServerError: what it needs is missing (``work_dir``, sshd, event files it can read).
    """
    host = host_address()
    port = free_port(host)
    task_dir = Path.cwd()
    if kind == "tensorboard":
        dirs, skipped = event_dirs(transport.tensorboard_sources())
        for line in skipped:
            say(line)
        return tensorboard_server(sys.executable, host, port, spec.job_id, dirs, env)
    secrets = transport.secrets()
    if kind == "notebook":
        root = Path(spec.work_dir) if spec.work_dir else task_dir
        if not root.is_dir():
            raise ServerError(f"work_dir {root}: no such directory in the task")
        # Jupyter's runtime files (one holds the token) stay with the task, not in $HOME.
        env.setdefault("JUPYTER_RUNTIME_DIR", str(task_dir / ".det-jupyter"))
        return notebook_server(sys.executable, host, port, secrets.get("jupyter_token") or "",
                               spec.job_id, root, spec.notebook_idle_type, env)
    user = login_user()
    sshd = sshd_path(env)
    config = prepare(task_dir / ".det-shell", secrets.get("ssh_public_key") or "", host, port,
                     user, env)
    return shell_server(sshd, config, host, port, user, env)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m det.harness.interactive")
    parser.add_argument("kind", choices=KINDS)
    kind = parser.parse_args(argv).kind
    env = dict(os.environ)
    try:
        spec = task_spec(env)
        timeout = start_timeout(env)
        transport = TaskTransport.from_env(env)
    except TaskEnvironmentError as e:
        say(str(e))
        return 2
    try:
        return serve(build(kind, spec, transport, env), transport, timeout)
    except (ServerError, DetError) as e:
        say(f"{kind} failed: {one_line(str(e))}")
        return 1
    finally:
        transport.close()


if __name__ == "__main__":
    sys.exit(main())
