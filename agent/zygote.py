"""Warm task start for the ``process`` runtime: a per-agent zygote that forks each task.

A Python task started cold pays for its interpreter and its imports (det's harness, psycopg,
fsspec: about 0.2 s of CPU here) every time; a search of 200 short trials on a 2-core host
spends most of its time there (bench/toy_search.py). The agent instead starts one
*zygote* process that imports the harness once and then forks a child per task (the
forkserver pattern): each task is still its own process, with its own session, environment,
working directory, output pipes and exit code, and it opens its database connection after the
fork (the zygote never connects).

Which tasks: the ones whose command is this interpreter running a script or a module
(``python3 train.py ARGS``, ``python -m det.harness.run model_def:Trial``), with no
``startup-hook.sh`` in the context (a hook is a shell script: such tasks start cold, through
the usual wrapper) and nothing installed in the task's environment (:mod:`det.agent.taskenv`:
what it holds may shadow what the zygote imported). :func:`python_command` decides the first.

The protocol, over a ``SOCK_SEQPACKET`` socket pair (one message per packet):

* zygote -> agent ``{"ready": pid}`` once its imports are done;
* agent -> zygote ``{"id": n, "argv": [...], "env": {...}, "cwd": "..."}`` (and ``"venv":
  [prefix, python, site-packages]``: the task's environment) with the task's stdout and
  stderr write ends attached (SCM_RIGHTS);
* zygote -> agent ``{"id": n, "pid": pid}`` (or ``{"id": n, "error": "..."}``), then
  ``{"exited": pid, "code": code}`` when that child ends (negative: killed by that signal).

The zygote ends when the agent does (its end of the socket closes), killing its tasks' process
groups first; a task also gets SIGKILL if the zygote dies (``PR_SET_PDEATHSIG``).
"""

import atexit
import contextlib
import ctypes
import gc
import json
import os
import runpy
import selectors
import shlex
import shutil
import signal
import site
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import NoReturn

import setproctitle

from det.agent.shell import plain_words
from det.agent.taskenv import TaskEnv
from det.host_user import PRIVATE_UMASK


def _preload() -> None:
    """Import, before anything is forked, what every det task imports: the harness, and
    (where installed) the TensorBoard event encoding a task loads at its first metric
    report (protobuf, ~20 ms of CPU), fsspec's local filesystem (checkpoint storage), and
    pkgutil, which ``runpy.run_path`` imports at each call (~1 ms of a task's CPU)."""
    import pkgutil  # noqa: F401

    import fsspec.implementations.local  # noqa: F401

    import det.harness.core  # noqa: F401
    from det.harness.tensorboard import event_protos

    event_protos()

_PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # looked up once: in a task, ~0.3 ms of CPU
_READY_SECONDS = 60  # for the zygote's imports, on a host busy with other tasks
_MAX_MESSAGE = 1 << 20  # bytes: a task's argv and environment in one packet


def python_command(argv: list[str], env: Mapping[str, str], workdir: Path,
                   python: str = sys.executable) -> list[str] | None:
    """The interpreter arguments (``["train.py", ...]`` or ``["-m", "mod", ...]``) when
    ``argv`` runs this interpreter or ``python`` (a task environment's over it:
    :mod:`det.agent.taskenv`, which the forked task becomes) on a script or module and can
    start warm, else None.

    ``argv`` is as :func:`det.configs.entrypoint.entrypoint_argv` makes it: a shell command
    (``["sh", "-c", CMD]``) counts only when CMD is plain words, with no shell syntax. The
    interpreter is one of those when its name, looked up on the task's ``PATH``, is the same
    executable in the same directory (so the same virtual environment)."""
    if (workdir / "startup-hook.sh").exists():
        return None
    if argv[:2] == ["sh", "-c"]:
        words = plain_words(argv)
        if words is None:
            return None
        argv = words
    if len(argv) < 2 or not any(_is_this_python(argv[0], env.get("PATH"), p)
                                for p in {sys.executable, python}):
        return None
    rest = argv[1:]
    if rest[0] == "-m":
        return rest if len(rest) >= 2 else None
    return None if rest[0].startswith("-") else rest


def _is_this_python(name: str, path: str | None, python: str) -> bool:
    found = shutil.which(name, path=path)
    if found is None:
        return False
    here, there = Path(python), Path(found)
    try:
        return (there.resolve() == here.resolve()
                and there.parent.resolve() == here.parent.resolve())
    except OSError:
        return False


class ZygoteChild:
    """A task forked by the zygote, shaped like the part of ``subprocess.Popen`` that
    :class:`det.agent.process.ProcessTask` uses: ``pid``, ``stdout``, ``stderr``, ``poll()``."""

    def __init__(self, pid: int, stdout_fd: int, stderr_fd: int, zygote: "Zygote") -> None:
        self.pid = pid
        self.stdout = os.fdopen(stdout_fd, "rb", buffering=0)
        self.stderr = os.fdopen(stderr_fd, "rb", buffering=0)
        self._zygote = zygote
        self._code: int | None = None

    def poll(self) -> int | None:
        """The exit code once the task has ended (negative: the signal), else None."""
        if self._code is None:
            self._code = self._zygote.take_exit_code(self.pid)
        return self._code


class Zygote:
    """The agent's handle on its zygote process: started on the first :meth:`spawn`, started
    again after it died. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._next_id = 0
        self._waiting: dict[int, Future] = {}
        self._codes: dict[int, int] = {}
        self._children: set[int] = set()

    def spawn(self, args: list[str], env: Mapping[str, str], workdir: Path,
              task_env: TaskEnv | None = None) -> ZygoteChild:
        """Fork a task running ``python ARGS`` (see :func:`python_command`) in ``workdir``
        with exactly ``env``; with ``task_env`` (one with nothing installed yet), as that
        environment's interpreter: its ``sys.executable`` and ``sys.prefix``, and its
        site-packages first on ``sys.path``, so that what the task installs with
        ``sys.executable -m pip`` goes there and can be imported. Raises ``OSError`` when
        the zygote cannot be reached or the fork failed (the caller starts the task cold
        instead)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            with self._lock:
                sock = self._running()
                self._next_id += 1
                rid = self._next_id
                answer: Future = Future()
                self._waiting[rid] = answer
                request = {"id": rid, "argv": args, "env": dict(env), "cwd": str(workdir)}
                if task_env is not None:
                    request["venv"] = [str(task_env.path), task_env.python,
                                       str(task_env.site_packages)]
                message = json.dumps(request).encode()
                socket.send_fds(sock, [message], [out_w, err_w])
            reply = answer.result(timeout=30)
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        if "error" in reply:
            os.close(out_r)
            os.close(err_r)
            raise OSError(f"the zygote could not start the task: {reply['error']}")
        return ZygoteChild(reply["pid"], out_r, err_r, self)

    def take_exit_code(self, pid: int) -> int | None:
        """``pid``'s exit code once it has ended (given once), else None."""
        with self._lock:
            return self._codes.pop(pid, None)

    def close(self) -> None:
        """Stop the zygote (its tasks' process groups are killed) and wait for it."""
        with self._lock:
            proc, sock = self._proc, self._sock
            self._proc = self._sock = None
        if sock is not None:
            # shutdown, not only close: the reader thread is blocked in recv on this socket,
            # and a close alone would neither wake it nor let the zygote see the end.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if proc is not None:
            proc.wait()

    def _running(self) -> socket.socket:
        """The live zygote's socket, starting one first if there is none (lock held)."""
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "det.agent.zygote", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, start_new_session=True,
                umask=PRIVATE_UMASK)  # its tasks' files are private (det.host_user)
        finally:
            theirs.close()
        ours.settimeout(_READY_SECONDS)
        try:
            first = json.loads(ours.recv(_MAX_MESSAGE) or b"{}")
        except TimeoutError:
            first = {}
        ours.settimeout(None)
        if "ready" not in first:
            ours.close()
            proc.kill()
            proc.wait()
            raise OSError("the zygote exited before it was ready")
        self._proc, self._sock = proc, ours
        threading.Thread(target=self._read, args=(ours,), daemon=True, name="zygote").start()
        return ours

    def _read(self, sock: socket.socket) -> None:
        """Route the zygote's answers and exit codes until it is gone; then its tasks are
        gone too (they die with it): each reads as killed."""
        while True:
            try:
                data = sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            with self._lock:
                if "exited" in msg:
                    self._children.discard(msg["exited"])
                    self._codes[msg["exited"]] = msg["code"]
                    continue
                answer = self._waiting.pop(msg["id"])
                if "pid" in msg:
                    self._children.add(msg["pid"])
            answer.set_result(msg)
        with self._lock:
            for pid in self._children:
                self._codes.setdefault(pid, -signal.SIGKILL)
            self._children.clear()
            for answer in self._waiting.values():
                answer.set_exception(OSError("the zygote exited"))
            self._waiting.clear()
            if self._sock is sock:
                self._sock = None


# -- the zygote process ------------------------------------------------------------------------


def _serve(sock: socket.socket) -> dict:
    """The zygote's loop: fork a child per request and report its end. Returns (in the
    child only) the request the child is to run, with ``"preloaded"``: the names of the
    zygote's modules and the last of them in ``sys.modules``' order."""
    _preload()
    # Titles are set up while the environment is the process's own (the children's will
    # replace it): this one call makes room for theirs.
    setproctitle.setproctitle(f"det zygote of agent {os.getppid()}")
    # What the zygote holds is never freed by its children: keep the collector out of it, or
    # each child's collections (and its exit's) touch every page and copy it (~0.1 s a task).
    gc.freeze()
    preloaded = frozenset(sys.modules), next(reversed(sys.modules))
    children: set[int] = set()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sock.send(json.dumps({"ready": os.getpid()}).encode())
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                _reap(sock, children)
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 2)
            except OSError:
                data, fds = b"", []
            if not data:  # the agent is gone: so are its tasks
                for pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                os._exit(0)
            request = json.loads(data)
            try:
                pid = os.fork()
            except OSError as e:
                sock.send(json.dumps({"id": request["id"], "error": str(e)}).encode())
                for fd in fds:
                    os.close(fd)
                continue
            if pid == 0:
                sel.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_r, wake_w, sock.fileno()):
                    os.close(fd)
                return {**request, "fds": fds, "preloaded": preloaded}
            for fd in fds:
                os.close(fd)
            children.add(pid)
            sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())


def _reap(sock: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
                  .encode())


def _become(request: dict) -> list[str]:
    """Turn this forked child into the task (session, death signal, output, directory,
    environment, ``sys.argv``/``sys.path`` as ``python ARGS`` would set them); returns
    the interpreter arguments to run."""
    os.setsid()
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    out, err = request["fds"]
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the task's own streams, never closed
    sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8",  # noqa: SIM115
                      errors="backslashreplace")
    sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8",  # noqa: SIM115
                      errors="backslashreplace")
    if unbuffered:
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    args = request["argv"]
    # What `ps` shows, as a cold start would: the task's command, not the zygote's.
    setproctitle.setproctitle(shlex.join([Path(sys.executable).name, *args]))
    first = os.getcwd() if args[0] == "-m" else str(Path(args[0]).resolve().parent)
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
             if p and p not in sys.path]
    sys.path[:1] = [first, *extra]
    if "venv" in request:
        _enter_venv(*request["venv"])
    return args


def _enter_venv(prefix: str, python: str, site_packages: str) -> None:
    """Make this process the task environment's interpreter, as far as Python code can tell:
    ``sys.executable``, ``sys.prefix`` (so ``sysconfig``'s install paths) and its
    site-packages on ``sys.path`` before det's, where the venv's interpreter has them."""
    dets = site.getsitepackages()  # det's: read before sys.prefix changes
    at = next((i for i, p in enumerate(sys.path) if p in dets), len(sys.path))
    sys.path.insert(at, site_packages)
    sys.prefix = sys.exec_prefix = prefix
    sys.executable = python


def _run(args: list[str]) -> dict:
    """Run the task's script or module as ``__main__``; returns its globals."""
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        return runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    sys.argv = list(args)
    return runpy.run_path(args[0], run_name="__main__")


def _exit_code(exc: SystemExit) -> int:
    """The exit status the interpreter gives an uncaught ``SystemExit``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _own_modules(preloaded: tuple[frozenset[str], str]) -> list[str]:
    """The names of the modules the task imported: those after the zygote's last one in
    ``sys.modules`` (new entries go last), read from the end so that the zygote's ~430
    entries are not touched (a name read is a reference counted: its page would be copied),
    less any of the zygote's that the task removed and imported again."""
    names, last = preloaded
    own = []
    for name in reversed(sys.modules):
        if name == last:
            break
        if name not in names:
            own.append(name)
    return own


def _finish(code: int, preloaded: tuple[frozenset[str], str], namespace: dict) -> NoReturn:
    """End the task as its interpreter's exit would (its threads joined, ``atexit``
    functions run, its own modules and globals released so their objects' finalizers run and
    open files flush, standard streams flushed), then ``os._exit(code)``; a negative ``code``
    ends it by that signal instead (an uncaught ^C ends by SIGINT).

    What it skips is the interpreter's teardown of the zygote's modules: that decrements
    every object the zygote imported, writing to (and so copying) every page of its heap,
    ~27 ms of CPU a task for objects the task never created."""
    threading._shutdown()  # what the interpreter's exit does first: join non-daemon threads
    atexit._run_exitfuncs()
    for name in _own_modules(preloaded):
        del sys.modules[name]
    namespace.clear()
    gc.collect()  # the frozen zygote heap is out of its sight: only the task's own objects
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def main() -> None:
    """``python -m det.agent.zygote FD``: serve the agent on socket FD; in each forked child,
    run the task's script or module as ``__main__`` and exit with its status, as
    ``python ARGS`` would."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    request = _serve(sock)
    preloaded = request["preloaded"]
    args = _become(request)
    namespace: dict = {}
    try:
        namespace = _run(args)
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish(code, preloaded, namespace)


if __name__ == "__main__":
    main()
