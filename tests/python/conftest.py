"""What the Python package's tests share: the binary, and a Kafka broker of their own
(the project's scripts/kafka-dev.sh on a home and a port of these tests, wiped before
and after)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("SESSIONIZER_BIN", ROOT / "target" / "debug" / "sessionizer"))
PORT = 29792
HOME = os.environ.get("SESSIONIZER_TEST_PY_KAFKA_HOME",
                      os.path.expanduser("~/.cache/sessionizer-python-kafka-tests"))
BROKERS = f"127.0.0.1:{PORT}"


def kafka_dev(*args, stdin=None):
    env = {**os.environ, "KAFKA_DEV_HOME": HOME, "KAFKA_DEV_PORT": str(PORT)}
    done = subprocess.run([str(ROOT / "scripts" / "kafka-dev.sh"), *args], env=env,
                          stdin=stdin, capture_output=True, text=True)
    assert done.returncode == 0, f"kafka-dev.sh {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def broker():
    kafka_dev("wipe")
    kafka_dev("start")
    yield BROKERS
    kafka_dev("wipe")


