"""The Python package against the command line: `python -m sessionizer` and
`SessionWindows` give the binary's output byte for byte on generated dirty data; a job
killed with SIGKILL and run again ends with the uninterrupted run's output; errors and
Ctrl-C behave as documented.

The binary is `$SESSIONIZER_BIN`, else target/debug/sessionizer of this checkout
(scripts/test.sh builds it before it runs these tests)."""

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import sessionizer

from conftest import BIN, kill_at_random_instants


def binary(*args):
    assert BIN.exists(), f"{BIN} is missing: cargo build -p sessionizer-cli first"
    done = subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def dirty(tmp_path_factory):
    """30,000 visits of 500 concurrent keys: out of order, late, duplicated, invalid."""
    path = tmp_path_factory.mktemp("input") / "visits.jsonl"
    binary("generate", "--events", 30000, "--keys", 500, "--seed", 5, "--out-of-order", "30s",
           "--late-fraction", "0.03", "--late-by", "30m", "--duplicate-fraction", "0.005",
           "--invalid-fraction", "0.002", "--return-fraction", "0.3", "--output", path)
    return path


def outputs(directory):
    return {name: (directory / name).read_bytes() if (directory / name).exists() else b""
            for name in ("sessions.jsonl", "late.jsonl", "dead.jsonl")}


def binary_run(tmp_path, name, inputs, args):
    out = tmp_path / name
    out.mkdir()
    binary("run", *[a for i in inputs for a in ("--input", i)], *args,
           "--output", out / "sessions.jsonl", "--late-output", out / "late.jsonl",
           "--dead-letter", out / "dead.jsonl")
    return outputs(out)


JOBS = [
    dict(collect="page"),
    dict(allowed_lateness="15m", collect={"pages": "page"}, sum={"dwell": "duration_ms"},
         dedup=True),
    dict(emit="final", gap="5m", count_distinct="page", first="referrer",
         last={"exit_page": "page"},
         min={"shortest": "duration_ms"}, max={"longest": "duration_ms"}, workers=2),
    dict(emit="on-update", allowed_lateness="10m", watermark_delay="1m", collect="page"),
]


@pytest.mark.parametrize("options", JOBS)
def test_session_windows_equal_the_command_line_byte_for_byte(tmp_path, dirty, options):
    job = sessionizer.SessionWindows(key="visit_id", time="event_time", **options)
    want = binary_run(tmp_path, "cli", [dirty], job.args())
    assert want["sessions.jsonl"].count(b"\n") > 1000
    assert want["late.jsonl"] and want["dead.jsonl"], "the input is dirty"
    out = tmp_path / "py"
    out.mkdir()
    stats = job.run(input=dirty, output=out / "sessions.jsonl", late_output=out / "late.jsonl",
                    dead_letter=out / "dead.jsonl")
    assert outputs(out) == want
    # The statistics add up, and say what the files hold.
    assert stats["records_read"] == (stats["in_sessions"] + stats["duplicates"]
                                     + stats["late"] + stats["invalid"])
    assert stats["invalid"] == want["dead.jsonl"].count(b"\n")
    lines = [line for line in dirty.read_bytes().splitlines() if line.strip()]
    assert stats["records_read"] == len(lines)


def test_python_m_sessionizer_is_the_command_line(tmp_path, dirty):
    args = ["--collect", "page", "--allowed-lateness", "15m"]
    want = binary_run(tmp_path, "cli", [dirty], args)
    out = tmp_path / "py"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "sessionizer", "run", "--input", dirty, *args,
         "--output", out / "sessions.jsonl", "--late-output", out / "late.jsonl",
         "--dead-letter", out / "dead.jsonl"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "sessions emitted" in done.stderr
    assert outputs(out) == want
    # Bad options: exit code 2 and the binary's message.
    bad = subprocess.run([sys.executable, "-m", "sessionizer", "run", "--gap", "0x"],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert "invalid --gap '0x'" in bad.stderr
    # sessionizer.main runs it in this process.
    assert sessionizer.main(["run", "--input", dirty, "--output", out / "again.jsonl",
                             "--progress", "never", *args]) == 0
    assert (out / "again.jsonl").read_bytes() == want["sessions.jsonl"]


def test_collect_sessionizes_dicts_in_memory():
    import datetime
    utc = datetime.timezone.utc
    events = [
        {"visit_id": "v1", "event_time": "2024-01-01T00:00:00Z", "page": "/"},
        {"visit_id": "v1", "event_time": datetime.datetime(2024, 1, 1, 0, 3, tzinfo=utc),
         "page": "/cart"},
        {"visit_id": "v2", "event_time": "2024-01-01T00:01:00Z", "page": "/"},
        {"page": "/no-key"},
        # Two hours later: closes v1's and v2's sessions, opens another for v1.
        {"visit_id": "v1", "event_time": "2024-01-01T02:00:00Z", "page": "/again"},
        # Late: the watermark has passed v1's first session's close.
        {"visit_id": "v1", "event_time": "2024-01-01T00:04:00Z", "page": "/late"},
    ]
    job = sessionizer.SessionWindows(gap="10m", collect={"pages": "page"})
    got = job.collect(events)
    assert [(s["key"], s["start"], s["event_count"], s["pages"]) for s in got.sessions] == [
        # By close time: v2's closes at 00:11, v1's at 00:13.
        ("v2", "2024-01-01T00:01:00.000Z", 1, ["/"]),
        ("v1", "2024-01-01T00:00:00.000Z", 2, ["/", "/cart"]),
        ("v1", "2024-01-01T02:00:00.000Z", 1, ["/again"]),
    ]
    assert [d["source"] for d in got.dead_letters] == ["events:4"]
    assert "visit_id" in got.dead_letters[0]["reason"]
    assert len(got.late) == 1 and got.late[0]["source"] == "events:6"
    assert got.stats["records_read"] == 6
    assert (got.stats["in_sessions"], got.stats["late"], got.stats["invalid"]) == (4, 1, 1)
    with pytest.raises(TypeError, match="time zone"):
        job.collect([{"visit_id": "v", "event_time": datetime.datetime(2024, 1, 1)}])


def test_errors_are_raised_with_the_command_lines_words(tmp_path):
    with pytest.raises(sessionizer.SessionizerError, match="invalid --gap") as bad:
        sessionizer.SessionWindows(gap="0x").run(input=tmp_path / "none.jsonl")
    assert bad.value.code == 2
    with pytest.raises(sessionizer.SessionizerError, match="cannot read input") as failed:
        sessionizer.SessionWindows().run(input=tmp_path / "none.jsonl",
                                         output=tmp_path / "s.jsonl")
    assert failed.value.code == 1
    with pytest.raises(TypeError, match="duration"):
        sessionizer.SessionWindows(gap=600)
    with pytest.raises(TypeError, match="output name"):
        sessionizer.SessionWindows(collect=3)


SERVICE = textwrap.dedent("""
    import sys, sessionizer
    job = sessionizer.SessionWindows(key="visit_id", time="event_time", gap="10m",
                                     allowed_lateness="15m", collect="page")
    job.run(input=sys.argv[1], output=sys.argv[2] + "/sessions.jsonl",
            late_output=sys.argv[2] + "/late.jsonl", dead_letter=sys.argv[2] + "/dead.jsonl",
            state_dir=sys.argv[3], checkpoint_every_records=2000, progress="never")
""")


def test_a_job_killed_at_random_instants_ends_with_the_uninterrupted_output(tmp_path):
    big = tmp_path / "visits.jsonl"
    binary("generate", "--events", 150000, "--keys", 2000, "--seed", 9, "--late-fraction", "0.02",
           "--invalid-fraction", "0.002", "--output", big)
    script = tmp_path / "service.py"
    script.write_text(SERVICE)

    def start(out, state):
        out.mkdir(exist_ok=True)
        return subprocess.Popen([sys.executable, script, big, out, state],
                                stderr=subprocess.PIPE)

    one = tmp_path / "one"
    began = time.monotonic()
    assert start(one, tmp_path / "state-one").wait() == 0
    took = time.monotonic() - began
    want = outputs(one)
    assert want["sessions.jsonl"].count(b"\n") > 5000

    out, state = tmp_path / "killed", tmp_path / "state-killed"
    kills = kill_at_random_instants(lambda: start(out, state), took, (0.1, 0.5), 8, 31)
    assert kills >= 3, f"only {kills} kills"
    assert start(out, state).wait() == 0  # done already: resumes at the end, adds nothing
    assert outputs(out) == want


def interrupted(script, out, data, pauses):
    """Runs `script OUT` with `data` on its stdin (left open, as a live input), sends it
    SIGINT after each of `pauses` (seconds), and returns its exit code and stderr."""
    child = subprocess.Popen([sys.executable, script, out], stdin=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    child.stdin.write(data)
    child.stdin.flush()
    for pause in pauses:
        time.sleep(pause)
        child.send_signal(signal.SIGINT)
    try:
        code = child.wait(timeout=20)
    finally:
        child.kill()
    return code, child.stderr.read().decode()


def test_ctrl_c_stops_a_run_cleanly_and_raises_keyboard_interrupt(tmp_path, dirty):
    script = tmp_path / "live.py"
    script.write_text(textwrap.dedent("""
        import sys, sessionizer
        try:
            sessionizer.SessionWindows(collect="page").run(
                input="-", output=sys.argv[1], progress="never")
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise SystemExit(130)
    """))
    out = tmp_path / "sessions.jsonl"
    lines = dirty.read_bytes().splitlines(keepends=True)
    code, err = interrupted(script, out, b"".join(lines[:5000]), [1.0])
    assert code == 130, err
    assert "interrupted" in err
    # What was processed was written out: the sessions closed within those lines.
    lines = out.read_text().splitlines()
    assert lines, "the sessions closed before the stop are written"
    for line in lines:
        assert json.loads(line)["event_count"] >= 1


def test_ctrl_c_in_python_m_sessionizer_is_the_binarys_sigint(tmp_path, dirty):
    """The command line in the interpreter stops as the binary does on SIGINT — the
    outputs written, exit code 1, no Python traceback — and leaves the interpreter's
    signal handling alone: a later Ctrl-C is Python's KeyboardInterrupt again."""
    script = tmp_path / "cli.py"
    script.write_text(textwrap.dedent("""
        import sys, time, sessionizer
        code = sessionizer.main(["run", "--input", "-", "--output", sys.argv[1],
                                 "--progress", "never", "--collect", "page"])
        print("exit", code, file=sys.stderr, flush=True)
        try:
            time.sleep(30)
        except KeyboardInterrupt:
            print("python's own", file=sys.stderr)
            raise SystemExit(0)
    """))
    out = tmp_path / "sessions.jsonl"
    code, err = interrupted(script, out, dirty.read_bytes()[:2_000_000], [1.0, 1.5])
    assert code == 0, err
    assert "stopped by a signal" in err and "exit 1" in err
    assert "python's own" in err and "Traceback" not in err
    assert out.read_text().splitlines(), "the sessions closed before the stop are written"


def test_a_config_file_gives_what_the_job_leaves_out(tmp_path, dirty):
    config = tmp_path / "job.toml"
    config.write_text('key = "visit_id"\ngap = "5m"\ncollect = ["page"]\n')
    events = []
    for line in dirty.read_text().splitlines()[:3000]:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    from_file = sessionizer.SessionWindows(config=config).collect(events)
    given = sessionizer.SessionWindows(gap="5m", collect="page").collect(events)
    default = sessionizer.SessionWindows(collect="page").collect(events)
    assert from_file.sessions == given.sessions
    # The file's 5-minute gap, not the command line's 30 minutes.
    assert from_file.sessions != default.sessions
    assert from_file.sessions[0]["page"]


def test_a_delta_table_and_parquet_files_from_python_hold_the_command_lines_sessions(tmp_path, dirty):
    """The package built with the feature delta (scripts/test.sh builds it so): the table
    holds the rows of the binary's `--emit final` JSON run, read back with deltalake."""
    import deltalake
    job = sessionizer.SessionWindows(collect="page")
    stats = job.run(input=dirty, delta_table=tmp_path / "table", state_dir=tmp_path / "state")
    rows = deltalake.DeltaTable(str(tmp_path / "table")).to_pyarrow_table().to_pylist()
    binary("run", "--input", dirty, "--collect", "page", "--emit", "final",
           "--output", tmp_path / "final.jsonl")
    final = [json.loads(line) for line in (tmp_path / "final.jsonl").read_text().splitlines()]
    assert len(rows) == len(final) == stats["sessions_emitted"] > 1000
    assert sorted(r["session_id"] for r in rows) == sorted(r["session_id"] for r in final)
    job.run(input=dirty, output=tmp_path / "parquet", output_format="parquet", emit="final")
    import pyarrow.parquet
    assert pyarrow.parquet.read_table(tmp_path / "parquet").num_rows == len(final)
