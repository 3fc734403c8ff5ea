"""sessionizer: sessions from event streams — per key, runs of activity closed by a gap
of inactivity — with event time, watermarks, allowed lateness and exactly-once outputs,
run by the Rust engine of the `sessionizer` command line in this process.

Two faces:

* the command line, with the same flags and output: ``python -m sessionizer run ...``
  (or :func:`main` with a list of arguments);
* :class:`SessionWindows`, a declarative session window job: key, time field, gap,
  watermark delay, allowed lateness, the built-in aggregates, the emit mode, and every
  other option of ``sessionizer run``, over files, Kafka topics, Delta tables (when the
  package is built with them) or an iterable of dicts. Nothing runs in Python per
  event: a job is one run of the engine, which returns its statistics as a dict.

See docs/python.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from sessionizer import _native
from sessionizer._native import SessionizerError, __version__

__all__ = ["SessionWindows", "Collected", "SessionizerError", "main", "__version__"]

#: The built-in aggregates: each takes a field, a list of fields, or a dict of
#: ``{output name: field}``.
AGGREGATES = ("collect", "first", "last", "count_distinct", "sum", "min", "max")


def main(argv: Iterable[str]) -> int:
    """Runs ``sessionizer ARGV...`` (without the program name) as the binary does —
    SIGINT and SIGTERM stop a run between two batches — and returns its exit code."""
    return _native.main(["sessionizer", *[str(a) for a in argv]])


def _duration(name: str, value: Any) -> str:
    if isinstance(value, datetime.timedelta):
        return f"{value // datetime.timedelta(milliseconds=1)}ms"
    if isinstance(value, str):
        return value
    raise TypeError(
        f"{name}: give a duration as text ('10m', '500ms', '1h') or a datetime.timedelta, "
        f"not {type(value).__name__}"
    )


def _text(name: str, value: Any) -> str:
    if isinstance(value, datetime.timedelta):
        return _duration(name, value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, bool) or value is None:
        raise TypeError(f"{name}: {value!r} is not a value of this option")
    return str(value)


def _aggregate_specs(name: str, value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [f"{out}={field}" for out, field in value.items()]
    if isinstance(value, (list, tuple)):
        return [_text(name, v) for v in value]
    raise TypeError(
        f"{name}: give a field, a list of fields or a dict of {{output name: field}}, "
        f"not {type(value).__name__}"
    )


def _args(options: Mapping[str, Any]) -> list[str]:
    """The command line's arguments of `options`: `name=value` is `--name value`
    (underscores as dashes); True is the flag alone; None and False leave it out; a
    list repeats it; `kafka_config` also takes a dict."""
    out: list[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif name in AGGREGATES:
            for spec in _aggregate_specs(name, value):
                out += [flag, spec]
        elif name == "kafka_config" and isinstance(value, Mapping):
            for key, v in value.items():
                out += [flag, f"{key}={v}"]
        elif isinstance(value, (list, tuple)):
            for v in value:
                out += [flag, _text(name, v)]
        elif name in ("gap", "watermark_delay", "allowed_lateness", "idle_timeout"):
            out += [flag, _duration(name, value)]
        else:
            out += [flag, _text(name, value)]
    return out


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise TypeError(
                f"a datetime without a time zone ({value!r}) is no point in time: give it "
                "a tzinfo (datetime.timezone.utc, say)"
            )
        return value.isoformat()
    if isinstance(value, datetime.date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _read_lines(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


@dataclasses.dataclass
class Collected:
    """What :meth:`SessionWindows.collect` gives: the session records, the late events
    and the dead letters, as the command line writes them (dicts), and the run's
    statistics."""

    sessions: list[dict]
    late: list[dict]
    dead_letters: list[dict]
    stats: dict


class SessionWindows:
    """A declarative session window job, run by the Rust engine.

    ``key`` and ``time`` name the fields of each event (a dotted path reaches into
    nested objects; by default ``visit_id`` and ``event_time``); ``gap`` closes a
    session after that much inactivity (text such as ``"10m"`` or a
    ``datetime.timedelta``; by default 30 minutes). Left out, these three are the
    command line's defaults, or those of a ``config`` TOML file. Every other keyword is an option of
    ``sessionizer run`` with underscores for dashes — ``watermark_delay``,
    ``allowed_lateness``, ``emit`` (``"on-close"``, ``"on-update"``, ``"final"``),
    ``dedup``, ``valid_time_range``, ``workers``, ... — and the aggregates ``collect``,
    ``first``, ``last``, ``count_distinct``, ``sum``, ``min``, ``max``, each a field, a
    list of fields or a dict of ``{output name: field}``::

        job = SessionWindows(key="visit_id", time="event_time", gap="10m",
                             allowed_lateness="15m", collect={"pages": "page"})
        stats = job.run(input="visits.jsonl", output="sessions.jsonl")
    """

    def __init__(self, *, key: str | None = None, time: str | None = None,
                 gap: Any = None, **options: Any) -> None:
        # Left out, they are the command line's defaults (`visit_id`, `event_time`,
        # 30 minutes) or a `config` file's.
        self.options: dict[str, Any] = {"key": key, "time": time, "gap": gap, **options}
        # Refuse a value of the wrong shape now, not when the job runs.
        _args(self.options)

    def args(self, **options: Any) -> list[str]:
        """The arguments of ``sessionizer run`` this job runs with (`options` added)."""
        return _args({**self.options, **options})

    def run(self, input: Any = None, output: Any = None, **options: Any) -> dict:
        """Runs the job: ``input`` a path or a list of paths (``"-"``: stdin; leave it
        out for a Kafka or Delta input), ``output`` a path (default: stdout), and any
        other option of ``sessionizer run`` — ``state_dir``, ``kafka_brokers``,
        ``kafka_topic``, ``kafka_group``, ``kafka_output_topic``, ``stop_at_end``,
        ``delta_table``, ``stats_file``, ... Returns the run's statistics (the
        ``--stats-file`` fields: ``records_read``, ``in_sessions``, ``duplicates``,
        ``late``, ``invalid``, ``sessions_emitted``, ...), or raises
        :class:`SessionizerError` (its ``code``: 2 for bad options, 1 for a failed
        run). Ctrl-C stops the run between two batches (what was processed is written,
        and checkpointed with a state directory) and raises KeyboardInterrupt."""
        extra: dict[str, Any] = {}
        if input is not None:
            extra["input"] = [input] if isinstance(input, (str, os.PathLike)) else list(input)
        if output is not None:
            extra["output"] = output
        return json.loads(_native.run(self.args(**extra, **options)))

    def collect(self, events: Iterable[Mapping[str, Any]], **options: Any) -> Collected:
        """Sessionizes ``events`` (dicts as JSON holds them; datetimes with a time zone
        become RFC 3339 text) and returns everything the run wrote. The events are
        handed to the engine through a temporary file: for large inputs, give files to
        :meth:`run`."""
        with tempfile.TemporaryDirectory(prefix="sessionizer-") as d:
            inp = os.path.join(d, "events.jsonl")
            with open(inp, "w", encoding="utf-8") as f:
                for e in events:
                    f.write(json.dumps(e, ensure_ascii=False, default=_json_default))
                    f.write("\n")
            paths = {n: os.path.join(d, f"{n}.jsonl") for n in ("sessions", "late", "dead")}
            stats = self.run(
                input=inp,
                output=paths["sessions"],
                late_output=paths["late"],
                dead_letter=paths["dead"],
                progress="never",
                **options,
            )
            late = _read_lines(paths["late"])
            dead = _read_lines(paths["dead"])
            # A record's source names the temporary file: name the event by its place
            # in `events` instead (1 for the first).
            for record in late + dead:
                source = record.get("source")
                if isinstance(source, str) and source.startswith(inp + ":"):
                    record["source"] = "events:" + source[len(inp) + 1:]
            return Collected(
                sessions=_read_lines(paths["sessions"]),
                late=late,
                dead_letters=dead,
                stats=stats,
            )
