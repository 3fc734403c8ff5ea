"""`GroupState` and `GroupStateTimeout`, as ``pyspark.sql.streaming.state`` has them:
the handle on a key's state that an ``applyInPandasWithState`` function receives.

The state lives in the engine between calls: at the end of a call whose function
updated it, it is converted by the job's state schema (as Spark's JVM does: structs
become Rows, arrays lists) and pickled, so a checkpoint, a restart after kill -9 and a
restore keep its types; the next call's ``get`` returns that converted value.
"""

from __future__ import annotations

import datetime
from typing import Optional, Tuple

from sessionizer.spark.row import Row

__all__ = ["GroupState", "GroupStateTimeout"]


class GroupStateTimeout:
    """The kinds of timeout of ``applyInPandasWithState``."""

    NoTimeout: str = "NoTimeout"
    ProcessingTimeTimeout: str = "ProcessingTimeTimeout"
    EventTimeTimeout: str = "EventTimeTimeout"


class GroupState:
    """A key's state in one call. ``exists``, ``get``, ``getOption`` and
    ``hasTimedOut`` are properties, as in PySpark."""

    NO_TIMESTAMP: int = -1

    def __init__(
        self,
        value: Optional[Row],
        batch_processing_time_ms: int,
        event_time_watermark_ms: int,
        timeout_conf: str,
        has_timed_out: bool,
        watermark_present: bool,
    ) -> None:
        self._value = value
        self._batch_processing_time_ms = batch_processing_time_ms
        self._event_time_watermark_ms = event_time_watermark_ms
        self._timeout_conf = timeout_conf
        self._has_timed_out = has_timed_out
        self._watermark_present = watermark_present
        self._defined = value is not None
        self._updated = False
        self._removed = False
        self._timeout_timestamp = GroupState.NO_TIMESTAMP

    @property
    def exists(self) -> bool:
        """Whether the key has state."""
        return self._defined

    @property
    def get(self) -> Tuple:
        """The state as a tuple shaped by the state schema; ValueError without one."""
        if self.exists:
            return tuple(self._value)
        raise ValueError("State is either not defined or has already been removed")

    @property
    def getOption(self) -> Optional[Tuple]:
        """The state as a tuple, or None."""
        return tuple(self._value) if self.exists else None

    @property
    def hasTimedOut(self) -> bool:
        """Whether this call is the key's timeout (no rows then)."""
        return self._has_timed_out

    @property
    def oldTimeoutTimestamp(self) -> int:
        """The timeout this call started with: none (every call starts without one)."""
        return GroupState.NO_TIMESTAMP

    def update(self, newValue: Tuple) -> None:
        """Sets the state (a tuple with one value per field of the state schema)."""
        if newValue is None:
            raise TypeError("newValue cannot be None")
        converted = []
        for v in newValue:
            if type(v).__module__ == "numpy" and hasattr(v, "tolist"):
                converted.append(v.tolist())
            elif hasattr(v, "to_pytimedelta"):
                converted.append(v.to_pytimedelta())
            elif hasattr(v, "to_pydatetime"):
                converted.append(v.to_pydatetime())
            else:
                converted.append(v)
        self._value = Row(*converted)
        self._defined = True
        self._updated = True
        self._removed = False

    def remove(self) -> None:
        """Removes the state."""
        self._defined = False
        self._updated = False
        self._removed = True

    def setTimeoutDuration(self, durationMs: int) -> None:
        """Calls the key again once the clock passes this batch's processing time plus
        `durationMs` (processing-time timeout only)."""
        if isinstance(durationMs, str):
            raise TypeError("durationMs must be an int (milliseconds), not str")
        if self._timeout_conf != GroupStateTimeout.ProcessingTimeTimeout:
            raise RuntimeError(
                "Cannot set timeout duration without enabling processing time timeout in "
                "applyInPandasWithState"
            )
        if durationMs <= 0:
            raise ValueError("Timeout duration must be positive")
        self._timeout_timestamp = int(durationMs) + self._batch_processing_time_ms

    def setTimeoutTimestamp(self, timestampMs: int | datetime.datetime) -> None:
        """Calls the key again once the watermark passes `timestampMs` (epoch
        milliseconds; event-time timeout only; not below the current watermark)."""
        if self._timeout_conf != GroupStateTimeout.EventTimeTimeout:
            raise RuntimeError(
                "Cannot set timeout timestamp without enabling event time timeout in "
                "applyInPandasWithState"
            )
        if isinstance(timestampMs, datetime.datetime):
            t = timestampMs
            if t.tzinfo is None:
                t = t.replace(tzinfo=datetime.timezone.utc)
            timestampMs = int(t.timestamp() * 1000)
        if timestampMs <= 0:
            raise ValueError("Timeout timestamp must be positive")
        if (
            self._event_time_watermark_ms != GroupState.NO_TIMESTAMP
            and timestampMs < self._event_time_watermark_ms
        ):
            raise ValueError(
                f"Timeout timestamp ({timestampMs}) cannot be earlier than the current "
                f"watermark ({self._event_time_watermark_ms})"
            )
        self._timeout_timestamp = int(timestampMs)

    def getCurrentWatermarkMs(self) -> int:
        """The batch's event-time watermark (0 in the first batch), in epoch
        milliseconds; only with a watermark (``withWatermark``)."""
        if not self._watermark_present:
            raise RuntimeError(
                "Cannot get event time watermark timestamp without setting watermark "
                "before applyInPandasWithState"
            )
        return self._event_time_watermark_ms

    def getCurrentProcessingTimeMs(self) -> int:
        """The batch's processing time, in epoch milliseconds (one value per batch)."""
        return self._batch_processing_time_ms

    def __str__(self) -> str:
        if self.exists:
            return "GroupState(%s)" % (self.get,)
        return "GroupState(<undefined>)"
