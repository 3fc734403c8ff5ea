#!/usr/bin/env bash
# A local Apache Kafka for trying sessionizer's Kafka mode and for its tests: KRaft mode
# (each node a broker and a controller in one JVM), listening on 127.0.0.1 only,
# transactions enabled. The broker's own jars come from Maven Central
# (scripts/kafka/pom.xml, Apache Kafka 4.1.1); Java 17 and Maven must be installed, and
# openssl for the secure listeners. By default one node on 127.0.0.1:39092, plaintext,
# replication factor 1.
#
#   scripts/kafka-dev.sh start     # fetch the jars once, format the log dir(s) once, start, wait until ready
#   scripts/kafka-dev.sh stop      # stop the broker(s) (the data stays)
#   scripts/kafka-dev.sh reset     # stop and delete the data
#   scripts/kafka-dev.sh wipe      # kill every broker under KAFKA_DEV_HOME (any port, any kind)
#                                  # and delete all their data; the jars and tls/ stay
#   scripts/kafka-dev.sh status    # running or not; exit 0 when every node runs
#   scripts/kafka-dev.sh brokers   # print the plaintext bootstrap address(es), comma-separated
#   scripts/kafka-dev.sh topics ARGS...   # run Kafka's own TopicCommand against the broker(s)
#   scripts/kafka-dev.sh produce TOPIC < FILE   # each line of FILE a record (Kafka's console producer)
#   scripts/kafka-dev.sh consume TOPIC          # print the committed records from the start, exit when idle 5 s
#
# A cluster of several nodes (KAFKA_DEV_NODES=3): node N listens on PORT+10*(N-1), its
# controller on that +1; the controller quorum has every node. Each node has its own
# config, data, log and pid file (named by its port), and can be handled alone:
#
#   scripts/kafka-dev.sh node N start      # start node N (if not running), wait until it is ready
#   scripts/kafka-dev.sh node N stop       # SIGTERM (controlled shutdown), SIGKILL after 30 s
#   scripts/kafka-dev.sh node N kill       # SIGKILL at once
#   scripts/kafka-dev.sh node N status     # running or not; exit 0 when running
#   scripts/kafka-dev.sh node N brokers    # print node N's plaintext address
#   scripts/kafka-dev.sh node N wait-isr [SECONDS]   # wait (default 120 s) until node N is in the
#                                                    # ISR of every partition it replicates
#
# (Kafka's defaults otherwise: the controller fences a killed node after about 9 s,
# broker.session.timeout.ms, and only then do acks=all writes to its partitions go on.)
#
# Secure listeners (KAFKA_DEV_SECURE=1), beside the plaintext one (which stays, for the
# controller, the brokers among themselves and admin work): on every node SASL_SSL on
# PORT+2 (SASL mechanisms SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN; user `sessionizer`,
# password `sessionizer-dev-secret`, created at format time or, for a log dir formatted
# before, with ConfigCommand after the start) and SSL on PORT+3 with a required client
# certificate (mTLS). A throwaway CA and the certificates are made once per KAFKA_DEV_HOME,
# in KAFKA_DEV_HOME/tls (10 years valid; delete tls/, brokers stopped, for new ones). A
# sessionizer build reaches these listeners only if its librdkafka has OpenSSL (the rdkafka
# crate's `ssl` feature). The subcommands below imply KAFKA_DEV_SECURE=1:
#
#   scripts/kafka-dev.sh secure-brokers    # print the SASL_SSL bootstrap address(es)
#   scripts/kafka-dev.sh mtls-brokers      # print the SSL (client certificate) bootstrap address(es)
#   scripts/kafka-dev.sh client-config [MECHANISM]   # librdkafka properties for SASL_SSL, one
#                                          # key=value a line (MECHANISM: SCRAM-SHA-512, the
#                                          # default, SCRAM-SHA-256 or PLAIN)
#   scripts/kafka-dev.sh mtls-config       # librdkafka properties for SSL with the client certificate
#   scripts/kafka-dev.sh java-client-config [MECHANISM|mtls]   # the same for Kafka's Java clients
#   scripts/kafka-dev.sh tls-files         # name=path of the CA, the client's certificate and key
#                                          # (and both in one PEM for Java), and of another CA and a
#                                          # client of it, which the broker does not trust
#
# Settings (environment):
#   KAFKA_DEV_HOME    where jars, config, data, logs and tls/ live (default: ~/.cache/sessionizer-kafka)
#   KAFKA_DEV_NODES   the number of nodes (default 1); with more than one: replication factor
#                     min(NODES,3) for new and internal topics, min.insync.replicas one less
#   KAFKA_DEV_SECURE  1: also the SASL_SSL and SSL listeners (default 0)
#   KAFKA_DEV_PORT    node 1's client port; its controller uses PORT+1. The default depends on
#                     the two above, so that every kind runs beside the others:
#                     39092 (one node), 39192 (one node, secure), 39292 (a cluster),
#                     39392 (a cluster, secure)
# Every subcommand acts on the broker(s) these settings name: give `stop`, `status`,
# `brokers`, `node N ...` and the others the same ones as the `start`.
#
# `start` (and `node N start`) is idempotent and safe to call from several processes at
# once (a lock serialises them): the tests call it to make sure a broker is up. A `start`
# with KAFKA_DEV_SECURE=1 fails, rather than restart it, if a broker without the secure
# listeners runs on the port.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
HOME_DIR=${KAFKA_DEV_HOME:-${HOME}/.cache/sessionizer-kafka}
LIBS=$HOME_DIR/libs-4.1.1
LOG4J=$HOME_DIR/log4j2.yaml
TLS=$HOME_DIR/tls

case "${1:-}" in
  secure-brokers | mtls-brokers | client-config | mtls-config | java-client-config | tls-files)
    KAFKA_DEV_SECURE=1 ;;
esac
SECURE=${KAFKA_DEV_SECURE:-0}
[ "$SECURE" = 1 ] || SECURE=0
NODES=${KAFKA_DEV_NODES:-1}
if ! [[ $NODES =~ ^[1-9]$ ]]; then
  echo "kafka-dev: KAFKA_DEV_NODES must be a number from 1 to 9, not '$NODES'" >&2
  exit 2
fi
DEFAULT_PORT=$((39092 + 100 * SECURE + (NODES > 1 ? 200 : 0)))
PORT=${KAFKA_DEV_PORT:-$DEFAULT_PORT}
if [ "$NODES" -gt 1 ]; then
  REPLICATION=$((NODES < 3 ? NODES : 3))
  MIN_ISR=$((REPLICATION - 1))
else
  REPLICATION=1
  MIN_ISR=1
fi

SCRAM_USER=sessionizer
SCRAM_PASSWORD=sessionizer-dev-secret

mkdir -p "$HOME_DIR"

# Node N's ports and files. Node 1 of the default single broker has the names this script
# always had (data-39092, server-39092.properties, broker-39092.log, broker-39092.pid).
node_port() { echo $((PORT + 10 * ($1 - 1))); }
data_dir() { echo "$HOME_DIR/data-$(node_port "$1")"; }
conf_file() { echo "$HOME_DIR/server-$(node_port "$1").properties"; }
log_file() { echo "$HOME_DIR/broker-$(node_port "$1").log"; }
pid_file() { echo "$HOME_DIR/broker-$(node_port "$1").pid"; }
# Written in node 1's log dir once the SCRAM user is in the cluster's metadata.
scram_marker() { echo "$(data_dir 1)/kafka-dev-scram-user"; }

# The comma-separated addresses of every node, at OFFSET from its client port.
addresses() {
  local offset=${1:-0} n out=""
  for n in $(seq 1 "$NODES"); do
    out+="${out:+,}127.0.0.1:$(($(node_port "$n") + offset))"
  done
  echo "$out"
}
BOOTSTRAP=$(addresses 0)

# A process that exists and is not a zombie (one whose parent has not reaped it yet).
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  [ "$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]
}

running() {
  local pidfile
  pidfile=$(pid_file "$1")
  [ -f "$pidfile" ] && alive "$(cat "$pidfile")"
}

has_secure_listeners() {
  grep -q '^listeners=.*SASL_SSL://' "$(conf_file "$1")" 2>/dev/null
}

fetch_jars() {
  if [ -f "$LIBS/.complete" ]; then return; fi
  # Brokers of several ports may start at once (each under its own port's lock).
  exec 7>"$HOME_DIR/.lock-jars"
  flock 7
  if [ -f "$LIBS/.complete" ]; then exec 7>&-; return; fi
  echo "kafka-dev: fetching Apache Kafka 4.1.1 jars from Maven Central into $LIBS" >&2
  rm -rf "$LIBS.tmp"
  mvn -q -B -f "$HERE/kafka/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$LIBS.tmp" -DincludeScope=runtime >&2 7>&-
  rm -rf "$LIBS"
  mv "$LIBS.tmp" "$LIBS"
  touch "$LIBS/.complete"
  exec 7>&-
}

# Signs a certificate for the key in DIR/NAME.key with the CA CA (CA.pem, CA.key):
# sign DIR NAME SUBJECT CA EXTENSIONS...
sign() {
  local dir=$1 name=$2 subject=$3 ca=$4
  shift 4
  openssl req -new -newkey rsa:2048 -nodes -keyout "$dir/$name.key" -out "$dir/$name.csr" \
    -subj "$subject" 2>/dev/null
  printf '%s\n' "$@" > "$dir/$name.ext"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/$ca.pem" -CAkey "$dir/$ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 3650 -sha256 \
    -extfile "$dir/$name.ext" -out "$dir/$name.crt" 2>/dev/null
  rm -f "$dir/$name.csr" "$dir/$name.ext"
}

# A throwaway CA, the broker's certificate for 127.0.0.1 and localhost, a client
# certificate (CN=sessionizer) of the same CA, and an unrelated CA with a client of its
# own; made once per KAFKA_DEV_HOME (10 years valid). Keys are unencrypted PKCS#8 PEM.
ensure_tls() {
  if [ -f "$TLS/.complete" ]; then return; fi
  exec 8>"$HOME_DIR/.lock-tls"
  flock 8
  if [ -f "$TLS/.complete" ]; then exec 8>&-; return; fi
  echo "kafka-dev: making a throwaway CA and certificates in $TLS" >&2
  local tmp=$TLS.tmp
  rm -rf "$tmp"
  mkdir -p "$tmp"
  local ca
  for ca in ca other-ca; do
    openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$tmp/$ca.key" -out "$tmp/$ca.pem" \
      -days 3650 -sha256 -subj "/O=sessionizer kafka-dev/CN=kafka-dev $ca" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  done
  sign "$tmp" broker "/O=sessionizer kafka-dev/CN=localhost" ca \
    "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost"
  local client
  for client in client:ca other-client:other-ca; do
    sign "$tmp" "${client%%:*}" "/O=sessionizer kafka-dev/CN=$SCRAM_USER" "${client##*:}" \
      "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=clientAuth"
  done
  # PEM key stores for Java (the broker's, and the clients' for Kafka's Java tools): the
  # key, then the certificate (without the CA's, as most servers send their chain: a
  # client that does not trust the CA fails with "unable to get local issuer certificate").
  cat "$tmp/broker.key" "$tmp/broker.crt" > "$tmp/broker.pem"
  cat "$tmp/client.key" "$tmp/client.crt" > "$tmp/client.pem"
  cat "$tmp/other-client.key" "$tmp/other-client.crt" > "$tmp/other-client.pem"
  chmod 600 "$tmp"/*.key "$tmp"/*client.pem "$tmp/broker.pem"
  touch "$tmp/.complete"
  rm -rf "$TLS"
  mv "$tmp" "$TLS"
  exec 8>&-
}

write_config() {
  local n=$1 port voters="" i
  port=$(node_port "$n")
  for i in $(seq 1 "$NODES"); do
    voters+="${voters:+,}$i@127.0.0.1:$(($(node_port "$i") + 1))"
  done
  local listeners="PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$((port + 1))"
  local advertised="PLAINTEXT://127.0.0.1:$port"
  local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  if [ "$SECURE" = 1 ]; then
    listeners+=",SASL_SSL://127.0.0.1:$((port + 2)),SSL://127.0.0.1:$((port + 3))"
    advertised+=",SASL_SSL://127.0.0.1:$((port + 2)),SSL://127.0.0.1:$((port + 3))"
    protocols+=",SASL_SSL:SASL_SSL,SSL:SSL"
  fi
  cat > "$(conf_file "$n")" <<EOF
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
listener.security.protocol.map=$protocols
inter.broker.listener.name=PLAINTEXT
log.dirs=$(data_dir "$n")
num.partitions=1
default.replication.factor=$REPLICATION
offsets.topic.replication.factor=$REPLICATION
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=$REPLICATION
transaction.state.log.min.isr=$MIN_ISR
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=$REPLICATION
share.coordinator.state.topic.min.isr=$MIN_ISR
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.cleaner.backoff.ms=1000
transaction.max.timeout.ms=900000
EOF
  if [ "$NODES" -gt 1 ]; then
    echo "min.insync.replicas=$MIN_ISR" >> "$(conf_file "$n")"
  fi
  if [ "$SECURE" = 1 ]; then
    cat >> "$(conf_file "$n")" <<EOF
ssl.keystore.type=PEM
ssl.keystore.location=$TLS/broker.pem
ssl.truststore.type=PEM
ssl.truststore.location=$TLS/ca.pem
listener.name.ssl.ssl.client.auth=required
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$SCRAM_USER="$SCRAM_PASSWORD";
EOF
  fi
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

# The cluster id of the nodes already formatted, or a new one.
cluster_id() {
  local n
  for n in $(seq 1 "$NODES"); do
    if [ -f "$(data_dir "$n")/meta.properties" ]; then
      sed -n 's/^cluster\.id=//p' "$(data_dir "$n")/meta.properties"
      return
    fi
  done
  java_cp kafka.tools.StorageTool random-uuid
}

format() {
  local n=$1 id=$2
  local scram=()
  if [ "$SECURE" = 1 ]; then
    scram=(--add-scram "SCRAM-SHA-512=[name=$SCRAM_USER,password=$SCRAM_PASSWORD]"
      --add-scram "SCRAM-SHA-256=[name=$SCRAM_USER,password=$SCRAM_PASSWORD]")
  fi
  mkdir -p "$(data_dir "$n")"
  java_cp kafka.tools.StorageTool format -t "$id" -c "$(conf_file "$n")" "${scram[@]}" >/dev/null 9>&-
}

launch() {
  local n=$1
  : > "$(log_file "$n")"
  # setsid: the broker outlives the shell (and the test process) that started it.
  setsid nohup java -Xms256m -Xmx1g -XX:+UseG1GC -Dlog4j2.configurationFile="$LOG4J" \
    -cp "$LIBS/*" kafka.Kafka "$(conf_file "$n")" >>"$(log_file "$n")" 2>&1 < /dev/null 9>&- &
  echo $! > "$(pid_file "$n")"
}

wait_ready() {
  local n=$1 log tries what=broker
  log=$(log_file "$n")
  if [ "$NODES" -gt 1 ]; then what="node $n"; fi
  tries=$((NODES > 1 ? 1800 : 600))
  for _ in $(seq 1 "$tries"); do
    if grep -q "Kafka Server started" "$log" 2>/dev/null; then
      echo "kafka-dev: $what ready on 127.0.0.1:$(node_port "$n") (log: $log)" >&2
      return 0
    fi
    if ! running "$n"; then
      echo "kafka-dev: the $what exited during start; its log ($log) ends with:" >&2
      tail -n 30 "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "kafka-dev: the $what did not become ready within $((tries / 10)) s; see $log" >&2
  return 1
}

# The SCRAM user, for a log dir formatted without it (by a plaintext start, or before
# this script had secure listeners): added over the plaintext listener.
ensure_scram_user() {
  if [ -f "$(scram_marker)" ]; then return; fi
  echo "kafka-dev: adding the SCRAM user $SCRAM_USER" >&2
  fetch_jars
  local mechanism described
  # One mechanism a request: the broker refuses two changes of one user in one request.
  for mechanism in SCRAM-SHA-512 SCRAM-SHA-256; do
    java_cp kafka.admin.ConfigCommand --bootstrap-server "$BOOTSTRAP" --alter \
      --entity-type users --entity-name "$SCRAM_USER" \
      --add-config "$mechanism=[password=$SCRAM_PASSWORD]" >/dev/null 9>&-
  done
  for _ in $(seq 1 10); do
    described=$(java_cp kafka.admin.ConfigCommand --bootstrap-server "$BOOTSTRAP" --describe \
      --entity-type users --entity-name "$SCRAM_USER" 2>/dev/null 9>&- || true)
    if [[ $described == *SCRAM-SHA-512* && $described == *SCRAM-SHA-256* ]]; then
      touch "$(scram_marker)"
      return
    fi
    sleep 0.2
  done
  echo "kafka-dev: the SCRAM user $SCRAM_USER did not appear" >&2
  return 1
}

# Starts the given nodes (those not running), waits until they are ready. Called with
# the lock held.
start_nodes() {
  local n id="" formatted=0 started=()
  for n in "$@"; do
    if running "$n" && [ "$SECURE" = 1 ] && ! has_secure_listeners "$n"; then
      echo "kafka-dev: the broker on 127.0.0.1:$(node_port "$n") runs without the secure listeners;" \
        "stop it first (scripts/kafka-dev.sh stop without KAFKA_DEV_SECURE) or use another KAFKA_DEV_PORT" >&2
      return 1
    fi
  done
  for n in "$@"; do
    if ! running "$n"; then started+=("$n"); fi
  done
  if [ ${#started[@]} -eq 0 ]; then
    if [ "$SECURE" = 1 ]; then ensure_scram_user; fi
    return 0
  fi
  fetch_jars
  if [ "$SECURE" = 1 ]; then ensure_tls; fi
  for n in "${started[@]}"; do
    write_config "$n"
    if [ ! -f "$(data_dir "$n")/meta.properties" ]; then
      if [ -z "$id" ]; then id=$(cluster_id); fi
      format "$n" "$id"
      formatted=$((formatted + 1))
    fi
  done
  # Every node formatted now, with the SCRAM user: the cluster's metadata starts with it.
  # Otherwise (a log dir formatted without it) ensure_scram_user adds it once started.
  if [ "$SECURE" = 1 ] && [ "$formatted" = "$NODES" ]; then touch "$(scram_marker)"; fi
  for n in "${started[@]}"; do launch "$n"; done
  for n in "${started[@]}"; do wait_ready "$n"; done
  if [ "$SECURE" = 1 ]; then ensure_scram_user; fi
}

# Stops the given nodes with SIGNAL (TERM: wait up to 30 s, then SIGKILL; KILL: at once).
stop_nodes() {
  local signal=$1 n pid pids=()
  shift
  for n in "$@"; do
    if running "$n"; then
      pid=$(cat "$(pid_file "$n")")
      kill "-$signal" "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  for pid in ${pids[@]+"${pids[@]}"}; do
    for _ in $(seq 1 300); do
      alive "$pid" || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    # Gone (its ports free) before returning, so that a restart can bind them.
    for _ in $(seq 1 100); do
      alive "$pid" || break
      sleep 0.1
    done
  done
  for n in "$@"; do rm -f "$(pid_file "$n")"; done
}

# "running on 127.0.0.1:PORT (pid P)" or "not running" (prefixed "node N " in a cluster).
status_of() {
  local n=$1 what prefix=""
  what="127.0.0.1:$(node_port "$n")"
  if [ "$NODES" -gt 1 ]; then prefix="node $n "; fi
  if running "$n" && has_secure_listeners "$n"; then
    what+=", SASL_SSL 127.0.0.1:$(($(node_port "$n") + 2)), SSL 127.0.0.1:$(($(node_port "$n") + 3))"
  fi
  if running "$n"; then
    echo "${prefix}running on $what (pid $(cat "$(pid_file "$n")"))"
  else
    echo "${prefix}not running"
    return 1
  fi
}

# Waits until node N is in the ISR of every partition it is a replica of.
wait_isr() {
  local n=$1 deadline=$((SECONDS + ${2:-120})) out missing
  fetch_jars
  while :; do
    if out=$(java_cp org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" \
      --describe 2>/dev/null); then
      missing=$(echo "$out" | awk -v n="$n" '
        /Partition:/ {
          topic = ""; part = ""; replicas = ""; isr = ""
          for (i = 1; i <= NF; i++) {
            if ($i == "Topic:") topic = $(i + 1)
            if ($i == "Partition:") part = $(i + 1)
            if ($i == "Replicas:") replicas = "," $(i + 1) ","
            if ($i == "Isr:") isr = "," $(i + 1) ","
          }
          if (index(replicas, "," n ",") && !index(isr, "," n ",")) print topic "-" part
        }')
      if [ -z "$missing" ]; then
        echo "kafka-dev: node $n is in sync" >&2
        return 0
      fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "kafka-dev: node $n not in the ISR of: $(echo "${missing:-?}" | tr '\n' ' ')" >&2
      return 1
    fi
    sleep 1
  done
}

client_config() {
  local mechanism=${1:-SCRAM-SHA-512}
  case "$mechanism" in
    SCRAM-SHA-512 | SCRAM-SHA-256 | PLAIN) ;;
    *) echo "kafka-dev: MECHANISM is SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN" >&2; exit 2 ;;
  esac
  ensure_tls
  cat <<EOF
security.protocol=SASL_SSL
sasl.mechanism=$mechanism
sasl.username=$SCRAM_USER
sasl.password=$SCRAM_PASSWORD
ssl.ca.location=$TLS/ca.pem
EOF
}

java_client_config() {
  local mechanism=${1:-SCRAM-SHA-512} module
  ensure_tls
  if [ "$mechanism" = mtls ]; then
    cat <<EOF
security.protocol=SSL
ssl.truststore.type=PEM
ssl.truststore.location=$TLS/ca.pem
ssl.keystore.type=PEM
ssl.keystore.location=$TLS/client.pem
EOF
    return
  fi
  case "$mechanism" in
    SCRAM-SHA-512 | SCRAM-SHA-256) module=org.apache.kafka.common.security.scram.ScramLoginModule ;;
    PLAIN) module=org.apache.kafka.common.security.plain.PlainLoginModule ;;
    *) echo "kafka-dev: expected SCRAM-SHA-512, SCRAM-SHA-256, PLAIN or mtls" >&2; exit 2 ;;
  esac
  cat <<EOF
security.protocol=SASL_SSL
sasl.mechanism=$mechanism
sasl.jaas.config=$module required username="$SCRAM_USER" password="$SCRAM_PASSWORD";
ssl.truststore.type=PEM
ssl.truststore.location=$TLS/ca.pem
EOF
}

node_number() {
  if ! [[ ${1:-} =~ ^[1-9]$ ]] || [ "$1" -gt "$NODES" ]; then
    echo "kafka-dev: no node '${1:-}' (KAFKA_DEV_NODES=$NODES)" >&2
    exit 2
  fi
}

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 2
}

ALL=$(seq 1 "$NODES")
case "${1:-}" in
  start)
    exec 9>"$HOME_DIR/.lock-$PORT"
    flock 9
    # shellcheck disable=SC2086
    start_nodes $ALL
    ;;
  stop)
    # shellcheck disable=SC2086
    stop_nodes TERM $ALL
    ;;
  reset)
    # shellcheck disable=SC2086
    stop_nodes TERM $ALL
    for n in $ALL; do rm -rf "$(data_dir "$n")"; done
    ;;
  wipe)
    for pidfile in "$HOME_DIR"/broker-*.pid; do
      [ -f "$pidfile" ] || continue
      pid=$(cat "$pidfile")
      if alive "$pid"; then
        kill -9 "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
          alive "$pid" || break
          sleep 0.1
        done
      fi
      rm -f "$pidfile"
    done
    rm -rf "$HOME_DIR"/data-* "$HOME_DIR"/broker-*.log
    ;;
  status)
    rc=0
    for n in $ALL; do status_of "$n" || rc=1; done
    exit $rc
    ;;
  brokers) echo "$BOOTSTRAP" ;;
  secure-brokers) addresses 2 ;;
  mtls-brokers) addresses 3 ;;
  node)
    node_number "${2:-}"
    n=$2
    case "${3:-}" in
      start)
        exec 9>"$HOME_DIR/.lock-$PORT"
        flock 9
        start_nodes "$n"
        ;;
      stop) stop_nodes TERM "$n" ;;
      kill) stop_nodes KILL "$n" ;;
      status) status_of "$n" ;;
      brokers) echo "127.0.0.1:$(node_port "$n")" ;;
      wait-isr) wait_isr "$n" "${4:-120}" ;;
      *) usage ;;
    esac
    ;;
  client-config) client_config "${2:-}" ;;
  mtls-config)
    ensure_tls
    cat <<EOF
security.protocol=SSL
ssl.ca.location=$TLS/ca.pem
ssl.certificate.location=$TLS/client.crt
ssl.key.location=$TLS/client.key
EOF
    ;;
  java-client-config) java_client_config "${2:-}" ;;
  tls-files)
    ensure_tls
    cat <<EOF
ca=$TLS/ca.pem
client-cert=$TLS/client.crt
client-key=$TLS/client.key
broker-cert=$TLS/broker.crt
other-ca=$TLS/other-ca.pem
other-client-cert=$TLS/other-client.crt
other-client-key=$TLS/other-client.key
client-pem=$TLS/client.pem
other-client-pem=$TLS/other-client.pem
EOF
    ;;
  topics)
    shift
    fetch_jars
    java_cp org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" "$@"
    ;;
  produce)
    fetch_jars
    java_cp org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$BOOTSTRAP" --topic "$2"
    ;;
  consume)
    fetch_jars
    java_cp org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$BOOTSTRAP" \
      --topic "$2" --from-beginning --isolation-level read_committed --timeout-ms 5000 2>/dev/null \
      | grep -v -e '^\[20' -e '^org\.apache\.kafka' || true
    ;;
  *) usage ;;
esac
