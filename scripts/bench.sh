#!/usr/bin/env bash
# End-to-end benchmark of `sessionizer run`: generates N visit events once (cached in
# bench-data/), runs the job REPEAT times and prints events/s and peak RSS of each run.
#
#   scripts/bench.sh [N] [REPEAT] [-- extra run options]
#   scripts/bench.sh 1000000 3
#
# Default job: JSON in, JSON out (a file in bench-data/), --collect page.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
REPEAT=${2:-3}
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")

cargo build --release -q -p sessionizer
BIN=target/release/sessionizer
mkdir -p bench-data
DATA=bench-data/visits-$N.jsonl
if [ ! -s "$DATA" ]; then
  "$BIN" generate --events "$N" --output "$DATA" 2>/dev/null
fi
BYTES=$(stat -c %s "$DATA")
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "input:   $DATA ($N events, $((BYTES / N)) bytes/event)"
echo "job:     run --collect page ${EXTRA[*]:-}"
for i in $(seq 1 "$REPEAT"); do
  "$BIN" run --input "$DATA" --output bench-data/sessions.jsonl --collect page \
    --stats-file bench-data/stats.json --progress never "${EXTRA[@]}" 2>/dev/null
  python3 - "$N" <<'PY'
import json, sys
s = json.load(open("bench-data/stats.json"))
n = s["records_read"]
secs = max(s["elapsed_ms"], 1) / 1000
rss = s.get("peak_rss_bytes", 0) / 2**20
print(f"run: {n} events in {secs:.3f} s = {n / secs / 1e6:.2f}M events/s, "
      f"{s['bytes_read'] / secs / 2**20:.0f} MiB/s, peak RSS {rss:.0f} MiB, "
      f"{s['sessions_emitted']} sessions")
PY
done
