"""A shell task's server: OpenSSH's ``sshd``, run by the task's own user.

The task's directory gets ``.det-shell/`` with a host key made for this task (``ssh-keygen``;
clients skip host key checks, as the key is new each time), ``authorized_keys`` holding the
task's public key (the private key stays in the database for users who may open the shell,
``det_user.task_ssh_key``) and ``sshd_config``. The login user is the process's own user, the only
one an unprivileged sshd can log in (root in det's image, whose sshd then needs its privilege
separation directory, made here).
"""

import os
import pwd
import shutil
import socket
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import psutil

from det.harness.interactive.common import Server, ServerError

SESSION_ENV = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "LANG",
               "DET_JOB_ID", "DET_ALLOCATION_TOKEN", "DET_AGENT_GUARD")
"""Variables of the task that its SSH sessions get too (sshd gives a session a fresh
environment): the same Python and det on ``PATH``, the task's GPUs, and the entries by which
the process runtime finds a task's processes to kill them with it (det.agent.process,
det.agent.guard): sshd's own session processes cannot be found so, as sshd writes its process
title over its environment, but killing what runs in a session ends the session."""

PRIVSEP_DIR = "/run/sshd"
"""Where sshd running as root chroots its unprivileged half (Debian's default)."""


def login_user() -> str:
    """The user SSH logs in as: this process's.

    Raises:
        ServerError: the uid has no passwd entry (sshd cannot log it in).
    """
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        raise ServerError(f"the task's user (uid {os.geteuid()}) has no passwd entry, so sshd "
                          f"cannot log it in; run the task as a user the image knows") from None


def sshd_path(env: Mapping[str, str]) -> str:
    """The absolute path of ``sshd`` (it re-executes itself by it).

    Raises:
        ServerError: not installed (Debian's ``openssh-server``).
    """
    found = shutil.which("sshd", path=f"{env.get('PATH', '')}:/usr/sbin:/sbin")
    if found is None:
        raise ServerError("sshd is not installed on this host or image: install Debian's "
                          "openssh-server (det's task image has it)")
    return os.path.abspath(found)


def sshd_config(host: str, port: int, files: Path, user: str, env: Mapping[str, str]) -> str:
    """sshd's configuration: ``user`` alone, by the key in ``files/authorized_keys``, on
    ``host:port``, with the host key in ``files``; no PAM, no password, no pid file, no checks
    of file modes (the task's files are its own); sessions get :data:`SESSION_ENV`."""
    lines = [f"ListenAddress {host}", f"Port {port}",
             f"HostKey {files / 'ssh_host_ed25519_key'}",
             f"AuthorizedKeysFile {files / 'authorized_keys'}", f"AllowUsers {user}",
             "PubkeyAuthentication yes", "PasswordAuthentication no",
             "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
             "UsePAM no", "StrictModes no", "PidFile none", "PrintMotd no",
             "X11Forwarding no", "Subsystem sftp internal-sftp"]
    pairs = [f'"{k}={env[k]}"' for k in SESSION_ENV if env.get(k) and '"' not in env[k]]
    if pairs:
        lines.append("SetEnv " + " ".join(pairs))
    return "\n".join(lines) + "\n"


def prepare(files: Path, public_key: str, host: str, port: int, user: str,
            env: Mapping[str, str]) -> Path:
    """Write the host key, ``authorized_keys`` and the config into ``files``; return the
    config's path.

    Raises:
        ServerError: ssh-keygen failed, or there is no public key.
    """
    if not public_key.strip():
        raise ServerError("the task has no SSH public key (det_task.secrets)")
    files.mkdir(parents=True, exist_ok=True)
    key = files / "ssh_host_ed25519_key"
    for stale in (key, key.with_suffix(".pub")):
        stale.unlink(missing_ok=True)
    done = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "det-task",
                           "-f", str(key)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ServerError(f"ssh-keygen could not make the host key: {done.stderr.strip()}")
    (files / "authorized_keys").write_text(public_key.strip() + "\n")
    config = files / "sshd_config"
    config.write_text(sshd_config(host, port, files, user, env))
    if os.geteuid() == 0:
        os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
    return config


def answers(host: str, port: int) -> bool:
    """Whether an SSH server answers at ``host:port`` (its banner starts ``SSH-``)."""
    try:
        with socket.create_connection((host, port), timeout=2.0) as s:
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def open_sessions(pid: int) -> int:
    """SSH connections sshd ``pid`` serves: one child process each."""
    try:
        return len(psutil.Process(pid).children())
    except psutil.NoSuchProcess:
        return 0


def shell_server(sshd: str, config: Path, host: str, port: int, user: str,
                 env: dict[str, str]) -> Server:
    """sshd in the foreground (``-D``) logging to stderr (``-e``), at ``user@host:port``; an
    open SSH session is use now."""
    server = Server("sshd", [sshd, "-D", "-e", "-f", str(config)], env,
                    f"{user}@{host}:{port}", lambda: answers(host, port))

    def activity() -> datetime | None:
        pid = server.pid
        return datetime.now(UTC) if pid is not None and open_sessions(pid) > 0 else None

    server.activity = activity
    return server
