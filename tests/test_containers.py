"""The docker runtime's pure parts: what a task container is made of, and why it ended.

GPU discovery runs against a stand-in for NVML at its boundary (the pynvml calls) only; the
slots it yields go through the real container configuration.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from psycopg.types.json import Jsonb

from det.agent.containers import (
    DEFAULT_SHM_BYTES,
    HARNESS_DIR,
    LABEL_AGENT,
    LABEL_ALLOCATION,
    WORKDIR,
    container_config,
    end_reason,
    image_for,
)
from det.agent.devices import Slot, cuda_slots, discover
from det.agent.image import DEFAULT_IMAGE
from det.agent.runtime import Launch
from det.configs.allocation import AllocationSpec
from det.errors import DetError


class FakeNVML:
    """pynvml's surface as two CUDA devices would answer it."""

    def __init__(self, uuids: list[str]) -> None:
        self.uuids = uuids
        self.shut = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return self.uuids[h].encode()

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H100"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=80 * 2**30)


def make_spec(**keys) -> AllocationSpec:
    """An allocation spec with defaults for every key but ``keys``."""
    return AllocationSpec.parse({"kind": "trial", "entrypoint": "true", "environment": {},
                                 "bind_mounts": [], "resources": {}, "checkpoint_storage": None,
                                 "context_id": None, "experiment_id": 1, "trial_id": 1, **keys},
                                7)


def config_for(slots: list[Slot], spec: dict | None = None,
               url: str = "postgresql://postgres@/det?host=/tmp/pgsock") -> dict:
    launch = Launch(7, ["python3", "-m", "det.harness.run"], {"DET_ALLOCATION_ID": "7"},
                    Path("/var/det/tasks/7"), make_spec(**(spec or {})), slots)
    return container_config(launch, agent_id="a1", image="img:1", db_url=url,
                            harness_dir=Path("/src/det"))


def mounts(config: dict) -> dict[str, tuple[str, bool]]:
    return {m["Target"]: (m["Source"], m["ReadOnly"]) for m in config["mounts"]}


def test_cuda_slots_reach_the_container_as_device_requests_by_uuid() -> None:
    nvml = FakeNVML(["GPU-aaa", "GPU-bbb"])
    slots = cuda_slots(nvml)
    assert nvml.shut
    assert [(s.slot_id, s.type, s.device_uuid, s.memory_mb) for s in slots] == [
        (0, "cuda", "GPU-aaa", 80 * 1024), (1, "cuda", "GPU-bbb", 80 * 1024)]
    config = config_for([slots[1]])
    [request] = config["device_requests"]
    assert request["DeviceIDs"] == ["GPU-bbb"] and request["Capabilities"] == [["gpu"]]
    assert "cpu_shares" not in config


def test_a_driver_that_does_not_answer_means_no_cuda_slots() -> None:
    class NoDriver(FakeNVML):
        def nvmlInit(self) -> None:
            raise RuntimeError("NVML Shared Library Not Found")

    assert cuda_slots(NoDriver([])) == []


def test_the_slot_type_chooses_what_a_gpu_host_offers(caplog) -> None:
    """``--slot-type`` (the reference agent's ``slot_type``): auto takes the GPUs where any
    answer, cpu offers ``--slots`` CPU slots even so, none offers nothing, cuda insists."""
    gpus = FakeNVML(["GPU-aaa"])
    assert [s.type for s in discover(4, "auto", gpus)] == ["cuda"]
    assert "--slots 4 left unused: this host offers its 1 CUDA device(s)" in caplog.text
    assert [s.type for s in discover(4, "cuda", gpus)] == ["cuda"]
    assert [(s.slot_id, s.type) for s in discover(3, "cpu", gpus)] == [
        (0, "cpu"), (1, "cpu"), (2, "cpu")]
    assert discover(4, "none", gpus) == []
    assert [s.type for s in discover(2, "auto", FakeNVML([]))] == ["cpu", "cpu"]
    with pytest.raises(DetError, match="--slot-type cuda: no CUDA device"):
        discover(2, "cuda", FakeNVML([]))
    with pytest.raises(DetError, match="--slot-type: expected one of auto, cuda, cpu, none"):
        discover(2, "gpus", gpus)


def test_cpu_slots_get_a_cpu_share_and_the_defaults() -> None:
    config = config_for([Slot(0, "cpu"), Slot(1, "cpu")])
    assert config["cpu_shares"] == 2048 and "device_requests" not in config
    assert config["shm_size"] == DEFAULT_SHM_BYTES and "mem_limit" not in config
    assert config["network_mode"] == "host" and config["init"] is True
    assert config["working_dir"] == WORKDIR
    assert config["labels"] == {LABEL_ALLOCATION: "7", LABEL_AGENT: "a1"}
    assert config["environment"] == {"DET_ALLOCATION_ID": "7", "PYTHONPATH": HARNESS_DIR}
    assert config["command"][-3:] == ["python3", "-m", "det.harness.run"]


def test_the_tls_files_of_the_database_url_are_mounted_read_only() -> None:
    """A remote agent's tasks verify det's gateway with its CA: the file the URL names must be
    there in the container, at the same path."""
    url = ("postgresql://det_task:pw@10.0.0.1:5433/det?sslmode=verify-full"
           "&sslrootcert=/home/a/ca.crt&sslcert=/home/a/c.crt&sslkey=/home/a/c.key")
    m = mounts(config_for([Slot(0, "cpu")], url=url))
    assert {k: v for k, v in m.items() if k.startswith("/home/a")} == {
        "/home/a/ca.crt": ("/home/a/ca.crt", True), "/home/a/c.crt": ("/home/a/c.crt", True),
        "/home/a/c.key": ("/home/a/c.key", True)}
    # a URL over the socket names none; "system" (the OS store) is no path
    assert not any(k.endswith(".crt") for k in mounts(config_for([Slot(0, "cpu")])))
    url = "postgresql://u@db/det?sslmode=verify-full&sslrootcert=system"
    assert "system" not in mounts(config_for([Slot(0, "cpu")], url=url))


def test_mounts_context_harness_socket_storage_and_the_users_bind_mounts() -> None:
    spec = {
        "bind_mounts": [{"host_path": "/data", "container_path": "/mnt/data", "read_only": True},
                        {"host_path": "/cache", "container_path": "cache"}],
        "checkpoint_storage": {"type": "shared_fs", "host_path": "/ckpt"},
        "resources": {"shm_size": 2**30, "memory_limit": 2**31},
    }
    config = config_for([Slot(0, "cpu")], spec)
    assert mounts(config) == {
        WORKDIR: ("/var/det/tasks/7", False),
        f"{HARNESS_DIR}/det": ("/src/det", True),
        "/tmp/pgsock": ("/tmp/pgsock", False),
        "/ckpt": ("/ckpt", False),
        "/mnt/data": ("/data", True),
        f"{WORKDIR}/cache": ("/cache", False),
    }
    assert config["shm_size"] == 2**30 and config["mem_limit"] == 2**31


def test_a_tcp_database_needs_no_socket_mount() -> None:
    config = config_for([], url="postgresql://det@db.example:5432/det")
    assert set(mounts(config)) == {WORKDIR, f"{HARNESS_DIR}/det"}
    assert "cpu_shares" not in config  # a zero-slot task gets no CPU weight of its own


def test_image_per_device_type_or_the_default() -> None:
    assert image_for(make_spec(), "cpu") == DEFAULT_IMAGE
    spec = make_spec(environment={"image": {"cpu": "my/cpu:1", "cuda": None}})
    assert image_for(spec, "cpu") == "my/cpu:1"
    assert image_for(spec, "cuda") == DEFAULT_IMAGE


def test_end_reasons_a_user_can_read() -> None:
    assert end_reason({"ExitCode": 0}, killed=False) is None
    assert end_reason({"ExitCode": 3}, killed=False) is None
    assert "out of memory" in end_reason({"ExitCode": 137, "OOMKilled": True}, killed=False)
    assert end_reason({"ExitCode": 137}, killed=False) == "killed by signal SIGKILL"
    assert end_reason({"ExitCode": 137}, killed=True) == "killed on request"
    assert end_reason({"ExitCode": 127, "Error": "exec failed"}, killed=False) == (
        "container error: exec failed")


def test_discovered_cuda_slots_are_listed_with_uuid_and_memory(det, conn) -> None:
    slots = cuda_slots(FakeNVML(["GPU-aaa", "GPU-bbb"]))
    conn.execute("SELECT det_agent.register('gpu-host', 'gpu-host', 'default', 'docker', %s)",
                 (Jsonb([s.as_row() for s in slots]),))
    listed = json.loads(det("slot", "list", "--json").stdout)
    assert [(s["slot_id"], s["type"], s["device_uuid"], s["memory_mb"]) for s in listed] == [
        (0, "cuda", "GPU-aaa", 81920), (1, "cuda", "GPU-bbb", 81920)]
    assert "GPU-bbb" in det("slot", "list").stdout
