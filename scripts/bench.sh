#!/usr/bin/env bash
# sessionizer benchmarks, one command:
#
#   scripts/bench.sh            # the whole suite (several minutes)
#   scripts/bench.sh quick      # end to end on 1M events only
#   SESSIONIZER_BIN=/path/to/sessionizer scripts/bench.sh quick   # another build (no cargo)
#
# Prints events/s, peak RSS and bytes per open session. Inputs are generated once into
# bench-data/ (about 390 bytes per event: 1M events = 390 MB, 10M = 3.9 GB).
#
#   e2e      `run --collect page`, JSON in, JSON out to a file, on 1M and 10M visits,
#            --workers 1 pinned to one core (taskset -c 0), and --workers 2 on two cores
#   decode   one JSON line to one event, against simd-json, sonic-rs, serde_json (criterion)
#   operator the session operator alone on pre-parsed events (criterion)
#   q11      a Nexmark q11 equivalent: in-process bids, 10 s gap, count per session
#   state    bytes of state per open session, 10M open sessions
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-all}

if [ -n "${SESSIONIZER_BIN:-}" ]; then
  BIN=$SESSIONIZER_BIN
else
  cargo build --release -q -p sessionizer-cli
  BIN=target/release/sessionizer
fi
mkdir -p bench-data
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/{print $2}') GiB"
echo "rustc:   $(rustc --version)"

e2e() { # N WORKERS REPEAT
  local n=$1 workers=$2 repeat=$3 data=bench-data/visits-$1.jsonl pin=()
  [ -s "$data" ] || "$BIN" generate --events "$n" --output "$data" 2>/dev/null
  cat "$data" > /dev/null # warm the page cache: measure the CPU, not the disk
  if [ "$workers" = 1 ] && command -v taskset >/dev/null; then pin=(taskset -c 0); fi
  for _ in $(seq 1 "$repeat"); do
    "${pin[@]}" "$BIN" run --input "$data" --output bench-data/sessions.jsonl --collect page \
      --workers "$workers" --stats-file bench-data/stats.json --progress never 2>/dev/null
    python3 - "$workers" "${pin[*]:-}" <<'PY'
import json, sys
s = json.load(open("bench-data/stats.json"))
n, secs = s["records_read"], max(s["elapsed_ms"], 1) / 1000
pin = " (one core)" if sys.argv[2] else ""
print(f"e2e  {n:>9} events  --workers {sys.argv[1]}{pin:11} {n / secs / 1e6:5.2f}M events/s  "
      f"{s['bytes_read'] / secs / 2**20:5.0f} MiB/s  peak RSS {s.get('peak_rss_bytes', 0) / 2**20:4.0f} MiB  "
      f"{s['sessions_emitted']} sessions")
PY
  done
}

case "$WHAT" in
  quick)
    e2e 1000000 1 3
    e2e 1000000 2 3
    ;;
  all)
    e2e 1000000 1 3
    e2e 1000000 2 3
    e2e 10000000 1 1
    e2e 10000000 2 1
    echo "-- decode, one visit line (criterion; lines/s)"
    cargo bench -q -p sessionizer-core --bench decode 2>/dev/null | grep -E "^decode bench|^validation|^decode/|thrpt" || true
    echo "-- operator alone (criterion)"
    cargo bench -q -p sessionizer-window --bench operator 2>/dev/null | grep -E "^operator|thrpt" || true
    echo "-- q11"
    cargo bench -q -p sessionizer-window --bench q11 -- 10000000 2>/dev/null | grep q11
    echo "-- state"
    cargo bench -q -p sessionizer-window --bench state_size -- 10000000 2>/dev/null | grep -v '^$'
    ;;
  *) echo "usage: scripts/bench.sh [all|quick]" >&2; exit 2 ;;
esac
