"""Load a trained trial back from a checkpoint directory (Determined 0.38's
``pytorch.load_trial_from_checkpoint_path``), e.g. one ``det checkpoint download`` fetched.

The checkpoint is in the trainer's layout (``det.harness.trainer``): ``load_data.json`` names
the trial class and its hyperparameters, ``code/`` holds its code, ``state_dict.pth`` the
models' weights.
"""

import json
import pathlib
from typing import Any

import torch

from det.errors import DetError
from det.harness import core
from det.harness.entrypoint import load_trial_class
from det.harness.trainer import CODE_DIR, LOAD_DATA_FILE, STATE_FILE
from det.harness.transport import LocalTransport
from det.harness.trial import PyTorchTrial, PyTorchTrialContext


def load_trial_from_checkpoint_path(
    path: str | pathlib.Path,
    trial_class: type[PyTorchTrial] | None = None,
    trial_kwargs: dict[str, Any] | None = None,
    torch_load_kwargs: dict[str, Any] | None = None,
) -> PyTorchTrial:
    """The trial of the checkpoint at ``path``, built with its hyperparameters (off-cluster)
    and its models' weights loaded. ``trial_class`` defaults to the class ``load_data.json``
    names, imported from ``code/``; ``trial_kwargs`` go to its constructor,
    ``torch_load_kwargs`` to ``torch.load`` (``map_location`` defaults to the CPU: the weights
    are then copied onto the models' devices, and a checkpoint written on a GPU host loads on
    one without).

    Raises ``DetError`` when ``path`` is not such a checkpoint,
    ``det.harness.errors.EntrypointError`` when the class cannot be imported.
    """
    root = pathlib.Path(path)
    try:
        load_data = json.loads((root / LOAD_DATA_FILE).read_text())
    except (OSError, ValueError) as e:
        raise DetError(f"{root}: not a PyTorchTrial checkpoint ({LOAD_DATA_FILE}: {e})") from e
    if load_data.get("trial_type") != "PyTorchTrial":
        raise DetError(f"{root}: a {load_data.get('trial_type')} checkpoint, not PyTorchTrial")
    if trial_class is None:
        trial_class = load_trial_class(load_data["trial_cls_spec"], root / CODE_DIR)
    config = dict(load_data.get("experiment_config") or {})
    transport = LocalTransport(config, dict(load_data.get("hparams") or {}), echo=False)
    with core.init(transport=transport, checkpoint_storage={
            "type": "shared_fs", "host_path": str(root.parent)}) as ctx:
        context = PyTorchTrialContext(ctx)
        trial = trial_class(context, **(trial_kwargs or {}))
    state = torch.load(root / STATE_FILE, **{"weights_only": False, "map_location": "cpu",
                                             **(torch_load_kwargs or {})})
    for model, weights in zip(context.models, state["models_state_dict"], strict=True):
        model.load_state_dict(weights)
    return trial
