"""The book's PyFlink job (chapter 5, "Sessionization", the stateful Kafka job) on the
sessionizer package: visits keyed by `visit_id`, event-time session windows with a
10-minute gap and 15 minutes of allowed lateness, a watermark 20 minutes behind the
largest visit time, each session with its visited pages and user — from a Kafka topic to
another, exactly once, or from a file to a file.

    python examples/python/flink_sessions.py --input visits.jsonl --output sessions.jsonl
    python examples/python/flink_sessions.py --brokers 127.0.0.1:39092 \\
        --topic visits --group visits_reader --output-topic sessions

Where the book's ProcessWindowFunction builds each session in Python when its window
fires, here the engine builds it — start, end, duration, event count, the pages in
event-time order, the user — with nothing in Python per visit. A late visit within the
allowed lateness re-emits its session with the next `revision`, as Flink fires the
window again.
"""

import argparse
import json
import sys

import sessionizer

JOB = sessionizer.SessionWindows(
    key="visit_id",
    time="event_time",
    gap="10m",
    watermark_delay="20m",
    allowed_lateness="15m",
    collect={"visited_pages": "page"},
    last={"user_id": "user_id"},
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", help="visits as JSON lines (instead of a topic)")
    parser.add_argument("--output", help="the sessions' JSON-lines file")
    parser.add_argument("--brokers")
    parser.add_argument("--topic")
    parser.add_argument("--group")
    parser.add_argument("--output-topic")
    args = parser.parse_args(argv)
    if args.input:
        stats = JOB.run(input=args.input, output=args.output)
    else:
        stats = JOB.run(kafka_brokers=args.brokers, kafka_topic=args.topic,
                        kafka_group=args.group, kafka_output_topic=args.output_topic,
                        stop_at_end=True)
    json.dump(stats, sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
