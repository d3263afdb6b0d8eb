"""Slot discovery: CUDA devices through NVML where a driver answers, else CPU slots, or the
kind ``det agent run --slot-type`` asks for."""

import logging
import os
from dataclasses import asdict, dataclass

from det.errors import DetError

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


SLOT_TYPES = ("auto", "cuda", "cpu", "none")
"""Values of ``det agent run --slot-type`` (the reference agent's ``slot_type``)."""


def check_slot_type(slot_type: str) -> None:
    """Raises ``DetError`` naming ``--slot-type`` unless ``slot_type`` is one of
    ``SLOT_TYPES``."""
    if slot_type not in SLOT_TYPES:
        raise DetError(f"--slot-type: expected one of {', '.join(SLOT_TYPES)}, got {slot_type!r}")


def discover(cpu_slots: int | None = None, slot_type: str = "auto", nvml=None) -> list[Slot]:
    """The slots to register, by ``slot_type`` (the reference agent's ``slot_type``):

    - ``auto``: the CUDA devices if any, else ``cpu_slots`` CPU slots (default: one per core);
    - ``cuda``: the CUDA devices;
    - ``cpu``: ``cpu_slots`` CPU slots even where GPUs are found (a GPU host lending its
      cores, or a bench measuring the same path on every host);
    - ``none``: no slots (an agent for 0-slot tasks: commands, notebooks, TensorBoards).

    ``nvml`` as in :func:`cuda_slots`. Raises ``DetError`` for another ``slot_type``, and for
    ``cuda`` where no CUDA device answers.
    """
    check_slot_type(slot_type)
    if slot_type == "none":
        return []
    if slot_type != "cpu":
        gpus = cuda_slots(nvml)
        if gpus or slot_type == "cuda":
            if not gpus:
                raise DetError("--slot-type cuda: no CUDA device answered through NVML")
            if cpu_slots is not None:
                log.warning("--slots %d left unused: this host offers its %d CUDA device(s) "
                            "(--slot-type cpu offers CPU slots instead)", cpu_slots, len(gpus))
            return gpus
    n = cpu_slots if cpu_slots is not None else (os.cpu_count() or 1)
    return [Slot(i, "cpu", device_name="cpu") for i in range(n)]
