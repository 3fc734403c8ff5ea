"""What the Python package's tests share: the binary, and a Kafka broker of their own
(the project's scripts/kafka-dev.sh on a home and a port of these tests, wiped before
and after)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("SESSIONIZER_BIN", ROOT / "target" / "debug" / "sessionizer")).resolve()
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




def kill_at_random_instants(start, took, share, rounds, seed):
    """Starts a restartable job (`start()`: a Popen with stderr piped) again and again,
    each run killed with SIGKILL after a random share (`share`: the least and the most)
    of `took`, the time of an uninterrupted run, for at most `rounds` runs or until one
    ends by itself; if none did, one more run to its end. Every run that ends must
    succeed. Returns how many runs were killed."""
    import random
    import signal
    import time

    rng = random.Random(seed)
    kills = 0
    for _ in range(rounds):
        child = start()
        time.sleep(rng.uniform(took * share[0], took * share[1]))
        if child.poll() is not None:
            _, err = child.communicate()
            assert child.returncode == 0, err
            return kills
        child.send_signal(signal.SIGKILL)
        child.communicate()
        kills += 1
    last = start()
    _, err = last.communicate(timeout=600)
    assert last.returncode == 0, err
    return kills
