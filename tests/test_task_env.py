"""A process task's own Python environment (det.agent.taskenv, issue 38): what a startup hook
or a trial installs with pip goes into its context's virtual environment over det's packages,
never into det's; it is made once per context; a task of another context does not see it; a
task whose environment cannot be made ends with the reason in its logs.

The end-to-end test runs a real reconciler and a real process agent on a real database, and
real pip installs of small local projects (no network: ``--no-index``)."""

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import wait_for

from det.agent.taskenv import TaskEnvError, ensure_env

DET_SITE = [Path(p) for p in __import__("site").getsitepackages()]


def project(root: Path, name: str, version: str, module: str) -> Path:
    """A pip-installable project ``name`` at ``root/name`` whose one module is ``module``."""
    src = root / name
    src.mkdir(parents=True)
    (src / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{name}"
        version = "{version}"
        """))
    (src / f"{module}.py").write_text(f"__version__ = {version!r}\n")
    return src


def det_packages() -> dict[Path, list[str]]:
    return {d: sorted(os.listdir(d)) for d in DET_SITE}


def det_imports(module: str) -> str:
    """What det's interpreter gets for ``import module``: its version, or the error."""
    r = subprocess.run([sys.executable, "-c", f"import {module}; print({module}.__version__)"],
                       capture_output=True, text=True)
    return r.stdout.strip() or r.stderr.strip().splitlines()[-1]


def test_an_environment_is_made_once_under_a_lock_and_again_when_half_made(tmp_path) -> None:
    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(lambda _: ensure_env(tmp_path, "7"), range(4)))
    assert sorted(e.created for e in made) == [False, False, False, True]
    env = made[0]
    assert env.is_bare()
    r = subprocess.run([env.python, "-c", "import sys, det; print(sys.prefix)"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == str(env.path)  # det's packages seen from inside
    (env.path / "det-env-ready").unlink()  # as a crash while making it leaves it
    again = ensure_env(tmp_path, "7")
    assert again.created and (again.path / "det-env-ready").exists()


def test_an_environment_that_cannot_be_made_names_its_path(tmp_path) -> None:
    (tmp_path / "envs").write_text("not a directory\n")
    with pytest.raises(TaskEnvError, match=f"task environment {tmp_path}/envs/3: cannot "
                                           "create it: .*File exists"):
        ensure_env(tmp_path / "envs", "3")


HOOK = """\
echo "start $DET_ALLOCATION_ID" >> "$VIRTUAL_ENV/hooks.txt"
python3 -c 'import p1tiny' 2>/dev/null || \\
    pip install -q --no-index --no-build-isolation {tiny} {shadow}
echo "end $DET_ALLOCATION_ID" >> "$VIRTUAL_ENV/hooks.txt"
"""

TRAIN = """\
import sys
import p1tiny
import tabulate
from det.harness import core

print("env", sys.executable, p1tiny.__version__, tabulate.__version__)
with core.init() as ctx:
    for op in ctx.searcher.operations():
        ctx.train.report_validation_metrics(steps_completed=1, metrics={"loss": 1.0})
        op.report_completed(1.0)
"""

CHECK = """\
import importlib.util, os, subprocess, sys
print("sees p1tiny:", importlib.util.find_spec("p1tiny") is not None)
subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                "--no-build-isolation", {other!r}], check=True)
import p1other
parent = open(f"/proc/{{os.getppid()}}/cmdline", "rb").read().split(b"\\0")[0].decode()
print("installed", p1other.__file__, "parent", parent)
"""


def test_a_hook_and_a_trial_install_into_their_context_s_environment(det, conn,
                                                                       tmp_path) -> None:
    """The issue's check: a startup hook installs a small package (and one det has too, at
    another version) and the trials import them; det's environment is unchanged after. The
    second trial of the context reuses its environment, its hook run after the first's; a
    warm-started command of another
    context does not see the package, and its own ``sys.executable -m pip install`` lands in
    its own environment. Injected: an environment that cannot be made."""
    src = tmp_path / "src"
    tiny = project(src, "p1tiny", "1.0", "p1tiny")
    det_tabulate = importlib.metadata.version("tabulate")
    shadow = project(src, "tabulate", "99.0", "tabulate")
    other = project(src, "p1other", "2.0", "p1other")
    before = det_packages()
    work = tmp_path / "agent"
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "2", "--runtime", "process",
              "--work-dir", str(work))

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "startup-hook.sh").write_text(HOOK.format(tiny=tiny, shadow=shadow))
    (ctx / "train.py").write_text(TRAIN)
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("name: hooked\nentrypoint: python3 train.py\nmax_restarts: 0\n"
                   "searcher: {name: grid, metric: loss, max_length: {batches: 1}, "
                   "max_concurrent_trials: 2}\n"
                   "hyperparameters: {x: {type: categorical, vals: [1, 2]}}\n")
    det("experiment", "create", str(cfg), str(ctx))
    assert det("experiment", "wait", "1", check=False, timeout=300).returncode == 0, \
        det.log("agent")
    context_id = conn.execute("SELECT context_id FROM experiments").fetchone()["context_id"]
    venv = work / "envs" / str(context_id)
    lines = [r["line"] for r in conn.execute("SELECT line FROM task_logs ORDER BY id")]
    ran = [x.split() for x in lines if x.startswith("env ")]
    assert [(Path(python).parent, *versions) for _, python, *versions in ran] == [
        (venv / "bin", "1.0", "99.0")] * 2
    assert sum("created the task environment" in x for x in lines) == 1  # the second reuses it
    # the two trials started together; their hooks ran one after the other
    hooks = [x.split() for x in (venv / "hooks.txt").read_text().splitlines()]
    assert [w for w, _ in hooks] == ["start", "end", "start", "end"], hooks
    assert hooks[0][1] == hooks[1][1] != hooks[2][1] == hooks[3][1]

    ctx_b = tmp_path / "ctx_b"
    ctx_b.mkdir()
    (ctx_b / "check.py").write_text(CHECK.format(other=str(other)))
    r = det("cmd", "run", "-c", str(ctx_b), "--", "python3", "check.py", timeout=300)
    out = r.stdout.splitlines()
    assert "sees p1tiny: False" in out, (r.stdout, r.stderr)
    installed = next(x.split(maxsplit=3) for x in out if x.startswith("installed"))
    assert Path(installed[1]).is_relative_to(work / "envs")
    assert not Path(installed[1]).is_relative_to(venv)
    assert installed[3].startswith("det zygote")  # forked warm, and still installed apart
    # a command's own `pip install` is its environment's pip, as the hook's was
    r = det("cmd", "run", "-c", str(ctx_b), "--", "sh", "-c",
            'command -v pip && python3 -c "import sys; print(sys.prefix)"', timeout=300)
    pip, prefix = map(Path, r.stdout.splitlines()[-2:])
    assert pip == prefix / "bin" / "pip" and prefix.parent == work / "envs", r.stdout

    assert det_packages() == before
    assert det_imports("tabulate") == det_tabulate
    assert "No module named 'p1tiny'" in det_imports("p1tiny")
    assert "No module named 'p1other'" in det_imports("p1other")

    (work / "envs" / "none").write_text("in the way\n")  # where a context-less task's goes
    r = det("cmd", "run", "--", "true", check=False, timeout=300)
    assert r.returncode != 0
    failed = conn.execute("SELECT id, exit_reason FROM allocations "
                          "ORDER BY job_id DESC LIMIT 1").fetchone()
    assert failed["exit_reason"].startswith(
        f"launch failed: task environment {work}/envs/none: cannot create it"), failed
    wait_for(lambda: conn.execute(
        "SELECT count(*) AS n FROM task_logs WHERE allocation_id = %s AND stream = 'det' "
        "AND line LIKE 'task environment %%: cannot create it: %%'",
        (failed["id"],)).fetchone()["n"] == 1, 30, "the reason in the task's logs")
