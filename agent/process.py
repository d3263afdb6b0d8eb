"""The ``process`` runtime: a task as a child process of the agent, for hosts with no
container engine.

The task runs in its own directory (the unpacked context), in its own session so the whole
process group can be signalled, and dies with the agent (see ``_WRAPPER``), so no task
outlives the agent that watches it. It ends with its main process: whatever it left running
in its group is killed then (:meth:`ProcessTask.poll`).
"""

import ctypes
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from det.agent.logs import LogShipper
from det.agent.output import OutputReader
from det.agent.runtime import DRAIN_SECONDS, Exit, Launch
from det.agent.shell import plain_words
from det.agent.zygote import Zygote, ZygoteChild, python_command
from det.configs.allocation import AllocationSpec

# The task's wrapper: runs the context's startup-hook.sh (sourced, so its exports reach the
# task; spec: run-training-code, Get Ready), then the entrypoint as its child, and returns its
# exit code. When the agent dies the kernel sends the wrapper SIGHUP (PR_SET_PDEATHSIG) and it
# SIGKILLs the task's whole process group, grandchildren included. SIGTERM (a graceful stop,
# sent to the group) is left to the task; the wrapper keeps waiting for it.
_WRAPPER = """trap 'kill -KILL 0' HUP
trap ':' TERM
if [ -f ./startup-hook.sh ]; then . ./startup-hook.sh || exit $?; fi
"$@" &
pid=$!
while :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || break; done
exit "$rc"
"""
log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_STOP_WAIT = 0.2  # seconds a task's end waits for its output's reader to let go of it


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGHUP)


@functools.cache
def _pdeathsig_prefix() -> list[str] | None:
    """``setpriv --pdeathsig HUP`` (util-linux >= 2.33) when this host has it, else None.

    It sets the wrapper's death signal before exec, as ``_die_with_parent`` does: without a
    ``preexec_fn`` Python spawns by vfork instead of copying the agent's memory with fork,
    about 0.4 ms instead of 11 ms a task here (bench/task_throughput.py)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    usage = subprocess.run([path, "--help"], capture_output=True, text=True).stdout
    return [path, "--pdeathsig", "HUP"] if "--pdeathsig" in usage else None


def spawn_cold(argv: list[str], env: dict[str, str], workdir: Path) -> subprocess.Popen:
    """Start ``argv`` through the wrapper (startup hook, death with the agent) in a new
    session, its output on pipes. A shell command of plain words runs as those words: the
    wrapper is already a shell, and a second one cost ~1 ms a task (issue 11)."""
    wrapper = ["sh", "-c", _WRAPPER, "det-task", *(plain_words(argv) or argv)]
    prefix = _pdeathsig_prefix()
    return subprocess.Popen(
        wrapper if prefix is None else [*prefix, *wrapper], cwd=workdir, env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, preexec_fn=_die_with_parent if prefix is None else None)


class ProcessTask:
    """One running task: ``proc`` (a ``Popen`` from :func:`spawn_cold`, or a
    :class:`~det.agent.zygote.ZygoteChild`), the leader of its own session. Output lines go to
    the logs under ``allocation_id``, read by ``output``'s thread, which never blocks the
    agent (see :meth:`poll`)."""

    def __init__(self, allocation_id: int, proc: "subprocess.Popen | ZygoteChild",
                 output: OutputReader) -> None:
        self.allocation_id = allocation_id
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
        group (a background child, one that ignored SIGTERM) is SIGKILLed at once, and its
        output is read for at most ``DRAIN_SECONDS`` more (a process that left the group may
        still hold it open). A task killed by signal N reports code -N."""
        code = self._proc.poll()
        if code is None:
            return None
        if self._exited_at is None:
            self._exited_at = time.monotonic()
            self._left_behind = self._signal(signal.SIGKILL)
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
    """Tasks as child processes of the agent, under the agent's own Python. CUDA slots are
    handed over as ``CUDA_VISIBLE_DEVICES`` (by uuid), so a task sees only its devices.

    With ``warm`` (the default; ``det agent run --cold-start`` turns it off), a task that runs
    this interpreter on a script or module is forked by the agent's zygote
    (:mod:`det.agent.zygote`) with det's harness already imported; the others, and every task
    if the zygote fails, start cold."""

    name = "process"
    python = sys.executable

    def __init__(self, logs: LogShipper, warm: bool = True) -> None:
        self.output = OutputReader(logs)
        self.zygote = Zygote() if warm else None

    def fetch(self, allocation_id: int, spec: AllocationSpec) -> None:
        return None  # a process needs nothing beyond the context

    def launch(self, launch: Launch) -> ProcessTask:
        env = {**os.environ, **launch.env}
        gpus = [s.device_uuid for s in launch.slots if s.type == "cuda" and s.device_uuid]
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        args = (None if self.zygote is None
                else python_command(launch.argv, env, launch.workdir))
        if args is not None:
            try:
                proc = self.zygote.spawn(args, env, launch.workdir)
                return ProcessTask(launch.allocation_id, proc, self.output)
            except OSError as e:
                log.warning("allocation %s: starting cold: %s", launch.allocation_id, e)
        proc = spawn_cold(launch.argv, env, launch.workdir)
        return ProcessTask(launch.allocation_id, proc, self.output)

    def adopt(self, agent_id: str, live: dict[int, Any]) -> dict[int, ProcessTask]:
        return {}  # processes die with the agent that started them (see _WRAPPER)


def exit_reason(code: int, killed: bool) -> str | None:
    """A reason a user can read for exit ``code``, beyond the code itself (None when the
    code says it all)."""
    if killed:
        return "killed on request"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return None
