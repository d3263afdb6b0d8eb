"""The ``process`` runtime: a task as a child process of the agent, for hosts with no
container engine.

The task runs in its own directory (the unpacked context), in its own session so the whole
process group can be signalled, and dies with the agent (:mod:`det.agent.guard`), so no task
outlives the agent that watches it. It ends with its main process: whatever it left running
in its group is killed then (:meth:`ProcessTask.poll`).
"""

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from det.agent.guard import Guard, kill_marked
from det.agent.logs import LogShipper
from det.agent.output import OutputReader
from det.agent.pooler import TaskPooler, pooler_dir
from det.agent.runtime import DRAIN_SECONDS, Exit, Launch
from det.agent.shell import plain_words, runs_as_is
from det.agent.taskenv import TaskEnv, TaskEnvError, ensure_env
from det.agent.zygote import Zygote, ZygoteChild, python_command
from det.configs.allocation import INTERACTIVE_KINDS, AllocationSpec
from det.host_user import PRIVATE_UMASK

# A context's startup-hook.sh is sourced (so its exports reach the task; spec:
# run-training-code, Get Ready) by a shell that then becomes the task. Hooks of one task
# environment run one at a time (flock(1), util-linux): two pip installs into one
# site-packages at once can break each other's files.
_WITH_HOOK = ('if [ -n "$VIRTUAL_ENV" ]; then exec 9>"$VIRTUAL_ENV/det-hook.lock"; flock 9; fi\n'
              '. ./startup-hook.sh || exit $?\n'
              'flock -u 9 2>/dev/null; exec 9>&-\nexec "$@"')  # the task holds no lock
log = logging.getLogger(__name__)

_STOP_WAIT = 0.2  # seconds a task's end waits for its output's reader to let go of it


def cold_argv(argv: list[str], env: dict[str, str], workdir: Path) -> list[str]:
    """The command a cold task starts as: ``argv`` (an entrypoint's, see
    :func:`det.configs.entrypoint.entrypoint_argv`) run by a shell only where one is needed.

    With a ``startup-hook.sh`` in ``workdir``, a shell sources it and then execs the command.
    Otherwise a shell command of plain words, or a list, that exec() runs as a shell would
    (:func:`~det.agent.shell.runs_as_is`) starts as those words: no shell (a shell
    and its fork were ~1 ms of CPU a task). The rest is ``sh -c CMD`` as given, or a list
    ``exec``'d by a shell, which reports a missing command (exit 127) as it always has."""
    words = plain_words(argv)
    if (workdir / "startup-hook.sh").exists():
        return ["sh", "-c", _WITH_HOOK, "det-task", *(words or argv)]
    if words is not None:
        return words if runs_as_is(words, env, workdir) else argv
    if argv[:2] == ["sh", "-c"] or runs_as_is(argv, env, workdir):
        return argv
    return ["sh", "-c", 'exec "$@"', "det-task", *argv]


def spawn_cold(argv: list[str], env: dict[str, str], workdir: Path) -> subprocess.Popen:
    """Start ``argv`` as :func:`cold_argv` says, in ``workdir`` with exactly ``env``, in a
    new session, its output on pipes, its files private (``PRIVATE_UMASK``: det.host_user).
    The caller adds a :class:`~det.agent.guard.Guard`'s marker to ``env`` so that the task
    dies with the agent."""
    return subprocess.Popen(
        cold_argv(argv, env, workdir), cwd=workdir, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        umask=PRIVATE_UMASK)


class ProcessTask:
    """One running task: ``proc`` (a ``Popen`` from :func:`spawn_cold`, or a
    :class:`~det.agent.zygote.ZygoteChild`), the leader of its own session. Output lines go to
    the logs under ``allocation_id``, read by ``output``'s thread, which never blocks the
    agent (see :meth:`poll`). With ``marker`` (an environment entry, ``VAR=value``), the
    processes carrying it die with the task too, those that left its session included."""

    def __init__(self, allocation_id: int, proc: "subprocess.Popen | ZygoteChild",
                 output: OutputReader, marker: bytes | None = None) -> None:
        self.allocation_id = allocation_id
        self._marker = marker
        self._output = output
        self._killed = False
        self._exited_at: float | None = None
        self._left_behind = False
        self._proc = proc
        self._read = output.follow(allocation_id, [(proc.stdout, "stdout"),
                                                   (proc.stderr, "stderr")])

    @property
    def killed(self) -> bool:
        return self._killed

    def poll(self) -> Exit | None:
        """The task's end once it has ended, else None; never blocks for long.

        The task is over when its main process exits: what it left behind in its process
        group (a background child, one that ignored SIGTERM) or marked with ``marker`` is
        SIGKILLed at once, and its
        output is read for at most ``DRAIN_SECONDS`` more (a process that left the group may
        still hold it open). A task killed by signal N reports code -N."""
        code = self._proc.poll()
        if code is None:
            return None
        if self._exited_at is None:
            self._exited_at = time.monotonic()
            self._left_behind = self._signal(signal.SIGKILL)
            if self._marker is not None and kill_marked(self._marker):
                self._left_behind = True
        if not self._read.is_set():
            if time.monotonic() < self._exited_at + DRAIN_SECONDS:
                return None
            self._output.stop(self.allocation_id)
            self._read.wait(_STOP_WAIT)
        if self._left_behind:
            self._output.logs.add(self.allocation_id, "det", "the task's main process exited; "
                                  "the processes it left behind were killed")
        return Exit(code, exit_reason(code, self.killed))

    def kill(self) -> None:
        """SIGKILL the task's whole process group (see ``Task.kill``)."""
        self._killed = True
        if self._proc.poll() is None:
            self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> bool:
        """Signal the task's process group; False when no process is left in it."""
        try:
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def remove(self) -> None:
        """Nothing outlives the task's end (see :meth:`poll`) but its directory, which the
        agent removes."""


class ProcessRuntime:
    """Tasks as child processes of the agent, each in its context's Python environment over
    the agent's own (:mod:`det.agent.taskenv`, kept in ``envs_dir``): what a task installs
    goes there, never into det's. CUDA slots are handed over as ``CUDA_VISIBLE_DEVICES`` (by
    uuid), so a task sees only its devices.

    With ``warm`` (the default; ``det agent run --cold-start`` turns it off), a task that runs
    this interpreter on a script or module, with no startup hook and nothing installed in its
    environment, is forked by the agent's zygote (:mod:`det.agent.zygote`) with det's harness
    already imported; the others, and every task if the zygote fails, start cold. With
    ``pool_size`` > 0 (``det agent run``'s default) tasks whose ``DET_DB_URL`` is
    ``task_url`` connect through the PgBouncer of agent ``agent_id`` (:mod:`det.agent.pooler`;
    ``pool_size``: the sessions it expects at once)."""

    name = "process"
    python = sys.executable

    def __init__(self, logs: LogShipper, envs_dir: Path, warm: bool = True,
                 task_url: str | None = None, pool_size: int = 0, agent_id: str = "") -> None:
        self.output = OutputReader(logs)
        self.envs_dir = envs_dir
        self.zygote = Zygote() if warm else None
        self.guard = Guard()
        self._host_env = dict(os.environ)  # copied once: os.environ decodes every read
        self.pooler = None
        if pool_size > 0 and task_url is not None:
            # its guard token makes it die with the agent, as a task does
            self.pooler = TaskPooler(task_url, pooler_dir(task_url, agent_id), pool_size,
                                     {**self._host_env, **self.guard.env})

    def fetch(self, allocation_id: int, spec: AllocationSpec) -> None:
        return None  # a process needs nothing beyond the context

    def launch(self, launch: Launch) -> ProcessTask:
        """Start the task; raises :class:`~det.agent.taskenv.TaskEnvError` (also written to
        the task's logs) when its environment cannot be made."""
        self.guard.ensure()
        task_env = self._task_env(launch)
        env = task_env.environ({**self._host_env, **launch.env, **self.guard.env})
        # det's interpreter, as a trial class's command names it, is the environment's
        argv = ([task_env.python, *launch.argv[1:]] if launch.argv[:1] == [self.python]
                else launch.argv)
        if self.pooler is not None and env.get("DET_DB_URL") == self.pooler.task_url:
            env["DET_DB_URL"] = self.pooler.url()
        gpus = [s.device_uuid for s in launch.slots if s.type == "cuda" and s.device_uuid]
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        # An interactive task's servers start processes in sessions of their own (Jupyter's
        # kernels and terminals, sshd's connections), which a kill of its group misses: they
        # carry its token, by which they are found when it ends (a scan of /proc, ~ms, that
        # the many short tasks of other kinds do not pay).
        marker = (f"DET_ALLOCATION_TOKEN={env['DET_ALLOCATION_TOKEN']}".encode()
                  if launch.spec.kind in INTERACTIVE_KINDS else None)
        args = (None if self.zygote is None or not task_env.is_bare()
                else python_command(argv, env, launch.workdir, task_env.python))
        if args is not None:
            try:
                proc = self.zygote.spawn(args, env, launch.workdir, task_env)
                return ProcessTask(launch.allocation_id, proc, self.output, marker)
            except OSError as e:
                log.warning("allocation %s: starting cold: %s", launch.allocation_id, e)
        proc = spawn_cold(argv, env, launch.workdir)
        return ProcessTask(launch.allocation_id, proc, self.output, marker)

    def _task_env(self, launch: Launch) -> TaskEnv:
        """The environment of the task's context, made now if need be (said in its logs)."""
        context_id = launch.spec.context_id
        try:
            task_env = ensure_env(self.envs_dir, "none" if context_id is None
                                  else str(context_id))
        except TaskEnvError as e:
            self.output.logs.add(launch.allocation_id, "det", str(e))
            raise
        if task_env.created:
            self.output.logs.add(launch.allocation_id, "det",
                                 f"created the task environment {task_env.path}: what the "
                                 "task installs goes there, over det's packages")
        return task_env

    def adopt(self, agent_id: str, live: dict[int, Any]) -> dict[int, ProcessTask]:
        return {}  # processes die with the agent that started them (see det.agent.guard)


def exit_reason(code: int, killed: bool) -> str | None:
    """A reason a user can read for exit ``code``, beyond the code itself (None when the
    code says it all)."""
    if killed:
        return "killed on request"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return None
