"""Pins and references, and SQL as the boundary for experiment configs (issue 32).

An experiment that warm-starts from a checkpoint (``searcher.source_trial_id`` /
``source_checkpoint_uuid``) and a model version pin that checkpoint: its owner can no longer
delete it or its experiment. So only an Editor of the checkpoint's workspace may make the pin;
a Viewer could otherwise pin another team's checkpoints forever. ``det_user.create_experiment``
checks the config keys the control plane reads, so a caller from psql cannot store a config
that breaks the reconciler or the readers, and the readers show an old or partial stored
config without a traceback.
"""

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.cli.users import password_verifier

PASSWORD = "correct horse battery staple"


def expanded(**searcher: object) -> dict:
    """An expanded one-trial config (det.configs), its searcher extended by ``searcher``."""
    from det.configs import load_experiment_config

    text = ("name: warm\nentrypoint: model_def:MyTrial\n"
            "searcher: {name: single, metric: loss, max_length: {batches: 10}}\n")
    cfg = load_experiment_config(text).expanded()
    cfg["searcher"].update(searcher)
    return cfg


@dataclass
class Source:
    """An ended experiment in workspace ``w2`` with one trial and one COMPLETED checkpoint."""

    experiment: int
    trial: int
    checkpoint: str


class Cluster:
    """Workspaces w1 and w2 (project p in each); vic is an Editor of w1 and only a Viewer of
    w2, olga an Editor of w2, eve has no role in w2."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.owner = psycopg.connect(url, autocommit=True, row_factory=dict_row)
        for w in ("w1", "w2"):
            self.owner.execute("SELECT det_user.workspace_create(%s, NULL, NULL, NULL)", (w,))
            self.owner.execute("SELECT det_user.project_create(%s, 'p', '')", (w,))
        for name in ("vic", "olga", "eve"):
            self.owner.execute("SELECT det_user.user_create(%s, %s, false)",
                               (name, password_verifier(self.owner, name, PASSWORD)))
        for role, user, ws in (("Editor", "vic", "w1"), ("Viewer", "vic", "w2"),
                               ("Editor", "olga", "w2"), ("Editor", "olga", "w1"),
                               ("Editor", "eve", "w1")):
            self.owner.execute("SELECT det_user.role_assign(%s, %s, NULL, %s, true)",
                               (role, user, ws))

    def connect(self, name: str) -> psycopg.Connection:
        return psycopg.connect(make_conninfo(self.url, user=name, password=PASSWORD),
                               autocommit=True, row_factory=dict_row)

    def source(self) -> Source:
        """An ended experiment of w2 whose one trial wrote one checkpoint (rows only)."""
        c = self.owner
        eid = c.execute("SELECT det_user.create_experiment(%s, '', NULL, 'w2', 'p') AS id",
                        (Jsonb(expanded()),)).fetchone()["id"]
        job = c.execute("SELECT job_id FROM experiments WHERE id = %s", (eid,)).fetchone()
        tid = c.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed, state, "
                        "end_time) VALUES (%s, gen_random_uuid(), '{}', 1, 'COMPLETED', now()) "
                        "RETURNING id", (eid,)).fetchone()["id"]
        alloc = c.execute(
            "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, "
            "state, ended_at, exit_code, settled) VALUES (%s, %s, 1, 'default', 1, '{}', "
            "'TERMINATED', now(), 0, true) RETURNING id", (job["job_id"], tid)).fetchone()["id"]
        ckpt = str(uuid.uuid4())
        c.execute("INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, "
                  "storage) VALUES (%s, %s, %s, 10, %s)",
                  (ckpt, tid, alloc, Jsonb({"type": "shared_fs", "host_path": "/nonexistent"})))
        c.execute("UPDATE trials SET latest_checkpoint = %s WHERE id = %s", (ckpt, tid))
        c.execute("UPDATE experiments SET state = 'COMPLETED', end_time = now() WHERE id = %s",
                  (eid,))
        return Source(eid, tid, ckpt)

    def close(self) -> None:
        self.owner.close()


@pytest.fixture
def cluster(db_url: str) -> Iterator[Cluster]:
    c = Cluster(db_url)
    yield c
    c.close()


def pin_of(src: Source, field: str) -> dict:
    return expanded(**{field: src.trial if field == "source_trial_id" else src.checkpoint})


def assert_owner_can_delete(cluster: Cluster, src: Source) -> None:
    """The pin rule's point: w2's Editor can still delete the checkpoint and its experiment."""
    with cluster.connect("olga") as olga:
        n = olga.execute("SELECT det_user.delete_checkpoints(%s::uuid[]) AS n",
                         ([src.checkpoint],)).fetchone()["n"]
        assert n == 1
        olga.execute("SELECT det_user.experiment_delete(%s)", (src.experiment,))
    row = cluster.owner.execute(
        "SELECT c.state, e.delete_requested_at FROM checkpoints c JOIN trials t "
        "ON t.id = c.trial_id JOIN experiments e ON e.id = t.experiment_id WHERE c.uuid = %s",
        (src.checkpoint,)).fetchone()
    assert row["state"] == "DELETING" and row["delete_requested_at"] is not None


@pytest.mark.parametrize("field", ["source_trial_id", "source_checkpoint_uuid"])
def test_viewer_cannot_pin_a_checkpoint_of_another_workspace(cluster: Cluster, field) -> None:
    """The attack: a Viewer of w2 submits an experiment in w1 warm-starting from w2's trial
    (or checkpoint); before the fix it was stored and w2's owner could never delete them."""
    src = cluster.source()
    ident = str(src.trial if field == "source_trial_id" else src.checkpoint)
    with cluster.connect("vic") as vic, pytest.raises(psycopg.errors.InsufficientPrivilege) as e:
        vic.execute("SELECT det_user.create_experiment(%s, '', NULL, 'w1', 'p')",
                    (Jsonb(pin_of(src, field)),))
    message = str(e.value)
    assert f"searcher.{field}" in message and ident in message and "Editor" in message
    assert cluster.owner.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == 1
    assert_owner_can_delete(cluster, src)


@pytest.mark.parametrize("field", ["source_trial_id", "source_checkpoint_uuid"])
def test_an_editor_of_the_source_may_pin(cluster: Cluster, field) -> None:
    """Editor of the checkpoint's workspace is enough: the pin is made and holds."""
    src = cluster.source()
    with cluster.connect("olga") as olga:
        olga.execute("SELECT det_user.create_experiment(%s, '', NULL, 'w1', 'p')",
                     (Jsonb(pin_of(src, field)),))
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="is pinned"):
            olga.execute("SELECT det_user.experiment_delete(%s)", (src.experiment,))


@pytest.mark.parametrize("field", ["source_trial_id", "source_checkpoint_uuid"])
def test_an_unseen_or_missing_source_is_not_found(cluster: Cluster, field) -> None:
    """A source in a workspace the caller cannot view reads exactly as one that does not
    exist (nothing about w2 leaks), and a trial id not yet taken cannot be pinned ahead."""
    src = cluster.source()
    missing = expanded(**{field: src.trial + 1000 if field == "source_trial_id"
                          else str(uuid.uuid4())})
    with cluster.connect("eve") as eve:
        for config in (pin_of(src, field), missing):
            with pytest.raises(psycopg.errors.NoDataFound, match=f"searcher.{field}: .* not found"):
                eve.execute("SELECT det_user.create_experiment(%s, '', NULL, 'w1', 'p')",
                            (Jsonb(config),))
    assert_owner_can_delete(cluster, src)


def test_model_version_of_a_view_only_checkpoint_is_refused(cluster: Cluster) -> None:
    """The attack: vic registers w2's checkpoint, which vic can only view, as a version of a
    model in w1; before the fix the version pinned it for good."""
    src = cluster.source()
    with cluster.connect("vic") as vic:
        vic.execute("SELECT det_user.model_create('stolen', '', NULL, 'w1')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege,
                           match=f"needs Editor on workspace 'w2' to register checkpoint "
                                 f"{src.checkpoint}"):
            vic.execute("SELECT det_user.model_register_version('stolen', %s, NULL, NULL, NULL, "
                        "NULL)", (src.checkpoint,))
    assert cluster.owner.execute(
        "SELECT count(*) AS n FROM model_versions").fetchone()["n"] == 0
    with cluster.connect("olga") as olga:  # an Editor of both may still register it
        olga.execute("SELECT det_user.model_register_version('stolen', %s, NULL, NULL, NULL, NULL)",
                     (src.checkpoint,))
        olga.execute("SELECT det_user.model_version_delete('stolen', 1)")
    assert_owner_can_delete(cluster, src)


def _without(cfg: dict, *path: str) -> dict:
    cfg = json.loads(json.dumps(cfg))
    node = cfg
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return cfg


def _with(cfg: dict, value: object, *path: str) -> dict:
    cfg = json.loads(json.dumps(cfg))
    node = cfg
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return cfg


BASE = expanded()

BAD_CONFIGS = [
    ("no searcher", _without(BASE, "searcher"), "searcher: required"),
    ("searcher not a mapping", _with(BASE, "single", "searcher"), "searcher: required"),
    ("no searcher name", _without(BASE, "searcher", "name"), "searcher.name: required"),
    ("bad searcher name", _with(BASE, "nope", "searcher", "name"),
     "searcher.name: expected one of single|random|grid|adaptive_asha|tpe"),
    ("no metric", _without(BASE, "searcher", "metric"), "searcher.metric: required"),
    ("blank metric", _with(BASE, " ", "searcher", "metric"), "searcher.metric: expected non-blank"),
    ("random without max_trials", _with(BASE, "random", "searcher", "name"),
     "searcher.max_trials: required"),
    ("tpe without max_length", _without(_with(_with(BASE, "tpe", "searcher", "name"), 4,
                                              "searcher", "max_trials"),
                                        "searcher", "max_length"),
     "searcher.max_length: required"),
    ("bad max_length", _with(BASE, {"steps": 5}, "searcher", "max_length"),
     "searcher.max_length: expected {batches|records|epochs: N}"),
    ("zero max_length", _with(BASE, {"batches": 0}, "searcher", "max_length"),
     "searcher.max_length: expected"),
    ("string smaller_is_better", _with(BASE, "yes", "searcher", "smaller_is_better"),
     "searcher.smaller_is_better: expected true or false"),
    ("string source_trial_id", _with(BASE, "abc", "searcher", "source_trial_id"),
     "searcher.source_trial_id: expected a whole number"),
    ("not a uuid", _with(BASE, "asdf", "searcher", "source_checkpoint_uuid"),
     "searcher.source_checkpoint_uuid: expected a checkpoint UUID"),
    ("negative slots", _with(BASE, -1, "resources", "slots_per_trial"),
     "resources.slots_per_trial: expected a whole number from 0 to 2147483647, got -1"),
    ("no slots", _without(BASE, "resources", "slots_per_trial"),
     "resources.slots_per_trial: required"),
    ("fractional slots", _with(BASE, 1.5, "resources", "slots_per_trial"),
     "resources.slots_per_trial: expected a whole number"),
    ("no resources", _without(BASE, "resources"), "resources: required"),
    ("no pool", _without(BASE, "resources", "resource_pool"),
     "resources.resource_pool: required"),
    ("empty pool list", _with(BASE, [], "resources", "resource_pool"),
     "resources.resource_pool: expected a pool name or a non-empty list"),
    ("bad pool in list", _with(BASE, ["default", 7], "resources", "resource_pool"),
     r"resources.resource_pool\[1\]: expected a string"),
    ("string weight", _with(BASE, "heavy", "resources", "weight"),
     "resources.weight: expected a number above 0"),
    ("priority 0", _with(BASE, 0, "resources", "priority"),
     "resources.priority: expected a whole number from 1 to 99"),
    ("string max_restarts", _with(BASE, "abc", "max_restarts"),
     "max_restarts: expected a whole number"),
    ("negative preemption_timeout", _with(BASE, -5, "preemption_timeout"),
     "preemption_timeout: expected a whole number"),
    ("long name", _with(BASE, "n" * 256, "name"), "name: expected at most 255 characters"),
    ("no name", _without(BASE, "name"), "name: required"),
    ("long description", _with(BASE, "d" * 4097, "description"),
     "description: expected at most 4096 characters"),
    ("string seed", _with(BASE, "x", "reproducibility", "experiment_seed"),
     "reproducibility.experiment_seed: expected a whole number"),
    ("string gc policy", _with(BASE, {"type": "shared_fs", "host_path": "/tmp",
                                      "save_trial_best": "all"}, "checkpoint_storage"),
     "checkpoint_storage.save_trial_best: expected a whole number"),
    ("not an object", ["a list"], "config: expected a JSON object"),
]


@pytest.mark.parametrize("config,message", [c[1:] for c in BAD_CONFIGS],
                         ids=[c[0] for c in BAD_CONFIGS])
def test_create_from_psql_checks_what_the_control_plane_reads(cluster: Cluster, config,
                                                             message) -> None:
    """The attack: a user calls det_user.create_experiment from psql with a config det.configs
    would refuse; before the fix it was stored (and describe then failed with a KeyError, or
    a pass's cast failed for every experiment). Now: one line naming the key, nothing
    stored."""
    with (cluster.connect("vic") as vic,
          pytest.raises(psycopg.errors.InvalidParameterValue, match=message)):
        vic.execute("SELECT det_user.create_experiment(%s, '', NULL, 'w1', 'p')", (Jsonb(config),))
    assert cluster.owner.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == 0


def test_every_expanded_config_passes(cluster: Cluster) -> None:
    """What det.configs expands is never refused: each searcher, a pool list, nulls."""
    from det.configs import load_experiment_config

    searchers = [
        "{name: single, metric: loss}",
        "{name: random, metric: loss, max_trials: 3, max_length: 5}",
        "{name: grid, metric: acc, smaller_is_better: false, max_length: {epochs: 2}}",
        "{name: adaptive_asha, metric: loss, max_trials: 4, max_length: {records: 100}}",
        "{name: adaptive_asha, metric: loss, max_trials: 4, max_time: 8, time_metric: t}",
        "{name: tpe, metric: loss, max_trials: 4, max_length: {batches: 8}}",
    ]
    with cluster.connect("vic") as vic:
        for s in searchers:
            cfg = load_experiment_config(
                "name: ok\nentrypoint: model_def:MyTrial\n"
                "resources: {resource_pool: [default], priority: 5, max_slots: 2}\n"
                "checkpoint_storage: {type: shared_fs, host_path: /tmp}\n"
                f"searcher: {s}\n").expanded()
            vic.execute("SELECT det_user.create_experiment(%s, '', NULL, 'w1', 'p')", (Jsonb(cfg),))
    assert cluster.owner.execute(
        "SELECT count(*) AS n FROM experiments").fetchone()["n"] == len(searchers)


OLD_CONFIGS = [
    ({"name": "old"}, "ACTIVE"),
    ({"name": "old"}, "COMPLETED"),
    ({"name": "old", "searcher": {"name": "adaptive_asha"}}, "ACTIVE"),
    ({"name": "old", "searcher": "random"}, "ACTIVE"),
    ({"name": "old", "searcher": {"name": "random", "max_length": 10}}, "ACTIVE"),
]


def test_describe_shows_an_old_config(det, conn) -> None:
    """Rows stored before det_user.create_experiment checked configs (written here through the
    owner's connection: no searcher, a partial one, one that is not a mapping, a bare
    max_length; running and ended) are described, as text and JSON, and listed without a
    traceback: before the fix `det experiment describe` raised KeyError for every viewer."""
    from det.queries.experiments import get_experiment
    from det.reconciler.searchers.live import add_rungs, with_live_progress
    from det.sql import named

    ids = []
    for config, state in OLD_CONFIGS:
        eid = conn.execute("SELECT det_user.create_experiment(%s, '', NULL) AS id",
                           (Jsonb(expanded()),)).fetchone()["id"]
        conn.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed, "
                     "steps_completed) VALUES (%s, gen_random_uuid(), '{}', 1, 5)", (eid,))
        conn.execute("UPDATE experiments SET config = %s, searcher_state = %s WHERE id = %s",
                     (Jsonb(config), Jsonb({"trials": []}), eid))
        if state == "COMPLETED":
            conn.execute("UPDATE experiments SET state = 'COMPLETED', end_time = now() "
                         "WHERE id = %s", (eid,))
        ids.append(eid)
    for eid in ids:
        out = det("experiment", "describe", str(eid), check=False)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        assert f"Experiment {eid}: warm" in out.stdout and "metric -" in out.stdout
        # what GET /api/v1/experiments/{id} serves
        exp = with_live_progress(conn, get_experiment(conn, eid))
        assert add_rungs(conn, exp, conn.execute(named("queries").experiment_trials,
                                              {"id": eid}).fetchall()) is False
    for args in (("experiment", "describe", "--json", str(ids[2])), ("experiment", "list")):
        out = det(*args, check=False)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
