"""One Core API: ``determined.core`` re-exports ``det.harness.core`` (one implementation), and
a det script and a 0.38 script see the same contexts."""

import pytest

import determined.core
from det.errors import DetError
from det.harness import core
from det.harness.transport import LocalTransport


def test_determined_core_is_det_harness_core() -> None:
    for name in determined.core.__all__:
        assert getattr(determined.core, name) is getattr(core, name), name


def test_det_names_on_info_and_0_38_names_on_the_contexts() -> None:
    config = {"searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 2}}}
    with core.init(transport=LocalTransport(config, {"lr": 0.1}, trial_seed=7,
                                            echo=False)) as ctx:
        assert (ctx.info.hparams, ctx.info.trial.hparams, ctx.info.trial_seed) == (
            {"lr": 0.1}, {"lr": 0.1}, 7)
        assert ctx.searcher.get_configured_units() is core.Unit.BATCHES
        for op in ctx.searcher.operations(core.SearcherMode.ChiefOnly):
            ctx.train.report_progress(0.5)
            op.report_completed(1.0)
        ctx.train.report_early_exit(core.EarlyExitReason.INVALID_HP)
        assert ctx.transport.progress == [(1, 1.0)]
        assert ctx.transport.early_exit == "invalid_hp"
        with pytest.raises(DetError, match="a det task cannot delete checkpoints"):
            ctx.checkpoint.delete("x")


def test_init_without_a_task_gives_0_38s_stand_ins(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    for name in ("DET_DB_URL", "DET_ALLOCATION_ID", "DET_ALLOCATION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    with core.init() as ctx:
        assert ctx.info is None
        (op,) = list(_complete(ctx.searcher.operations()))
        assert op.length == 1
        with ctx.checkpoint.store_path() as (path, uuid):
            (path / "w").write_text("1")
        assert ctx.checkpoint.get_metadata(uuid) == {"steps_completed": 0}
        ctx.checkpoint.delete(uuid)
        assert not (tmp_path / "determined" / uuid).exists()


def _complete(ops):
    for op in ops:
        op.report_completed(0.0)
        yield op
