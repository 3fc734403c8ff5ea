"""The measuring half of scripts/bench-spark.sh: DATA DIR BATCHES.

Writes the book's function without its prints into DIR/quiet_sessions.py, cuts DATA into
BATCHES files for PySpark, runs sessionizer.spark (one core) and PySpark 4.3
(tests/python/pyspark_job.py, local[2]) on the same micro-batches, sampling the RSS of
each process tree every 100 ms, and compares their sessions."""

import inspect
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "python"))


DICTS = '''
UTC = datetime.timezone.utc


def map_visits_in_dicts(visit_id_tuple, input_rows, current_state):
    """The book's function, line for line, on lists of dicts instead of DataFrames
    (applyWithState)."""
    visit_id = visit_id_tuple[0]
    if current_state.hasTimedOut:
        visits, user_id, = current_state.get
        sorted_visits = sorted(visits, key=lambda v: v.event_time_as_milliseconds)
        first = sorted_visits[0].event_time_as_milliseconds
        last = sorted_visits[len(sorted_visits) - 1].event_time_as_milliseconds
        current_state.remove()
        yield {"visit_id": visit_id,
               "start_time": datetime.datetime.fromtimestamp(first / 1000.0, tz=UTC),
               "end_time": datetime.datetime.fromtimestamp(last / 1000.0, tz=UTC),
               "visited_pages": sorted_visits, "duration_in_milliseconds": last - first,
               "user_id": user_id}
    else:
        should_use_event_time_for_watermark = current_state.getCurrentWatermarkMs() == 0
        base_watermark = current_state.getCurrentWatermarkMs()
        new_visits = []
        user_id = None
        for rows in input_rows:
            new_visits = [{"event_time_as_milliseconds":
                           int(r["event_time"].replace(tzinfo=UTC).timestamp()) * 1000,
                           "page": r["page"]} for r in rows]
            if should_use_event_time_for_watermark:
                base_watermark = max(v["event_time_as_milliseconds"] for v in new_visits)
            user_id = rows[0]["user_id"]
        visits_so_far = []
        if current_state.exists:
            visits_so_far, user_id, = current_state.get
        current_state.update((visits_so_far + new_visits, user_id,))
        current_state.setTimeoutTimestamp(base_watermark + 10 * 60 * 1000)
'''


def quiet_module(directory):
    """The book's function without its prints, and its port to dicts."""
    import spark_sessions

    source = inspect.getsource(spark_sessions.map_visits_to_session)
    source = "\n".join(line for line in source.splitlines() if "print(" not in line)
    header = ("import datetime\nimport pandas\nfrom typing import *\n"
              "from sessionizer.spark.state import GroupState\n")
    (directory / "quiet_sessions.py").write_text(header + source + "\n" + DICTS)


def tree_rss(pid):
    """The summed RSS (bytes) of `pid` and its descendants."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def measure(command, env):
    start = time.monotonic()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]

    def sample():
        while child.poll() is None:
            peak[0] = max(peak[0], tree_rss(child.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    _, err = child.communicate()
    sampler.join()
    took = time.monotonic() - start
    if child.returncode != 0:
        sys.exit(f"{command[0]} failed:\n{err.decode()[-3000:]}")
    return took, peak[0]


def sessions(path):
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    for r in rows:
        r["visited_pages"].sort(key=lambda p: (p["event_time_as_milliseconds"], p["page"]))
    return sorted(rows, key=lambda r: (r["visit_id"], r["start_time"]))


def main(data, directory, batches):
    directory = Path(directory).resolve()
    quiet_module(directory)
    lines = Path(data).read_text().splitlines(keepends=True)
    events = len(lines)
    per_batch = -(-events // batches)
    split = directory / "batches"
    split.mkdir(exist_ok=True)
    for f in split.iterdir():
        f.unlink()
    now = time.time() - 1000
    for i in range(batches):
        f = split / f"batch-{i:03d}.json"
        f.write_text("".join(lines[i * per_batch:(i + 1) * per_batch]))
        os.utime(f, (now + i, now + i))
    path = os.pathsep.join([str(directory), str(ROOT / "tests" / "python" / "pyspark_fix"),
                            str(ROOT / "examples" / "python")])
    env = {**os.environ, "PYTHONPATH": path, "TZ": "UTC", "PYSPARK_PYTHON": sys.executable,
           "SPARK_SESSIONS_FUNCTION": "quiet_sessions:map_visits_to_session"}

    ours_out = directory / "ours.jsonl"
    ours = ["taskset", "-c", "0", sys.executable, "-c",
            "import sys, spark_sessions, quiet_sessions; "
            "spark_sessions.sessions(sys.argv[1], int(sys.argv[2]), "
            "quiet_sessions.map_visits_to_session).run(sys.argv[3])",
            str(Path(data).resolve()), str(per_batch), str(ours_out)]
    took, rss = measure(ours, env)
    print(f"sessionizer.spark applyInPandasWithState (1 core): {events / took:,.0f} events/s, "
          f"{took:.1f} s, peak RSS {rss / 2**20:,.0f} MB", flush=True)

    dicts_out = directory / "dicts.jsonl"
    dicts = ["taskset", "-c", "0", sys.executable, "-c",
             "import sys, spark_sessions, quiet_sessions; from sessionizer import spark; "
             "spark.read_json(sys.argv[1], schema=spark_sessions.visit_schema, "
             "records_per_batch=int(sys.argv[2])).withWatermark('event_time', '1 minute')"
             ".groupBy('visit_id').applyWithState(quiet_sessions.map_visits_in_dicts, "
             "spark_sessions.output_schema, spark_sessions.state_schema, 'update', "
             "'EventTimeTimeout').run(sys.argv[3])",
             str(Path(data).resolve()), str(per_batch), str(dicts_out)]
    took, rss = measure(dicts, env)
    same = sessions(dicts_out) == sessions(ours_out)
    print(f"sessionizer.spark applyWithState, the same function on dicts (1 core): "
          f"{events / took:,.0f} events/s, {took:.1f} s, peak RSS {rss / 2**20:,.0f} MB "
          f"(rows {'equal to' if same else 'DIFFERENT from'} the pandas run's)", flush=True)

    spark_out = directory / "spark.jsonl"
    checkpoint = directory / "spark-checkpoint"
    subprocess.run(["rm", "-rf", str(checkpoint)], check=True)
    spark = [sys.executable, str(ROOT / "tests" / "python" / "pyspark_job.py"), str(split),
             str(spark_out), str(checkpoint)]
    took, rss = measure(spark, env)
    print(f"PySpark 4.3 applyInPandasWithState (local[2]): {events / took:,.0f} events/s, "
          f"{took:.1f} s, peak RSS {rss / 2**20:,.0f} MB (JVM and Python workers)", flush=True)

    # PySpark's stream does not emit the sessions still open after the last batch's
    # no-data batch; ours ends with +inf: compare what PySpark emitted.
    ours_rows, spark_rows = sessions(ours_out), sessions(spark_out)
    spark_keys = {(r["visit_id"], r["start_time"]) for r in spark_rows}
    emitted = [r for r in ours_rows if (r["visit_id"], r["start_time"]) in spark_keys]
    print(f"sessions: sessionizer {len(ours_rows):,} (PySpark's {len(spark_rows):,} among "
          f"them: {'equal' if emitted == spark_rows else 'DIFFERENT'})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
