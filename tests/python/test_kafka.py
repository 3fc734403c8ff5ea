"""A declarative job from Python on a Kafka topic, exactly once: the ten-line script of
docs/python.md, killed with SIGKILL at random instants and started again until it ends,
commits the same session records as an uninterrupted run of it — none lost, none twice.

The broker is the project's own (scripts/kafka-dev.sh: Apache Kafka's jars from Maven
Central, KRaft on 127.0.0.1), on a home and a port of these tests' own, wiped before
and after."""

import subprocess
import sys
import textwrap
import time

from conftest import BIN, kafka_dev, kill_at_random_instants


JOB = textwrap.dedent("""
    import sys, sessionizer
    job = sessionizer.SessionWindows(key="visit_id", time="event_time", gap="10m",
                                     collect="page", emit="final")
    stats = job.run(kafka_brokers=sys.argv[1], kafka_topic=sys.argv[2],
                    kafka_group=sys.argv[3], kafka_output_topic=sys.argv[4],
                    stop_at_end=True, checkpoint_interval="200ms", progress="never")
    print(stats["sessions_emitted"])
""")


def test_a_python_job_on_a_topic_commits_every_session_once_through_kills(tmp_path, broker):
    assert BIN.exists(), f"{BIN} is missing: cargo build -p sessionizer-cli --features kafka"
    kafka_dev("topics", "--create", "--topic", "py-visits", "--partitions", "3")
    generated = subprocess.run(
        [str(BIN), "generate", "--events", "40000", "--keys", "1000", "--seed", "4",
         "--late-fraction", "0.01", "--late-by", "30m", "--invalid-fraction", "0.002",
         "--kafka-brokers", broker, "--kafka-topic", "py-visits"],
        capture_output=True, text=True)
    assert generated.returncode == 0, generated.stderr
    script = tmp_path / "job.py"
    script.write_text(JOB)

    def job(group, output):
        return subprocess.Popen([sys.executable, script, broker, "py-visits", group, output],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    for topic in ("py-sessions-one", "py-sessions-killed"):
        kafka_dev("topics", "--create", "--topic", topic, "--partitions", "3")

    began = time.monotonic()
    one = job("py-one", "py-sessions-one")
    out, err = one.communicate(timeout=300)
    assert one.returncode == 0, err
    took = time.monotonic() - began
    emitted = int(out.strip())
    want = sorted(kafka_dev("consume", "py-sessions-one").splitlines())
    assert len(want) == emitted > 3000

    kills = kill_at_random_instants(lambda: job("py-killed", "py-sessions-killed"), took,
                                    (1 / 6, 0.8), 6, 3)
    assert kills >= 2, f"only {kills} kills"
    got = sorted(kafka_dev("consume", "py-sessions-killed").splitlines())
    assert len(got) == len(want)
    assert got == want
