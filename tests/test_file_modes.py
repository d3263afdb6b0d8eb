"""What det and its tasks write on a host is their user's alone (issue 32): ``DET_HOME`` was
0755 and checkpoints, contexts and logs under it world-readable (umask 022). And det serve
and the agent say so when they run as root."""

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import Det, wait_for

from det import host_user
from det.agent.process import spawn_cold
from det.agent.zygote import Zygote
from det.db.embedded import running_url

TRAIN = """
from det.harness import core

print("training", flush=True)
with core.init() as ctx:
    for op in ctx.searcher.operations():
        ctx.train.report_validation_metrics(1, {"loss": 0.5})
        with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
            (path / "weights.bin").write_bytes(b"w" * 100)
            (path / "sub").mkdir()
            (path / "sub" / "note.txt").write_text("step 1")
        op.report_completed(0.5)
"""


def open_to_others(root: Path) -> list[str]:
    """Every file and directory below ``root`` that its group or others may read, write or
    enter, with its mode; sockets and links aside (their modes guard nothing)."""
    found = []
    for path in root.rglob("*"):
        st = path.lstat()
        if stat.S_ISSOCK(st.st_mode) or stat.S_ISLNK(st.st_mode):
            continue
        if st.st_mode & 0o077:
            found.append(f"{path.relative_to(root.parent)} {stat.filemode(st.st_mode)}")
    return found


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask of a login shell (the one issue 32 found det running under)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def local(tmp_path: Path, umask_022: None) -> Iterator[Det]:
    """A Det runner with a DET_HOME not made yet and no DET_DB_URL (det's embedded database)."""
    env = {k: v for k, v in os.environ.items() if k != "DET_DB_URL"}
    env.update(DET_HOME=str(tmp_path / "home"), DET_USER="tester", PYTHONUNBUFFERED="1")
    d = Det(env, tmp_path)
    yield d
    d("cluster", "down", check=False, timeout=120)


def test_det_home_and_what_a_task_writes_there_are_private(local: Det, tmp_path: Path) -> None:
    home = tmp_path / "home"
    local("cluster", "up", "--runtime", "process", "--slots", "1", "--web-port", "0")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "train.py").write_text(TRAIN)
    config = tmp_path / "exp.yaml"
    config.write_text("name: modes\nentrypoint: python3 train.py\n"
                      "searcher: {name: single, metric: loss, max_length: {batches: 1}}\n")
    local("experiment", "create", str(config), str(ctx))
    assert local("experiment", "wait", "1", timeout=180).returncode == 0
    assert "training" in local("trial", "logs", "1").stdout

    checkpoints = home / "checkpoints"
    assert [p.name for p in checkpoints.rglob("note.txt")] == ["note.txt"]
    assert any((home / "agent").rglob("train.py"))  # the context as the agent unpacked it
    assert (home / "run" / "agent.log").exists() and (home / "run" / "supervisor.log").exists()
    # As root, the server runs as pgserver's user (with root's group): it passes through home.
    assert stat.S_IMODE(home.stat().st_mode) == (0o710 if os.geteuid() == 0 else 0o700)
    assert open_to_others(home) == []
    # ... and still reaches its data directory: a checkpoint reopens its files.
    with psycopg.connect(running_url(home), autocommit=True) as owner:
        owner.execute("CHECKPOINT")
        assert owner.execute("SELECT count(*) FROM experiments").fetchone() == (1,)


def test_cold_and_forked_tasks_write_private_files(tmp_path: Path, umask_022: None) -> None:
    script = "import os; os.makedirs('out/sub'); open('out/sub/f', 'w').write('x')"
    env = {"PATH": os.environ["PATH"]}
    cold, forked = tmp_path / "cold", tmp_path / "forked"
    cold.mkdir(mode=0o700)
    forked.mkdir(mode=0o700)
    assert spawn_cold([sys.executable, "-c", script], env, cold).wait(30) == 0
    (forked / "train.py").write_text(script)
    zygote = Zygote()
    try:
        child = zygote.spawn(["train.py"], env, forked)
        codes: list[int | None] = []
        wait_for(lambda: codes.append(child.poll()) or codes[-1] is not None, 30,
                 "the forked task's exit")
        assert codes[-1] == 0
    finally:
        zygote.close()
    for workdir in (cold, forked):
        assert (workdir / "out" / "sub" / "f").read_text() == "x"
        assert stat.S_IMODE((workdir / "out").stat().st_mode) == 0o700
        assert open_to_others(workdir / "out") == []


def test_root_is_warned_about_once(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(host_user, "_warned", set())
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert host_user.warn_if_root("det agent", host_user.AGENT_AS_ROOT) is False
    assert capsys.readouterr().err == ""

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert host_user.warn_if_root("det agent", host_user.AGENT_AS_ROOT) is True
    assert host_user.warn_if_root("det agent", host_user.AGENT_AS_ROOT) is True
    assert host_user.warn_if_root("det serve", host_user.SERVE_AS_ROOT) is True
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1].strip() for line in err] == ["det agent runs as root",
                                                          "det serve runs as root"]
    assert "every file of this host" in err[0] and "every file of this host" in err[1]
