#!/usr/bin/env python3
"""Helpers of scripts/measure-floor.sh (docs/semantics.md S-30, BENCHMARKS.md).

  floor_pairs.py shift IN OUT FRACTION MIN_MS MAX_MS SEED
      copies the JSON lines of IN (epoch-ms "event_time") to OUT, shifting the time of
      FRACTION of the events back by a uniform MIN_MS..MAX_MS (seeded): late events.
  floor_pairs.py pairs OUT GAP_MS
      the final view of a session output (the latest record of every session id not
      retracted) and, per key, the pairs of sessions closer than the gap
      (next.start - prev.end <= GAP_MS, i.e. [start, end + gap] intervals touching).
      Prints one JSON object.
  floor_pairs.py diff OUT_A OUT_B
      how many sessions of the final views are only in A, only in B, and in both
      (compared by key, start, end, event count); and, with the late outputs next to
      them (OUT.late.jsonl), whether the sessions that differ are exactly those of the
      keys with events late in B but not in A, each short of exactly those events.
"""
import collections
import json
import random
import sys
from datetime import datetime


def ms(text):
    # "2024-01-01T00:03:00.250Z"
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def final_view(path):
    live = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            sid = (r["key"], r["session_id"])
            if r.get("retract"):
                live.pop(sid, None)
            else:
                live[sid] = (r["key"], ms(r["start"]), ms(r["end"]), r["event_count"])
    return list(live.values())


def pairs(path, gap):
    by_key = {}
    sessions = final_view(path)
    for key, start, end, count in sessions:
        by_key.setdefault(key, []).append((start, end))
    close_pairs = 0
    keys_with_pairs = 0
    overlapping = 0
    for spans in by_key.values():
        spans.sort()
        found = 0
        for i in range(len(spans)):
            for j in range(i + 1, len(spans)):
                (s1, e1), (s2, e2) = spans[i], spans[j]
                if s2 <= e1 + gap and s1 <= e2 + gap:
                    found += 1
                    if s2 <= e1:
                        overlapping += 1
        close_pairs += found
        keys_with_pairs += found > 0
    print(json.dumps({
        "sessions": len(sessions),
        "events_in_sessions": sum(s[3] for s in sessions),
        "pairs_closer_than_gap": close_pairs,
        "of_which_overlapping": overlapping,
        "keys_with_such_pairs": keys_with_pairs,
    }))


def diff(a, b):
    sa, sb = set(final_view(a)), set(final_view(b))
    only_a, only_b = sa - sb, sb - sa
    late_a = {json.loads(line)["source"] for line in open(a[: -len(".jsonl")] + ".late.jsonl")}
    newly_late = collections.Counter()
    for line in open(b[: -len(".jsonl")] + ".late.jsonl"):
        r = json.loads(line)
        if r["source"] not in late_a:
            newly_late[r["event"]["visit_id"]] += 1
    lost = collections.Counter()
    for key, _, _, count in only_a:
        lost[key] += count
    for key, _, _, count in only_b:
        lost[key] -= count
    print(json.dumps({
        "only_in_a": len(only_a),
        "only_in_b": len(only_b),
        "in_both": len(sa & sb),
        "events_late_only_in_b": sum(newly_late.values()),
        "differences_are_exactly_those_events": set(lost) == set(newly_late)
        and all(lost[k] == newly_late[k] for k in lost)
        and all(sum(1 for x in only_a if x[0] == k) == sum(1 for x in only_b if x[0] == k) for k in lost),
    }))


def shift(src, dst, fraction, lo, hi, seed):
    rng = random.Random(seed)
    shifted = 0
    with open(src) as f, open(dst, "w") as out:
        for line in f:
            r = json.loads(line)
            if rng.random() < fraction:
                r["event_time"] -= rng.randint(lo, hi)
                shifted += 1
            out.write(json.dumps(r, separators=(",", ":")) + "\n")
    print(json.dumps({"late_events": shifted}))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "shift":
        shift(args[0], args[1], float(args[2]), int(args[3]), int(args[4]), int(args[5]))
    elif cmd == "pairs":
        pairs(args[0], int(args[1]))
    elif cmd == "diff":
        diff(args[0], args[1])
    else:
        sys.exit(__doc__)
