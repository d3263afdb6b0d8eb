"""The modules Determined 0.38 training code imports beyond ``core`` / ``pytorch`` (issue 38):
``determined.common`` (util, storage, api), ``determined.launch.deepspeed`` / ``horovod`` /
``tensorflow``, ``evaluate_batch(batch)`` without ``batch_idx``, a hand-built
``core.DistributedContext``, ``import determined`` without torch, and ``ruamel.yaml``
installed with det."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from test_api import free_port

from det.errors import DetError
from det.harness.storage import StorageError
from det.harness.trainer import takes_batch_idx
from determined.common import api, storage, util
from determined.common.api import bindings

REPO = Path(__file__).resolve().parent.parent


def _python(code: str, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


def test_import_determined_loads_no_torch() -> None:
    """``determined`` exported ``InvalidHP`` from the torch-importing trial module, so every
    ``import determined`` (a Core API script, the SDK) took 1.66 s of torch; 0.38.1 takes
    0.52 s. The submodules stay lazy: ``determined.common`` loads no torch either."""
    r = _python("import sys, determined, determined.common; import determined.launch; "
                "e = determined.InvalidHP('x'); "
                "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_invalid_hp_is_the_harness_class() -> None:
    """``det.InvalidHP`` raised by user code is the class the trainer catches."""
    import determined
    from det.harness import trial

    assert determined.InvalidHP is trial.InvalidHP


# --- determined.common ----------------------------------------------------------------------

def test_common_util_yaml_as_upstream(tmp_path, capsys) -> None:
    """``yaml`` is ruamel.yaml; ``yaml_safe_load`` / ``yaml_safe_dump`` round-trip; a config
    with a duplicate key makes ``safe_load_yaml_with_exceptions`` print upstream's
    ``Error: invalid experiment config file.`` and exit 1."""
    from ruamel import yaml

    import determined.common

    assert determined.common.yaml is yaml
    doc = {"hyperparameters": {"lr": 0.1, "layers": [1, 2]}, "name": "x"}
    assert util.yaml_safe_load(util.yaml_safe_dump(doc)) == doc
    out = tmp_path / "c.yaml"
    with out.open("w") as f:
        assert util.yaml_safe_dump(doc, f) is None
    assert util.yaml_safe_load(out.read_text()) == doc
    with pytest.raises(SystemExit) as exit_:
        util.safe_load_yaml_with_exceptions("a: 1\nb: 2\na: 3\n")
    assert exit_.value.code == 1
    printed = capsys.readouterr().out
    assert printed.startswith("Error: invalid experiment config file.\nDuplicateKeyError")
    assert "line 3" in printed


def test_common_util_and_api_helpers(monkeypatch) -> None:
    """The master address comes from DET_MASTER, else DET_MASTER_ADDR, else localhost:8080;
    canonical URLs and the other helpers as 0.38.1 gives them."""
    monkeypatch.delenv("DET_MASTER", raising=False)
    monkeypatch.delenv("DET_MASTER_ADDR", raising=False)
    assert util.get_default_master_address() == "localhost:8080"
    monkeypatch.setenv("DET_MASTER_ADDR", "10.0.0.2:9000")
    assert api.get_default_master_url() == "10.0.0.2:9000"
    monkeypatch.setenv("DET_MASTER", "https://det.example")
    assert util.get_default_master_address() == "https://det.example"
    assert api.canonicalize_master_url("det.example") == "http://det.example:8080"
    assert api.canonicalize_master_url("https://det.example/") == "https://det.example:443"
    with pytest.raises(ValueError, match="must not contain username"):
        api.canonicalize_master_url("http://u:p@det.example")
    assert util.sizeof_fmt(1536) == "1.5KB" and util.sizeof_fmt(3 * 2**20) == "3.0MB"
    assert [list(c) for c in util.chunks([1, 2, 3, 4, 5], 2)] == [[1, 2], [3, 4], [5]]
    assert util.strtobool("on") and util.strtobool("anything") and not util.strtobool("0")
    monkeypatch.setenv("DET_DEBUG", "true")
    assert util.debug_mode()


def test_common_api_bindings_states_and_errors() -> None:
    """Scripts compare ``wait()``'s state with ``bindings.experimentv1State.COMPLETED`` and
    print states without the ``STATE_`` prefix; ``api.errors`` carry ``message``."""
    assert bindings.experimentv1State("STATE_COMPLETED") is bindings.experimentv1State.COMPLETED
    assert str(bindings.trialv1State.STOPPING_CANCELED) == "STOPPING_CANCELED"
    assert str(bindings.checkpointv1State.PARTIALLY_DELETED) == "PARTIALLY_DELETED"
    e = api.errors.NotFoundException("experiment 7 not found")
    assert isinstance(e, api.errors.APIException) and e.status_code == 404
    assert str(e) == e.message == "experiment 7 not found"


def test_common_storage_round_trip(tmp_path) -> None:
    """``storage.build`` of a shared_fs section stores, restores, downloads and deletes a
    directory under ``<host_path>/<storage_path>/<name>`` (det's checkpoint storage)."""
    manager = storage.build({"type": "shared_fs", "host_path": str(tmp_path / "ckpt"),
                             "storage_path": "sub", "save_trial_best": 1}, None)
    assert isinstance(manager, storage.SharedFSStorageManager)
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "w.bin").write_bytes(b"weights")
    manager.upload(src, "run-1")
    assert (tmp_path / "ckpt" / "sub" / "run-1" / "d" / "w.bin").read_bytes() == b"weights"
    with manager.store_path("run-2") as path:
        (path / "m.json").write_text("{}")
    with manager.restore_path("run-2") as path:
        assert (path / "m.json").read_text() == "{}"
    manager.download("run-1", tmp_path / "out")
    assert (tmp_path / "out" / "d" / "w.bin").read_bytes() == b"weights"
    assert manager.delete("run-1", ["**/*"]) == {}
    assert not (tmp_path / "ckpt" / "sub" / "run-1").exists()
    with pytest.raises(StorageError, match="run-1"):
        manager.download("run-1", tmp_path / "again")
    directory = storage.build({"type": "directory"}, str(tmp_path / "container"))
    assert isinstance(directory, storage.DirectoryStorageManager)
    assert directory.base_path == str(tmp_path / "container")


def test_common_storage_refuses_bad_sections() -> None:
    """Each bad section names what is wrong: no type, a type det does not store to, a missing
    key; partial deletes are refused (det deletes whole directories)."""
    with pytest.raises(ValueError, match="Missing 'type'"):
        storage.build({}, None)
    with pytest.raises(TypeError, match="Unknown storage type: gcs"):
        storage.build({"type": "gcs", "bucket": "b"}, None)
    with pytest.raises(ValueError, match="checkpoint_storage.host_path"):
        storage.build({"type": "shared_fs"}, None)
    manager = storage.build({"type": "directory", "container_path": "/nonexistent"}, None)
    with pytest.raises(ValueError, match="globs"):
        manager.delete("x", ["*.bin"])


# --- determined.launch ----------------------------------------------------------------------

@pytest.mark.parametrize("launcher,package", [("deepspeed", "deepspeed"),
                                              ("horovod", "horovod"),
                                              ("tensorflow", "tensorflow")])
def test_framework_launcher_without_its_package_says_so_in_one_line(launcher, package) -> None:
    """0.38 entrypoints ``python3 -m determined.launch.<launcher> ...`` failed with 'No module
    named determined.launch.<launcher>'; where the framework is not installed, the launcher
    now prints one line naming the package and exits 1."""
    if subprocess.run([sys.executable, "-c", f"import {package}"],
                      capture_output=True).returncode == 0:
        pytest.skip(f"{package} is installed here")
    r = subprocess.run([sys.executable, "-m", f"determined.launch.{launcher}", "train.py"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"determined.launch.{launcher}: the {package} package is not "
                               "installed")
    assert f"pip install {package}" in lines[0]


# --- determined.pytorch ---------------------------------------------------------------------

def test_takes_batch_idx_as_upstreams_has_param() -> None:
    """``evaluate_batch`` gets ``batch_idx`` when it names it or takes a second positional
    parameter (0.38.1's ``has_param(fn, "batch_idx", 2)`` on the bound method)."""
    class T:
        def both(self, batch, batch_idx):
            return {}

        def batch_only(self, batch):
            return {}

        def renamed(self, batch, i):
            return {}

        def keyword(self, batch, *, batch_idx=0):
            return {}

    t = T()
    assert takes_batch_idx(t.both) and takes_batch_idx(t.renamed) and takes_batch_idx(t.keyword)
    assert not takes_batch_idx(t.batch_only)


BATCH_ONLY_TRIAL = """
import logging

import torch
from torch.utils.data import TensorDataset

from determined import pytorch


class BatchOnlyTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(1, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.0))

    def build_training_data_loader(self):
        return pytorch.DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=4)

    def build_validation_data_loader(self):
        x = torch.arange(8, dtype=torch.float32).reshape(8, 1)
        return pytorch.DataLoader(TensorDataset(x), batch_size=4)

    def train_batch(self, batch, epoch_idx, batch_idx):
        loss = self.model(batch[0]).sum() * 0
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        return {"mean_x": batch[0].mean()}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    with pytorch.init(hparams={"global_batch_size": 4}) as train_context:
        trainer = pytorch.Trainer(BatchOnlyTrial(train_context), train_context)
        trainer.fit(max_length=pytorch.Batch(1), checkpoint_policy="none")
    print("validated")
"""


def test_evaluate_batch_without_batch_idx_validates(tmp_path) -> None:
    """A trial whose ``evaluate_batch(self, batch)`` has no ``batch_idx`` (0.38 accepts both)
    failed with 'takes 2 positional arguments but 3 were given'; it validates now."""
    script = tmp_path / "batch_only.py"
    script.write_text(BATCH_ONLY_TRIAL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env["HOME"] = str(tmp_path / "home")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "validated" in r.stdout
    assert "'mean_x': 3.5" in r.stderr, r.stderr  # (1.5 + 5.5) / 2


# --- determined.core.DistributedContext -----------------------------------------------------

HAND_BUILT = """
import sys

from determined import core

rank, port = int(sys.argv[1]), int(sys.argv[2])
dist = core.DistributedContext(rank=rank, size=2, local_rank=rank, local_size=2,
                               cross_rank=0, cross_size=1, pub_port=port)
print(dist.allgather(rank * 10), dist.broadcast(f"from {rank}"), dist.allgather_local(rank),
      flush=True)
dist.close()
"""


def test_hand_built_distributed_context_needs_no_torch_distributed_setup(tmp_path) -> None:
    """0.38.1's ``core.DistributedContext(rank=..., size=..., ...)`` built by hand in two
    processes (no launcher, no ``init_process_group`` by the user) gathers and broadcasts:
    det's failed with 'Default process group has not been initialized'."""
    script = tmp_path / "hand_built.py"
    script.write_text(HAND_BUILT)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env["DET_RENDEZVOUS_TIMEOUT"] = "120"
    workers = [subprocess.Popen([sys.executable, str(script), str(r), str(port)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for r in (0, 1)]
    outs = [w.communicate(timeout=240) for w in workers]
    for w, (_, err) in zip(workers, outs, strict=True):
        assert w.returncode == 0, err
    assert [out.strip() for out, _ in outs] == ["[0, 10] from 0 [0, 1]"] * 2


def test_hand_built_context_across_agents_needs_chief_ip() -> None:
    """Workers on several agents must be told where the chief is (upstream asserts the
    same); a single worker needs nothing."""
    from determined import core

    with pytest.raises(DetError, match="chief_ip is required"):
        core.DistributedContext(rank=1, size=4, local_rank=1, local_size=2, cross_rank=0,
                                cross_size=2)
    one = core.DistributedContext(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0,
                                  cross_size=1, chief_ip="10.0.0.1")
    assert one.allgather("x") == ["x"] and one.chief_ip == "10.0.0.1"


# --- installed with det ---------------------------------------------------------------------

def test_what_upstreams_determined_installs_for_user_code_is_a_dependency_of_det() -> None:
    """0.38.1's ``determined`` requires ruamel.yaml (9 of the 10 patched upstream examples
    imported it), filelock and requests (examples' data loaders); det's package lists them,
    and they import here."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in deps}
    assert {"ruamel.yaml", "filelock", "requests"} <= names
    r = _python("import ruamel.yaml, filelock, requests")
    assert r.returncode == 0, r.stderr


# --- determined.pytorch.experimental --------------------------------------------------------

BATCH_PROCESS = """
import json
import sys

import torch
from torch.utils.data import TensorDataset

from determined import core
from determined.pytorch import experimental


class Doubler(experimental.TorchBatchProcessor):
    def __init__(self, context):
        self.context = context
        self.model = context.prepare_model_for_inference(torch.nn.Identity())
        self.rows = []

    def process_batch(self, batch, batch_idx):
        x = self.context.to_device(batch[0])
        self.rows.append([batch_idx, (self.model(x) * 2).flatten().tolist()])

    def on_checkpoint_start(self):
        with self.context.upload_path() as path:
            n = len(list(path.iterdir()))
            (path / f"part_{n}.json").write_text(json.dumps(self.rows))
        self.rows = []

    def on_finish(self):
        print("finished", self.context.get_distributed_rank(), flush=True)


rank, size, port = (int(a) for a in sys.argv[1:4])
dist = None
if size > 1:
    dist = core.DistributedContext(rank=rank, size=size, local_rank=rank, local_size=size,
                                   cross_rank=0, cross_size=1, pub_port=port)
dataset = TensorDataset(torch.arange(10, dtype=torch.float32).reshape(10, 1))
experimental.torch_batch_process(Doubler, dataset, batch_size=2, checkpoint_interval=2,
                                 distributed_context=dist)
"""


def _batch_outputs(home: Path) -> dict[str, list]:
    """``{rank_N: [[batch_idx, values], ...]}`` of the one run's uploaded parts, and the
    checkpoints' ``batch_completed`` values under ``checkpoints``."""
    root = home / ".local" / "share" / "determined"
    out: dict[str, list] = {"checkpoints": []}
    for ckpt in root.iterdir():
        if (ckpt / "batch_completed.json").exists():
            out["checkpoints"].append(
                json.loads((ckpt / "batch_completed.json").read_text())["batch_completed"])
        for rank_dir in ckpt.glob("rank_*"):
            parts = sorted(rank_dir.iterdir())
            out[rank_dir.name] = [row for p in parts for row in json.loads(p.read_text())]
    out["checkpoints"].sort()
    return out


@pytest.mark.parametrize("size", [1, 2])
def test_torch_batch_process_shards_checkpoints_and_uploads(size, tmp_path) -> None:
    """10 records in batches of 2, checkpoint every 2 batches: one worker processes batches
    0-4 and checkpoints after 2, 4 and 5 batches; two hand-built workers take batches
    alternately (rank 0: records 0-1, 4-5, 8-9; rank 1: 2-3, 6-7) and checkpoint the least
    batches done (2, then 3). Each worker's uploads land under <uuid>/rank_<rank>."""
    script = tmp_path / "batch_process.py"
    script.write_text(BATCH_PROCESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env.update(HOME=str(tmp_path / "home"), DET_RENDEZVOUS_TIMEOUT="120")
    env.pop("XDG_DATA_HOME", None)
    port = free_port()
    workers = [subprocess.Popen([sys.executable, str(script), str(r), str(size), str(port)],
                                env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for r in range(size)]
    for r, w in enumerate(workers):
        out, err = w.communicate(timeout=240)
        assert w.returncode == 0, err
        assert f"finished {r}" in out
    outputs = _batch_outputs(tmp_path / "home")
    if size == 1:
        assert outputs == {"checkpoints": [2, 4, 5], "rank_0": [
            [0, [0.0, 2.0]], [1, [4.0, 6.0]], [2, [8.0, 10.0]], [3, [12.0, 14.0]],
            [4, [16.0, 18.0]]]}
    else:
        assert outputs == {"checkpoints": [2, 3],
                           "rank_0": [[0, [0.0, 2.0]], [1, [8.0, 10.0]], [2, [16.0, 18.0]]],
                           "rank_1": [[0, [4.0, 6.0]], [1, [12.0, 14.0]]]}


def test_torch_batch_process_refuses_loader_arguments_that_break_sharding() -> None:
    """Upstream's rules, each naming the argument."""
    from determined.pytorch import experimental

    class Nothing(experimental.TorchBatchProcessor):
        def __init__(self, context):
            pass

        def process_batch(self, batch, batch_idx):
            pass

    with pytest.raises(ValueError, match="'shuffle' must be false"):
        experimental.torch_batch_process(Nothing, [1, 2], dataloader_kwargs={"shuffle": True})
    with pytest.raises(ValueError, match="'sampler'"):
        experimental.torch_batch_process(Nothing, [1, 2], dataloader_kwargs={"sampler": []})
    with pytest.raises(ValueError, match="checkpoint_interval"):
        experimental.torch_batch_process(Nothing, [1, 2], checkpoint_interval=0)
