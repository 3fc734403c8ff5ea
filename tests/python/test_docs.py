"""Every example of docs/python.md and of the README's Python section runs as written:
its `python -m sessionizer` commands and its Python blocks, in a directory holding
generated visits (`visits.jsonl`), the Kafka ones against the tests' broker (their
address put in for the documented 127.0.0.1:39092, their topics made first); and the
book's PyFlink job (examples/python/flink_sessions.py) gives the sessions of the
command line with the same options."""

import re
import subprocess
import sys

import pytest

from conftest import BIN, ROOT, kafka_dev

DOCUMENTED_BROKERS = "127.0.0.1:39092"


def blocks(path, language):
    """The fenced blocks of `language` in the markdown file `path`."""
    return blocks_of(path.read_text(), language)


def blocks_of(text, language):
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def python_section_of_readme():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Using it from Python", 1)[1].split("\n## ", 1)[0]
    return section


@pytest.fixture
def visits(tmp_path):
    done = subprocess.run([str(BIN), "generate", "--events", "20000", "--seed", "8",
                           "--late-fraction", "0.01", "--invalid-fraction", "0.002",
                           "--output", tmp_path / "visits.jsonl"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return tmp_path


def run_python(code, cwd):
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{code}\n{done.stderr}"
    return done


def run_commands(block, cwd):
    """The block's `python -m sessionizer` lines, with this interpreter."""
    ran = 0
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("python -m sessionizer"):
            continue
        command = line.replace("python", sys.executable, 1)
        done = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True)
        assert done.returncode == 0, f"{line}\n{done.stderr}"
        ran += 1
    return ran


def kafka_ready(code, broker):
    """`code` against the tests' broker, with the topics it names made and `visits`
    filled with generated visits."""
    for topic in set(re.findall(r'(?:kafka_)?(?:output_)?topic="([^"]+)"', code)):
        kafka_dev("topics", "--create", "--if-not-exists", "--topic", topic, "--partitions", "3")
    if re.search(r'(?:kafka_)?topic="visits"', code):
        done = subprocess.run([str(BIN), "generate", "--events", "5000", "--seed", "2",
                               "--kafka-brokers", broker, "--kafka-topic", "visits"],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    return code.replace(DOCUMENTED_BROKERS, broker)


def test_the_guides_examples_run_as_written(visits, broker):
    guide = ROOT / "docs" / "python.md"
    commands = sum(run_commands(b, visits) for b in blocks(guide, "sh"))
    assert commands >= 3
    codes = blocks(guide, "python")
    assert len(codes) >= 3
    for code in codes:
        if DOCUMENTED_BROKERS in code:
            code = kafka_ready(code, broker)
        if "state_dir" in code:
            # Started again with the same arguments: it resumes, and adds nothing.
            run_python(code, visits)
        run_python(code, visits)
    assert (visits / "sessions.jsonl").stat().st_size > 0


def test_the_readmes_python_section_runs_as_written(visits, broker):
    section = python_section_of_readme()
    assert run_commands("\n".join(blocks_of(section, "sh")), visits) == 1
    for code in blocks_of(section, "python"):
        run_python(kafka_ready(code, broker), visits)
    assert (visits / "sessions.jsonl").stat().st_size > 0


def test_the_books_flink_job_gives_the_command_lines_sessions(visits):
    example = ROOT / "examples" / "python" / "flink_sessions.py"
    done = subprocess.run([sys.executable, example, "--input", "visits.jsonl", "--output",
                           "flink.jsonl"], cwd=visits, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert '"sessions_emitted"' in done.stderr
    cli = subprocess.run([str(BIN), "run", "--input", "visits.jsonl", "--output", "cli.jsonl",
                          "--key", "visit_id", "--time", "event_time", "--gap", "10m",
                          "--watermark-delay", "20m", "--allowed-lateness", "15m",
                          "--collect", "visited_pages=page", "--last", "user_id=user_id"],
                         cwd=visits, capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    flink = (visits / "flink.jsonl").read_bytes()
    assert flink.count(b"\n") > 1000 and b'"user_id"' in flink
    assert flink == (visits / "cli.jsonl").read_bytes()
