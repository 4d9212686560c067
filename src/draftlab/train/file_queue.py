"""The trainer's file writes (checkpoints, best weights, pruning) on one background thread, in the order given.

With the step on CUDA graphs the GPU runs ahead of nothing: validation has just drained its queue when a checkpoint
is due (both fall on multiples of 100 steps in the GPU preset), so every second the main thread spends serialising
and writing files is a second the GPU idles. Here the main thread only hands over copies already taken (see
`checkpoint.snapshot_checkpoint`) and goes on stepping. One worker keeps the writes in the order the loop made them:
a checkpoint's folder renamed before `latest.json` moves (checkpoint.py), a best file written before the prune that
may delete it. At most `depth` writes wait (3: an epoch's end queues a best file, a checkpoint and a prune), so
host memory holds a few snapshots and no more.

A write's error is raised in the main thread at the next `submit` or when the queue closes, which the loop's `with`
does before it returns or raises, and no write queued after it runs; a process killed mid-write leaves the previous
checkpoint whole (the writes are atomic).
"""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

log = logging.getLogger("draftlab")


class FileQueue:
    def __init__(self, depth: int = 3) -> None:
        if depth < 1:
            raise ValueError(f"FileQueue depth={depth}: at least 1")
        self.depth = depth
        self._pool: ThreadPoolExecutor | None = None  # started on first use: a trainer that writes nothing has none
        self._pending: deque[Future] = deque()
        self._failed: BaseException | None = None  # set on the worker: every later job is skipped

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Runs `fn(*args)` after every write submitted before it; first raises a write that failed, and waits
        while `depth` writes are queued."""
        while self._pending and (self._pending[0].done() or len(self._pending) >= self.depth):
            self._pending.popleft().result()  # re-raises a failed write here, in the loop's thread
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draftlab-trainer-files")
        self._pending.append(self._pool.submit(self._run, fn, args))

    def _run(self, fn: Callable[..., Any], args: tuple) -> Any:
        """On the worker. After a failure nothing more runs: a checkpoint that failed must not be followed by the
        prune that deletes the best file the previous checkpoint names."""
        if self._failed is not None:
            raise RuntimeError(f"skipped: an earlier file write failed ({self._failed})")
        try:
            return fn(*args)
        except BaseException as err:
            self._failed = err
            raise

    def drain(self) -> None:
        """Waits for every queued write; raises the first one that failed (those after it were skipped)."""
        error = None
        while self._pending:
            try:
                self._pending.popleft().result()
            except Exception as err:  # noqa: BLE001 - the first is raised once the queue is empty
                error = error or err
        if error is not None:
            raise error

    def close(self) -> None:
        try:
            self.drain()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            self._failed = None  # its error has been raised: a later run's writes start afresh

    def __enter__(self) -> "FileQueue":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Every queued write finished; after an error in the block, a write's own error is logged, not raised
        over the block's."""
        try:
            self.close()
        except Exception as err:  # noqa: BLE001 - re-raised unless the block's error is on its way
            if exc_type is None:
                raise
            log.warning("train: a queued file write failed too: %s", err)
