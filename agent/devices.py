"""Slot discovery: CUDA devices through NVML where a driver answers, else CPU slots."""

import logging
import os
from dataclasses import asdict, dataclass

log = logging.getLogger("det.agent")


@dataclass(frozen=True)
class Slot:
    """One schedulable device. ``memory_mb`` is the device memory in MiB (None for CPU)."""

    slot_id: int
    type: str
    device_uuid: str | None = None
    device_name: str = ""
    memory_mb: int | None = None

    def as_row(self) -> dict:
        return asdict(self)


def cuda_slots(nvml=None) -> list[Slot]:
    """The host's CUDA devices through NVML (``nvml``: the pynvml module, injectable so tests
    can stand in for the driver); [] when no driver or library answers."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return []
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.info("no CUDA devices: %s", e)
        return []
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid, name = nvml.nvmlDeviceGetUUID(h), nvml.nvmlDeviceGetName(h)
            mem = nvml.nvmlDeviceGetMemoryInfo(h).total // 2**20
            out.append(Slot(i, "cuda", _text(uuid), _text(name), mem))
        return out
    finally:
        nvml.nvmlShutdown()


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def discover(cpu_slots: int | None = None) -> list[Slot]:
    """The slots to register: CUDA devices if any, else ``cpu_slots`` CPU slots (default:
    one per CPU core)."""
    gpus = cuda_slots()
    if gpus:
        return gpus
    n = cpu_slots if cpu_slots is not None else (os.cpu_count() or 1)
    return [Slot(i, "cpu", device_name="cpu") for i in range(n)]
