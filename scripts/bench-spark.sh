#!/usr/bin/env bash
# The book's PySpark sessions mapper (examples/python/spark_sessions.py, its prints
# removed) on 1M generated visits of 100K concurrent keys in 4 micro-batches of 250,000
# records: sessionizer.spark from a release wheel on one core (taskset -c 0) against
# PySpark 4.3's applyInPandasWithState (local[2], one file per micro-batch). Prints
# events/s and peak RSS (the whole process tree: PySpark's JVM and Python workers
# summed) of each, and whether both gave the same sessions.
#
#   scripts/bench-spark.sh
#
# The wheel, pandas, pyarrow and pyspark go into a virtual environment of their own
# (${BENCH_VENV:-$HOME/.cache/sessionizer-bench-venv}); inputs go to bench-data/.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${BENCH_VENV:-$HOME/.cache/sessionizer-bench-venv}
target=${CARGO_TARGET_DIR:-target}
dir=bench-data/spark
events=${EVENTS:-1000000}
keys=${KEYS:-100000}
batches=4

cargo build --release -q -p sessionizer-cli
bin=$target/release/sessionizer
mkdir -p "$dir"
data=$dir/visits-$events-$keys.jsonl
[ -f "$data" ] || "$bin" generate --events "$events" --keys "$keys" --seed 1 --output "$data"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade "maturin>=1.9,<2" "pandas<3" pyarrow "pyspark==4.3.0"
rm -rf "$target/bench-wheels"
# A wheel for this machine only: the system libraries librdkafka links stay outside it.
"$venv/bin/maturin" build --release -q --auditwheel skip -o "$target/bench-wheels"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$target"/bench-wheels/*.whl

"$venv/bin/python" scripts/bench_spark.py "$data" "$dir" "$batches"
