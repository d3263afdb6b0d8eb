"""Bad input through the real `det` command: one line naming what and where, a non-zero
exit, and nothing written."""

import os
from pathlib import Path

import psycopg
import pytest

GOOD = """\
name: ok
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""


def write(tmp_path: Path, text: str | bytes) -> Path:
    p = tmp_path / "cfg.yaml"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def rows(conn) -> dict[str, int]:
    """Row counts of the tables a submission writes."""
    return {t: conn.execute(f"SELECT count(*) AS n FROM {t}").fetchone()["n"]
            for t in ("experiments", "jobs", "trials", "context_blobs")}


def one_line_error(r) -> str:
    """The single stderr line of a refused command (asserting there is exactly one)."""
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    return lines[0]


def alias_bomb(levels: int = 9) -> str:
    """The "billion laughs" (9 levels: 387 million values once expanded)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return GOOD + "data:\n" + "".join(f"  {line}\n" for line in lines)


@pytest.mark.parametrize(("text", "expected"), [
    ("name: [unclosed\n", "cfg.yaml"),
    (GOOD + "bogus_key: 1\n", "bogus_key"),
    (GOOD + "max_restarts: many\n", "max_restarts"),
    (GOOD.replace("{batches: 10}", "10 batches"), "searcher.max_length"),
    (GOOD.replace("MyTrial", "Missing"), "defines no class Missing"),
    (GOOD.replace("model_def:", "nomodule:"), "no file nomodule.py"),
    # Accepted, or crashed, before det bounded its input (issue 10).
    (GOOD.replace("metric: loss", 'metric: ""'), "searcher.metric: expected a non-blank"),
    (GOOD + "data: {x: .nan}\n", "data.x: expected a finite number, got nan"),
    (GOOD + 'description: "a\\0b"\n', "description: expected text without NUL characters"),
    (GOOD + 'labels: ["\\ud800"]\n', "labels[0]: expected valid Unicode text"),
    (GOOD + "hyperparameters: {lr: {type: log, minval: 1, maxval: 2, base: 1}}\n",
     "hyperparameters.lr.base: expected a number > 0 other than 1"),
    (GOOD.replace("name: ok", "name: " + "n" * 1_000_000), "name: expected at most 255 characters"),
    (alias_bomb(), "cfg.yaml: more than 100000 values once its aliases are expanded"),
    (GOOD + "data: " + "[" * 3000 + "]" * 3000 + "\n", "cfg.yaml: line 4, column 70: nested"),
    (GOOD + "data: " + "x" * (2 << 20) + "\n", "cfg.yaml: config file is larger than the limit"),
    (GOOD.encode() + b"description: caf\xe9\n", "cfg.yaml: not UTF-8 text (byte 121)"),
])
def test_bad_config_is_one_line_and_writes_nothing(det, conn, ctx, tmp_path, text,
                                                   expected) -> None:
    before = rows(conn)
    r = det("experiment", "create", str(write(tmp_path, text)), str(ctx), check=False)
    assert expected in one_line_error(r)
    assert rows(conn) == before


def test_context_over_limit(det, conn, ctx, tmp_path) -> None:
    with open(ctx / "weights.bin", "wb") as f:
        f.truncate(96 * 1024 * 1024)  # sparse: costs no disk
    r = det("experiment", "create", str(write(tmp_path, GOOD)), str(ctx), check=False)
    assert r.returncode == 1 and "limit is 95 MiB" in r.stderr
    assert conn.execute("SELECT count(*) AS n FROM context_blobs").fetchone()["n"] == 0


@pytest.mark.parametrize("args", [["experiment", "describe", "42"], ["trial", "logs", "7"],
                                  ["experiment", "pause", "42"],
                                  ["checkpoint", "download", "nope", "-o", "/tmp/x"]])
def test_unknown_ids(det, args) -> None:
    r = det(*args, check=False)
    assert r.returncode == 1 and "not found" in r.stderr and len(r.stderr.splitlines()) == 1


def test_create_list_describe(det, conn, ctx, tmp_path) -> None:
    r = det("experiment", "create", str(write(tmp_path, GOOD)), str(ctx))
    assert r.stdout.strip() == "Created experiment 1"
    listing = det("experiment", "list").stdout
    # the owner is who the database says is acting: the role the test's URL names
    me = conn.execute("SELECT session_user AS u").fetchone()["u"]
    assert "ok" in listing and "ACTIVE" in listing and me in listing
    # issue 34: the searcher, best metric and how long it ran are columns too
    header = listing.splitlines()[0].split()
    assert header[header.index("Searcher") + 1] == "Best" and header[-1] == "Duration"
    assert " single " in listing
    import json

    described = json.loads(det("experiment", "describe", "1", "--json").stdout)
    assert described["config"]["searcher"]["max_length"] == {"batches": 10}
    assert described["config"]["checkpoint_storage"]["type"] == "shared_fs"


@pytest.mark.parametrize("link", [
    "/etc",  # absolute, a directory (links out of the context are followed to files only)
    "../outside",  # relative, leaving the context, a directory
    "missing.py",  # dangling
    "helper.py",  # a loop
])
def test_context_link_that_cannot_be_unpacked_is_refused(det, conn, ctx, tmp_path,
                                                         link) -> None:
    (tmp_path / "outside").mkdir()
    os.symlink(link, ctx / "helper.py")
    before = rows(conn)
    r = det("experiment", "create", str(write(tmp_path, GOOD)), str(ctx), check=False)
    assert "helper.py" in one_line_error(r)
    assert rows(conn) == before


def test_test_mode_help_says_what_it_does(det) -> None:
    out = det("experiment", "create", "--help").stdout
    assert "--test-mode" in out and "--test" in out and "archived test experiment" in out


@pytest.mark.parametrize("args", [
    ("job", "update", "{job}", "--weight", "nan"),
    ("job", "update", "{job}", "--weight", "inf"),
    ("job", "update", "{job}", "--weight", "-inf"),
    ("job", "update-batch", "{job}.weight=nan"),
    ("experiment", "set", "weight", "1", "inf"),
])
def test_non_finite_weight_is_refused(det, conn, ctx, tmp_path, args) -> None:
    det("experiment", "create", str(write(tmp_path, GOOD)), str(ctx))
    job = conn.execute("SELECT job_id FROM experiments WHERE id = 1").fetchone()["job_id"]
    r = det(*(a.format(job=job) for a in args), check=False)
    assert "weight" in one_line_error(r) and "finite number" in r.stderr
    assert conn.execute("SELECT weight FROM jobs WHERE id = %s", (job,)).fetchone()["weight"] == 1


def test_database_refuses_non_finite_weight(det, conn, ctx, tmp_path) -> None:
    det("experiment", "create", str(write(tmp_path, GOOD)), str(ctx))
    job = conn.execute("SELECT job_id FROM experiments WHERE id = 1").fetchone()["job_id"]
    for value in ("NaN", "Infinity", "-Infinity", "1e400", "1e7", "0"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="weight"):
            conn.execute("SELECT det_user.job_update(%s, 'weight', %s)", (job, value))
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE jobs SET weight = 'NaN' WHERE id = %s", (job,))
    conn.execute("SELECT det_user.job_update(%s, 'weight', '2.5')", (job,))
    assert conn.execute("SELECT weight FROM jobs WHERE id = %s", (job,)).fetchone()["weight"] == 2.5


def test_the_wait_bar_names_state_trials_progress_and_time(conn, ended) -> None:
    """Issue 34: the bar read "Experiment 3 ACTIVE: :  29%", without trials done, elapsed
    time or ETA."""
    import io

    from tqdm import tqdm

    from det.cli.experiments import WAIT_BAR, wait_description
    from det.sql import named

    eid, _ = ended.make([[(10, 0.5)], [(10, 0.4)]])
    counts = conn.execute(named("queries").trials_done, {"id": eid}).fetchone()
    assert counts == {"done": 2, "total": 2}
    out = io.StringIO()
    with tqdm(total=100, file=out, bar_format=WAIT_BAR, ncols=100) as bar:
        bar.n = 29
        bar.set_description_str(wait_description(3, "ACTIVE", 1, 4))
    line = out.getvalue().split("\r")[-2]
    assert line.startswith("Experiment 3 ACTIVE, 1/4 trials done  29%|") \
        and "elapsed, ~" in line and line.endswith(" left")


def test_durations_read_as_a_person_says_them() -> None:
    from datetime import timedelta

    from det.cli.output import duration

    assert [duration(timedelta(seconds=s)) for s in (-3, 45, 725, 10925, 187200)] == [
        "0s", "45s", "12m 05s", "3h 02m", "2d 04h"]
