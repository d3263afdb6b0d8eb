"""det.configs: parsing, expansion, one-line errors. Pure (no database)."""

import jsonschema
import pytest
import yaml

from det.configs import (
    ExperimentConfig,
    IntHP,
    Length,
    NestedHP,
    entrypoint_argv,
    env_for_device,
    experiment_json_schema,
    is_trial_class,
    load_experiment_config,
)
from det.configs.job import job_change, parse_job_id
from det.errors import ConfigError

GOOD = """
name: mnist
description: digits
labels: [a, b]
entrypoint: model_def:MnistTrial
hyperparameters:
  global_batch_size: 64
  lr: {type: log, minval: -4, maxval: -1, base: 10, count: 3}
  layers: {type: int, minval: 1, maxval: 4, count: 2}
  optimizer:
    name: {type: categorical, vals: [sgd, adam]}
    momentum: {type: double, minval: 0.0, maxval: 0.9, count: 2}
    extra: {}
  dropout: {type: const, val: 0.5}
searcher:
  name: grid
  metric: validation_loss
  max_length: {batches: 500}
  max_concurrent_trials: 2
resources: {slots_per_trial: 2, priority: 10, shm_size: 1G}
checkpoint_storage: {type: shared_fs, host_path: /tmp/ckpt, storage_path: det}
environment:
  environment_variables: [A=1, B=x=y]
  image: {cpu: python:3.11}
bind_mounts: [{host_path: /data, container_path: data, read_only: true}]
data: {url: http://example}
min_validation_period: {epochs: 1}
reproducibility: {experiment_seed: 42}
"""

MINIMAL = """
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {records: 1000}}
"""


def test_good_config_parses() -> None:
    cfg = load_experiment_config(GOOD, "good.yaml")
    assert cfg.searcher.name == "grid"
    assert cfg.searcher.max_length == Length("batches", 500)
    assert cfg.resources.shm_size == 1 << 30
    assert cfg.environment.environment_variables.cuda == ["A=1", "B=x=y"]
    assert cfg.environment.image.cpu == "python:3.11"
    assert cfg.environment.image.cuda is None
    assert isinstance(cfg.hyperparameters.root["layers"], IntHP)
    assert isinstance(cfg.hyperparameters.root["optimizer"], NestedHP)


def test_expanded_fills_defaults_and_round_trips() -> None:
    expanded = load_experiment_config(MINIMAL).expanded(now=1_700_000_000)
    assert expanded["name"] == "Experiment"
    assert expanded["max_restarts"] == 5
    assert expanded["resources"] == {
        "slots_per_trial": 1,
        "resource_pool": "default",
        "priority": None,
        "weight": 1.0,
        "max_slots": None,
        "shm_size": None,
        "memory_limit": None,
    }
    assert expanded["searcher"]["max_length"] == {"records": 1000}
    assert expanded["searcher"]["smaller_is_better"] is True
    assert expanded["reproducibility"] == {"experiment_seed": 1_700_000_000}
    assert expanded["environment"]["environment_variables"] == {"cpu": [], "cuda": []}
    assert expanded["preemption_timeout"] == 3600
    assert expanded["checkpoint_policy"] == "best"
    assert expanded["checkpoint_storage"] is None
    assert ExperimentConfig.model_validate(expanded).expanded() == expanded


def test_good_config_round_trips_and_fits_the_json_schema() -> None:
    expanded = load_experiment_config(GOOD).expanded()
    assert expanded["hyperparameters"]["global_batch_size"] == {"type": "const", "val": 64}
    assert expanded["hyperparameters"]["optimizer"]["extra"] == {}
    assert ExperimentConfig.model_validate(expanded).expanded() == expanded
    schema = experiment_json_schema()
    jsonschema.validate(expanded, schema)
    jsonschema.validate(yaml.safe_load(GOOD), schema)
    jsonschema.validate(yaml.safe_load(MINIMAL), schema)


def test_expansion_keeps_a_given_seed_and_fills_a_missing_one() -> None:
    assert load_experiment_config(GOOD).expanded()["reproducibility"]["experiment_seed"] == 42
    seed = load_experiment_config(MINIMAL).expanded()["reproducibility"]["experiment_seed"]
    assert isinstance(seed, int) and seed > 1_600_000_000


def test_nulls_mean_absent() -> None:
    cfg = load_experiment_config(MINIMAL + "max_restarts: null\nhyperparameters: null\n")
    assert cfg.max_restarts == 5
    assert cfg.hyperparameters.root == {}


def test_adaptive_asha_config_is_accepted() -> None:
    cfg = load_experiment_config(
        "entrypoint: a:B\nsearcher: {name: adaptive_asha, metric: loss, max_trials: 16,"
        " max_time: 100, time_metric: batches}\n"
    )
    assert cfg.searcher.name == "adaptive_asha"
    assert cfg.searcher.divisor == 4.0 and cfg.searcher.mode == "standard"
    assert cfg.searcher.max_length == Length("batches", 100)


def test_adaptive_asha_time_metric_may_be_any_metric_name() -> None:
    """§1.7: 0.38's time_metric names any reported metric; only batches, records and epochs
    also give det's trainer a length to train to."""
    cfg = load_experiment_config(
        "entrypoint: python3 train.py\nsearcher: {name: adaptive_asha, metric: loss,"
        " max_trials: 4, max_time: 60, time_metric: seconds}\n"
    )
    assert (cfg.searcher.max_time, cfg.searcher.time_metric) == (60, "seconds")
    assert cfg.searcher.max_length is None


def test_length_unit_and_value() -> None:
    length = Length.parse({"epochs": 3})
    assert (length.unit, length.value, length.to_json()) == ("epochs", 3, {"epochs": 3})


SEARCHER = "searcher: {name: single, metric: l, max_length: {batches: 1}}\n"
ASHA_HEAD = "entrypoint: x\nsearcher: {name: adaptive_asha, metric: l, max_length: {batches: 8}, "
ASHA = ASHA_HEAD + "max_trials: 2, "


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("entrypoint: [a\n" + SEARCHER, "", "line 2"),
        ("entrypoint: x\nentrypoint: y\n" + SEARCHER, "", "duplicate key 'entrypoint'"),
        ("entrypoint: x\nfoo: 1\n" + SEARCHER, "", "unknown key 'foo'"),
        (
            "entrypoint: x\nsearcher: {name: single, metric: l, max_length: {batches: 1}, x: 1}",
            "searcher",
            "unknown key 'x'",
        ),
        ("entrypoint: x\nmax_restarts: many\n" + SEARCHER, "max_restarts", "expected an integer"),
        ("entrypoint: x\nmax_restarts: -1\n" + SEARCHER, "max_restarts", ">= 0"),
        (
            "entrypoint: x\nsearcher: {name: random, metric: l, max_trials: 2, max_length: 1.5}",
            "searcher.max_length",
            "expected {batches|records|epochs: int}",
        ),
        (
            "entrypoint: x\nsearcher: {name: single, metric: l, max_length: {steps: 1}}",
            "searcher.max_length",
            "expected {batches|records|epochs: int}",
        ),
        (
            "entrypoint: x\nsearcher: {name: single, metric: l, max_length: {batches: 0}}",
            "searcher.max_length",
            "expected {batches|records|epochs: int}",
        ),
        (
            "entrypoint: x\nhyperparameters: {lr: {type: log, minval: 1, maxval: 2}}\n" + SEARCHER,
            "hyperparameters.lr.base",
            "required key missing",
        ),
        (
            "entrypoint: x\nhyperparameters: {o: {n: {type: int, minval: 1, maxval: 3}}}\n"
            + "searcher: {name: grid, metric: l, max_length: {batches: 1}}",
            "hyperparameters.o.n.count",
            "required when searcher.name is grid",
        ),
        (
            "entrypoint: x\nhyperparameters: {a: {type: double, minval: 2, maxval: 1}}\n"
            + SEARCHER,
            "hyperparameters.a.maxval",
            "expected maxval >= minval",
        ),
        (
            "entrypoint: x\nhyperparameters: {a: {type: float}}\n" + SEARCHER,
            "hyperparameters.a.type",
            "expected one of const|int|double|log|categorical, got 'float'",
        ),
        (
            "entrypoint: x\nhyperparameters: {a: {type: categorical, vals: []}}\n" + SEARCHER,
            "hyperparameters.a.vals",
            "",
        ),
        (SEARCHER, "entrypoint", "required key missing"),
        ("entrypoint: 7\n" + SEARCHER, "entrypoint", "expected a string"),
        (
            "entrypoint: x\nsearcher: {name: bayes, metric: l}",
            "searcher.name",
            "expected one of single|random|grid|adaptive_asha|tpe, got 'bayes'",
        ),
        ("entrypoint: x\nsearcher: {metric: l}", "searcher.name", "required key missing"),
        (
            "entrypoint: x\nsearcher: {name: random, metric: l, max_length: {batches: 1}}",
            "searcher.max_trials",
            "required key missing",
        ),
        (
            "entrypoint: x\nsearcher: {name: adaptive_asha, metric: l, max_trials: 2}",
            "searcher",
            "max_time",
        ),
        (ASHA + "divisor: 1}", "searcher.divisor", "expected a value > 1"),
        (ASHA_HEAD + "max_trials: 0}", "searcher.max_trials", "expected a value >= 1, got 0"),
        (
            ASHA + "mode: fast}",
            "searcher.mode",
            "expected one of 'aggressive', 'standard' or 'conservative', got 'fast'",
        ),
        (ASHA + "max_time: 9}", "searcher.time_metric", "required when searcher.max_time is set"),
        (
            ASHA + "time_metric: b}",
            "searcher.max_time",
            "required when searcher.time_metric is set",
        ),
        (ASHA + "max_time: 9, time_metric: loss_time}", "searcher.max_length", "not both"),
        (ASHA + "max_time: 9, time_metric: batches}", "searcher.max_length", "not both"),
        (ASHA + "bracket_rungs: [2, 0]}", "searcher.bracket_rungs[1]", ">= 1"),
        (ASHA + "stop_once: maybe}", "searcher.stop_once", "expected true or false"),
        ("entrypoint: x\nresources: {priority: 100}\n" + SEARCHER, "resources.priority", "99"),
        ("entrypoint: x\nresources: {weight: 0}\n" + SEARCHER, "resources.weight", "> 0"),
        (
            "entrypoint: x\nenvironment: {environment_variables: [A=1, B]}\n" + SEARCHER,
            "environment.environment_variables[1]",
            "expected KEY=VALUE, got 'B'",
        ),
        (
            "entrypoint: x\nbind_mounts: [{host_path: data, container_path: /d}]\n" + SEARCHER,
            "bind_mounts[0].host_path",
            "expected an absolute path",
        ),
        (
            "entrypoint: x\ncheckpoint_storage: {type: gcs, bucket: b}\n" + SEARCHER,
            "checkpoint_storage.type",
            "expected one of shared_fs|directory|s3, got 'gcs'",
        ),
        (
            "entrypoint: x\ncheckpoint_storage: {type: shared_fs, host_path: /a,"
            " storage_path: /b}\n" + SEARCHER,
            "checkpoint_storage.storage_path",
            "under host_path",
        ),
        ("entrypoint: x\ncheckpoint_policy: some\n" + SEARCHER, "checkpoint_policy", "'best'"),
        ("- just a list\n", "", "expected a mapping at the top level"),
    ],
)
def test_bad_config_gives_one_line_naming_the_path(text: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment_config(text, "exp.yaml")
    error = info.value
    assert error.path == path
    assert "\n" not in str(error)
    assert str(error).startswith(f"exp.yaml: {path}: " if path else "exp.yaml: ")
    assert message in str(error)


def test_error_message_example_from_the_brief() -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment_config(
            "entrypoint: x\nsearcher: {name: single, metric: l, max_length: five}", "const.yaml"
        )
    assert str(info.value) == ("const.yaml: searcher.max_length: expected "
                               "{batches|records|epochs: int} or an int (batches)")


def test_entrypoint_forms() -> None:
    assert is_trial_class("model_def:MnistTrial")
    assert is_trial_class("pkg.model_def:Trial_2")
    assert not is_trial_class("python3 train.py")
    assert not is_trial_class("model_def:Mnist.Trial")
    assert not is_trial_class(["python3", "train.py"])
    assert entrypoint_argv("model_def:MnistTrial", "/usr/bin/python3") == [
        "/usr/bin/python3",
        "-m",
        "det.harness.run",
        "model_def:MnistTrial",
    ]
    assert entrypoint_argv("python3 train.py --epochs 1", "py") == [
        "sh",
        "-c",
        "python3 train.py --epochs 1",
    ]
    assert entrypoint_argv(["python3", "train.py"], "py") == ["python3", "train.py"]


def test_env_for_device() -> None:
    cfg = load_experiment_config(
        "entrypoint: x\n"
        + "environment: {environment_variables: {cpu: [A=1, A=2, E=], cuda: [G=x=y]}}\n"
        + SEARCHER
    )
    assert env_for_device(cfg.environment, "cpu") == {"A": "2", "E": ""}
    expanded = cfg.expanded()["environment"]
    assert env_for_device(expanded, "cuda") == {"G": "x=y"}
    assert env_for_device({"environment_variables": ["K=V"]}, "cuda") == {"K": "V"}
    assert env_for_device({}, "cpu") == {}
    with pytest.raises(ConfigError) as info:
        env_for_device({"environment_variables": {"cpu": ["OK=1", "=bad"]}}, "cpu")
    assert info.value.path == "environment.environment_variables.cpu[1]"
    assert "'=bad'" in str(info.value)


# Bad input that was accepted, or crashed, before det bounded configs (issue 10, "Bad input").
@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ('entrypoint: x\nsearcher: {name: single, metric: "", max_length: {batches: 1}}',
         "searcher.metric", "expected a non-blank string"),
        ('entrypoint: x\nsearcher: {name: single, metric: "  ", max_length: {batches: 1}}',
         "searcher.metric", "expected a non-blank string"),
        ("entrypoint: x\nhyperparameters: {lr: {type: log, minval: 1, maxval: 2, base: 1}}\n"
         + SEARCHER, "hyperparameters.lr.base", "other than 1"),
        ("entrypoint: x\nhyperparameters: {lr: {type: log, minval: 1, maxval: 2, base: -2}}\n"
         + SEARCHER, "hyperparameters.lr.base", "> 0"),
        ("entrypoint: x\nhyperparameters: {lr: {type: log, minval: 1, maxval: 400, base: 10}}\n"
         + SEARCHER, "hyperparameters.lr.maxval", "10.0 ** 400.0 is not a finite number"),
        ("entrypoint: x\nhyperparameters: {a: {type: double, minval: -1e308, maxval: 1e308}}\n"
         + SEARCHER, "hyperparameters.a.maxval", "maxval - minval is not a finite number"),
        ("entrypoint: x\nhyperparameters: {a: {type: int, minval: 0, maxval: 9223372036854775808}}"
         "\n" + SEARCHER, "hyperparameters.a.maxval", "<= 9223372036854775807"),
        ("entrypoint: x\ndata: {x: .nan}\n" + SEARCHER, "data.x",
         "expected a finite number, got nan"),
        ("entrypoint: x\ndata: {x: [1, 1.0e+400]}\n" + SEARCHER, "data.x[1]", "got inf"),
        ("entrypoint: x\nresources: {weight: .inf}\n" + SEARCHER, "resources.weight", "got inf"),
        ("entrypoint: x\nresources: {weight: -.inf}\n" + SEARCHER, "resources.weight", "got -inf"),
        ("entrypoint: x\nhyperparameters: {a: {type: categorical, vals: [1, .nan]}}\n" + SEARCHER,
         "hyperparameters.a.vals[1]", "finite"),
        ('entrypoint: x\ndescription: "a\\0b"\n' + SEARCHER, "description", "NUL"),
        ('entrypoint: x\nlabels: ["a\\ud800"]\n' + SEARCHER, "labels[0]", "lone surrogate"),
        ('entrypoint: x\ndata: {"k\\0": 1}\n' + SEARCHER, "data", "NUL"),
        ("entrypoint: x\ndata: {.nan: 1}\n" + SEARCHER, "data", "key nan: expected a finite"),
        ("entrypoint: x\ndata: {2001-01-01: 1}\n" + SEARCHER, "data", "got date"),
        ("entrypoint: x\ndata: {x: !!binary aGVsbG8=}\n" + SEARCHER, "data.x", "got bytes"),
        ("entrypoint: x\ndata: {x: 2001-01-01}\n" + SEARCHER, "data.x", "got date"),
        ("entrypoint: x\nname: " + "n" * 256 + "\n" + SEARCHER, "name", "at most 255 characters"),
        ('entrypoint: x\nname: "two\\nlines"\n' + SEARCHER, "name",
         "expected printable text (no line breaks or control characters), got 'two\\nlines'"),
        ("entrypoint: x\ndescription: " + "d" * 5000 + "\n" + SEARCHER, "description",
         "at most 4096 characters"),
        ("entrypoint: x\nlabels: [" + "l" * 256 + "]\n" + SEARCHER, "labels[0]", "at most 255"),
        ("entrypoint: x\nmax_restarts: 2147483648\n" + SEARCHER, "max_restarts",
         "<= 2147483647"),
        ("entrypoint: x\nresources: {slots_per_trial: 2147483648}\n" + SEARCHER,
         "resources.slots_per_trial", "<= 2147483647"),
        ("entrypoint: x\nsearcher: {name: single, metric: l, max_length: {batches: "
         "9223372036854775808}}", "searcher.max_length", "expected {batches|records|epochs: int}"),
        ("entrypoint: x\nhyperparameters: {a: {type: int, minval: 1, maxval: 1000, count: 1000},"
         " b: {type: double, minval: 0, maxval: 1, count: 11}}\n"
         "searcher: {name: grid, metric: l, max_length: {batches: 1}}",
         "hyperparameters", "11000 points; the limit is 10000"),
        ("entrypoint: x\nsearcher: {name: random, metric: l, max_length: {batches: 1}, "
         "max_trials: 10001}", "searcher.max_trials", "<= 10000"),
        # ASHA computes divisor ** rung: these overflowed, or hung the searcher.
        (ASHA + "bracket_rungs: [1000000000]}", "searcher.bracket_rungs[0]", "<= 64"),
        (ASHA + "max_rungs: 65}", "searcher.max_rungs", "<= 64"),
        (ASHA + "divisor: 1.0e+300}", "searcher.divisor", "<= 1024"),
        ("entrypoint: x\nresources: {weight: 1.0e+300}\n" + SEARCHER, "resources.weight",
         "<= 1000000"),
    ],
)
def test_bad_values_are_refused_naming_the_field(text: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment_config(text, "exp.yaml")
    assert info.value.path == path, str(info.value)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"exp.yaml: {path}: ")
    assert message in str(info.value)


def _alias_bomb(levels: int) -> str:
    """The "billion laughs": each level a list of nine aliases of the previous one."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "entrypoint: x\n" + SEARCHER + "data:\n" + "".join(f"  {line}\n" for line in lines)


def _alias_chain(links: int) -> str:
    """Shallow in the text, ``links`` deep once the aliases are expanded."""
    lines = ["a0: &a0 [x]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, links)]
    return "entrypoint: x\n" + SEARCHER + "data:\n" + "".join(f"  {line}\n" for line in lines)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # 9**8 = 43 million values once expanded; pydantic and the JSON encoder used to expand
        # them (the 9-level bomb took 33 s and 1.4 GB).
        (_alias_bomb(8), "more than 100000 values once its aliases are expanded"),
        (_alias_chain(100), "nested deeper than 64 levels once its aliases are expanded"),
        ("entrypoint: x\n" + SEARCHER + "data: {x: " + "[" * 3000 + "]" * 3000 + "}\n",
         "line 3, column 73: nested deeper than 64 levels"),
        ("entrypoint: x\n" + SEARCHER + "data: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
         "nested deeper than 64 levels"),
        ("entrypoint: x\n" + SEARCHER + "data: &d {x: *d}\n", "recursive alias"),
        ("entrypoint: x\0\n" + SEARCHER, "invalid YAML: character 14 is U+0000"),
        ("entrypoint: x\n" + SEARCHER + "data: {s: &s " + "s" * 200_000 + ", l: ["
         + ", ".join(["*s"] * 10) + "]}\n",
         "more than 1 MiB of text once its aliases are expanded"),
        ("entrypoint: x\n" + SEARCHER + "data: {x: " + "x" * (1 << 20) + "}\n",
         "config is 1048664 bytes; the limit is 1 MiB"),
    ],
    ids=["alias-bomb", "alias-chain", "deep-flow-list", "deep-flow-map", "recursive", "nul",
         "big-alias", "big-file"],
)
def test_oversized_yaml_is_refused_naming_the_file(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment_config(text, "exp.yaml")
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("exp.yaml: ")
    assert message in str(info.value)


def test_aliases_within_bounds_still_work() -> None:
    cfg = load_experiment_config(
        "entrypoint: x\n" + SEARCHER
        + "data:\n  base: &b {lr: 0.1, layers: [1, 2]}\n  copy: *b\n  merged: {<<: *b, lr: 1}\n"
    )
    assert cfg.data["copy"] == {"lr": 0.1, "layers": [1, 2]}
    assert cfg.data["merged"] == {"lr": 1, "layers": [1, 2]}


def test_bounds_hold_at_their_limits() -> None:
    cfg = load_experiment_config(
        "entrypoint: x\nname: " + "n" * 255 + "\nmax_restarts: 2147483647\n"
        + "hyperparameters: {lr: {type: log, minval: -300, maxval: 300, base: 10},"
        + " a: {type: int, minval: -9223372036854775808, maxval: 9223372036854775807}}\n"
        + "searcher: {name: random, metric: l, max_trials: 10000, "
        + "max_length: {batches: 9223372036854775807}}\n"
        + "data: {x: " + "[" * 60 + "]" * 60 + "}\n"
    )
    assert len(cfg.name) == 255 and cfg.max_restarts == 2**31 - 1


def test_errors_quoting_input_stay_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment_config('entrypoint: x\ndata: {"a\\x85b": {"\\0": 1}}\n' + SEARCHER,
                               "exp\n.yaml")
    assert info.value.path == "data.a\x85b"
    assert str(info.value) == ("exp\\n.yaml: data.a\\x85b: key '\\x00': expected text "
                               "without NUL characters")


def test_job_change_values() -> None:
    assert job_change("resource-pool", "gpu") == "gpu"
    assert job_change("weight", "2.5") == "2.5"
    assert job_change("priority", "7") == "7"
    assert job_change("ahead-of", "12") == "12"
    assert parse_job_id("12") == 12
    for field, value, message in [
        ("weight", "nan", "weight: expected a finite number, got 'nan'"),
        ("weight", "-inf", "weight: expected a finite number, got '-inf'"),
        ("weight", "1e7", "weight: expected a value <= 1000000.0, got '1e7'"),
        ("priority", "100", "priority: expected an integer between 1 and 99 (lower runs "
         "first), got 100"),
        ("resource-pool", "", "resource-pool: expected a non-empty string"),
        ("resource-pool", "\udcff", "resource-pool: expected valid Unicode text"),
        ("behind-of", "0", "behind-of: expected a value >= 1, got '0'"),
        ("slots", "1", "slots: unknown job field 'slots'"),
    ]:
        with pytest.raises(ConfigError) as info:
            job_change(field, value)
        assert str(info.value).startswith(message)
    with pytest.raises(ConfigError, match="12x: expected a job id, got '12x'"):
        parse_job_id("12x", "12x")


@pytest.mark.parametrize(("text", "message"), [
    ("searcher: {name: single, metric: l, max_lenght: {batches: 1}}",
     "searcher: unknown key 'max_lenght' (did you mean 'max_length'?)"),
    ("searcher: {name: single, metric: l, max_length: 1}\nresources: {slots_per_trail: 2}",
     "resources: unknown key 'slots_per_trail' (did you mean 'slots_per_trial'?)"),
    ("searcher: {name: single, metric: l, max_length: 1}\n"
     "bind_mounts: [{host_path: /a, container_path: /b, readonly: true}]",
     "bind_mounts[0]: unknown key 'readonly' (did you mean 'read_only'?)"),
    ("searcher: {name: single, metric: l, max_length: 1}\nzzz: 1", "unknown key 'zzz'"),
])
def test_an_unknown_key_is_told_the_closest_key_there(text: str, message: str) -> None:
    """Issue 34: a misspelt key got no "did you mean"."""
    with pytest.raises(ConfigError) as e:
        load_experiment_config("entrypoint: x\n" + text, "c.yaml")
    assert str(e.value) == f"c.yaml: {message}"
