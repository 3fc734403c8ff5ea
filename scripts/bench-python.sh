#!/usr/bin/env bash
# The Python package against the binary: the same declarative job (`--collect page`,
# 10-minute gap) on 1M generated visits, run alternately ROUNDS times (default 5) by the
# release binary and by `SessionWindows.run` from a release wheel, each on one core
# (taskset -c 0). Prints events/s and peak RSS of every run, then the medians.
#
#   scripts/bench-python.sh            # builds the release binary and wheel (features
#                                      # kafka and parquet, as the wheel has them)
#
# The wheel is installed into a virtual environment of its own
# (${BENCH_VENV:-$HOME/.cache/sessionizer-bench-venv}); inputs go to bench-data/.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
venv=${BENCH_VENV:-$HOME/.cache/sessionizer-bench-venv}
data=bench-data/visits-1000000.jsonl
target=${CARGO_TARGET_DIR:-target}

cargo build --release -q -p sessionizer-cli --features kafka,parquet
bin=$target/release/sessionizer
mkdir -p bench-data
[ -f "$data" ] || "$bin" generate --events 1000000 --seed 1 --output "$data"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade "maturin>=1.9,<2"
rm -rf "$target/bench-wheels"
# A wheel for this machine only: the system libraries librdkafka links stay outside it.
"$venv/bin/maturin" build --release -q --auditwheel skip -o "$target/bench-wheels"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$target"/bench-wheels/*.whl

events=$(grep -c . "$data")
args=(--key visit_id --time event_time --gap 10m --collect page)
measure() { # label, command...: one line "label events/s peak-RSS-MB"
  local label=$1; shift
  local log; log=$(mktemp)
  local start end
  start=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$log" taskset -c 0 "$@" >/dev/null 2>&1
  end=$(date +%s.%N)
  python3 -c "import sys; s=float(sys.argv[2])-float(sys.argv[1]); print(f'{sys.argv[3]} {int(sys.argv[4])/s:.0f} {int(open(sys.argv[5]).read().split()[-1])/1024:.0f}')" \
    "$start" "$end" "$label" "$events" "$log"
  rm -f "$log"
}
results=$(mktemp)
for _ in $(seq "$rounds"); do
  measure binary "$bin" run --input "$data" --output /dev/null --progress never "${args[@]}" | tee -a "$results"
  measure python "$venv/bin/python" -c "import sessionizer; sessionizer.SessionWindows(gap='10m', collect='page').run(input='$data', output='/dev/null', progress='never')" | tee -a "$results"
done
python3 - "$results" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
for who in ("binary", "python"):
    speeds = [float(r[1]) for r in rows if r[0] == who]
    rss = [float(r[2]) for r in rows if r[0] == who]
    print(f"median {who}: {statistics.median(speeds):,.0f} events/s, peak RSS {statistics.median(rss):.0f} MB")
PY
rm -f "$results"
