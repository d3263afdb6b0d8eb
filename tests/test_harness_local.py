"""det.harness without a database: LocalTransport, the Trainer loop, local runs, the digits
example. Nothing here needs PostgreSQL."""

import pathlib
from typing import Any

import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from det.configs import load_experiment_config
from det.errors import ConfigError
from det.harness import core, pytorch
from det.harness.entrypoint import load_trial_class
from det.harness.errors import (
    EntrypointError,
    MissingSearcherMetricError,
    TaskEnvironmentError,
    TrialCodeError,
)
from det.harness.lengths import UnitConverter
from det.harness.local import local_hparams, run_local
from det.harness.run import main as run_main
from det.harness.transport import LocalTransport

DIGITS = pathlib.Path(__file__).resolve().parent.parent / "examples" / "digits"


def expanded(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with every default filled, as the harness gets it from det."""
    return load_experiment_config(yaml.safe_dump(config)).expanded()


def digits_config(name: str = "const", **overrides: Any) -> dict[str, Any]:
    config = yaml.safe_load((DIGITS / f"{name}.yaml").read_text())
    config.update(overrides)
    return expanded(config)


@pytest.fixture(scope="module")
def digits_trial() -> type[pytorch.PyTorchTrial]:
    return load_trial_class("model_def:DigitsTrial", DIGITS)


def fit(
    trial_class: type[pytorch.PyTorchTrial],
    config: dict[str, Any],
    hparams: dict[str, Any],
    storage: pathlib.Path,
    transport: LocalTransport | None = None,
    **kwargs: Any,
) -> tuple[pytorch.Trainer, LocalTransport, str]:
    transport = transport or LocalTransport(config, hparams, echo=False, **kwargs)
    with core.init(
        transport=transport, checkpoint_storage={"type": "shared_fs", "host_path": str(storage)}
    ) as ctx:
        trainer = pytorch.Trainer(trial_class, ctx)
        outcome = trainer.fit()
    return trainer, transport, outcome


def test_digits_test_mode(capsys: pytest.CaptureFixture[str]) -> None:
    run_local(digits_config("random"), DIGITS, test_mode=True)
    out = capsys.readouterr().out
    assert "restored" in out and "test mode passed" in out


def test_digits_const_reaches_90_percent(
    digits_trial: type[pytorch.PyTorchTrial], tmp_path: pathlib.Path
) -> None:
    config = digits_config(searcher={**digits_config()["searcher"], "max_length": {"batches": 300}})
    hparams = local_hparams(config["hyperparameters"])
    trainer, transport, outcome = fit(digits_trial, config, hparams, tmp_path)
    assert outcome == "completed" and trainer.batches_trained == 300
    ((op_id, accuracy),) = transport.completed_ops
    assert accuracy >= 0.90
    validations = [(s, m) for g, s, m in transport.metrics if g == "validation"]
    assert [s for s, _ in validations] == [100, 200, 300]
    # epochs completed, as 0.38.1 counts them (300 batches are 6.x passes over the data)
    assert validations[-1][1]["batches"] == 300 and validations[-1][1]["epochs"] == 6
    (uuid, steps, resources, metadata), = transport.checkpoints
    assert steps == 300 and metadata["steps_completed"] == 300
    # Determined's layout: the state, what the trial is, and its code
    assert {"state_dict.pth", "load_data.json", "metadata.json"} <= set(resources)
    assert resources["state_dict.pth"] == (tmp_path / uuid / "state_dict.pth").stat().st_size
    assert all(r.startswith("code/") for r in set(resources) - {
        "state_dict.pth", "load_data.json", "metadata.json"})


def test_restore_resumes_at_same_step_with_identical_state(
    digits_trial: type[pytorch.PyTorchTrial], tmp_path: pathlib.Path
) -> None:
    # 256 records per batch: 5 batches per epoch, so 12 batches cross two epoch ends (StepLR,
    # reshuffle) and the checkpoint at 7 sits mid-epoch; dropout exercises the RNG state.
    config = digits_config(scheduling_unit=4, min_validation_period={"batches": 3})
    hparams = {"global_batch_size": 256, "lr": 0.003, "hidden": 32, "dropout": 0.3}
    straight, _, _ = fit(digits_trial, config, hparams, tmp_path, ops=[12])
    first, t1, _ = fit(digits_trial, config, hparams, tmp_path, ops=[7])
    uuid = first.latest_checkpoint_uuid
    resumed, t2, outcome = fit(
        digits_trial, config, hparams, tmp_path, ops=[12], latest_checkpoint=uuid,
        steps_completed=7,
    )
    assert outcome == "completed" and resumed.batches_trained == 12
    assert [s for g, s, _ in t2.metrics if g == "training"] == [8, 12]
    assert (resumed.epoch_idx, resumed.batch_in_epoch) == (straight.epoch_idx, 2)
    for a, b in zip(straight.context.models, resumed.context.models, strict=True):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert torch.equal(x, y), name
    opt_a, opt_b = straight.context.optimizers[0], resumed.context.optimizers[0]
    assert opt_a.param_groups[0]["lr"] == opt_b.param_groups[0]["lr"] == 0.003
    assert t1.checkpoints[0][1] == 7


def test_a_checkpoint_written_on_a_gpu_host_loads_and_resumes_on_one_without(
    digits_trial: type[pytorch.PyTorchTrial], tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A trial trained on a GPU agent is downloaded to a laptop, or resumed on a CPU agent. The
    # checkpoint is rewritten as a GPU host writes it: each tensor's storage tagged cuda:0.
    config = digits_config(min_validation_period={"batches": 5})
    hparams = {"global_batch_size": 64, "lr": 0.003, "hidden": 32, "dropout": 0.3}
    first, _, _ = fit(digits_trial, config, hparams, tmp_path, ops=[5])
    uuid = first.latest_checkpoint_uuid
    state_file = tmp_path / uuid / "state_dict.pth"
    state = torch.load(state_file, weights_only=False)
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(state, state_file)
    if not torch.cuda.is_available():  # the rewritten file reads as a GPU host's would
        with pytest.raises(RuntimeError, match="CUDA device"):
            torch.load(state_file, weights_only=False)

    trial = pytorch.load_trial_from_checkpoint_path(tmp_path / uuid)
    loaded = trial.context.models[0].state_dict()
    for name, x in first.context.models[0].state_dict().items():
        assert torch.equal(x.cpu(), loaded[name].cpu()), name
        assert loaded[name].device == trial.context.device, name

    resumed, transport, outcome = fit(digits_trial, config, hparams, tmp_path, ops=[10],
                                      latest_checkpoint=uuid, steps_completed=5)
    assert outcome == "completed" and resumed.batches_trained == 10
    assert [s for g, s, _ in transport.metrics if g == "validation"] == [10]


class CountingTrial(pytorch.PyTorchTrial):
    """A linear model on 40 records (10 batches of 4); records every batch index trained."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(2, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))
        self.seen: list[int] = []
        data = torch.arange(80, dtype=torch.float32).reshape(40, 2) / 80
        self.data = TensorDataset(data, data.sum(dim=1, keepdim=True))

    def build_training_data_loader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=7)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
        assert batch_idx == self.context.current_train_batch() == len(self.seen)
        self.seen.append(batch_idx)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return loss

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        return {"mse": torch.nn.functional.mse_loss(self.model(x), y)}


def counting_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "entrypoint": "test:CountingTrial",
        "hyperparameters": {"global_batch_size": 4},
        "searcher": {"name": "single", "metric": "mse", "max_length": {"batches": 10}},
        "scheduling_unit": 5,
    }
    config.update(overrides)
    return expanded(config)


class OpRecorder(LocalTransport):
    """Records how many batches the trial had trained when each op completed."""

    trainer: pytorch.Trainer | None = None
    at_completion: list[int]

    def complete_op(self, op_id: int, metric: float) -> None:
        assert self.trainer is not None
        self.at_completion.append(self.trainer.batches_trained)
        super().complete_op(op_id, metric)


def test_never_trains_past_an_op_length(tmp_path: pathlib.Path) -> None:
    config = counting_config(
        min_validation_period={"batches": 4}, min_checkpoint_period={"batches": 6}
    )
    transport = OpRecorder(config, {"global_batch_size": 4}, echo=False, ops=[3, 10, 17])
    transport.at_completion = []
    with core.init(transport=transport, checkpoint_storage={"type": "shared_fs",
                                                             "host_path": str(tmp_path)}) as ctx:
        trainer = transport.trainer = pytorch.Trainer(CountingTrial, ctx)
        assert trainer.fit() == "completed"
    assert transport.at_completion == [3, 10, 17]
    assert trainer.trial.seen == list(range(17))  # type: ignore[union-attr]
    steps = {
        g: [s for gg, s, _ in transport.metrics if gg == g] for g in ("training", "validation")
    }
    assert steps["training"] == [3, 5, 10, 15, 17]
    assert steps["validation"] == [3, 7, 10, 14, 17]
    assert [c[1] for c in transport.checkpoints] == [6, 12, 17]
    assert trainer.epoch_idx == 1


def test_op_length_in_records_is_converted_to_batches(tmp_path: pathlib.Path) -> None:
    config = counting_config(
        searcher={"name": "single", "metric": "mse", "max_length": {"records": 10}})
    trainer, transport, _ = fit(CountingTrial, config, {"global_batch_size": 4}, tmp_path)
    assert trainer.batches_trained == 3  # ceil(10 / 4)
    assert transport.progress[-1] == (1, 12.0)  # records


def test_missing_searcher_metric_names_it(tmp_path: pathlib.Path) -> None:
    config = counting_config(
        searcher={"name": "single", "metric": "accuracy", "max_length": {"batches": 2}})
    with pytest.raises(MissingSearcherMetricError, match="'accuracy'.*batches, epochs, mse"):
        fit(CountingTrial, config, {"global_batch_size": 4}, tmp_path)


def test_preemption_checkpoints_and_stops(tmp_path: pathlib.Path) -> None:
    class PreemptAfter(LocalTransport):
        """The trainer asks before each batch: true from the 4th question, i.e. after 3."""

        calls = 0

        def should_preempt(self) -> bool:
            self.calls += 1
            return self.calls >= 4

    config = counting_config()
    transport = PreemptAfter(config, {"global_batch_size": 4}, echo=False)
    trainer, _, outcome = fit(CountingTrial, config, {}, tmp_path, transport=transport)
    assert outcome == "preempted" and trainer.batches_trained == 3
    assert transport.preemption_acknowledged
    assert [c[1] for c in transport.checkpoints] == [3] and not transport.completed_ops


def test_stop_requested_validates_checkpoints_and_exits_early(tmp_path: pathlib.Path) -> None:
    class StopAtTwo(CountingTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            self.context.set_stop_requested(batch_idx == 1)
            return super().train_batch(batch, epoch_idx, batch_idx)

    trainer, transport, outcome = fit(StopAtTwo, counting_config(), {"global_batch_size": 4},
                                      tmp_path)
    assert outcome == "stopped" and trainer.batches_trained == 2
    assert transport.early_exit == "user_requested_stop"
    assert [s for g, s, _ in transport.metrics if g == "validation"] == [2]


def test_lengths_and_hparams() -> None:
    units = UnitConverter(global_batch_size=32, records_per_epoch=1000)
    assert units.to_batches(100, "records") == 4
    assert units.to_batches(2, "epochs") == 63  # ceil(2000 / 32)
    with pytest.raises(ConfigError, match="global_batch_size"):
        UnitConverter(None, None).to_batches(10, "records")
    specs = {
        "a": 3, "b": {"type": "const", "val": "x"}, "c": {"type": "int", "minval": 1, "maxval": 4},
        "d": {"type": "log", "base": 10, "minval": -3, "maxval": -1},
        "e": {"type": "categorical", "vals": [7, 8]}, "f": {"g": {"type": "double", "minval": 0,
                                                                "maxval": 1}},
    }
    assert local_hparams(specs) == {"a": 3, "b": "x", "c": 2, "d": 0.01, "e": 7, "f": {"g": 0.5}}


def test_entrypoint_errors_and_user_code_errors(tmp_path: pathlib.Path) -> None:
    (tmp_path / "bad_trials.py").write_text(
        "from det.harness import pytorch\n"
        "class NotATrial:\n    pass\n"
        "class Broken(pytorch.PyTorchTrial):\n"
        "    def __init__(self, context):\n        raise RuntimeError('boom in init')\n"
        "    build_training_data_loader = build_validation_data_loader = train_batch = None\n"
    )
    with pytest.raises(EntrypointError, match="module 'missing_mod' not found"):
        load_trial_class("missing_mod:X", tmp_path)
    with pytest.raises(EntrypointError, match="no attribute 'Nope'"):
        load_trial_class("bad_trials:Nope", tmp_path)
    with pytest.raises(EntrypointError, match="not a subclass"):
        load_trial_class("bad_trials:NotATrial", tmp_path)
    config = counting_config(entrypoint="bad_trials:Broken")
    with pytest.raises(TrialCodeError, match="RuntimeError: boom in init"):
        run_local(config, tmp_path, test_mode=True)


def test_run_entrypoint_without_task_env(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(DIGITS)
    for name in ("DET_DB_URL", "DET_ALLOCATION_ID", "DET_ALLOCATION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    assert run_main(["model_def:DigitsTrial"]) == 1
    assert TaskEnvironmentError.__name__ in capsys.readouterr().err
