"""Scenario files for ``det job simulate --scenario FILE``: one scheduling pass, offline.

The format (stable; new keys only ever get defaults):

```yaml
scheduler: {type: priority, preemption: true, fitting_policy: best}   # as in the cluster config
agents:
  - {id: a1, slots: 4, max_aux_containers: 100}
tasks:                      # in submission order
  - {id: t1, job: j1, slots: 4, priority: 50, weight: 1, preemptible: true,
     state: running, on: {a1: 4}}
  - {id: t2, slots: 1, priority: 40}
```
Task defaults: ``state: pending``, ``job`` = the task's id, ``slots: 1``, ``weight: 1``,
``preemptible: true``, ``priority`` = the scheduler's ``default_priority``, no ``max_slots``.
A running task's ``on`` gives how many slots it holds on which agents (a zero-slot task:
``{a1: 0}``); ``state: stopping`` is a running task already told to stop.
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from det.configs.cluster import SchedulerConfig
from det.configs.load import config_error, parse_yaml
from det.errors import ConfigError
from det.reconciler.schedulers.model import Agent, Task


class ScenarioAgent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    slots: int = Field(ge=0)
    max_aux_containers: int = Field(100, ge=0)


class ScenarioTask(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    job: str | None = None
    slots: int = Field(1, ge=0)
    priority: int | None = Field(None, ge=1, le=99)
    weight: float = Field(1.0, gt=0)
    max_slots: int | None = Field(None, ge=0)
    preemptible: bool = True
    state: Literal["pending", "running", "stopping"] = "pending"
    on: dict[str, int] = Field(default_factory=dict)


class Scenario(BaseModel):
    """A scheduler, agents and tasks (submission order); see the module docstring."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    scheduler: SchedulerConfig = SchedulerConfig()
    agents: list[ScenarioAgent] = Field(default_factory=list)
    tasks: list[ScenarioTask] = Field(default_factory=list)

    @model_validator(mode="after")
    def _placements_add_up(self) -> "Scenario":
        size = {a.id: a.slots for a in self.agents}
        used = dict.fromkeys(size, 0)
        for i, t in enumerate(self.tasks):
            where = f"tasks[{i}] ({t.id})"
            if t.state == "pending" and t.on:
                raise PydanticCustomError("on", "{where}: a pending task holds nothing; drop "
                                          "'on' or set state: running", {"where": where})
            if t.state != "pending" and not t.on:
                raise PydanticCustomError("on", "{where}: a running task needs "
                                          "'on: {{agent: slots}}'", {"where": where})
            for agent, n in t.on.items():
                if agent not in size:
                    raise PydanticCustomError("on", "{where}: no agent '{agent}'",
                                              {"where": where, "agent": agent})
                used[agent] += n
            if t.state != "pending" and sum(t.on.values()) != t.slots:
                raise PydanticCustomError("on", "{where}: 'on' holds {held} slots, the task "
                                          "needs {slots}", {"where": where, "slots": t.slots,
                                                            "held": sum(t.on.values())})
        for agent, n in used.items():
            if n > size[agent]:
                raise PydanticCustomError("on", "agent '{agent}': tasks hold {n} slots, it has "
                                          "{size}", {"agent": agent, "n": n,
                                                     "size": size[agent]})
        return self

    def to_model(self) -> tuple[list[Agent], list[Task]]:
        """The scheduler's inputs: slots are numbered 0..n-1 per agent, held from the low end
        in task order."""
        next_free = {a.id: 0 for a in self.agents}
        tasks = []
        aux = dict.fromkeys(next_free, 0)
        for t in self.tasks:
            on: dict[str, tuple[int, ...]] = {}
            for agent, n in t.on.items():
                on[agent] = tuple(range(next_free[agent], next_free[agent] + n))
                next_free[agent] += n
                if t.slots == 0:
                    aux[agent] += 1
            prio = t.priority if t.priority is not None else self.scheduler.default_priority
            tasks.append(Task(t.id, t.job or t.id, t.slots, prio, t.weight, t.preemptible,
                              t.max_slots, t.state != "pending", t.state == "stopping", on))
        agents = [Agent(a.id, tuple(range(a.slots)), tuple(range(next_free[a.id], a.slots)),
                        aux[a.id], a.max_aux_containers) for a in self.agents]
        return agents, tasks


def load_scenario(text: str, source: str | None = None) -> Scenario:
    """Parse a scenario file. Raises ``ConfigError`` naming the file, key and expectation."""
    data = parse_yaml(text, source)
    if not isinstance(data, Mapping):
        raise ConfigError("", "expected a mapping with scheduler, agents and tasks", source)
    tasks = data.get("tasks")
    if isinstance(tasks, list):  # YAML 1.1 reads the key `on` as the boolean true
        data = {**data, "tasks": [{("on" if k is True else k): v for k, v in t.items()}
                                  if isinstance(t, Mapping) else t for t in tasks]}
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, data, source) from None
