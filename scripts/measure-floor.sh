#!/usr/bin/env bash
# The per-key floor (docs/semantics.md S-30) on generated data: pairs of sessions of one
# key closer than the gap, sessions, late events.
#
#   [MEAN_INTERVAL=2m] scripts/measure-floor.sh [BIN [BIN_BEFORE]]
#
# Input: 1M `sessionizer generate` visits (seed 9, --mean-interval MEAN_INTERVAL, default
# the generator's 20s), then 1% of the events shifted back by a uniform 5-30 minutes
# (scripts/floor_pairs.py shift, seed 9). Job: --gap 10m --watermark-delay 1m,
# --allowed-lateness 0s and 5m. With BIN_BEFORE (a build without the floor) both are run
# and their final views compared. Needs python3.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/debug/sessionizer}
BEFORE=${2:-}
MEAN_INTERVAL=${MEAN_INTERVAL:-20s}
PY=scripts/floor_pairs.py
mkdir -p bench-data
clean=bench-data/floor-visits-$MEAN_INTERVAL.jsonl
data=bench-data/floor-visits-$MEAN_INTERVAL-late.jsonl
if [ ! -s "$data" ]; then
  "$BIN" generate --events 1000000 --seed 9 --mean-interval "$MEAN_INTERVAL" \
    --time-format epoch-ms --output "$clean" 2>/dev/null
  python3 "$PY" shift "$clean" "$data" 0.01 300000 1800000 9
fi
for a in 0s 5m; do
  for which in after before; do
    bin=$BIN
    if [ "$which" = before ]; then
      [ -n "$BEFORE" ] || continue
      bin=$BEFORE
    fi
    out=bench-data/floor-$which-$a.jsonl
    "$bin" run --input "$data" --output "$out" --time-format epoch-ms --gap 10m \
      --watermark-delay 1m --allowed-lateness "$a" --stats-file bench-data/floor-stats.json \
      --progress never 2>/dev/null
    late=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["late"])' bench-data/floor-stats.json)
    echo "A=$a $which: late events $late, $(python3 "$PY" pairs "$out" 600000)"
    if [ "$which" = before ]; then
      echo "A=$a before vs after (final views): $(python3 "$PY" diff "$out" bench-data/floor-after-$a.jsonl)"
      reasons=$(python3 -c 'import json,sys,collections; print(dict(collections.Counter(json.loads(l)["reason"] for l in open(sys.argv[1]))))' "${out%.jsonl}.late.jsonl")
      echo "A=$a before: late reasons $reasons"
    else
      reasons=$(python3 -c 'import json,sys,collections; print(dict(collections.Counter(json.loads(l)["reason"] for l in open(sys.argv[1]))))' "${out%.jsonl}.late.jsonl")
      echo "A=$a after: late reasons $reasons"
    fi
  done
done
