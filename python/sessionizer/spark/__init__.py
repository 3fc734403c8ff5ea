"""PySpark's arbitrary stateful processing on the sessionizer engine, without a JVM.

A job ported from PySpark keeps its function as written — ``f(key, rows, state)``
called per key per micro-batch with PySpark's :class:`GroupState` — and its schemas;
only the imports and the few lines that set up the stream change::

    from sessionizer import spark
    from sessionizer.spark import GroupState, GroupStateTimeout
    from sessionizer.spark.types import StructType, StructField, StringType, LongType

    query = (spark.read_json("visits.jsonl", schema=visit_schema, records_per_batch=500)
             .withWatermark("event_time", "1 minute")
             .groupBy("visit_id")
             .applyInPandasWithState(map_visits_to_session, output_schema, state_schema,
                                     "update", GroupStateTimeout.EventTimeTimeout))
    stats = query.run("sessions.jsonl", state_dir="state")

The rules are Spark's: a micro-batch's rows behind its watermark are dropped (only with
an event-time timeout), each key with rows is called once with them, then every key
whose timeout the batch's watermark has passed (``timeout < watermark``) is called with
``hasTimedOut`` and no rows; the watermark moves at the end of the batch (0 in the
first). Micro-batches are ``records_per_batch`` consecutive input records, so two runs,
and a run restarted from its state directory, call the function with the same rows.
At the end of the input a batch without rows runs (Spark's no-data batch), then the
watermark becomes +inf and every remaining timeout fires. See docs/python.md.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

from sessionizer import _native
from sessionizer.spark.row import Row
from sessionizer.spark.state import GroupState, GroupStateTimeout
from sessionizer.spark.types import StringType, TimestampType, _of

__all__ = [
    "read_json",
    "read_kafka",
    "DataStream",
    "GroupedStream",
    "StatefulQuery",
    "GroupState",
    "GroupStateTimeout",
    "Row",
]

_UNITS = {
    "millisecond": 1,
    "ms": 1,
    "second": 1000,
    "s": 1000,
    "minute": 60_000,
    "m": 60_000,
    "hour": 3_600_000,
    "h": 3_600_000,
    "day": 86_400_000,
    "d": 86_400_000,
    "week": 7 * 86_400_000,
}


def _interval_ms(text: str) -> int:
    """Milliseconds of a Spark interval ('1 minute', '15 minutes', '10 seconds',
    '1 hour 30 minutes', '500 ms')."""
    parts = re.findall(r"(\d+)\s*([a-zA-Z]+)", text)
    if not parts or re.sub(r"(\d+)\s*([a-zA-Z]+)", "", text).strip():
        raise ValueError(f"{text!r} is not an interval such as '1 minute' or '10 seconds'")
    total = 0
    for number, unit in parts:
        unit = unit.lower()
        unit = _UNITS.get(unit) or _UNITS.get(unit.removesuffix("s"))
        if unit is None:
            raise ValueError(f"{text!r}: unknown unit")
        total += int(number) * unit
    return total


def _bytes(size: int | str) -> int:
    """Bytes of a size: an int, or text such as '64MB', '1GiB', '512kb'."""
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", str(size), flags=re.I)
    if not m:
        raise ValueError(f"{size!r} is not a size such as '64MB'")
    power = " kmgt".index(m.group(2).lower() or " ")
    return int(m.group(1)) * 1024 ** power


def read_json(
    path: str | os.PathLike | Iterable[str | os.PathLike],
    schema: Any = None,
    records_per_batch: int = 1000,
) -> "DataStream":
    """A stream of the JSON lines of one file or several (read in the order given),
    cut into micro-batches of `records_per_batch` records. With `schema` (a
    :class:`~sessionizer.spark.types.StructType`, ours or PySpark's) the rows have its
    columns, in its order and converted to its types; without, the fields as they are."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if records_per_batch < 1:
        raise ValueError("records_per_batch must be at least 1")
    source = {"inputs": [os.fspath(p) for p in paths]}
    return DataStream(source, _of(schema), records_per_batch, None)


def read_kafka(
    brokers: str,
    topic: str,
    group: str,
    schema: Any = None,
    records_per_batch: int = 1000,
) -> "DataStream":
    """A stream of the JSON records of a Kafka topic, read as a member of consumer group
    `group`: each partition is a task of its own — its keys' state in a changelog topic,
    moved to another member on a rebalance — cut into micro-batches of
    `records_per_batch` consecutive records of the partition (so a restart or a
    rebalance calls the function with the same rows). The output goes to a topic,
    exactly once (:meth:`StatefulQuery.run` with ``output_topic``). Security settings
    come from ``SESSIONIZER_KAFKA_*`` environment variables, as for the command line."""
    if records_per_batch < 1:
        raise ValueError("records_per_batch must be at least 1")
    source = {"kafka": {"brokers": brokers, "topic": topic, "group": group}}
    return DataStream(source, _of(schema), records_per_batch, None)


class DataStream:
    """Rows read in micro-batches; :meth:`withWatermark`, then :meth:`groupBy`."""

    def __init__(self, source, schema, records_per_batch, watermark) -> None:
        self._source = source
        self._schema = schema
        self._records_per_batch = records_per_batch
        self._watermark = watermark

    def withWatermark(self, eventTime: str, delayThreshold: str) -> "DataStream":
        """The event-time column (RFC 3339 text or epoch milliseconds in the input) and
        how far the watermark stays behind the largest event time seen."""
        delay = _interval_ms(delayThreshold)
        return DataStream(self._source, self._schema, self._records_per_batch, (eventTime, delay))

    def groupBy(self, *cols: str) -> "GroupedStream":
        """The key columns; the function gets their values as a tuple."""
        names = [c for col in cols for c in ([col] if isinstance(col, str) else col)]
        if not names:
            raise ValueError("groupBy needs at least one column")
        return GroupedStream(self, names)


class GroupedStream:
    """A stream grouped by key: :meth:`applyInPandasWithState` or
    :meth:`applyWithState`."""

    def __init__(self, stream: DataStream, keys: list[str]) -> None:
        self._stream = stream
        self._keys = keys

    def applyInPandasWithState(
        self,
        func: Callable,
        outputStructType: Any,
        stateStructType: Any,
        outputMode: str,
        timeoutConf: str,
    ) -> "StatefulQuery":
        """PySpark's ``applyInPandasWithState``: ``func(key, rows, state)`` gets the key
        as a tuple, an iterator of pandas DataFrames (one, with the key's rows of the
        micro-batch; none in a timeout call) and a :class:`GroupState`, and returns an
        iterable of DataFrames whose columns are those of `outputStructType`."""
        return StatefulQuery(
            self, func, outputStructType, stateStructType, outputMode, timeoutConf, True
        )

    def applyWithState(
        self,
        func: Callable,
        outputStructType: Any,
        stateStructType: Any,
        outputMode: str,
        timeoutConf: str,
    ) -> "StatefulQuery":
        """As :meth:`applyInPandasWithState` without pandas: the rows come as an
        iterator of one list of dicts, and `func` returns an iterable of rows (dicts,
        Rows or tuples in the output schema's order)."""
        return StatefulQuery(
            self, func, outputStructType, stateStructType, outputMode, timeoutConf, False
        )


class StatefulQuery:
    """A stateful job, ready to run."""

    def __init__(self, grouped, func, output, state, mode, timeout, pandas_frames) -> None:
        if mode not in ("append", "update"):
            raise ValueError(f"outputMode must be 'append' or 'update', not {mode!r}")
        timeouts = (
            GroupStateTimeout.NoTimeout,
            GroupStateTimeout.ProcessingTimeTimeout,
            GroupStateTimeout.EventTimeTimeout,
        )
        if timeout not in timeouts:
            raise ValueError(f"timeoutConf must be one of {', '.join(timeouts)}, not {timeout!r}")
        stream = grouped._stream
        if timeout == GroupStateTimeout.EventTimeTimeout and stream._watermark is None:
            raise ValueError(
                "Watermark must be specified in the query using withWatermark() for using "
                "event-time timeout in applyInPandasWithState"
            )
        self._stream = stream
        self._keys = grouped._keys
        self._func = func
        self._output = _of(output)
        self._state = _of(state)
        if self._output is None or self._state is None:
            raise ValueError("give the output and the state schema")
        self._timeout = timeout
        self._pandas = pandas_frames

    def run(
        self,
        output: str | os.PathLike | None = None,
        state_dir: str | os.PathLike | None = None,
        late: str | os.PathLike | None = None,
        dead_letters: str | os.PathLike | None = None,
        *,
        output_topic: str | None = None,
        dead_letter_topic: str | None = None,
        late_topic: str | None = None,
        stop_at_end: bool = False,
        instance_id: str | None = None,
        idle_timeout: str | None = None,
        commit_interval: str | None = None,
        state_memory: int | str | None = None,
    ) -> dict[str, Any]:
        """Runs the job and returns its statistics.

        From files (:func:`read_json`): the function's rows go to `output` (JSON lines).
        With `state_dir`, every micro-batch is checkpointed: a run stopped at any instant
        (kill -9 too) and started again with the same arguments continues where its last
        checkpoint stood, and `output` ends as that of a run that never stopped. `late`
        receives the rows dropped behind the watermark, `dead_letters` the records that
        are not JSON objects with the key and time fields.

        From a topic (:func:`read_kafka`): the rows go to `output_topic` (dead letters to
        `dead_letter_topic`, late rows to `late_topic`), committed with the state and the
        input offsets in one Kafka transaction — exactly once across kills and
        rebalances. The run goes on until Ctrl-C, or until the topic's end with
        `stop_at_end`; `idle_timeout` ('30 seconds') moves a quiet partition's watermark
        on with the clock; `instance_id` names this member's transactions (default: one
        kept with the group's state).

        `state_memory` ('256MB', or bytes) keeps the keys' state in RocksDB on local disk
        beyond that memory budget (the package built with the feature rocksdb): the
        calls and outputs are the same; state larger than memory fits.

        An exception of the function ends the run (its traceback, and the key in a
        note); nothing of its micro-batch is written or committed."""
        stream = self._stream
        watermark = stream._watermark
        options = {
            "inputs": stream._source.get("inputs", []),
            "output": os.fspath(output) if output is not None else None,
            "late": os.fspath(late) if late is not None else None,
            "dead_letters": os.fspath(dead_letters) if dead_letters is not None else None,
            "key": self._keys,
            # Spark's from_json keeps the schema's fields only: the others are not read.
            "fields": stream._schema.names if stream._schema is not None else None,
            "time": watermark[0] if watermark else None,
            "watermark_delay_ms": watermark[1] if watermark else None,
            "batch_size": stream._records_per_batch,
            "timeout": {
                GroupStateTimeout.EventTimeTimeout: "event",
                GroupStateTimeout.ProcessingTimeTimeout: "processing",
            }.get(self._timeout, "none"),
            "state_dir": os.fspath(state_dir) if state_dir is not None else None,
            "state_memory_bytes": _bytes(state_memory) if state_memory is not None else None,
        }
        kafka = stream._source.get("kafka")
        if kafka is None:
            if output is None:
                raise ValueError("a job on files writes to a file: give output")
            given = [n for n, v in (("output_topic", output_topic),
                                    ("dead_letter_topic", dead_letter_topic),
                                    ("late_topic", late_topic), ("instance_id", instance_id),
                                    ("idle_timeout", idle_timeout),
                                    ("commit_interval", commit_interval)) if v is not None]
            if given or stop_at_end:
                raise ValueError(f"{', '.join(given) or 'stop_at_end'}: only for a job on a "
                                 "Kafka topic (read_kafka)")
        else:
            if output_topic is None:
                raise ValueError("a job on a Kafka topic writes to a topic: give output_topic")
            if output is not None or late is not None or dead_letters is not None or state_dir is not None:
                raise ValueError("a job on a Kafka topic keeps its state in the cluster and "
                                 "writes to topics: give output_topic, dead_letter_topic, "
                                 "late_topic, not files or a state_dir")
            options["kafka"] = {
                **kafka,
                "output_topic": output_topic,
                "dead_letter_topic": dead_letter_topic,
                "late_topic": late_topic,
                "instance_id": instance_id,
                "stop_at_end": bool(stop_at_end),
                "idle_timeout_ms": _interval_ms(idle_timeout) if idle_timeout else None,
                "commit_interval_ms": _interval_ms(commit_interval) if commit_interval else None,
            }
        return json.loads(_native.run_stateful(self._caller(), json.dumps(options)))

    def collect(self) -> list[dict[str, Any]]:
        """Runs the job without a state directory and returns its output rows."""
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.jsonl")
            self.run(out)
            with open(out, encoding="utf-8") as f:
                return [json.loads(line) for line in f]

    def _caller(self) -> Callable:
        """The function the engine calls per key: the user's, with PySpark's
        GroupState, frames and schemas around it."""
        func = self._func
        schema = self._stream._schema
        output = self._output
        state_schema = self._state
        timeout_conf = self._timeout
        watermark_present = self._stream._watermark is not None
        names = schema.names if schema is not None else None
        times = [f.name for f in schema.fields if isinstance(f.dataType, TimestampType)] if schema else []
        time_field = self._stream._watermark[0] if self._stream._watermark else None
        out_names = output.names
        dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

        if self._pandas:
            import numpy
            import pandas

            def frames(rows: list[dict], event_times: list[int]) -> Iterable:
                if not rows:
                    return iter(())
                if names is None:
                    return iter((pandas.DataFrame(rows),))
                # Struct columns stay dicts, as Spark hands them to pandas.
                columns = {name: [r.get(name) for r in rows] for name in names}
                for name in times:
                    if name == time_field:
                        # The engine has read these times already.
                        ms = numpy.array(event_times, dtype="datetime64[ms]")
                        columns[name] = ms.astype("datetime64[ns]")
                        continue
                    col = pandas.Series(columns[name])
                    if col.dtype.kind in "iuf":
                        columns[name] = pandas.to_datetime(col, unit="ms")
                    else:
                        columns[name] = pandas.to_datetime(
                            col, utc=True, format="ISO8601").dt.tz_localize(None)
                return iter((pandas.DataFrame(columns),))

            def records(out: Any) -> Iterable:
                """The rows of a returned frame, each as its values in the output
                schema's field order."""
                if not isinstance(out, pandas.DataFrame):
                    raise TypeError(
                        f"applyInPandasWithState's function must return pandas.DataFrames, "
                        f"not {type(out).__name__}"
                    )
                cols = [str(c) for c in out.columns]
                if cols != out_names:
                    missing = [n for n in out_names if n not in cols]
                    unexpected = [c for c in cols if c not in out_names]
                    if missing or unexpected:
                        raise ValueError(
                            "Column names of the returned pandas.DataFrame do not match the "
                            f"output schema. Missing: {', '.join(missing) or '-'}. "
                            f"Unexpected: {', '.join(unexpected) or '-'}."
                        )
                return zip(*(out[name].tolist() for name in out_names))
        else:

            def frames(rows: list[dict], event_times: list[int]) -> Iterable:
                if not rows:
                    return iter(())
                if schema is not None:
                    rows = [schema.to_python(r).asDict() for r in rows]
                return iter((rows,))

            def records(out: Any) -> Iterable:
                return (output._values(out),)

        loads = json.loads
        # The engine's key: one field's text, or several fields' values as a JSON array.
        if len(self._keys) == 1:
            key_type = schema.fields[schema.names.index(self._keys[0])].dataType \
                if schema is not None and self._keys[0] in schema.names else None
            if key_type is None or isinstance(key_type, (StringType, TimestampType)):
                def key_of(text):
                    return (text,)
            else:
                def key_of(text):
                    return (key_type.to_python(loads(text)),)
        else:
            def key_of(text):
                return tuple(loads(text))

        def call(key_json, rows, event_times, before, timed_out, watermark_ms, processing_ms):
            rows = [loads(r) for r in rows]
            key = key_of(key_json)
            value = pickle.loads(before) if before is not None else None
            state = GroupState(
                value, processing_ms, watermark_ms, timeout_conf, timed_out, watermark_present
            )
            lines = []
            result = func(key, frames(rows, event_times), state)
            if result is not None:
                for out in result:
                    for record in records(out):
                        lines.append(dumps(output.to_json(record)))
            if state._removed:
                action, after = 2, None
            elif state._updated:
                action, after = 1, pickle.dumps(state_schema.to_python(state._value), protocol=5)
            else:
                action, after = 0, None
            timeout = None
            if state._timeout_timestamp != GroupState.NO_TIMESTAMP:
                if timeout_conf == GroupStateTimeout.EventTimeTimeout:
                    timeout = ("event", state._timeout_timestamp)
                else:
                    timeout = ("processing", state._timeout_timestamp - processing_ms)
            return lines, action, after, timeout

        return call
