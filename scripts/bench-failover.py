#!/usr/bin/env python3
"""Failover with a standby (scripts/bench.sh kafka calls this).

Two processes A and B in one group, both with --standby-replicas 1, over a topic that
holds many open sessions (a gap nothing closes). Once B's copies of A's tasks have
caught up, A is killed with SIGKILL; the script prints the time from the kill until B
has restored A's partitions (the group notices A is gone after its session timeout),
and what B's restore read.

usage: bench-failover.py BIN BROKERS TOPIC GROUP OUTPUT_TOPIC
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

BIN, BROKERS, TOPIC, GROUP, OUTPUT = sys.argv[1:6]
SESSION_TIMEOUT_MS = 10000  # the group's session timeout (README: 10 s)


def start(instance):
    args = [BIN, "run", "--kafka-brokers", BROKERS, "--kafka-topic", TOPIC,
            "--kafka-group", GROUP, "--kafka-output-topic", OUTPUT,
            "--kafka-instance-id", instance, "--standby-replicas", "1",
            "--gap", "1000h", "--checkpoint-interval", "1s", "--progress", "never",
            "--kafka-config", f"session.timeout.ms={SESSION_TIMEOUT_MS}"]
    env = dict(os.environ, RUST_LOG="sessionizer=debug", NO_COLOR="1")
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=env, text=True)
    lines = []

    def pump():
        for line in p.stderr:
            lines.append((time.monotonic(), line.rstrip()))

    threading.Thread(target=pump, daemon=True).start()
    return p, lines


def wait_for(lines, pred, what, timeout=120, after=0.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for t, line in list(lines):
            if t >= after and pred(line):
                return t, line
        time.sleep(0.02)
    sys.exit(f"failover bench: timed out waiting for {what}")


a, a_log = start("a")
wait_for(a_log, lambda l: "partitions assigned" in l, "A to join")
b, b_log = start("b")
wait_for(b_log, lambda l: "standby copies followed" in l and "changelogs=[]" not in l,
         "B to follow A's changelogs")
# Caught up: no copy update for 3 s.
while True:
    updates = [t for t, l in b_log if "standby copies updated" in l]
    if updates and time.monotonic() - updates[-1] > 3:
        break
    time.sleep(0.5)
killed = time.monotonic()
a.send_signal(signal.SIGKILL)
a.wait()
t, line = wait_for(b_log, lambda l: "partitions assigned" in l and "restored_keys=0" not in l,
                   "B to take A's partitions", after=killed)
fields = dict(re.findall(r"(\w+)=([^ ]+)", line))
b.send_signal(signal.SIGTERM)
b.wait()
print(f"kafka failover with a standby: {t - killed:5.2f} s from SIGKILL to A's partitions running in B "
      f"(session timeout {SESSION_TIMEOUT_MS / 1000:.0f} s); B's restore: "
      f"{fields.get('restored_keys')} keys, {fields.get('restored_records')} changelog records read, "
      f"{fields.get('ms')} ms")
