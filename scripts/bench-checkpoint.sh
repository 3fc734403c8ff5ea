#!/usr/bin/env bash
# Benchmarks of durable state (issue 4), end to end with the release binary:
#
#   1. throughput on the 1M-event bench (bench-data/visits-1000000.jsonl, as
#      scripts/bench.sh) without checkpoints, and with --state-dir and a checkpoint
#      every 1s, 100ms and 0s (after every 4 MiB batch);
#   2. checkpoint bytes and time against the number of changed keys: a job with 1M open
#      sessions (--keep-open), then runs over inputs touching K of its keys (--keep-open),
#      each writing one delta checkpoint of K keys;
#   3. restore of 1M open sessions: a run resuming the 1M-session job over an empty input.
#
#   scripts/bench-checkpoint.sh [REPEAT]
#   SESSIONIZER_BIN=/path/to/sessionizer scripts/bench-checkpoint.sh   # another build (no cargo)
set -euo pipefail
cd "$(dirname "$0")/.."
REPEAT=${1:-3}

if [ -n "${SESSIONIZER_BIN:-}" ]; then
  BIN=$SESSIONIZER_BIN
else
  cargo build --release -q -p sessionizer-cli
  BIN=target/release/sessionizer
fi
mkdir -p bench-data
DATA=bench-data/visits-1000000.jsonl
if [ ! -s "$DATA" ]; then
  "$BIN" generate --events 1000000 --output "$DATA" 2>/dev/null
fi
WORK=$(mktemp -d bench-data/ckpt-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"

stat() { python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

echo "== 1. throughput, 1M events, run --collect page (best of $REPEAT)"
for mode in none 1s 100ms 0s; do
  best=""
  for _ in $(seq 1 "$REPEAT"); do
    rm -rf "$WORK/state"
    extra=()
    [ "$mode" != none ] && extra=(--state-dir "$WORK/state" --checkpoint-interval "$mode")
    "$BIN" run --input "$DATA" --output "$WORK/out.jsonl" --collect page \
      --stats-file "$WORK/stats.json" --progress never "${extra[@]}" 2>/dev/null
    ms=$(stat "$WORK/stats.json" "s['elapsed_ms']")
    if [ -z "$best" ] || [ "$ms" -lt "$best" ]; then best=$ms; cp "$WORK/stats.json" "$WORK/best.json"; fi
  done
  if [ "$mode" = none ]; then
    echo "no checkpoints:        $best ms = $(stat "$WORK/best.json" "f\"{1e3/max(s['elapsed_ms'],1):.2f}M events/s\"")"
  else
    echo "interval $mode: $(printf '%6s' "$best") ms; $(stat "$WORK/best.json" "f\"{s['checkpoints']['written']} checkpoints ({s['checkpoints']['bases']} bases), {s['checkpoints']['bytes']/2**20:.1f} MiB, pipeline paused {s['checkpoints']['pause_us_total']/1e3:.0f} ms in all (longest {s['checkpoints']['pause_us_max']/1e3:.1f} ms), writing in the background {s['checkpoints']['write_us_total']/1e3:.0f} ms\"")"
  fi
done

echo "== 2. checkpoint size and time against changed keys (1M open sessions)"
python3 - "$WORK" <<'PY'
import sys
work = sys.argv[1]
# 1M keys, one event each, all within 10 minutes: with the default 30m gap all stay open.
with open(f"{work}/open.jsonl", "w") as f:
    for i in range(1_000_000):
        ms = i * 600_000 // 1_000_000
        f.write('{"visit_id":"k%07d","event_time":%d,"page":"/p%d"}\n' % (i, 1_704_067_200_000 + ms, i % 50))
for k in (1_000, 10_000, 100_000, 1_000_000):
    with open(f"{work}/touch-{k}.jsonl", "w") as f:
        step = 1_000_000 // k
        for j in range(k):
            f.write('{"visit_id":"k%07d","event_time":%d,"page":"/q"}\n' % (j * step, 1_704_067_800_000 + j * 60_000 // k))
open(f"{work}/empty.jsonl", "w").close()
PY
JOB=(--time-format epoch-ms --collect page --progress never --state-dir "$WORK/open-state" --keep-open)
"$BIN" run --input "$WORK/open.jsonl" --output "$WORK/open-out.jsonl" --stats-file "$WORK/s.json" "${JOB[@]}" 2>/dev/null
echo "base, 1M open sessions: $(stat "$WORK/s.json" "f\"{s['checkpoints']['last_bytes']/2**20:.1f} MiB, {s['checkpoints']['last_keys']} keys, encode {s['checkpoints']['pause_us_max']/1e3:.0f} ms + write {s['checkpoints']['write_us_max']/1e3:.0f} ms\"")"
cp -r "$WORK/open-state" "$WORK/open-state.saved"
for k in 1000 10000 100000 1000000; do
  rm -rf "$WORK/open-state" && cp -r "$WORK/open-state.saved" "$WORK/open-state"
  "$BIN" run --input "$WORK/touch-$k.jsonl" --output "$WORK/open-out.jsonl" --stats-file "$WORK/s.json" "${JOB[@]}" 2>/dev/null
  echo "$(printf '%8d' "$k") changed keys: $(stat "$WORK/s.json" "f\"{s['checkpoints']['last_bytes']/2**10:10.1f} KiB, {s['checkpoints']['last_keys']} keys written ({'base' if s['checkpoints']['bases'] else 'delta'}), encode {s['checkpoints']['pause_us_max']/1e3:.1f} ms + write {s['checkpoints']['write_us_max']/1e3:.1f} ms; restore before it {s['checkpoints']['restore_us']/1e3:.0f} ms\"")"
done

echo "== 3. restore of 1M open sessions (best of $REPEAT)"
for _ in $(seq 1 "$REPEAT"); do
  rm -rf "$WORK/open-state" && cp -r "$WORK/open-state.saved" "$WORK/open-state"
  "$BIN" run --input "$WORK/empty.jsonl" --output "$WORK/open-out.jsonl" --stats-file "$WORK/s.json" "${JOB[@]}" 2>/dev/null
  echo "restore: $(stat "$WORK/s.json" "f\"{s['checkpoints']['restore_us']/1e3:.0f} ms (whole run {s['elapsed_ms']} ms, peak RSS {s.get('peak_rss_bytes',0)/2**20:.0f} MiB)\"")"
done
