"""Progress lines for long jobs, from the driver."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Progress:
    """Logs the progress of running Spark stages every ``interval_s`` from the driver."""

    def __init__(self, spark: SparkSession, job: str, interval_s: float) -> None:
        self._spark = spark
        self._log = logging.getLogger(f"llog.spark.{job}")
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: dict[int, tuple[int, int]] = {}

    def __enter__(self) -> Progress:
        if self._interval > 0:
            self._thread = threading.Thread(target=self._run, name="spark-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        tracker = self._spark.sparkContext.statusTracker()
        while not self._stop.wait(self._interval):
            try:
                for stage_id in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(stage_id)
                    if info is None:
                        continue
                    state = (info.numCompletedTasks, info.numActiveTasks)
                    if self._last.get(stage_id) == state:
                        continue
                    self._last[stage_id] = state
                    self._log.info(
                        "stage %d (%s): %d/%d tasks done, %d running, %d failed",
                        stage_id, info.name, info.numCompletedTasks, info.numTasks,
                        info.numActiveTasks, info.numFailedTasks,
                    )
            except Exception:  # the context may be stopping; progress is best effort
                return
