"""Configs Determined 0.38.1 accepts (issue 38): ``min_validation_period`` and
``min_checkpoint_period`` may be 0 (its ``length.json``: ``minimum: 0``, default
``{batches: 0}``) while ``searcher.max_length`` stays >= 1 (``check-positive-length.json``);
``det preview-search`` validates a config exactly as ``det experiment create`` does."""

from pathlib import Path

import pytest

from det.errors import ConfigError
from det.harness.lengths import UnitConverter
from det.reconciler.searchers.preview import search_preview

BASE = """\
name: periods
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("extra", [
    "min_validation_period: {batches: 0}\n",
    "min_checkpoint_period: {batches: 0}\n",
    "min_validation_period: {records: 0}\nmin_checkpoint_period: {epochs: 0}\n"
    "records_per_epoch: 100\n",
])
def test_zero_periods_are_accepted_by_create(det, conn, ctx, tmp_path: Path,
                                             extra: str) -> None:
    r = det("experiment", "create", str(write(tmp_path, BASE + extra)), str(ctx))
    assert "Created experiment" in r.stdout
    config = conn.execute("SELECT config FROM experiments").fetchone()["config"]
    for line in extra.splitlines():
        key, _, value = line.partition(": ")
        if key.startswith("min_"):
            unit = value.strip("{}").split(":")[0]
            assert config[key] == {unit: 0}


@pytest.mark.parametrize(("extra", "field", "expected"), [
    ("min_validation_period: {batches: -1}\n", "min_validation_period",
     "expected {batches|records|epochs: int >= 0}"),
    ("min_checkpoint_period: {weeks: 0}\n", "min_checkpoint_period",
     "expected {batches|records|epochs: int >= 0}"),
])
def test_bad_periods_are_refused_naming_the_field(tmp_path: Path, extra: str, field: str,
                                                  expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        search_preview(BASE + extra, "cfg.yaml")
    assert f"{field}: {expected}" in str(info.value)


def test_max_length_zero_stays_refused() -> None:
    with pytest.raises(ConfigError, match="searcher.max_length: expected"):
        search_preview(BASE.replace("{batches: 10}", "{batches: 0}"), "cfg.yaml")


def test_a_zero_period_means_none_to_the_trainer() -> None:
    units = UnitConverter(global_batch_size=32, records_per_epoch=3200)
    assert units.length_to_batches({"batches": 0}, "min_validation_period") is None
    assert units.length_to_batches({"epochs": 0}, "min_checkpoint_period") is None


TYPELESS_STORAGE = BASE + "checkpoint_storage: {save_trial_best: 2, save_trial_latest: 1}\n"


def test_preview_search_accepts_a_typeless_checkpoint_storage_as_create_does(
        det, conn, ctx, tmp_path: Path) -> None:
    config = write(tmp_path, TYPELESS_STORAGE)
    created = det("experiment", "create", str(config), str(ctx))
    assert "Created experiment" in created.stdout
    preview = det("preview-search", str(config))
    assert "single" in preview.stdout
    assert search_preview(TYPELESS_STORAGE, "cfg.yaml")["trials"] == 1


@pytest.mark.parametrize("extra", [
    "checkpoint_storage: {type: s3}\n",  # a typed storage still needs its own keys
    "checkpoint_storage: {save_trial_best: -1}\n",
    "max_restarts: many\n",
])
def test_create_and_preview_search_refuse_alike(det, ctx, tmp_path: Path, extra: str) -> None:
    config = write(tmp_path, BASE + extra)
    created = det("experiment", "create", str(config), str(ctx), check=False)
    preview = det("preview-search", str(config), check=False)
    assert created.returncode != 0 and preview.returncode != 0
    assert created.stderr.strip().splitlines()[-1] == preview.stderr.strip().splitlines()[-1]
