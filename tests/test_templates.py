"""Configuration templates (issue 16): the merge rule as a pure function (Determined's own
merge cases, schemas/test_cases/v0/merging.yaml, reference-facts §3.9), and `det template` /
`det experiment create --template` through the real `det` command against a real database."""

import json
from pathlib import Path

import pytest
from test_cli import one_line_error

from det.configs.templates import load_template, merge
from det.errors import ConfigError

MERGE_CASES = {
    "the config's scalars win; maps merge key by key; absent and null keys come from the "
    "template": (
        {"name": "mine", "max_restarts": None, "data": {"lr": 0.1, "deep": {"a": 1}}},
        {"name": "theirs", "max_restarts": 2, "data": {"lr": 1, "bs": 8, "deep": {"b": 2}}},
        {"name": "mine", "max_restarts": 2, "data": {"lr": 0.1, "bs": 8, "deep": {"a": 1, "b": 2}}},
    ),
    "lists: the config's list, else the template's (no concatenation)": (
        {"labels": ["a"], "entrypoint": ["python3", "x.py"]},
        {"labels": ["b", "c"], "entrypoint": ["sh"], "resources": {"resource_pool": ["p", "q"]}},
        {"labels": ["a"], "entrypoint": ["python3", "x.py"],
         "resources": {"resource_pool": ["p", "q"]}},
    ),
    "bind mounts: the config's, then the template's at other container paths": (
        {"bind_mounts": [{"host_path": "/asdf", "container_path": "/asdf"}]},
        {"bind_mounts": [{"host_path": "/zxcv", "container_path": "/zxcv"},
                         {"host_path": "/not_asdf", "container_path": "/asdf"}]},
        {"bind_mounts": [{"host_path": "/asdf", "container_path": "/asdf"},
                         {"host_path": "/zxcv", "container_path": "/zxcv"}]},
    ),
    "environment variables: the template's first, then the config's, per device type": (
        {"environment": {"environment_variables": ["A=1", "B=config"]}},
        {"environment": {"environment_variables": {"cpu": ["B=template", "C=3"]}}},
        {"environment": {"environment_variables": {"cpu": ["B=template", "C=3", "A=1", "B=config"],
                                                   "cuda": ["A=1", "B=config"]}}},
    ),
    "an image per device type; one image stands for every type": (
        {"environment": {"image": {"cuda": "mine:cuda"}}},
        {"environment": {"image": "theirs:all"}},
        {"environment": {"image": {"cuda": "mine:cuda", "cpu": "theirs:all"}}},
    ),
    "checkpoint storage, partial: the template fills in the GC settings": (
        {"checkpoint_storage": {"type": "directory", "container_path": "/c",
                                "save_experiment_best": 3}},
        {"checkpoint_storage": {"save_experiment_best": 10, "save_trial_best": 10,
                                "save_trial_latest": 10}},
        {"checkpoint_storage": {"type": "directory", "container_path": "/c",
                                "save_experiment_best": 3, "save_trial_best": 10,
                                "save_trial_latest": 10}},
    ),
    "checkpoint storage of another type: only the common keys carry over": (
        {"checkpoint_storage": {"type": "shared_fs", "host_path": "/h",
                                "save_experiment_best": 0, "save_trial_best": 1}},
        {"checkpoint_storage": {"type": "directory", "container_path": "/c",
                                "save_experiment_best": 10, "save_trial_best": 10,
                                "save_trial_latest": 10}},
        {"checkpoint_storage": {"type": "shared_fs", "host_path": "/h",
                                "save_experiment_best": 0, "save_trial_best": 1,
                                "save_trial_latest": 10}},
    ),
    "searcher, partial: all fields combined": (
        {"searcher": {"name": "random", "max_trials": 10}},
        {"searcher": {"metric": "sae", "smaller_is_better": True, "source_trial_id": 1}},
        {"searcher": {"name": "random", "max_trials": 10, "metric": "sae",
                      "smaller_is_better": True, "source_trial_id": 1}},
    ),
    "searcher of another name: only the common keys carry over": (
        {"searcher": {"name": "single", "max_length": {"batches": 1000}, "metric": "loss",
                      "smaller_is_better": True}},
        {"searcher": {"name": "random", "max_concurrent_trials": 2,
                      "max_length": {"batches": 10000}, "max_trials": 10000,
                      "smaller_is_better": False, "source_checkpoint_uuid": "asdf"}},
        {"searcher": {"name": "single", "max_length": {"batches": 1000}, "metric": "loss",
                      "smaller_is_better": True, "source_checkpoint_uuid": "asdf"}},
    ),
    "hyperparameters: a typed one is taken whole, nested ones merge, null is a constant": (
        {"hyperparameters": {"lr": {"type": "int", "minval": 10, "maxval": 100},
                             "transformer": {"backbone": "bert"}, "other": None}},
        {"hyperparameters": {"lr": {"type": "int", "minval": 50, "maxval": 500, "count": 5},
                             "transformer": {"task": "language-modeling"},
                             "other": {"task": "x"}, "extra": 3}},
        {"hyperparameters": {"lr": {"type": "int", "minval": 10, "maxval": 100},
                             "transformer": {"backbone": "bert", "task": "language-modeling"},
                             "other": None, "extra": 3}},
    ),
}


@pytest.mark.parametrize(("config", "template", "merged"), MERGE_CASES.values(),
                         ids=list(MERGE_CASES))
def test_merge(config, template, merged) -> None:
    before = json.dumps([config, template])
    assert merge(config, template) == merged
    assert json.dumps([config, template]) == before  # neither input is modified


@pytest.mark.parametrize(("text", "expected"), [
    ("- a\n", "t.yaml: a template must be a mapping of config keys, got list"),
    ("", "t.yaml: a template must be a mapping of config keys, got an empty document"),
    ("name: [x\n", "t.yaml: line 2, column 1: invalid YAML"),
    ("max_restarts: many\n", "t.yaml: max_restarts: expected an integer, got 'many'"),
    ("bogus: 1\n", "t.yaml: unknown key 'bogus'"),
    ("checkpoint_storage: {type: s4}\n", "t.yaml: checkpoint_storage.type: expected one of"),
    ("searcher: {metric: ''}\n", "t.yaml: searcher.metric: expected a non-blank string"),
])
def test_a_bad_template_is_refused(text, expected) -> None:
    with pytest.raises(ConfigError) as info:
        load_template(text, "t.yaml")
    assert str(info.value).startswith(expected), str(info.value)


def test_a_template_may_leave_out_any_key() -> None:
    text = "searcher: {metric: loss}\ncheckpoint_storage: {save_trial_best: 3}\nresources: {}\n"
    assert load_template(text) == {"searcher": {"metric": "loss"},
                                   "checkpoint_storage": {"save_trial_best": 3},
                                   "resources": {}}


EXPERIMENT = """\
name: from-template
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss, max_length: {batches: 10}}
labels: [mine]
environment:
  environment_variables: [B=experiment]
"""

TEMPLATE = """\
description: shared settings
labels: [theirs]
max_restarts: 2
checkpoint_storage: {type: shared_fs, host_path: /mnt/ckpt, save_trial_best: 3}
data: {url: "https://example.com/data"}
environment:
  environment_variables: [A=template, B=template]
searcher: {name: random, metric: accuracy, smaller_is_better: false, max_trials: 5}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def stored_config(conn, exp_id: int) -> dict:
    return conn.execute("SELECT config FROM experiments WHERE id = %s",
                        (exp_id,)).fetchone()["config"]


def test_templates_end_to_end(det, conn, ctx, tmp_path) -> None:
    assert det("template", "set", "shared", str(write(tmp_path, "t.yaml", TEMPLATE))).stdout == (
        "Created template shared in workspace Uncategorized\n")
    det("tpl", "set", "other", str(write(tmp_path, "o.yaml", "max_restarts: 7\n")))
    assert [t["name"] for t in json.loads(det("template", "list", "--json").stdout)] == [
        "other", "shared"]
    assert "max_restarts" in det("template", "list", "--details").stdout
    described = det("template", "describe", "shared").stdout
    assert "host_path: /mnt/ckpt" in described and described.startswith("description:")

    det("experiment", "create", str(write(tmp_path, "e.yaml", EXPERIMENT)), str(ctx),
        "--template", "shared")
    config = stored_config(conn, 1)
    # The experiment's own values win; what it leaves out comes from the template.
    assert (config["name"], config["labels"], config["description"]) == (
        "from-template", ["mine"], "shared settings")
    assert config["max_restarts"] == 2 and config["data"] == {"url": "https://example.com/data"}
    assert config["checkpoint_storage"] == {"type": "shared_fs", "host_path": "/mnt/ckpt",
                                            "storage_path": None, "save_experiment_best": 0,
                                            "save_trial_best": 3, "save_trial_latest": 1}
    # Another searcher than the template's: only the template's keys common to every
    # searcher carry over (smaller_is_better; the config's own metric wins).
    assert config["searcher"]["name"] == "single" and "max_trials" not in config["searcher"]
    assert config["searcher"]["metric"] == "loss"
    assert config["searcher"]["smaller_is_better"] is False
    assert config["environment"]["environment_variables"]["cpu"] == [
        "A=template", "B=template", "B=experiment"]

    # Changing or removing the template later changes no experiment.
    det("template", "set", "shared", str(write(tmp_path, "t2.yaml", "max_restarts: 9\n")))
    assert "max_restarts: 9" in det("template", "describe", "shared").stdout
    assert stored_config(conn, 1) == config
    assert det("template", "remove", "shared").stdout == (
        "Removed template shared from workspace Uncategorized\n")
    assert stored_config(conn, 1) == config
    assert [t["name"] for t in json.loads(det("template", "list", "--json").stdout)] == ["other"]


def test_bad_templates_are_one_line_and_write_nothing(det, conn, ctx, tmp_path) -> None:
    exp = write(tmp_path, "e.yaml", EXPERIMENT)
    cases = [
        (("template", "set", "t", str(write(tmp_path, "l.yaml", "[1, 2]\n"))),
         "l.yaml: a template must be a mapping of config keys, got list"),
        (("template", "set", "t", str(write(tmp_path, "k.yaml", "resources: {slot: 1}\n"))),
         "k.yaml: resources: unknown key 'slot'"),
        (("template", "set", "t", str(tmp_path / "missing.yaml")),
         "missing.yaml: cannot read config file"),
        (("template", "set", " ", str(write(tmp_path, "ok.yaml", "max_restarts: 1\n"))),
         'template name " ": cannot be blank'),
        (("template", "set", "a\tb", str(tmp_path / "ok.yaml")),
         "template name \"a\\tb\": cannot contain line breaks or control characters"),
        (("template", "describe", "nope"), "template 'nope' not found"),
        (("template", "remove", "nope"), 'template "nope" not found'),
        (("experiment", "create", str(exp), str(ctx), "--template", "nope"),
         'template "nope" not found in workspace "Uncategorized"'),
    ]
    for args, expected in cases:
        r = det(*args, check=False)
        assert expected in one_line_error(r), (args, r.stderr)
    assert conn.execute("SELECT count(*) AS n FROM templates").fetchone()["n"] == 0

    # A merge that makes an invalid config is refused, naming the key and the template.
    random = "searcher: {name: random, max_trials: 2}\n"
    det("template", "set", "bad", str(write(tmp_path, "b.yaml", random)))
    no_searcher = write(tmp_path, "n.yaml", "entrypoint: model_def:MyTrial\n")
    r = det("experiment", "create", str(no_searcher), str(ctx), "--template", "bad", check=False)
    assert one_line_error(r) == (f"Error: {no_searcher} with template 'bad': searcher.metric: "
                                 "required key missing")
    # Each valid alone: a grid search over a hyperparameter without a count is not.
    det("template", "set", "grid", str(write(
        tmp_path, "g.yaml", "searcher: {name: grid, metric: loss, max_length: {batches: 5}}\n")))
    hps = write(tmp_path, "h.yaml", "entrypoint: model_def:MyTrial\n"
                "hyperparameters: {lr: {type: double, minval: 0.1, maxval: 1}}\n")
    r = det("experiment", "create", str(hps), str(ctx), "--template", "grid", check=False)
    assert one_line_error(r) == (f"Error: {hps} with template 'grid': hyperparameters.lr.count: "
                                 "required when searcher.name is grid")
    assert conn.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == 0
