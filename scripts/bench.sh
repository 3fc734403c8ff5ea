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
#   keys     count only (no aggregates), 10M events over 100K and over 1M concurrent keys
#   open     peak RSS of `run` holding 1M open sessions (one event per key, --gap 1000h)
#            minus that of a 1,000-key run: bytes per open session through the CLI
#
#   scripts/bench.sh rocksdb    # the rocksdb state backend (feature `rocksdb`)
#
#   rocksdb  1M visits on each backend (`run --collect page`, one core); then
#            ROCKS_OPEN (default 20M) open sessions with one collected page each under
#            --state-memory 512MB with a state directory: the run and its base at the
#            end of input (pause, write, base file, RocksDB files kept), the state on
#            disk, and two restarts on it: with as many workers (the stores start from
#            the base's copies) and with two (every key read into new stores).
#
#   scripts/bench.sh kafka      # Kafka in, Kafka out (feature `kafka`, a local broker
#                               # from scripts/kafka-dev.sh, started if needed)
#
#   kafka    1M visits preloaded in a 4-partition topic, sessionized into a 4-partition
#            topic exactly once: --workers 1 and 2, commit every 1s and 100ms, and two
#            processes in one group; the same job as the library's KafkaGroup (the
#            example kafka_group, session windows and stateful) beside the command
#            line with its options; then the restore of 1M open sessions from the
#            changelog and from a --state-dir snapshot, and a failover to a standby
#            (scripts/bench-failover.py). Prints events/s, peak RSS and the CPU
#            seconds of the process (the broker runs on the same machine).
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-all}

if [ "$WHAT" = kafka ] || [ "$WHAT" = rocksdb ]; then
  if [ -n "${SESSIONIZER_BIN:-}" ]; then BIN=$SESSIONIZER_BIN; else
    cargo build --release -q -p sessionizer-cli --features "$WHAT"
    BIN=target/release/sessionizer
  fi
elif [ -n "${SESSIONIZER_BIN:-}" ]; then
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

# One Kafka run: LABEL then the run's arguments; prints events/s, RSS and CPU seconds.
kafka_run() {
  local label=$1; shift
  /usr/bin/time -f "%e %U %S %M" -o bench-data/time.txt "$BIN" run --kafka-brokers "$KB" "$@" \
    --stats-file bench-data/kstats.json --progress never 2>/dev/null
  python3 - "$label" <<'PY'
import json, sys
s = json.load(open("bench-data/kstats.json"))
wall, user, sys_, rss = open("bench-data/time.txt").read().split()
n = s["records_read"]
r = s.get("kafka", {}).get("restores", [])
restore = ""
if r:
    keys = sum(x["keys"] for x in r); recs = sum(x["changelog_records"] for x in r)
    ms = max(x["ms"] for x in r)
    restore = f"  restored {keys} keys from {recs} changelog records ({r[0]['source']}) in {ms} ms"
print(f"kafka {sys.argv[1]:34} {n:>8} events {n / float(wall) / 1e3:7.0f}K events/s (wall {float(wall):5.2f} s)  "
      f"CPU {float(user) + float(sys_):5.2f} s  peak RSS {int(rss) / 1024:4.0f} MiB{restore}")
PY
}

# The library's KafkaGroup (the example kafka_group) beside the command line running the
# same job: INPUT OUTPUT GROUP_PREFIX.
kafka_library_runs() {
  local in=$1 out=$2 g=$3 dead=$3-dead
  cargo build --release -q -p sessionizer --features kafka --example kafka_group
  scripts/kafka-dev.sh topics --create --topic "$dead" --partitions 1 >/dev/null
  kafka_run "CLI, the example's job" --kafka-topic "$in" --kafka-group "$g-cli" \
    --kafka-output-topic "$out" --stop-at-end --collect page --gap 2m --allowed-lateness 2m \
    --watermark-delay 30s --checkpoint-interval 500ms --workers 1
  for mode in windows stateful; do
    local flag=()
    [ "$mode" = stateful ] && flag=(--stateful)
    /usr/bin/time -f "%e %U %S %M" -o bench-data/time.txt target/release/examples/kafka_group \
      "$KB" "$g-lib-$mode" "$in" "$out" "$dead" one --stop-at-end "${flag[@]}" \
      > bench-data/kstats.json 2>/dev/null
    python3 - "library KafkaGroup, run_$mode" <<'PY'
import json, sys
s = json.load(open("bench-data/kstats.json"))
wall, user, sys_, rss = open("bench-data/time.txt").read().split()
n = s["records_read"]
print(f"kafka {sys.argv[1]:34} {n:>8} events {n / float(wall) / 1e3:7.0f}K events/s (wall {float(wall):5.2f} s)  "
      f"CPU {float(user) + float(sys_):5.2f} s  peak RSS {int(rss) / 1024:4.0f} MiB")
PY
  done
}

kafka_bench() {
  KB=127.0.0.1:39092
  scripts/kafka-dev.sh start >/dev/null
  local tag in out n=1000000
  tag=$(date +%s)
  in=bench-visits-$tag out=bench-sessions-$tag
  for t in "$in" "$out"; do
    scripts/kafka-dev.sh topics --create --topic "$t" --partitions 4 >/dev/null
  done
  "$BIN" generate --events $n --kafka-brokers $KB --kafka-topic "$in" 2>/dev/null
  for interval in 1s 100ms; do
    for w in 1 2; do
      kafka_run "--workers $w, commit every $interval" --kafka-topic "$in" \
        --kafka-group "bench-$tag-$w-$interval" --kafka-output-topic "$out" --stop-at-end \
        --collect page --checkpoint-interval $interval --workers $w
    done
  done
  # Two processes in one group, started together.
  local g=bench-$tag-two
  /usr/bin/time -f "%e" -o bench-data/two.txt bash -c "
    '$BIN' run --kafka-brokers $KB --kafka-topic $in --kafka-group $g --kafka-output-topic $out \
      --stop-at-end --collect page --checkpoint-interval 1s --kafka-instance-id a --progress never 2>/dev/null &
    '$BIN' run --kafka-brokers $KB --kafka-topic $in --kafka-group $g --kafka-output-topic $out \
      --stop-at-end --collect page --checkpoint-interval 1s --kafka-instance-id b --progress never 2>/dev/null &
    wait"
  python3 -c "import sys; w=float(open('bench-data/two.txt').read()); print(f'kafka two processes, commit every 1s          $n events {$n/w/1e3:7.0f}K events/s (wall {w:5.2f} s, both processes from start to end)')"
  # The same job written with the library: the example kafka_group (KafkaGroup, on this
  # driver; gap 2m, lateness 2m, watermark 30s, pages collected, a commit every 500 ms,
  # one worker), against the command line with those options, and its stateful version.
  kafka_library_runs "$in" "$out" "bench-$tag"
  # 1M open sessions (one event per key, a gap nothing closes), kept open at the end;
  # then the same group again: a full restore from the changelog, and from a snapshot.
  local open=bench-open-$tag sd=bench-data/kafka-state-$tag
  scripts/kafka-dev.sh topics --create --topic "$open" --partitions 4 >/dev/null
  "$BIN" generate --events $n --keys $n --session-length 1 --kafka-brokers $KB --kafka-topic "$open" 2>/dev/null
  rm -rf "$sd"
  kafka_run "1M open sessions, first run" --kafka-topic "$open" --kafka-group "bench-$tag-open" \
    --kafka-output-topic "$out" --stop-at-end --keep-open --gap 1000h --state-dir "$sd"
  kafka_run "restart, restore from the changelog" --kafka-topic "$open" --kafka-group "bench-$tag-open" \
    --kafka-output-topic "$out" --stop-at-end --keep-open --gap 1000h
  kafka_run "restart, restore from a snapshot" --kafka-topic "$open" --kafka-group "bench-$tag-open" \
    --kafka-output-topic "$out" --stop-at-end --keep-open --gap 1000h --state-dir "$sd"
  rm -rf "$sd"
  # Failover: two processes with a standby each over the 1M open sessions; one killed.
  python3 scripts/bench-failover.py "$BIN" "$KB" "$open" "bench-$tag-failover" "$out"
  for t in $(scripts/kafka-dev.sh topics --list 2>/dev/null | grep -- "-$tag"); do
    scripts/kafka-dev.sh topics --delete --topic "$t" >/dev/null 2>&1 || true
  done
}

# One rocksdb-backend run: LABEL then the run's arguments; prints the run, its peak RSS
# and what its checkpoints and restore did.
rocks_run() {
  local label=$1; shift
  /usr/bin/time -f "%e %M" -o bench-data/time.txt "$BIN" run "$@" \
    --stats-file bench-data/rstats.json --progress never 2>/dev/null
  python3 - "$label" <<'PY'
import json, sys
s = json.load(open("bench-data/rstats.json"))
wall, rss = open("bench-data/time.txt").read().split()
c = s.get("checkpoints", {})
st = s.get("state_store", {})
n = s["records_read"] - c.get("records_before", 0)
print(f"rocksdb {sys.argv[1]:28} {n:>9} events in {float(wall):6.1f} s ({n / max(float(wall), 1e-3) / 1e3:6.0f}K/s)  "
      f"peak RSS {int(rss) / 1024:5.0f} MiB  evicted {st.get('evicted', 0)}")
if c:
    print(f"        checkpoints {c['written']} (bases {c['bases']}): state files {c['bytes']} bytes, new RocksDB files "
          f"{c.get('store_bytes_new', 0)} bytes, longest pause {c['pause_us_max'] / 1e3:.0f} ms, "
          f"longest write {c['write_us_max'] / 1e3:.0f} ms; restore {c['restore_us'] / 1e3:.0f} ms "
          f"({c.get('restore_keys_linked', 0)} keys linked)")
PY
}

rocks_bench() {
  local data=bench-data/visits-1000000.jsonl
  [ -s "$data" ] || "$BIN" generate --events 1000000 --output "$data" 2>/dev/null
  cat "$data" > /dev/null
  for backend in "memory" "rocksdb --state-memory 512MB"; do
    # shellcheck disable=SC2086
    rocks_run "1M visits, $backend" --input "$data" --output bench-data/sessions.jsonl \
      --collect page --state-backend $backend
  done
  local n=${ROCKS_OPEN:-20000000} open sd=bench-data/rocks-state
  open=bench-data/open-$n.jsonl
  [ -s "$open" ] || "$BIN" generate --events "$n" --keys "$n" --session-length 1 --output "$open" 2>/dev/null
  rm -rf "$sd"
  local job=(--input "$open" --output bench-data/sessions.jsonl --collect page --gap 1000h
    --state-dir "$sd" --keep-open --checkpoint-interval 1h --state-backend rocksdb --state-memory 512MB)
  rocks_run "$n open sessions" "${job[@]}"
  echo "        state directory: $(du -sh --apparent-size "$sd" | cut -f1) (RocksDB copies $(du -shc --apparent-size "$sd"/rocksdb-* | tail -1 | cut -f1), live stores $(du -sh --apparent-size "$sd"/spill 2>/dev/null | cut -f1 || echo 0))"
  rocks_run "restart, same workers" "${job[@]}"
  rocks_run "restart, --workers 2" "${job[@]}" --workers 2
  rm -rf "$sd"
}

# Count only, many keys: N events over K concurrent visits, WORKERS, REPEAT.
e2e_keys() {
  local n=$1 keys=$2 workers=$3 repeat=$4 data=bench-data/keys$2-$1.jsonl pin=()
  [ -s "$data" ] || "$BIN" generate --events "$n" --keys "$keys" --output "$data" 2>/dev/null
  cat "$data" > /dev/null
  if [ "$workers" = 1 ] && command -v taskset >/dev/null; then pin=(taskset -c 0); fi
  for _ in $(seq 1 "$repeat"); do
    "${pin[@]}" "$BIN" run --input "$data" --output bench-data/sessions.jsonl --gap 10m \
      --workers "$workers" --stats-file bench-data/stats.json --progress never 2>/dev/null
    python3 - "$workers" "$keys" <<'PY'
import json, sys
s = json.load(open("bench-data/stats.json"))
n, secs = s["records_read"], max(s["elapsed_ms"], 1) / 1000
print(f"keys {n:>9} events {int(sys.argv[2]):>8} keys  --workers {sys.argv[1]}  count only  "
      f"{n / secs / 1e6:5.2f}M events/s  peak RSS {s.get('peak_rss_bytes', 0) / 2**20:4.0f} MiB")
PY
  done
}

# Bytes per open session through the CLI: 1M keys with one event each, nothing closes.
open_sessions() {
  local big=bench-data/open-1m.jsonl small=bench-data/open-1k.jsonl
  [ -s $big ] || "$BIN" generate --events 1000000 --keys 1000000 --session-length 1 --output $big 2>/dev/null
  [ -s $small ] || "$BIN" generate --events 1000 --keys 1000 --session-length 1 --output $small 2>/dev/null
  for w in 1 2; do
    local rss=()
    for f in $big $small; do
      /usr/bin/time -f "%M" -o bench-data/time.txt "$BIN" run --input $f --output /dev/null \
        --gap 1000h --workers $w --progress never 2>/dev/null
      rss+=("$(cat bench-data/time.txt)")
    done
    python3 -c "import sys; b, s = int(sys.argv[1]), int(sys.argv[2]); print(f'open 1M open sessions --workers {sys.argv[3]}: peak RSS {b / 1024:.0f} MiB, 1K-key run {s / 1024:.0f} MiB: {(b - s) * 1024 / 999000:.0f} bytes per open session')" "${rss[0]}" "${rss[1]}" $w
  done
}

case "$WHAT" in
  keys)
    e2e_keys 10000000 100000 1 1
    e2e_keys 10000000 1000000 1 1
    e2e_keys 10000000 1000000 2 1
    ;;
  open)
    open_sessions
    ;;
  kafka)
    kafka_bench
    ;;
  rocksdb)
    rocks_bench
    ;;
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
    e2e_keys 10000000 100000 1 1
    e2e_keys 10000000 1000000 1 1
    e2e_keys 10000000 1000000 2 1
    open_sessions
    ;;
  *) echo "usage: scripts/bench.sh [all|quick|keys|open|kafka]" >&2; exit 2 ;;
esac
