"""Build script: it only derives the package list; pyproject.toml holds everything else.

The repository root is the ``det`` package (``package-dir: det = "."``), which pyproject's
``packages.find`` cannot express: run at the root it names the sub-packages ``db``, ``agent``,
... So every regular package below the root (a directory with an ``__init__.py``) becomes
``det.<name>``, found at build time: a new sub-package cannot be left out of a wheel.
``tests``, ``examples`` and ``bench`` are run from a checkout and are not part of det.
``compat/determined`` (no ``__init__`` in ``compat``, so not a det sub-package) is the
top-level ``determined`` package: Determined's API for user code.
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
NOT_SHIPPED = ["tests", "examples", "bench"]
COMPAT = ROOT / "compat"

setup(
    packages=["det", *(f"det.{p}" for p in find_packages(
        ROOT, exclude=[*NOT_SHIPPED, *(f"{d}.*" for d in NOT_SHIPPED)])),
        *find_packages(COMPAT, include=["determined", "determined.*"])],
    # This script lies in the root, that is in package det: naming it keeps it out of the
    # wheel (build_py skips the setup script, which is sys.argv[0] unless named here).
    script_name="setup.py",
)
