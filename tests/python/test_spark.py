"""sessionizer.spark: PySpark's applyInPandasWithState contract on the engine. The book's
function (examples/python/spark_sessions.py) against real PySpark 4.3 on the same
micro-batches; GroupState's rules by hand-written cases; the state's types across a kill
-9; a failing function."""

import json
import os
from datetime import datetime
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BIN, ROOT, kafka_dev, kill_at_random_instants
from sessionizer import spark
from sessionizer.spark import GroupStateTimeout, Row
from sessionizer.spark.types import LongType, StringType, StructField, StructType

EXAMPLES = ROOT / "examples" / "python"
sys.path.insert(0, str(EXAMPLES))
import spark_sessions  # noqa: E402


def generate(path, events, seed, *extra, keys=50):
    subprocess.run([str(BIN), "generate", "--events", str(events), "--keys", str(keys),
                    "--seed", str(seed), "--output", str(path), *extra], check=True,
                   capture_output=True)
    return path.read_text().splitlines(keepends=True)


def normalized(path):
    """Rows by (visit, start), each visit's pages by (time, page): Spark leaves the
    order of a key's rows within a micro-batch open, and the book's function sorts pages
    by time only, at one-second resolution."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    for r in rows:
        r["visited_pages"].sort(key=lambda p: (p["event_time_as_milliseconds"], p["page"]))
    return sorted((r for r in rows if not r["visit_id"].startswith("~")),
                  key=lambda r: (r["visit_id"], r["start_time"]))


def sentinel_batch(tag, count, at):
    """`count` visits of keys that sort after every real one, at `at`: a batch of them
    moves the watermark past every real visit's timeout."""
    return [json.dumps({"visit_id": f"~{tag}-{i:04d}", "event_time": at, "user_id": "u",
                        "page": "/"}) + "\n" for i in range(count)]


def test_the_books_function_gives_what_pyspark_gives_on_the_same_micro_batches(tmp_path):
    batch = 500
    lines = generate(tmp_path / "visits.jsonl", 3000, 11, "--out-of-order", "20s",
                     "--late-fraction", "0.01", "--late-by", "10m",
                     "--duplicate-fraction", "0.01")
    lines = lines[: len(lines) // batch * batch]
    # Two batches of far-future visits of keys we leave out: in the last one, Spark's
    # watermark has passed every real visit's timeout, so both engines emit every session
    # of the real visits in micro-batches, without Spark's no-data batch.
    lines += sentinel_batch("a", batch, "2030-01-01T00:00:00Z")
    lines += sentinel_batch("b", batch, "2030-01-01T00:00:01Z")
    batches = tmp_path / "batches"
    batches.mkdir()
    now = time.time() - 1000
    for i in range(len(lines) // batch):
        f = batches / f"batch-{i:03d}.json"
        f.write_text("".join(lines[i * batch:(i + 1) * batch]))
        os.utime(f, (now + i, now + i))
    ours_input = tmp_path / "all.jsonl"
    ours_input.write_text("".join(lines))

    stats = spark_sessions.sessions(str(ours_input), batch).run(tmp_path / "ours.jsonl")
    # pyspark_fix: a one-line mend of PySpark 4.3.0's worker (its docstring says which).
    path = [str(ROOT / "tests" / "python" / "pyspark_fix"), str(EXAMPLES)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path),
           "PYSPARK_PYTHON": sys.executable, "TZ": "UTC"}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "python" / "pyspark_job.py"),
                           str(batches), str(tmp_path / "spark.jsonl"), str(tmp_path / "ckpt")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-5000:]

    ours, theirs = normalized(tmp_path / "ours.jsonl"), normalized(tmp_path / "spark.jsonl")
    assert len(theirs) > 100, "the comparison has sessions to compare"
    assert ours == theirs
    assert stats["late"] > 0, "late visits were dropped by both"
    # Rows behind their batch's watermark but not behind the previous batch's: Spark's
    # late rule keeps them, a rule by the batch's own watermark would not.
    between, previous, current, largest = 0, 0, 0, None
    for i in range(0, len(lines), batch):
        times = [int(datetime.fromisoformat(json.loads(x)["event_time"].replace("Z", "+00:00"))
                     .timestamp() * 1000) for x in lines[i:i + batch]]
        between += sum(previous < t <= current for t in times)
        largest = max([*times, largest or 0])
        previous, current = current, max(current, largest - 60_000)
    assert between > 0, "the data tells the two late rules apart"
    assert stats["batches"] == len(lines) // batch + 1, "the micro-batches, then the no-data batch"


def lines_of(*rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


STATE = StructType([StructField("count", LongType()), StructField("last", StringType())])
OUT = StructType([StructField("key", StringType()), StructField("count", LongType()),
                  StructField("watermark", LongType()), StructField("timed_out", StringType())])


def test_group_state_follows_pysparks_rules_call_by_call(tmp_path):
    source = tmp_path / "in.jsonl"
    # Micro-batches of two records; a 10-second watermark delay.
    source.write_text(lines_of(
        {"k": "a", "t": 0}, {"k": "b", "t": 1000},        # W 0 (the first batch)
        {"k": "c", "t": 70_000}, {"k": "x", "t": 5},      # W -9000, shown as 0
        {"k": "b", "t": 71_000}, {"k": "y", "t": 9_000},  # W 60000, late only <= -9000
        {"k": "z", "t": 71_500}, {"k": "v", "t": 50_000},  # W 61000, late <= 60000: v
    ))
    seen = []

    def f(key, rows, state):
        rows = [r for frame in rows for r in frame]
        seen.append((key, [r["t"] for r in rows], state.hasTimedOut, state.exists,
                     state.getCurrentWatermarkMs()))
        assert isinstance(type(state).exists, property) and isinstance(type(state).get, property)
        if state.hasTimedOut:
            assert rows == []
            count, last = state.get
            state.remove()
            assert not state.exists and state.getOption is None
            yield {"key": key[0], "count": count, "watermark": state.getCurrentWatermarkMs(),
                   "timed_out": last}
            return
        count = state.get[0] if state.exists else 0
        state.update((count + len(rows), key[0]))
        watermark = state.getCurrentWatermarkMs()
        if watermark > 0:
            with pytest.raises(ValueError, match="cannot be earlier than the current watermark"):
                state.setTimeoutTimestamp(watermark - 1)
        with pytest.raises(RuntimeError, match="processing time timeout"):
            state.setTimeoutDuration(1000)
        state.setTimeoutTimestamp(max(max(r["t"] for r in rows) + 10_000, watermark))

    query = (spark.read_json(source, records_per_batch=2).withWatermark("t", "10 seconds")
             .groupBy("k").applyWithState(f, OUT, STATE, "append",
                                         GroupStateTimeout.EventTimeTimeout))
    out = tmp_path / "out.jsonl"
    stats = query.run(out, late=tmp_path / "late.jsonl")
    rows = [json.loads(line) for line in out.read_text().splitlines()]

    # Batch 3 (W 60000): the data calls of b and y (y is behind W but not behind the
    #   previous batch's -9000: Spark's late rule); then a (10000 < 60000) and x (10005)
    #   time out, by deadline. y's timeout is 60000: not passed yet.
    # Batch 4 (W 61000): z's data call, v late; y times out (60000 < 61000).
    # The end: a batch without rows (W 61500: nothing due), then +inf: c, b, z.
    assert [(r["key"], r["count"], r["watermark"]) for r in rows][:3] == [
        ("a", 1, 60_000), ("x", 1, 60_000), ("y", 1, 61_000)]
    assert [(r["key"], r["count"]) for r in rows][3:] == [("c", 1), ("b", 2), ("z", 1)]
    assert stats["late"] == 1
    assert json.loads((tmp_path / "late.jsonl").read_text())["event"]["k"] == "v"
    data = [s for s in seen if not s[2]]
    assert data[0][4] == 0 and data[1][4] == 0, "the first batch's watermark is 0"
    assert (("b",), [71_000], False, True, 60_000) in seen, "a data call, not b's timeout"
    assert (("y",), [9_000], False, False, 60_000) in seen


def test_a_timeout_at_the_watermark_waits_until_the_watermark_passes_it(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(lines_of({"k": "a", "t": 1000}, {"k": "z", "t": 20_000},
                               {"k": "z", "t": 21_000}, {"k": "z", "t": 22_000}))
    fired = []

    def f(key, rows, state):
        if state.hasTimedOut:
            fired.append((key[0], state.getCurrentWatermarkMs()))
            state.remove()
        elif key[0] == "a":
            state.update((1, "a"))
            state.setTimeoutTimestamp(11_000)  # W after batch 2 is exactly 11000
        return []

    spark.read_json(source, records_per_batch=1).withWatermark("t", "10 seconds") \
        .groupBy("k").applyWithState(f, OUT, STATE, "update", "EventTimeTimeout") \
        .run(tmp_path / "out.jsonl")
    # Batch 4's watermark is 11000 = the timeout: not yet (Spark: timeout < watermark).
    assert fired == [("a", 12_000)]


def test_late_rows_reach_the_function_without_an_event_time_timeout(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(lines_of({"k": "a", "t": 100_000}, {"k": "a", "t": 0}))
    got = []

    def f(key, rows, state):
        got.extend(r["t"] for frame in rows for r in frame.to_dict(orient="records"))
        return []

    stats = (spark.read_json(source, records_per_batch=1).withWatermark("t", "1 second")
             .groupBy("k").applyInPandasWithState(f, OUT, STATE, "update", "NoTimeout")
             .run(tmp_path / "out.jsonl"))
    assert got == [100_000, 0] and stats["late"] == 0


def test_the_state_comes_back_as_rows_of_the_state_schema_with_attribute_access(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(lines_of({"k": "a", "t": 1, "p": "/x"}, {"k": "a", "t": 2, "p": "/y"}))
    pages = StructType([StructField("page", StringType()), StructField("t", LongType())])
    from sessionizer.spark.types import ArrayType
    schema = StructType([StructField("visits", ArrayType(pages))])
    kinds = []

    def f(key, rows, state):
        visits = list(state.get[0]) if state.exists else []
        kinds.extend(type(v).__name__ for v in visits)
        if visits:
            assert [v.page for v in visits] == ["/x"] and visits[0].t == 1
        state.update((visits + [{"t": r["t"], "page": r["p"]} for frame in rows for r in frame],))
        return []

    spark.read_json(source, records_per_batch=1).groupBy("k") \
        .applyWithState(f, OUT, schema, "update", "NoTimeout").run(tmp_path / "o.jsonl")
    assert kinds == ["Row"], "a dict the function stored comes back as a Row"
    row = pickle.loads(pickle.dumps(Row(page="/x", t=1)))
    assert row.page == "/x" and row.asDict() == {"page": "/x", "t": 1}


def test_an_exception_in_the_function_stops_the_run_with_its_traceback_and_key(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(lines_of(*({"k": f"k{i}", "t": i} for i in range(6))))

    def f(key, rows, state):
        if key == ("k3",):
            raise KeyError("no such page")
        yield {"key": key[0], "count": 1, "watermark": 0, "timed_out": None}

    query = spark.read_json(source, records_per_batch=2).groupBy("k") \
        .applyWithState(f, OUT, STATE, "update", "NoTimeout")
    out = tmp_path / "out.jsonl"
    with pytest.raises(KeyError, match="no such page") as info:
        query.run(out)
    assert 'in the call for key "k3"' in "".join(getattr(info.value, "__notes__", []))
    assert any(frame.name == "f" for frame in info.traceback), "the function's own frame"
    # The batches before the failing one are written, nothing of it (k2 was called).
    assert [json.loads(line)["key"] for line in out.read_text().splitlines()] == ["k0", "k1"]


def test_the_rocksdb_state_backend_gives_the_rows_of_the_memory_backend(tmp_path):
    generate(tmp_path / "visits.jsonl", 8000, 9, "--out-of-order", "20s", keys=2000)
    query = spark_sessions.sessions(str(tmp_path / "visits.jsonl"), 300)
    memory = query.run(tmp_path / "memory.jsonl")
    rocksdb = query.run(tmp_path / "rocksdb.jsonl", state_memory="64kB")
    assert rocksdb["keys_evicted"] > 100, "state went to disk and came back"
    assert memory["keys_evicted"] is None
    assert (tmp_path / "rocksdb.jsonl").read_bytes() == (tmp_path / "memory.jsonl").read_bytes()
    assert {k: memory[k] for k in ("data_calls", "timeout_calls", "outputs")} == \
        {k: rocksdb[k] for k in ("data_calls", "timeout_calls", "outputs")}


KILL_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[4])
import spark_sessions
spark_sessions.sessions(sys.argv[1], 100).run(sys.argv[2], state_dir=sys.argv[3])
"""


def test_a_job_with_a_state_dir_killed_at_random_instants_ends_with_the_uninterrupted_output(tmp_path):
    # Late visits, some of them behind a batch's watermark but not the previous batch's:
    # a restart must judge them as the uninterrupted run does.
    lines = generate(tmp_path / "visits.jsonl", 15000, 5, "--out-of-order", "20s",
                     "--late-fraction", "0.05", "--late-by", "100s")
    script = tmp_path / "job.py"
    script.write_text(KILL_SCRIPT)

    def start(out, state):
        return subprocess.Popen([sys.executable, str(script), str(tmp_path / "visits.jsonl"),
                                 str(out), str(state), str(EXAMPLES)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    began = time.monotonic()
    whole = start(tmp_path / "whole.jsonl", tmp_path / "whole-state")
    _, err = whole.communicate(timeout=600)
    assert whole.returncode == 0, err
    took = time.monotonic() - began
    kills = kill_at_random_instants(lambda: start(tmp_path / "killed.jsonl", tmp_path / "state"),
                                    took, (0.15, 0.4), 6, 3)
    assert kills >= 2
    whole_text = (tmp_path / "whole.jsonl").read_text()
    assert len(lines) == 15000 and whole_text.count("\n") > 500
    assert (tmp_path / "killed.jsonl").read_text() == whole_text


def test_the_books_function_on_a_topic_commits_every_session_once_through_kills(tmp_path, broker):
    kafka_dev("topics", "--create", "--topic", "sp-visits", "--partitions", "3")
    for topic in ("sp-one", "sp-killed", "sp-dead-one", "sp-dead-killed"):
        kafka_dev("topics", "--create", "--topic", topic, "--partitions", "3")
    generated = subprocess.run(
        [str(BIN), "generate", "--events", "12000", "--keys", "300", "--seed", "6",
         "--out-of-order", "20s", "--late-fraction", "0.01", "--late-by", "10m",
         "--invalid-fraction", "0.002", "--kafka-brokers", broker, "--kafka-topic", "sp-visits"],
        capture_output=True, text=True)
    assert generated.returncode == 0, generated.stderr

    def job(group, output, dead):
        return subprocess.Popen(
            [sys.executable, str(EXAMPLES / "spark_sessions.py"), "--brokers", broker,
             "--topic", "sp-visits", "--group", group, "--output-topic", output,
             "--dead-letter-topic", dead, "--stop-at-end", "--records-per-batch", "200"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    began = time.monotonic()
    one = job("sp-one", "sp-one", "sp-dead-one")
    _, err = one.communicate(timeout=600)
    assert one.returncode == 0, err
    took = time.monotonic() - began
    stats = json.loads(err.strip().splitlines()[-1])
    want = sorted(kafka_dev("consume", "sp-one").splitlines())
    assert len(want) > 500
    assert all(json.loads(line)["visited_pages"] for line in want)
    assert len(kafka_dev("consume", "sp-dead-one").splitlines()) > 0, "dead letters"
    assert stats, "the run's statistics"

    kills = kill_at_random_instants(lambda: job("sp-killed", "sp-killed", "sp-dead-killed"),
                                    took, (1 / 6, 0.8), 6, 4)
    assert kills >= 2, f"only {kills} kills"
    got = sorted(kafka_dev("consume", "sp-killed").splitlines())
    assert got == want


def test_an_exception_on_a_topic_ends_the_run_with_it_and_commits_nothing_of_its_batch(tmp_path, broker):
    kafka_dev("topics", "--create", "--topic", "sp-fail-in", "--partitions", "1")
    kafka_dev("topics", "--create", "--topic", "sp-fail-out", "--partitions", "1")
    records = tmp_path / "records.jsonl"
    records.write_text(lines_of(*({"k": f"k{i:03d}", "t": i} for i in range(300))))
    with open(records) as f:
        kafka_dev("produce", "sp-fail-in", stdin=f)

    def f(key, rows, state):
        if key == ("k250",):  # in the third micro-batch of 100 records
            raise KeyError("no such page")
        yield {"key": key[0], "count": 1, "watermark": 0, "timed_out": None}

    query = spark.read_kafka(broker, "sp-fail-in", "sp-fail", records_per_batch=100) \
        .groupBy("k").applyWithState(f, OUT, STATE, "update", "NoTimeout")
    with pytest.raises(KeyError, match="no such page") as info:
        query.run(output_topic="sp-fail-out", stop_at_end=True, commit_interval="100 ms")
    assert 'in the call for key "k250"' in "".join(getattr(info.value, "__notes__", []))
    committed = [json.loads(line)["key"] for line in kafka_dev("consume", "sp-fail-out").splitlines()]
    # Whole micro-batches before the failing one, or none: never k200..k249, called in
    # the failing batch before k250.
    assert len(committed) in (0, 100, 200)
    assert committed == [f"k{i:03d}" for i in range(len(committed))]


def test_the_calls_at_the_end_of_the_input_see_the_last_watermark_and_may_set_a_timeout(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(lines_of({"k": "a", "t": 100_000}, {"k": "b", "t": 200_000}))
    seen = []

    def f(key, rows, state):
        if state.hasTimedOut:
            seen.append((key[0], state.getCurrentWatermarkMs()))
            # Re-armed, as a function that waits for more may do: nothing fires it.
            state.setTimeoutTimestamp(state.getCurrentWatermarkMs() + 1)
            yield {"key": key[0], "count": 1, "watermark": state.getCurrentWatermarkMs(),
                   "timed_out": "yes"}
            return
        state.update((1, key[0]))
        state.setTimeoutTimestamp(10**12)

    query = spark.read_json(source, records_per_batch=1).withWatermark("t", "10 seconds") \
        .groupBy("k").applyWithState(f, OUT, STATE, "update", "EventTimeTimeout")
    for _ in range(2):  # again from the finished checkpoint: nothing more
        stats = query.run(tmp_path / "out.jsonl", state_dir=tmp_path / "state")
    # The no-data batch ran at 190000 (b's time less 10 s): what the last calls see.
    assert seen == [("a", 190_000), ("b", 190_000)]
    assert stats["outputs"] == 2
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2
