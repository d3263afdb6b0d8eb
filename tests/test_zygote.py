"""Warm task start (``det.agent.zygote``): which tasks start warm, and that a forked task is
its own process: environment, directory, arguments, output, exit code, database connection,
and death with the zygote that forked it.

The zygote tests fork real processes from a real zygote; the end-to-end test runs a Core API
search through a real reconciler and a ``--warm-start`` agent on a real database.
"""

import importlib
import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import wait_for
from psycopg.rows import dict_row

from det.agent.process import spawn_cold
from det.agent.shell import plain_words
from det.agent.zygote import Zygote, _own_modules, python_command

PYTHON = Path(sys.executable)
HERE_PATH = str(PYTHON.parent)


@pytest.mark.parametrize("argv, hook, expected", [
    ([str(PYTHON), "train.py", "--lr", "0.1"], False, ["train.py", "--lr", "0.1"]),
    (["sh", "-c", f"{PYTHON.name} -m pkg.mod a b"], False, ["-m", "pkg.mod", "a", "b"]),
    (["sh", "-c", f"{PYTHON.name} train.py > out.txt"], False, None),  # shell syntax
    (["sh", "-c", f"X=1 {PYTHON.name} train.py"], False, None),  # an assignment is syntax too
    ([str(PYTHON), "-u", "train.py"], False, None),  # interpreter options: start cold
    ([str(PYTHON), "-m"], False, None),
    ([str(PYTHON)], False, None),
    (["bash", "train.sh"], False, None),  # not Python
    ([str(PYTHON), "train.py"], True, None),  # a startup hook runs in a shell first
])
def test_which_tasks_start_warm(tmp_path, argv, hook, expected) -> None:
    if hook:
        (tmp_path / "startup-hook.sh").write_text("export A=1\n")
    env = {"PATH": f"{HERE_PATH}:/usr/bin:/bin"}
    assert python_command(argv, env, tmp_path) == expected


@pytest.mark.parametrize("command, words", [
    ("true", ["true"]),
    ("python3 train.py --lr 0.1", ["python3", "train.py", "--lr", "0.1"]),
    ("exit 3", ["exit", "3"]),  # a builtin: the wrapper, a shell, runs it as sh -c would
    ("echo $HOME", None), ("a && b", None), ("X=1 run", None), ("ls *.py", None),
    ("if true", None), ("! false", None),  # reserved words are syntax
])
def test_plain_shell_commands_run_without_a_shell_of_their_own(command, words) -> None:
    assert plain_words(["sh", "-c", command]) == words


@pytest.mark.parametrize("command, code, out", [
    ("exit 3", 3, ""), ("echo hi there", 0, "hi there\n"), ("no-such-command-x", 127, ""),
])
def test_a_plain_cold_command_exits_and_prints_as_under_sh(tmp_path, command, code,
                                                           out) -> None:
    proc = spawn_cold(["sh", "-c", command], dict(os.environ), tmp_path)
    stdout, _ = proc.communicate(timeout=30)
    assert (proc.returncode, stdout.decode()) == (code, out)


def test_another_interpreter_starts_cold(tmp_path) -> None:
    other = tmp_path / "bin"
    other.mkdir()
    (other / "python3").symlink_to(PYTHON.resolve())  # same binary, another environment
    env = {"PATH": f"{other}:/usr/bin:/bin"}
    assert python_command(["python3", "train.py"], env, tmp_path) is None


@pytest.fixture
def zygote():
    z = Zygote()
    yield z
    z.close()


def run(zygote: Zygote, args: list[str], env: dict[str, str], cwd: Path,
        timeout: float = 30) -> tuple[int, str, str]:
    child = zygote.spawn(args, env, cwd)
    out, err = child.stdout.read().decode(), child.stderr.read().decode()
    codes: list[int] = []
    wait_for(lambda: codes.append(child.poll()) or codes[-1] is not None, timeout,
             "the task's exit code")
    return codes[-1], out, err


SCRIPT = """
import os, sys
print("env", os.environ.get("TASK_VAR"), "leak", os.environ.get("AGENT_ONLY"))
print("cwd", os.getcwd())
print("argv", sys.argv)
print("path0", sys.path[0])
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ["EXIT"]))
"""


def test_a_forked_task_has_its_own_environment_directory_and_exit_code(zygote,
                                                                          tmp_path) -> None:
    os.environ["AGENT_ONLY"] = "agent"  # the zygote's own environment must not reach tasks
    try:
        (tmp_path / "train.py").write_text(SCRIPT)
        env = {"PATH": os.environ["PATH"], "TASK_VAR": "one", "EXIT": "3"}
        code, out, err = run(zygote, ["train.py", "--x", "1"], env, tmp_path)
    finally:
        del os.environ["AGENT_ONLY"]
    assert code == 3
    assert out.splitlines() == ["env one leak None", f"cwd {tmp_path}",
                                "argv ['train.py', '--x', '1']", f"path0 {tmp_path}"]
    assert err == "to stderr\n"
    # Two tasks from the same zygote: each sees only its own environment.
    env2 = {**env, "TASK_VAR": "two", "EXIT": "0"}
    code, out, _ = run(zygote, ["train.py"], env2, tmp_path)
    assert code == 0 and out.startswith("env two leak None")


def test_a_module_an_exception_and_a_signal(zygote, tmp_path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "main.py").write_text("import sys\nprint('module', __name__, sys.argv)\n")
    (tmp_path / "boom.py").write_text("raise ValueError('boom')\n")
    (tmp_path / "die.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    env = {"PATH": os.environ["PATH"]}
    code, out, _ = run(zygote, ["-m", "pkg.main", "a"], env, tmp_path)
    # as `python -m` sets it: argv[0] is the module's file
    assert (code, out) == (0, f"module __main__ ['{pkg / 'main.py'}', 'a']\n")
    code, _, err = run(zygote, ["boom.py"], env, tmp_path)
    assert code == 1 and "ValueError: boom" in err
    code, _, _ = run(zygote, ["die.py"], env, tmp_path)
    assert code == -signal.SIGKILL


def test_a_task_s_own_modules_are_those_it_imported(tmp_path, monkeypatch) -> None:
    """What a forked task releases at its exit: the modules it imported, found from the end
    of ``sys.modules``, not the zygote's, also where it removed the zygote's last module or
    removed one of them and imported it again."""
    for name in ("zy_pre", "zy_last", "zy_own"):
        (tmp_path / f"{name}.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("zy_pre")
        importlib.import_module("zy_last")
        preloaded = frozenset(sys.modules), next(reversed(sys.modules))
        assert preloaded[1] == "zy_last"
        del sys.modules["zy_pre"]
        importlib.import_module("zy_pre")  # the zygote's, imported again: not the task's
        importlib.import_module("zy_own")
        assert _own_modules(preloaded) == ["zy_own"]
        del sys.modules["zy_last"]  # the end marker is gone: every name is checked
        assert _own_modules(preloaded) == ["zy_own"]
    finally:
        for name in ("zy_pre", "zy_last", "zy_own"):
            sys.modules.pop(name, None)


EXIT_SCRIPT = """
import atexit, sys, threading, time
import helper  # a module of the task's own: released at its exit like its globals
log = open("log.txt", "w")  # never closed: flushed as the interpreter's exit would
log.write("buffered")
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
helper.keep.append(open("helper.txt", "w"))
helper.keep[0].write("from a module")
sys.exit(sys.argv[1] if sys.argv[1:] else None)
"""


def test_a_forked_task_exits_as_its_interpreter_would(zygote, tmp_path) -> None:
    """The zygote's child skips the interpreter's teardown of the preloaded modules, but not
    what a task can see: joined threads, atexit, finalized globals (flushed files),
    SystemExit's status and message."""
    (tmp_path / "train.py").write_text(EXIT_SCRIPT)
    (tmp_path / "helper.py").write_text("keep = []\n")
    env = {"PATH": os.environ["PATH"]}
    code, out, err = run(zygote, ["train.py"], env, tmp_path)
    assert code == 0 and err == ""
    assert out.splitlines() == ["thread joined", "atexit ran"]
    assert (tmp_path / "log.txt").read_text() == "buffered"
    assert (tmp_path / "helper.txt").read_text() == "from a module"
    code, _, err = run(zygote, ["train.py", "no data"], env, tmp_path)
    assert (code, err) == (1, "no data\n")
    # an uncaught ^C: atexit still runs, then the task ends by SIGINT
    (tmp_path / "ctrl_c.py").write_text(
        "import atexit\natexit.register(lambda: print('atexit ran'))\nraise KeyboardInterrupt\n")
    code, out, err = run(zygote, ["ctrl_c.py"], env, tmp_path)
    assert (code, out) == (-signal.SIGINT, "atexit ran\n") and "KeyboardInterrupt" in err


def test_tasks_die_with_their_zygote_and_a_new_one_starts(zygote, tmp_path) -> None:
    (tmp_path / "sleep.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    env = {"PATH": os.environ["PATH"]}
    child = zygote.spawn(["sleep.py"], env, tmp_path)
    assert child.stdout.readline() == b"up\n"
    # `ps` shows the task's own command, not the zygote's
    assert b"sleep.py" in Path(f"/proc/{child.pid}/cmdline").read_bytes()
    os.kill(zygote._proc.pid, signal.SIGKILL)
    assert wait_for(child.poll, 30, "the task to read as killed") == -signal.SIGKILL
    wait_for(lambda: not Path(f"/proc/{child.pid}").exists()
             or "Z" in Path(f"/proc/{child.pid}/stat").read_text().split(")")[1][:3],
             30, "the task process to die with its zygote")
    (tmp_path / "ok.py").write_text("print('again')\n")
    assert run(zygote, ["ok.py"], env, tmp_path)[:2] == (0, "again\n")


TRAIN = """
import os
from det.harness import core

with core.init() as ctx:
    parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")
    print("allocation", os.environ["DET_ALLOCATION_ID"], "parent", b" ".join(parent).decode())
    opened = ctx.transport._session.run("opened", lambda conn: conn.execute(
        "SELECT extract(epoch FROM backend_start) FROM pg_stat_activity "
        "WHERE pid = pg_backend_pid()").fetchone()[0])
    print("connected", os.environ["DET_ALLOCATION_ID"], opened)
    step = 0
    for op in ctx.searcher.operations():
        while step < op.length:
            step += 1
            ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": 1 / step})
        ctx.train.report_validation_metrics(steps_completed=step, metrics={"loss": 1 / step})
        op.report_completed(1 / step)
"""


def test_a_warm_agent_runs_a_search_each_task_with_its_own_connection(det, conn,
                                                                      tmp_path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "train.py").write_text(TRAIN)
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("name: warm\nentrypoint: python3 train.py\nmax_restarts: 0\n"
                   "searcher: {name: random, metric: loss, max_trials: 4, "
                   "max_concurrent_trials: 2, max_length: {batches: 5}}\n"
                   "hyperparameters: {x: {type: double, minval: 0, maxval: 1}}\n")
    det("experiment", "create", str(cfg), str(ctx))
    det.start("reconciler", "reconcile", "--interval", "0.5")
    # Directly connected tasks: the check below reads each task's server process's start,
    # which a pooled warm process predates (tests/test_pooler.py checks pooled sessions).
    det.start("agent", "agent", "run", "--slots", "2", "--runtime", "process", "--warm-start",
              "--no-task-pooler")
    assert det("experiment", "wait", "1", check=False, timeout=180).returncode == 0, \
        det.log("agent")
    with conn.cursor(row_factory=dict_row) as cur:
        trials = cur.execute("SELECT state::text AS s, (SELECT count(*) FROM metrics m "
                             "WHERE m.trial_id = t.id) AS n FROM trials t").fetchall()
        lines = [r["line"] for r in cur.execute(
            "SELECT line FROM task_logs WHERE line LIKE 'allocation %%' "
            "OR line LIKE 'connected %%'").fetchall()]
        started_at = {r["id"]: float(r["t"]) for r in cur.execute(
            "SELECT id::text AS id, extract(epoch FROM started_at) AS t FROM allocations")}
    assert [t["s"] for t in trials] == ["COMPLETED"] * 4
    assert all(t["n"] == 6 for t in trials)  # 5 training rows and 1 validation row each
    started = [x for x in lines if x.startswith("allocation")]
    assert len(started) == 4
    assert len({x.split()[1] for x in started}) == 4  # each its own allocation
    assert all("det zygote" in x for x in started)  # forked, not started cold
    # Each task's connection was opened after the agent claimed its run (so after the fork):
    # the zygote holds no connection that its children could share.
    connected = [x.split() for x in lines if x.startswith("connected")]
    assert len(connected) == 4
    assert all(float(opened) > started_at[alloc] for _, alloc, opened in connected)
