"""What importing det.harness costs: a Core API script must not import torch (issue 11: torch
was ~0.9 s of a task's ~1.1 s before its first line) nor pglast. Each check runs in a fresh
interpreter, since this test process has torch imported already."""

import subprocess
import sys

import pytest


def modules_after(code: str) -> set[str]:
    """Names in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout
    return set(out.split())


@pytest.mark.parametrize(
    "code", ["import det.harness.core", "from det.harness import core", "import det.harness"]
)
def test_core_api_does_not_import_torch(code: str) -> None:
    modules = modules_after(code)
    assert "torch" not in modules
    assert "det.harness.pytorch" not in modules
    # nor the SQL parser of the migrations, which only the schema's owner runs (~60 ms, ~3 MB
    # in every task and in the zygote each task is forked from)
    assert "pglast" not in modules


@pytest.mark.parametrize(
    "code",
    [
        "from det.harness import pytorch; pytorch.PyTorchTrial",
        "import det.harness; det.harness.pytorch.Trainer",
        "import det.harness.pytorch",
        "import det.harness.core; import det.harness; det.harness.pytorch.PyTorchTrial",
        "from det.harness import *; pytorch.PyTorchTrial; core.init",
    ],
)
def test_pytorch_api_still_importable(code: str) -> None:
    assert "torch" in modules_after(code)
