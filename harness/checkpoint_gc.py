"""The checkpoint GC task: ``python -m det.harness.checkpoint_gc``.

The reconciler schedules it as a zero-slot allocation of an experiment with DELETING
checkpoints, so it runs on an agent of the experiment's pool, where the storage is reachable.
It loops: take a batch of DELETING checkpoints (``det_task.gc_task_checkpoints``), remove their
files, mark them DELETED (``det_task.gc_task_deleted``, which records the bytes freed), until none
is left; for an experiment being deleted it then removes its TensorBoard files
(``det_task.gc_task_tensorboards``, ``det.harness.tensorboard``) and says so
(``det_task.gc_task_tensorboards_deleted``): the experiment's rows go only then, so one deleted
with no checkpoints gets a GC task too.
Every step is idempotent, so a task killed at any point is finished by the next one:
files already gone count as removed, and rows are marked only after their files are gone.
A storage error is written on the experiment (``det_task.gc_task_failed``) and the task exits 1.
Then it sweeps the storages it touched for what crashed runs left: staging
directories and checkpoint directories no row names (``det_task.gc_task_unrecorded``), untouched
for ``LEFTOVER_AGE_SECONDS`` (``FsspecStorage.leftovers``).
No link is followed (``FsspecStorage.remove_tree``): a link a task left in its
checkpoint, or put in place of a directory of the storage, is removed as a link or left
alone, never the files it points to.

Its identity comes from the environment the agent sets: ``DET_DB_URL``,
``DET_ALLOCATION_TOKEN``.
"""

import json
import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from det.db.reconnect import Reconnecting
from det.errors import one_line
from det.harness.errors import StorageError
from det.harness.storage import FsspecStorage, storage_from_config
from det.harness.tensorboard import delete_experiment_files
from det.sql import named

log = logging.getLogger("det.checkpoint_gc")
Q = named("harness")

BATCH = 100
"""Checkpoints per round trip: removed (``WORKERS`` at a time), then marked DELETED together."""

WORKERS = 8
"""Checkpoints removed at the same time."""

LEFTOVER_AGE_SECONDS = 3600.0
"""How long a checkpoint directory without a row, or a staging directory, must have been
untouched before the sweep removes it: far longer than a writer takes between its last file
and its record (det_task.report_checkpoint), so a checkpoint being written is never taken."""


class GcTask:
    """One GC task's connection and storages. ``url``: the database; ``token``: the
    allocation's token."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token
        self.session = Reconnecting(url)
        self.storages: dict[str, FsspecStorage] = {}
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="det-gc")

    def _call(self, what: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run ``sql`` (autocommit), reconnecting through connection losses (det.db.retry)."""
        return self.session.run(what, lambda conn: conn.execute(sql, args).fetchall())

    def _storage(self, config: dict[str, Any]) -> FsspecStorage:
        key = json.dumps(config, sort_keys=True)
        if key not in self.storages:
            self.storages[key] = storage_from_config(config)
        return self.storages[key]

    def run(self) -> tuple[int, int]:
        """Remove every DELETING checkpoint of the experiment; returns (checkpoints, bytes
        freed). Raises ``StorageError`` (after recording it on the experiment)."""
        count = freed = 0
        while batch := self._call("checkpoint GC: next batch", Q.gc_checkpoints,
                                  self.token, BATCH):
            try:
                # In parallel: each removal mostly waits (on the disk's metadata updates, on
                # S3's round trips); list() re-raises the first failure.
                list(self.pool.map(lambda row: self._storage(row[1]).delete(row[0]), batch))
            except StorageError as e:
                self._call("checkpoint GC: report failure", Q.gc_failed, self.token, str(e))
                raise
            freed += sum(size or 0 for _, _, size in batch)
            marked = self._call("checkpoint GC: mark deleted", Q.gc_deleted, self.token,
                                [uuid for uuid, _, _ in batch])[0][0]
            count += len(batch)
            if marked == 0:
                break  # none of them was ours to mark: never loop on the same batch
        for experiment_id, storage in self._call(
                "checkpoint GC: TensorBoard files", Q.gc_tensorboards, self.token):
            try:
                delete_experiment_files(self._storage(storage), experiment_id)
            except StorageError as e:
                self._call("checkpoint GC: report failure", Q.gc_failed, self.token, str(e))
                raise
            self._call("checkpoint GC: TensorBoard files removed", Q.gc_tensorboards_deleted,
                       self.token)
        return count, freed

    def sweep(self, older_than: float = LEFTOVER_AGE_SECONDS) -> list[str]:
        """Remove what crashed or fenced runs left in the storages this task touched (see
        the module docstring); returns what was removed. A failure is a warning: leftovers
        are nobody's data, and the next GC task tries again."""
        def recorded(uuids: list[str]) -> set[str]:
            rows = self._call("checkpoint GC: unrecorded checkpoints", Q.gc_unrecorded,
                              self.token, uuids)
            return set(uuids) - {u for (u,) in rows}

        removed = []
        for storage in self.storages.values():
            try:
                for url in storage.leftovers(recorded, older_than):
                    if storage.remove_tree(url, f"leftover {url}: cannot remove"):
                        removed.append(url)
            except (StorageError, OSError) as e:
                log.warning("sweeping leftovers: %s", one_line(str(e)))
        return removed

    def close(self) -> None:
        self.pool.shutdown()
        self.session.close()


def main() -> int:
    """Entry point; returns the exit code (0: every DELETING checkpoint removed)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    task = GcTask(os.environ["DET_DB_URL"], os.environ["DET_ALLOCATION_TOKEN"])
    started = time.monotonic()
    try:
        count, freed = task.run()
        leftovers = task.sweep()
    except StorageError as e:
        log.error("%s", one_line(str(e)))
        return 1
    finally:
        task.close()
    log.info("removed %d checkpoint(s), %d bytes, and %d leftover(s) of crashed runs, in "
             "%.2f s", count, freed, len(leftovers), time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
