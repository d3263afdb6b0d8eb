"""A wheel built from the tree holds all of det, and installed as a user installs it (a fresh
virtual environment, not editable) it runs the digits example to COMPLETED."""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import REPO

# Run from a checkout, not part of det (setup.py says the same).
NOT_SHIPPED = {"tests", "examples", "bench"}
# Files other than modules that det reads at run time (pyproject.toml, package-data).
DATA = ["schema.sql", "schema/*.sql", "agent/image/Dockerfile", "db/migrations/*.sql", "sql/*.sql",
        "api/static/*", "api/static/vendor/*"]  # the WebUI's files (det serve)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """det's wheel, built (as `pip wheel` does, without its dependencies) from a copy of the
    tree, so the build leaves nothing in the checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "det"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "--wheel-dir", str(tmp / "dist"), str(src)],
                   check=True, env=_without_repo(os.environ))
    [built] = (tmp / "dist").glob("det-*.whl")
    return built


def _without_repo(env: os._Environ | dict[str, str]) -> dict[str, str]:
    """``env`` without what would make a Python find det in the checkout or the shared venv."""
    return {k: v for k, v in env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def test_the_wheel_holds_every_module_and_data_file(wheel: Path) -> None:
    modules = set()
    for root, dirs, files in os.walk(REPO):
        here = Path(root).relative_to(REPO)
        # Not det: hidden folders (.git, .venv), build outputs, what is run from a checkout.
        dirs[:] = [d for d in dirs if not (d.startswith(".") or d in ("build", "__pycache__")
                                           or d.endswith(".egg-info")
                                           or (here == Path(".")
                                               and d in (*NOT_SHIPPED, "compat")))]
        modules |= {(here / f).as_posix() for f in files if f.endswith(".py")}
    modules.discard("setup.py")
    data = {p.relative_to(REPO).as_posix() for pattern in DATA for p in REPO.glob(pattern)
            if p.is_file()}
    assert "reconciler/schedulers/__init__.py" in modules and "db/migrations/0001_initial.sql" \
        in data
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    shipped = {n.removeprefix("det/") for n in names if n.startswith("det/")}
    assert shipped == modules | data
    # The top-level `determined` package (Determined's API, issue 13) from compat/determined.
    compat = {p.relative_to(REPO / "compat").as_posix()
              for p in (REPO / "compat" / "determined").rglob("*.py")}
    assert "determined/pytorch/__init__.py" in compat
    assert {n for n in names if n.startswith("determined/")} == compat


@pytest.fixture
def venv(wheel: Path, tmp_path: Path) -> Path:
    """A fresh virtual environment (no system site-packages) with the wheel and its torch
    extra installed, not editable. torch is pinned to the host's build (a CPU wheel on a local
    disk here) rather than the index's newest."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    torch = f"torch=={importlib.metadata.version('torch')}"
    # This pip installs into the new environment (--python); --no-compile saves half the time.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "--quiet", "--no-compile", f"{wheel}[torch]", torch],
                   check=True, env=_without_repo(os.environ), timeout=600)
    return venv


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    """Background processes a test starts; terminated (then killed) after it."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        p.terminate()
    for p in started:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_installed_wheel_runs_digits_to_completed(venv: Path, db_url: str, tmp_path: Path,
                                                  procs: list[subprocess.Popen]) -> None:
    env = {**_without_repo(os.environ), "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
           "DET_DB_URL": db_url, "DET_HOME": str(tmp_path / "home"), "DET_USER": "tester",
           "DET_AGENT_RUNTIME": "process", "PYTHONUNBUFFERED": "1"}
    python, det = str(venv / "bin" / "python"), str(venv / "bin" / "det")

    def run(*args: str, timeout: float = 120) -> str:
        r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=timeout)
        assert r.returncode == 0, f"{' '.join(args)} exited {r.returncode}:\n{r.stdout}{r.stderr}"
        return r.stdout

    where = run(python, "-c", "import sysconfig, det, det.reconciler.schedulers; "
                              "print(det.__file__); print(sysconfig.get_paths()['purelib'])")
    det_file, site_packages = map(Path, where.split())
    assert det_file.is_relative_to(site_packages) and site_packages.is_relative_to(venv), where
    determined = run(python, "-c", "import determined, determined.core, determined.pytorch, "
                                   "determined.launch.torch_distributed; "
                                   "print(determined.__file__)")
    assert Path(determined.strip()).is_relative_to(site_packages), determined

    cfg = yaml.safe_load((REPO / "examples" / "digits" / "const.yaml").read_text())
    cfg["searcher"]["max_length"] = {"batches": 20}
    cfg["min_validation_period"] = {"batches": 10}
    (tmp_path / "const.yaml").write_text(yaml.safe_dump(cfg))
    for name, args in (("reconciler", ["reconcile", "--interval", "0.5"]),
                       ("agent", ["agent", "run", "--slots", "1"])):
        log = open(tmp_path / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        procs.append(subprocess.Popen([det, *args], cwd=tmp_path, env=env, stdout=log,
                                      stderr=subprocess.STDOUT))
    run(det, "experiment", "create", "const.yaml", str(REPO / "examples" / "digits"))
    run(det, "experiment", "wait", "1", timeout=240)
    exp = json.loads(run(det, "experiment", "describe", "1", "--json"))
    assert exp["state"] == "COMPLETED", exp
    [trial] = exp["trials"]
    assert trial["state"] == "COMPLETED" and trial["steps_completed"] == 20
