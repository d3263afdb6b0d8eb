"""One formatting rule for the CLI and the WebUI (issue 34): numbers to 4 significant digits,
sizes in KiB/MiB, durations, yes/no; det.cli.output's functions and core.js's fmt, size and
span print the same text for the same values (run in a real Chromium); ``det experiment
describe`` and ``det trial describe`` show one column per hyperparameter and metric.
"""

import json
import math
import random
import re
import struct
from datetime import timedelta
from pathlib import Path

from conftest import EndedExperiments
from psycopg.types.json import Jsonb
from test_webui import browser  # noqa: F401  (the fixture)

from det.cli.output import cell, duration, flatten, number, size

REPO = Path(__file__).resolve().parent.parent

# (value, as shown): what tables printed before issue 34 was 0.9747596085071564,
# 2.2727272727272725, 1.2345e-05 and "False".
NUMBERS = [
    (0.9747596085071564, "0.9748"), (2.2727272727272725, "2.273"), (1.0, "1"), (-0.0, "0"),
    (0.5, "0.5"), (120, "120"), (123456789, "123456789"), (12345.6, "1.235e+4"),
    (1234.5, "1235"), (1.0625, "1.063"), (-1.0625, "-1.063"), (9999.5, "1e+4"),
    (0.0001, "0.0001"), (1.23456e-05, "1.235e-5"), (0.00099996, "0.001"), (1e20, "1e+20"),
    (10**16, "1e+16"), (float("nan"), "nan"), (float("-inf"), "-inf"), (True, "yes"),
    (False, "no"), (None, ""),
]
SIZES = [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (123456789, "117.7 MiB"),
         (5 * 2**30, "5 GiB"), (3000 * 2**40, "3000 TiB")]
SECONDS = [(-3, "0s"), (45.9, "45s"), (65, "1m 05s"), (725, "12m 05s"), (7380, "2h 03m"),
           (187200, "2d 04h")]


def test_numbers_sizes_and_durations_read_as_the_rule_says() -> None:
    assert [number(v) for v, _ in NUMBERS] == [s for _, s in NUMBERS]
    assert [size(v) for v, _ in SIZES] == [s for _, s in SIZES]
    assert [duration(timedelta(seconds=v)) for v, _ in SECONDS] == [s for _, s in SECONDS]
    assert cell({"lr": 0.00012345678, "opt": {"name": "adam", "fused": False}}) == \
        "lr=0.0001235, opt.fused=no, opt.name=adam"
    assert flatten({"a": {"b": {"c": 1}}, "d": [1, 2], "e": {}}) == {"a.b.c": 1, "d": [1, 2]}


def _floats(n: int) -> list[float]:
    """Awkward doubles: random bit patterns (every exponent), round decimals and the exact
    halves at the 5th significant digit where half-even and half-up rounding part."""
    rnd = random.Random(34)
    out = [struct.unpack("<d", struct.pack("<Q", rnd.getrandbits(64)))[0] for _ in range(n)]
    out += [rnd.uniform(-1e6, 1e6) for _ in range(n)]
    out += [round(rnd.uniform(0, 10), rnd.randint(0, 6)) * 10.0 ** rnd.randint(-8, 8)
            for _ in range(n)]
    out += [(2 * k + 1) / 2**s for k in range(1, 400, 37) for s in range(1, 12)]
    return [x for x in out if math.isfinite(x)]  # NaN and the infinities: in NUMBERS


def test_the_webui_formats_as_the_cli_does(browser) -> None:  # noqa: F811
    """core.js's fmt, size and span, run in Chromium, against det.cli.output over the same
    values: the table of NUMBERS, SIZES and SECONDS, then some 4,600 awkward doubles (each
    also as a size) and 200 large integers."""
    browser.get("about:blank")
    core = (REPO / "api" / "static" / "core.js").read_text()
    floats = _floats(1500)
    ints = [random.Random(1).randint(-10**15, 10**15) for _ in range(200)]
    # JSON carries no NaN or infinity: those go as their names.
    values = [v if not isinstance(v, float) or math.isfinite(v) else str(v) for v, _ in NUMBERS]
    got = browser.execute_script(
        core + """
        const special = {nan: NaN, inf: Infinity, "-inf": -Infinity};
        const [values, floats, ints, sizes, seconds] = arguments;
        return {
          numbers: values.map((v) => fmt(typeof v === "string" ? special[v] : v)),
          floats: floats.map(fmt), ints: ints.map(fmt), sizes: sizes.map(size),
          sizesOfFloats: floats.map((x) => size(Math.abs(x))), seconds: seconds.map(span),
        };""", values, floats, ints, [v for v, _ in SIZES], [v for v, _ in SECONDS])
    assert got["numbers"] == [s for _, s in NUMBERS]
    assert got["sizes"] == [s for _, s in SIZES]
    assert got["seconds"] == [s for _, s in SECONDS]
    differ = [(x, js, number(x))
              for x, js in zip(floats, got["floats"], strict=True) if js != number(x)]
    assert not differ, differ[:10]
    assert got["ints"] == [number(i) for i in ints]
    assert got["sizesOfFloats"] == [size(abs(x)) for x in floats]


# Three trials of a search: nested hyperparameters with 17-digit floats, validations of
# several metrics, a trial that never validated, one that ended with a long reason.
HPARAMS = [
    {"lr": 0.0031622776601683794, "hidden": 128, "opt": {"name": "adam", "beta": 0.9}},
    {"lr": 0.00012345678901234567, "hidden": 64, "opt": {"name": "sgd", "beta": 0.95}},
    {"lr": 0.012, "hidden": 256, "opt": {"name": "adam", "beta": 0.99}},
]
VALIDATIONS = [
    [(50, {"loss": 0.31234567, "accuracy": 0.9011111, "epochs": 1.1363636363636365}),
     (100, {"loss": 0.123456789, "accuracy": 0.9747596085071564, "epochs": 2.272727272727273})],
    [(50, {"loss": 0.2222222222, "accuracy": 0.95, "epochs": 1.1363636363636365})],
    [],
]


def make_search(conn, ended: EndedExperiments) -> int:
    """An ended experiment of the three trials above (checkpoints at each validation's step,
    2.5 MiB each), its trials' best validation set as the harness leaves it. Returns its id."""
    eid, _ = ended.make([[(s, None) for s, _ in v] or [(10, None)] for v in VALIDATIONS],
                        file_bytes=5 * 2**19)
    trials = [r["id"] for r in conn.execute(
        "SELECT id FROM trials WHERE experiment_id = %s ORDER BY id", (eid,))]
    for tid, hp, vals in zip(trials, HPARAMS, VALIDATIONS, strict=True):
        conn.execute("UPDATE trials SET hparams = %s, steps_completed = %s WHERE id = %s",
                     (Jsonb(hp), max([s for s, _ in vals], default=10), tid))
        for steps, values in vals:
            conn.execute(
                "INSERT INTO metrics (trial_id, allocation_id, \"group\", steps_completed, "
                "\"values\") SELECT %s, id, 'validation', %s, %s FROM allocations "
                "WHERE trial_id = %s", (tid, steps, Jsonb(values), tid))
        conn.execute("UPDATE trials SET best_validation = det_internal.trial_best_validation(id) "
                     "WHERE id = %s", (tid,))
    conn.execute("UPDATE trials SET exit_reason = 'the searcher stopped it: its loss was "
                 "worse than the rung''s best at 100 batches' WHERE id = %s", (trials[1],))
    return eid


def test_describe_shows_a_column_per_hyperparameter_and_metric(det, conn, ended) -> None:
    eid = make_search(conn, ended)
    out = det("experiment", "describe", str(eid)).stdout
    assert "best: 0.1235" in out, out
    trials = out.split("Trials:\n")[1].split("\n\n")[0].splitlines()
    assert trials[0].split() == ["ID", "State", "hidden", "lr", "opt.beta", "opt.name",
                                 "Batches", "Best", "loss", "accuracy", "Restarts",
                                 "Exit"], out  # epochs (progress, as batches) is no metric
    first, second, third = (line.split() for line in trials[2:5])
    # The first trial's best validation (loss 0.1235) is its second: its metrics are that one's.
    assert first[2:10] == ["128", "0.003162", "0.9", "adam", "100", "0.1235", "0.9748",
                           "0"], out
    assert second[2:9] == ["64", "0.0001235", "0.95", "sgd", "50", "0.2222", "0.95"]
    assert third[2:7] == ["256", "0.012", "0.99", "adam", "10"] and len(third) == 8, third
    assert "worse than the rung's best" in out
    checkpoints = out.split("Checkpoints:\n")[1]
    assert "accuracy=0.9748, epochs=2.273, loss=0.1235" in checkpoints, checkpoints
    listed = det("checkpoint", "list", str(eid)).stdout
    assert re.search(r"\b2\.5 MiB\b", listed) and "2621440" not in listed, listed
    # --json keeps every digit, and the metrics of each trial's best validation.
    described = json.loads(det("experiment", "describe", str(eid), "--json").stdout)
    assert [t["validation"] for t in described["trials"]] == [
        VALIDATIONS[0][1][1], VALIDATIONS[1][0][1], None]


def test_trial_describe_shows_a_column_per_metric(det, conn, ended) -> None:
    eid = make_search(conn, ended)
    tid = conn.execute("SELECT min(id) AS id FROM trials WHERE experiment_id = %s",
                       (eid,)).fetchone()["id"]
    out = det("trial", "describe", str(tid)).stdout
    assert "hyperparameters: hidden=128, lr=0.003162, opt.beta=0.9, opt.name=adam" in out, out
    table = out.split("\n\n")[-1].splitlines()
    assert table[0].split() == ["Group", "Batches", "accuracy", "epochs", "loss"], out
    assert table[2].split() == ["validation", "50", "0.9011", "1.136", "0.3123"], out
