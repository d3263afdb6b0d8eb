"""The process runtime's tasks die with their agent (det.agent.guard), and a cold task starts
as its own command where a shell would run the same (det.agent.process.cold_argv)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import processes, wait_for

from det.agent.guard import Guard
from det.agent.process import cold_argv, spawn_cold


@pytest.fixture
def sleepers():
    """Kills, after the test, whatever `sleep 47N` it left."""
    yield
    for n in range(470, 480):
        for pid in processes(["sleep", str(n)]):
            os.kill(pid, signal.SIGKILL)


AGENT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from det.agent.guard import Guard
    from det.agent.process import spawn_cold
    guard = Guard()
    guard.ensure()
    # a task whose main process waits, a child in its group, one that left its session
    spawn_cold(["sh", "-c", "sleep 471 & setsid sleep 472 & wait"],
               {**os.environ, **guard.env}, Path(sys.argv[1]))
    print("started", flush=True)
    time.sleep(600)
""")


def test_a_killed_agents_tasks_die_with_it(tmp_path, sleepers) -> None:
    """kill -9 of the agent: the guard kills its task, the task's child and the child that
    left the task's session (setsid); a process the agent did not start stays."""
    bystander = subprocess.Popen(["sleep", "473"])
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout.readline() == "started\n"
        wait_for(lambda: processes(["sleep", "471"]) and processes(["sleep", "472"]), 30,
                 "the task's processes to start")
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        wait_for(lambda: not processes(["sleep", "471"]) and not processes(["sleep", "472"]),
                 10, "the killed agent's task processes to die")
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        agent.kill()
        agent.wait()


def test_a_guard_killed_meanwhile_is_started_again_and_still_knows_the_tasks(
        tmp_path, sleepers) -> None:
    guard = Guard()
    guard.ensure()
    task = spawn_cold(["sleep", "474"], {**os.environ, **guard.env}, tmp_path)
    first = guard._proc
    first.kill()
    first.wait()
    guard.ensure()  # what the agent does before its next launch
    assert guard._proc is not first and guard._proc.poll() is None
    assert task.poll() is None
    guard.close()  # the agent's end
    assert task.wait(10) == -signal.SIGKILL


@pytest.mark.parametrize("command, expected", [
    ("true", ["true"]),
    ("echo hi there", ["echo", "hi", "there"]),
    ("exit 3", ["sh", "-c", "exit 3"]),  # a builtin: only a shell runs it
    ("cd /tmp", ["sh", "-c", "cd /tmp"]),
    ("no-such-command-x", ["sh", "-c", "no-such-command-x"]),  # the shell says "not found"
    ("echo a; echo b", ["sh", "-c", "echo a; echo b"]),  # shell syntax
    ("./noshebang.sh", ["sh", "-c", "./noshebang.sh"]),  # a script exec() cannot run
    ("./run.sh 1", ["./run.sh", "1"]),
])
def test_a_cold_task_starts_as_its_own_command_where_a_shell_would_run_the_same(
        tmp_path, command, expected) -> None:
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho run $1\n")
    (tmp_path / "noshebang.sh").write_text("echo no shebang\n")
    for script in ("run.sh", "noshebang.sh"):
        (tmp_path / script).chmod(0o755)
    env = {"PATH": "/usr/bin:/bin"}
    assert cold_argv(["sh", "-c", command], env, tmp_path) == expected
    proc = spawn_cold(["sh", "-c", command], env, tmp_path)
    out, _ = proc.communicate(timeout=30)
    shell = subprocess.run(["sh", "-c", command], cwd=tmp_path, env=env, capture_output=True)
    assert (proc.returncode, out) == (shell.returncode, shell.stdout)


def test_a_list_entrypoint_or_a_startup_hook_goes_through_a_shell(tmp_path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    assert cold_argv(["echo", "x"], env, tmp_path) == ["echo", "x"]
    missing = spawn_cold(["no-such-command-y", "x"], env, tmp_path)
    _, err = missing.communicate(timeout=30)
    assert missing.returncode == 127 and b"no-such-command-y" in err
    (tmp_path / "startup-hook.sh").write_text("export GREETING=hooked\n")
    assert cold_argv(["sh", "-c", "env"], env, tmp_path)[:2] == ["sh", "-c"]
    hooked = spawn_cold(["sh", "-c", "env"], env, tmp_path)
    out, _ = hooked.communicate(timeout=30)
    assert hooked.returncode == 0 and b"GREETING=hooked" in out
    (tmp_path / "startup-hook.sh").write_text("exit 4\n")
    failed = spawn_cold(["sh", "-c", "true"], env, tmp_path)
    failed.communicate(timeout=30)
    assert failed.returncode == 4
