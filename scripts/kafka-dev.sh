#!/usr/bin/env bash
# A single-node Apache Kafka broker for trying sessionizer's Kafka mode and for its tests:
# KRaft mode (broker and controller in one JVM), listening on 127.0.0.1 only, replication
# factor 1, transactions enabled. The broker's own jars come from Maven Central
# (scripts/kafka/pom.xml, Apache Kafka 4.1.1); Java 17 and Maven must be installed.
#
#   scripts/kafka-dev.sh start     # fetch the jars once, format the log dir once, start, wait until ready
#   scripts/kafka-dev.sh stop      # stop the broker (its data stays)
#   scripts/kafka-dev.sh reset     # stop and delete the data
#   scripts/kafka-dev.sh status    # running or not; exit 0 when running
#   scripts/kafka-dev.sh brokers   # print the bootstrap address (127.0.0.1:PORT)
#   scripts/kafka-dev.sh topics ARGS...   # run Kafka's own TopicCommand against the broker
#   scripts/kafka-dev.sh produce TOPIC < FILE   # each line of FILE a record (Kafka's console producer)
#   scripts/kafka-dev.sh consume TOPIC          # print the committed records from the start, exit when idle 5 s
#
# Settings (environment):
#   KAFKA_DEV_HOME   where jars, config, data and log live (default: ~/.cache/sessionizer-kafka)
#   KAFKA_DEV_PORT   the client port (default 39092); the controller uses PORT+1
#
# `start` is idempotent and safe to call from several processes at once (a lock serialises
# them): the tests call it to make sure a broker is up.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
HOME_DIR=${KAFKA_DEV_HOME:-${HOME}/.cache/sessionizer-kafka}
PORT=${KAFKA_DEV_PORT:-39092}
CONTROLLER_PORT=$((PORT + 1))
LIBS=$HOME_DIR/libs-4.1.1
DATA=$HOME_DIR/data-$PORT
CONF=$HOME_DIR/server-$PORT.properties
LOG4J=$HOME_DIR/log4j2.yaml
LOG=$HOME_DIR/broker-$PORT.log
PIDFILE=$HOME_DIR/broker-$PORT.pid

mkdir -p "$HOME_DIR"

running() {
  [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

fetch_jars() {
  if [ -f "$LIBS/.complete" ]; then return; fi
  echo "kafka-dev: fetching Apache Kafka 4.1.1 jars from Maven Central into $LIBS" >&2
  rm -rf "$LIBS.tmp"
  mvn -q -B -f "$HERE/kafka/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$LIBS.tmp" -DincludeScope=runtime >&2
  rm -rf "$LIBS"
  mv "$LIBS.tmp" "$LIBS"
  touch "$LIBS/.complete"
}

write_config() {
  cat > "$CONF" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$DATA
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.cleaner.backoff.ms=1000
transaction.max.timeout.ms=900000
EOF
  cat > "$LOG4J" <<'EOF'
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        Pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaRaftServer
        level: INFO
      - name: kafka.Kafka
        level: INFO
EOF
}

java_cp() {
  java -Xms256m -Xmx512m -Dlog4j2.configurationFile="$LOG4J" -cp "$LIBS/*" "$@"
}

start() {
  if running; then return 0; fi
  fetch_jars
  write_config
  if [ ! -f "$DATA/meta.properties" ]; then
    mkdir -p "$DATA"
    java_cp kafka.tools.StorageTool format -t "$(java_cp kafka.tools.StorageTool random-uuid)" \
      -c "$CONF" >/dev/null 9>&-
  fi
  : > "$LOG"
  # setsid: the broker outlives the shell (and the test process) that started it.
  setsid nohup java -Xms256m -Xmx1g -XX:+UseG1GC -Dlog4j2.configurationFile="$LOG4J" \
    -cp "$LIBS/*" kafka.Kafka "$CONF" >>"$LOG" 2>&1 < /dev/null 9>&- &
  echo $! > "$PIDFILE"
  for _ in $(seq 1 600); do
    if grep -q "Kafka Server started" "$LOG" 2>/dev/null; then
      echo "kafka-dev: broker ready on 127.0.0.1:$PORT (log: $LOG)" >&2
      return 0
    fi
    if ! running; then
      echo "kafka-dev: the broker exited during start; its log ($LOG) ends with:" >&2
      tail -n 30 "$LOG" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "kafka-dev: the broker did not become ready within 60 s; see $LOG" >&2
  return 1
}

stop() {
  if running; then
    local pid
    pid=$(cat "$PIDFILE")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 300); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start)
    exec 9>"$HOME_DIR/.lock-$PORT"
    flock 9
    start
    ;;
  stop) stop ;;
  reset)
    stop
    rm -rf "$DATA"
    ;;
  status)
    if running; then echo "running on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"))"; else echo "not running"; exit 1; fi
    ;;
  brokers) echo "127.0.0.1:$PORT" ;;
  topics)
    shift
    fetch_jars
    java_cp org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$PORT" "$@"
    ;;
  produce)
    fetch_jars
    java_cp org.apache.kafka.tools.ConsoleProducer --bootstrap-server "127.0.0.1:$PORT" --topic "$2"
    ;;
  consume)
    fetch_jars
    java_cp org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "127.0.0.1:$PORT" \
      --topic "$2" --from-beginning --isolation-level read_committed --timeout-ms 5000 2>/dev/null \
      | grep -v -e '^\[20' -e '^org\.apache\.kafka' || true
    ;;
  *)
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
