"""Issue 13: code and configs written for Determined 0.38 run on det unchanged.

The programs under ``examples/determined_compat/`` are written in the style of Determined's
documentation (Core API steps, a ``PyTorchTrial`` with the ``Trainer``); each runs here
off-cluster (``python3 script.py``) and on a det cluster to COMPLETED, unchanged.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "determined_compat"
CORE = EXAMPLES / "core_api"


def _python_first(env: dict[str, str]) -> dict[str, str]:
    """Tasks' ``python3`` (entrypoints are shell commands) is this interpreter."""
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}


def _off_cluster(script: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env["HOME"] = str(home)
    env.pop("XDG_DATA_HOME", None)
    return subprocess.run([sys.executable, str(script), *args], cwd=script.parent, env=env,
                          capture_output=True, text=True, timeout=300)


# --- off-cluster ---------------------------------------------------------------------------

@pytest.mark.parametrize("step", ["0_start", "1_metrics", "2_checkpoints", "3_hpsearch",
                                  "4_searcher_ops"])
def test_core_api_steps_run_off_cluster(step: str, tmp_path: Path) -> None:
    r = _off_cluster(CORE / f"{step}.py", tmp_path)
    assert r.returncode == 0, r.stderr


def test_off_cluster_core_context_logs_metrics_and_stores_checkpoints_locally(
        tmp_path: Path) -> None:
    """As Determined's dummy contexts: metrics logged, checkpoints under
    ~/.local/share/determined, one searcher op of length 1, no cluster info."""
    r = _off_cluster(CORE / "2_checkpoints.py", tmp_path)
    assert "report_validation_metrics(steps_completed=50, metrics={'total': 25.0})" in r.stderr
    stored = sorted((tmp_path / ".local/share/determined").iterdir())
    assert len(stored) == 5
    state = json.loads((stored[0] / "state.json").read_text())
    assert state["step"] in (10, 20, 30, 40, 50)
    assert json.loads((stored[0] / "metadata.json").read_text())["steps_completed"] == state["step"]
    r = _off_cluster(CORE / "4_searcher_ops.py", tmp_path)
    assert "report_validation_metrics(steps_completed=1, metrics={'total': 1})" in r.stderr


# --- on a det cluster ----------------------------------------------------------------------

def _run_on_cluster(det, conn, config: Path, context: Path, timeout: float = 240) -> int:
    det.env = _python_first(det.env)
    out = det("experiment", "create", str(config), str(context)).stdout
    exp = int(out.split()[-1])
    if not det.procs:
        det.start("reconciler", "reconcile", "--interval", "0.5")
        det.start("agent", "agent", "run", "--slots", "4")
    r = det("experiment", "wait", str(exp), check=False, timeout=timeout)
    logs = "".join(det("trial", "logs", str(t["id"])).stdout for t in conn.execute(
        "SELECT id FROM trials WHERE experiment_id = %s", (exp,)).fetchall())
    assert r.returncode == 0, r.stdout + r.stderr + logs
    return exp


def test_core_api_steps_complete_on_a_det_cluster(det, conn, tmp_path) -> None:
    """Steps 0-4, unchanged, each to COMPLETED; their metrics and checkpoints in the tables."""
    ctx = tmp_path / "core_api"
    shutil.copytree(CORE, ctx)
    for step in ("0_start", "1_metrics", "2_checkpoints", "3_hpsearch", "4_searcher_ops"):
        _run_on_cluster(det, conn, ctx / f"{step}.yaml", ctx)
    metrics = conn.execute(
        "SELECT t.experiment_id AS e, m.\"group\" AS g, count(*) AS n FROM metrics m "
        "JOIN trials t ON t.id = m.trial_id GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    assert {(r["e"], r["g"]): r["n"] for r in metrics} == {
        (2, "training"): 5, (2, "validation"): 1,
        (3, "training"): 5, (3, "validation"): 1,
        (4, "training"): 3 * 4, (4, "validation"): 3 * 4,
        (5, "training"): 4, (5, "validation"): 1,
    }
    checkpoints = conn.execute(
        "SELECT t.experiment_id AS e, count(*) AS n FROM checkpoints c JOIN trials t "
        "ON t.id = c.trial_id GROUP BY 1 ORDER BY 1").fetchall()
    assert [(r["e"], r["n"]) for r in checkpoints] == [(3, 5), (5, 1)]
    trials = conn.execute("SELECT experiment_id AS e, count(*) AS n FROM trials "
                          "GROUP BY 1 ORDER BY 1").fetchall()
    assert [r["n"] for r in trials] == [1, 1, 1, 3, 1]
