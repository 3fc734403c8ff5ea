#!/usr/bin/env bash
# Two (or more) sessionizer binaries (built with the feature `kafka`) alternated run by
# run on Kafka in, Kafka out exactly once: 1M generated visits preloaded in a
# 4-partition topic, `--collect page --stop-at-end`, committing every INTERVAL, one
# worker, a new consumer group per run. Prints each run's events/s (wall time), CPU
# seconds and peak RSS. The local broker is scripts/kafka-dev.sh's (started if needed).
#
#   scripts/bench-kafka-alternate.sh RUNS INTERVAL BIN_A BIN_B [BIN...]
#   scripts/bench-kafka-alternate.sh 3 100ms base/sessionizer target/release/sessionizer
set -euo pipefail
cd "$(dirname "$0")/.."
N=$1; INTERVAL=$2; shift 2
KB=127.0.0.1:39092
scripts/kafka-dev.sh start >/dev/null
mkdir -p bench-data
tag=$(date +%s); in=alt-visits-$tag; out=alt-sessions-$tag
for t in "$in" "$out"; do
  scripts/kafka-dev.sh topics --create --topic "$t" --partitions 4 >/dev/null
done
"$1" generate --events 1000000 --kafka-brokers $KB --kafka-topic "$in" 2>/dev/null
for round in $(seq 1 "$N"); do
  for b in "$@"; do
    /usr/bin/time -f "%e %U %S %M" -o bench-data/alt-time.txt "$b" run --kafka-brokers $KB \
      --kafka-topic "$in" --kafka-group "alt-$tag-$round-$RANDOM" --kafka-output-topic "$out" \
      --stop-at-end --collect page --checkpoint-interval "$INTERVAL" --progress never 2>/dev/null
    read -r wall user sys rss < bench-data/alt-time.txt
    python3 -c "print(f'$b, commit every $INTERVAL: {1e6/$wall/1e3:5.0f}K events/s  wall {$wall:5.2f} s  CPU {$user+$sys:4.2f} s  peak RSS {$rss/1024:4.0f} MiB')"
  done
done
for t in "$in" "$out"; do
  scripts/kafka-dev.sh topics --delete --topic "$t" >/dev/null 2>&1 || true
done
