"""The agent's side of a gang launch (issue 12): what each agent of a distributed trial
tells its share of the workers.

Every agent holding slots of an allocation launches one task with the slots it holds there
(``DET_SLOT_IDS``); :mod:`det.launch.torch_distributed` turns it into one worker per slot.
"""

import json

from det.agent.devices import Slot


def gang_env(agent_id: str, slots: list[Slot]) -> dict[str, str]:
    """The variables the launcher reads (:mod:`det.launch.gang`) for the slots this agent
    holds of one allocation."""
    return {"DET_SLOT_IDS": json.dumps([s.slot_id for s in slots]),
            "DET_GANG_AGENTS": agent_id}
