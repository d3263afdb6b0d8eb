"""Fuzz det's input boundary (issue 10, "Bad input"): experiment configs and the arguments of
the commands that change jobs.

The property, for every generated input: the command either is accepted and its result is
schedulable (a real reconciler pass then runs without error and gives the experiment trials
and allocations), or it is refused with exactly one line on stderr ("Error: ..."), no
traceback, exit code 1, and no row written.

The real ``det`` command runs in this process (``det.cli.main.main`` with ``sys.argv`` set, its
output captured): a subprocess costs about a second of interpreter start per example. It runs
against a real PostgreSQL database (the ``db_url`` fixture). Hypothesis runs derandomized
(a fixed seed per test, no example database), with no deadline: the same examples every run.
``DET_FUZZ_EXAMPLES`` (default 60 per test) runs more, for a deliberate hunt.
"""

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from det.cli.main import main
from det.reconciler.passes import Settings, run_pass

# Fixtures (the database, the context) are shared by the examples on purpose.
FUZZ = settings(max_examples=int(os.environ.get("DET_FUZZ_EXAMPLES", 60)), deadline=None,
                derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

BASE: dict[str, Any] = {
    "name": "fuzz",
    "description": "a fuzzed experiment",
    "labels": ["fuzz"],
    "entrypoint": "model_def:MyTrial",
    "hyperparameters": {
        "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10, "count": 2},
        "layers": {"type": "int", "minval": 1, "maxval": 4, "count": 2},
        "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5, "count": 2},
        "optimizer": {"type": "categorical", "vals": ["sgd", "adam"]},
        "batch_size": 32,
    },
    "searcher": {"name": "random", "metric": "loss", "max_trials": 2,
                 "max_length": {"batches": 10}},
    "resources": {"slots_per_trial": 1},
    "data": {"url": "http://example"},
    "max_restarts": 1,
}

SEARCHERS: list[dict[str, Any]] = [
    {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
    {"name": "grid", "metric": "loss", "max_length": {"batches": 10},
     "max_concurrent_trials": 2},
    {"name": "adaptive_asha", "metric": "loss", "max_trials": 4, "max_time": 16,
     "time_metric": "batches", "max_concurrent_trials": 2},
    {"name": "tpe", "metric": "loss", "max_trials": 3, "max_length": {"batches": 10}},
]

# Where a mutation may land: every key of BASE and of its searchers, a level down too.
PATHS: list[tuple[str, ...]] = sorted(
    {(k,) for k in BASE}
    | {("hyperparameters", k) for k in BASE["hyperparameters"]}
    | {("hyperparameters", h, k) for h, d in BASE["hyperparameters"].items()
       if isinstance(d, dict) for k in d}
    | {("searcher", k) for s in [BASE["searcher"], *SEARCHERS] for k in s}
    | {("resources", k) for k in ("slots_per_trial", "resource_pool", "priority", "weight",
                                  "max_slots", "shm_size")}
    | {("max_restarts",), ("preemption_timeout",), ("records_per_epoch",),
       ("scheduling_unit",), ("min_validation_period",), ("reproducibility",),
       ("data", "x"), ("bogus",)}
)

# Text as it may reach det: lone surrogates included (YAML escapes them as "\ud800").
TEXT = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=12),
    st.sampled_from(["", " ", "\0", "\ud800", "n" * 256, "d" * 5000, "model_def:MyTrial",
                     "batches", "loss", "default", "nan", "inf", "-1", "1e400", "0", "0.5"]),
)
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2, 64, 65, 1024, 10_000, 10_001, 10**6, 2**31 - 1, 2**31,
                     2**63 - 1, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1.0, 0.5, 1e6, 1e308, -1e308, 5e-324, 1024.5]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` three times in four, else ``bad``: most commands then get far enough to be
    accepted or refused by the scheduler's rules, not only by the first bad token."""
    return st.integers(0, 3).flatmap(lambda i: bad if i == 0 else good)


def alias_bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "data:\n" + "".join(f"  {line}\n" for line in lines)


# Raw-text changes no YAML dumper makes.
TEXT_EDITS = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("append"), st.sampled_from([
        alias_bomb(9), "data: &d {x: *d}\n", "data: " + "[" * 500 + "]" * 500 + "\n",
        "data: {x: " + "y" * (1 << 20) + "}\n", "description: !!binary aGVsbG8=\n",
        "max_restarts: .nan\n", "name: [unclosed\n",
    ])),
    st.tuples(st.just("byte"), st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\x00"])),
)


@st.composite
def configs(draw: st.DrawFn) -> bytes:
    """A config file: BASE, perhaps another searcher, 0-3 values replaced or removed, and
    one time in four a raw-text edit."""
    config = yaml.safe_load(yaml.safe_dump(BASE))
    if draw(st.booleans()):
        config["searcher"] = dict(draw(st.sampled_from(SEARCHERS)))
    for path in draw(st.lists(st.sampled_from(PATHS), max_size=3)):
        node = config
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        if draw(st.integers(0, 9)) == 0:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = draw(VALUES)
    text = yaml.safe_dump(config).encode()
    edit, arg = draw(mostly(st.just(("keep", None)), TEXT_EDITS))
    if edit == "truncate":
        text = text[: int(len(text) * arg)]
    elif edit == "append":
        text += arg.encode()
    elif edit == "byte":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + arg + text[at:]
    return text


def det(*args: str) -> tuple[int, str, str]:
    """Run ``det ARGS`` in this process: (exit code, stdout, stderr). An exception other than
    ``SystemExit`` (a traceback, for a user) propagates and fails the test."""
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["det", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
        code: Any = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv
    return (code if isinstance(code, int) else 1), out.getvalue(), err.getvalue()


def assert_refused(code: int, out: str, err: str) -> None:
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), (code, out, err)
    # For --hypothesis-show-statistics: what the refusals were about.
    event("refused: " + lines[0].split(": ")[-1][:40])


ROW_COUNTS = """
SELECT (SELECT count(*) FROM experiments) AS experiments, (SELECT count(*) FROM jobs) AS jobs,
       (SELECT count(*) FROM trials) AS trials, (SELECT count(*) FROM context_blobs) AS blobs
"""
JOBS = "SELECT id, priority, weight, resource_pool, fallback_pools, queue_position FROM jobs"
SCHEDULED = """
SELECT e.state::text AS state,
       (SELECT count(*) FROM trials t WHERE t.experiment_id = e.id) AS trials,
       (SELECT count(*) FROM allocations a JOIN trials t ON t.id = a.trial_id
         WHERE t.experiment_id = e.id) AS allocations
  FROM experiments e WHERE e.id = %s
"""


class Cluster:
    """The test's database, seen by the in-process ``det`` and by a reconciler pass."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)

    def counts(self) -> dict[str, int]:
        return self.conn.execute(ROW_COUNTS).fetchone()

    def jobs(self) -> list[dict[str, Any]]:
        return self.conn.execute(JOBS + " ORDER BY id").fetchall()

    def reconcile(self) -> None:
        """One real reconciler pass; it must not fail."""
        run_pass(self.conn, Settings(), "fuzz")


@pytest.fixture
def cluster(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.setenv("DET_DB_URL", db_url)
    monkeypatch.setenv("DET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DET_USER", "fuzzer")
    c = Cluster(db_url)
    yield c
    c.conn.close()


@pytest.fixture
def places(ctx: Path, tmp_path: Path) -> dict[str, Path]:
    """Arguments ``det experiment create`` may be given instead of a config file or context."""
    bad = tmp_path / "bad-ctx"
    bad.mkdir()
    (bad / "model_def.py").write_text("class MyTrial:\n    pass\n")
    (bad / "data.py").symlink_to("/etc/hostname")
    return {"ctx": ctx, "missing": tmp_path / "missing", "file": ctx / "model_def.py",
            "dir": tmp_path, "bad-ctx": bad}


@FUZZ
@given(text=configs(),
       where=mostly(st.just(("config", "ctx")),
                    st.sampled_from([("missing", "ctx"), ("dir", "ctx"), ("config", "missing"),
                                     ("config", "file"), ("config", "bad-ctx")])),
       flags=mostly(st.just(()), st.sampled_from([("--config", "max_restarts=2"), ("--force",)])))
def test_a_config_is_schedulable_or_refused_in_one_line(
        cluster: Cluster, places: dict[str, Path], tmp_path: Path, text: bytes,
        where: tuple[str, str], flags: tuple[str, ...]) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(text)
    config, context = (path if w == "config" else places[w] for w in where)
    before = cluster.counts()
    code, out, err = det("experiment", "create", *flags, str(config), str(context))
    if code != 0:
        assert_refused(code, out, err)
        assert cluster.counts() == before
        return
    assert err == "" and out.startswith("Created experiment "), (out, err)
    event("accepted")
    exp_id = int(out.split()[-1])
    cluster.reconcile()
    row = cluster.conn.execute(SCHEDULED, (exp_id,)).fetchone()
    assert row["state"] == "ACTIVE" and row["trials"] > 0 and row["allocations"] > 0, row


CLUSTER_CONFIG = """
resource_pools:
  - name: default
  - name: prio
    scheduler: {type: priority}
"""

# Argument values: numbers and text as a shell passes them (argv holds no NUL character).
ARG = st.one_of(NUMBERS.map(str), TEXT).filter(lambda s: "\0" not in s)
FIELDS = ["priority", "weight", "resource-pool", "ahead-of", "behind-of"]
FIELD = mostly(st.sampled_from(FIELDS), TEXT.filter(lambda s: "\0" not in s))


def value_for(field: str, jobs: tuple[int, ...]) -> st.SearchStrategy[str]:
    plausible = {
        "priority": st.integers(1, 99).map(str),
        "weight": st.floats(0.01, 100).map(str),
        "resource-pool": st.sampled_from(["default", "prio", "gpu"]),
        "ahead-of": st.sampled_from(jobs).map(str),
        "behind-of": st.sampled_from(jobs).map(str),
    }.get(field, ARG)
    return mostly(plausible, ARG)


@st.composite
def job_commands(draw: st.DrawFn, jobs: tuple[int, ...]) -> list[str]:
    """A ``det job update``, ``update-batch`` or ``experiment set`` command line. Values are
    given as ``--opt=VALUE`` or after ``--``, so that they never read as options (click's
    usage errors are not det's to word)."""
    job = mostly(st.sampled_from(jobs), st.sampled_from([0, -1, 99, 2**63, 10**30]))
    kind = draw(st.sampled_from(["update", "update-batch", "set"]))
    if kind == "update":
        fields = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=3))
        options = [f"--{f}={draw(value_for(f, jobs))}" for f in fields]
        return ["job", "update", *options, "--", str(draw(job))]
    if kind == "update-batch":
        changes = []
        for _ in range(draw(st.integers(1, 3))):
            field = draw(FIELD)
            changes.append(f"{draw(mostly(job.map(str), ARG))}.{field}="
                           f"{draw(value_for(field, jobs))}")
        return ["job", "update-batch", "--", *changes]
    field = draw(st.sampled_from(["weight", "priority"]))
    experiment = mostly(st.sampled_from([1, 2]), st.sampled_from([3, 10**30]))
    return ["experiment", "set", field, "--", str(draw(experiment)), draw(value_for(field, jobs))]


@pytest.fixture
def two_jobs(cluster: Cluster, ctx: Path, tmp_path: Path) -> tuple[int, ...]:
    """Experiments 1 (pool default, fair share) and 2 (pool prio, priority scheduler)."""
    (tmp_path / "cluster.yaml").write_text(CLUSTER_CONFIG)
    assert det("cluster", "config", "apply", str(tmp_path / "cluster.yaml"))[0] == 0
    for pool in ("default", "prio"):
        config = {**BASE, "resources": {"resource_pool": pool}}
        (tmp_path / "exp.yaml").write_text(yaml.safe_dump(config))
        assert det("experiment", "create", str(tmp_path / "exp.yaml"), str(ctx))[0] == 0
    return tuple(r["id"] for r in cluster.jobs())


@FUZZ
@given(data=st.data())
def test_a_job_change_is_applied_or_refused_in_one_line(cluster: Cluster,
                                                        two_jobs: tuple[int, ...],
                                                        data: st.DataObject) -> None:
    args = data.draw(job_commands(two_jobs))
    before = cluster.jobs()
    code, out, err = det(*args)
    if code != 0:
        assert_refused(code, out, err)
        assert cluster.jobs() == before
        return
    assert err == "", err
    event("accepted")
    if args[:2] == ["job", "update"]:  # the job now holds what was asked
        given = dict(a[2:].split("=", 1) for a in args[2:-2])
        job = next(j for j in cluster.jobs() if j["id"] == int(args[-1]))
        if "weight" in given:
            assert job["weight"] == float(given["weight"]), (given, job)
        if "resource-pool" in given:
            assert job["resource_pool"] == given["resource-pool"], (given, job)
        if "priority" in given and not {"ahead-of", "behind-of"} & set(given):
            assert job["priority"] == int(given["priority"]), (given, job)
    cluster.reconcile()
    states = cluster.conn.execute("SELECT state::text AS s FROM experiments").fetchall()
    assert {r["s"] for r in states} == {"ACTIVE"}, states
