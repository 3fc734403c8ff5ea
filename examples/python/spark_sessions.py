"""The book's PySpark job (chapter 5, "Sessionization", the stateful Kafka job with
``applyInPandasWithState``) on the sessionizer package: visits grouped by `visit_id`, a
watermark one minute behind the latest visit time, a visit's pages kept in the group's
state until no visit came for 10 minutes of event time, then one session row.

``map_visits_to_session`` below is the book's function with its body unchanged; only
its imports and the stream's set-up differ (``sessionizer.spark`` instead of a
SparkSession; micro-batches of a fixed number of records). From a topic to a topic,
exactly once, as the book runs it — or from files to a file:

    python examples/python/spark_sessions.py --brokers 127.0.0.1:39092 \\
        --topic visits --group sessions_mapper --output-topic sessions
    python examples/python/spark_sessions.py --input visits.jsonl --output sessions.jsonl \\
        [--state-dir DIR]
"""

import argparse
import datetime
import json
import sys
from typing import Any, Dict, Iterable, List, Tuple, Optional

import pandas
from sessionizer import spark
from sessionizer.spark.state import GroupState
from sessionizer.spark.types import (StructField, LongType, TimestampType, StringType,
                                     ArrayType, StructType)


def map_visits_to_session(visit_id_tuple: Any,
                          input_rows: Iterable[pandas.DataFrame],
                          current_state: GroupState) -> Iterable[pandas.DataFrame]:
    session_expiration_time_10min_as_ms = 10 * 60 * 1000
    visit_id = visit_id_tuple[0]

    def get_session_to_return(visited_pages: List[Tuple[str, str]], user_id: str) -> Dict[str, Any]:
        sorted_visits = sorted(visited_pages,
                               key=lambda event_time_with_page: event_time_with_page.event_time_as_milliseconds)
        first_event_time_as_milliseconds = sorted_visits[0].event_time_as_milliseconds
        last_event_time_as_milliseconds = sorted_visits[len(sorted_visits) - 1].event_time_as_milliseconds

        duration_in_milliseconds = last_event_time_as_milliseconds - first_event_time_as_milliseconds
        # Using the [...] is required to avoid
        # "ValueError: If using all scalar values, you must pass an index" error
        return {
            "visit_id": [visit_id],
            "start_time": [datetime.datetime.fromtimestamp(first_event_time_as_milliseconds / 1000.0,
                                                           tz=datetime.timezone.utc)],
            "end_time": [datetime.datetime.fromtimestamp(last_event_time_as_milliseconds / 1000.0,
                                                         tz=datetime.timezone.utc)],
            "visited_pages": [sorted_visits],
            "duration_in_milliseconds": [duration_in_milliseconds],
            "user_id": [user_id]
        }

    visit_to_return = None
    if current_state.hasTimedOut:
        print(f"Session ({current_state.get}) expired for {visit_id}; let's generate the final output here")
        visits, user_id, = current_state.get
        visit_to_return = get_session_to_return(visits, user_id)
        current_state.remove()
    else:
        should_use_event_time_for_watermark = current_state.getCurrentWatermarkMs() == 0
        base_watermark = current_state.getCurrentWatermarkMs()
        new_visits = []
        user_id: Optional[str] = None
        for input_df_for_group in input_rows:
            input_df_for_group['event_time_as_milliseconds'] = input_df_for_group['event_time'] \
                .apply(lambda x: int(pandas.Timestamp(x).timestamp()) * 1000)
            if should_use_event_time_for_watermark:
                base_watermark = int(input_df_for_group['event_time_as_milliseconds'].max())

            new_visits = input_df_for_group[['event_time_as_milliseconds', 'page']].to_dict(orient='records')
            user_id = input_df_for_group.at[0, 'user_id']

        visits_so_far = []
        if current_state.exists:
            visits_so_far, user_id, = current_state.get

        print(f'visits_so_far={visits_so_far}')
        visits_for_state = visits_so_far + new_visits
        print(f'Updating {visits_for_state}')
        current_state.update((visits_for_state, user_id,))

        timeout_timestamp = base_watermark + session_expiration_time_10min_as_ms
        current_state.setTimeoutTimestamp(timeout_timestamp)

    if visit_to_return:
        print(visit_to_return)
        yield pandas.DataFrame(visit_to_return)


# The book's schemas, as written there.
visit_schema = StructType([
    StructField("visit_id", StringType()),
    StructField("event_time", TimestampType()),
    StructField("user_id", StringType()),
    StructField("page", StringType()),
])
visited_pages_type = ArrayType(StructType([
    StructField("page", StringType()),
    StructField("event_time_as_milliseconds", LongType())
]))
output_schema = StructType([
    StructField("visit_id", StringType()),
    StructField("user_id", StringType()),
    StructField("start_time", TimestampType()),
    StructField("end_time", TimestampType()),
    StructField("visited_pages", visited_pages_type),
    StructField("duration_in_milliseconds", LongType())
])
state_schema = StructType([
    StructField("visits", visited_pages_type),
    StructField("user_id", StringType())
])


def sessions(inputs, records_per_batch=500, function=map_visits_to_session, stream=None):
    """The book's query over JSON-lines files (or `stream`), in micro-batches of
    `records_per_batch`."""
    if stream is None:
        stream = spark.read_json(inputs, schema=visit_schema, records_per_batch=records_per_batch)
    return (stream
            .withWatermark("event_time", "1 minute")
            .groupBy("visit_id")
            .applyInPandasWithState(function, output_schema, state_schema, "update",
                                    "EventTimeTimeout"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", help="visits as JSON lines (instead of a topic)")
    parser.add_argument("--output", help="the sessions' JSON-lines file")
    parser.add_argument("--state-dir", help="checkpoints: a rerun after a crash continues")
    parser.add_argument("--brokers")
    parser.add_argument("--topic")
    parser.add_argument("--group")
    parser.add_argument("--output-topic")
    parser.add_argument("--dead-letter-topic")
    parser.add_argument("--stop-at-end", action="store_true", help="end at the topic's end")
    parser.add_argument("--records-per-batch", type=int, default=500)
    args = parser.parse_args(argv)
    if args.input:
        query = sessions(args.input, args.records_per_batch)
        stats = query.run(args.output, state_dir=args.state_dir)
    else:
        stream = spark.read_kafka(args.brokers, args.topic, args.group, schema=visit_schema,
                                  records_per_batch=args.records_per_batch)
        stats = sessions(None, stream=stream).run(
            output_topic=args.output_topic, dead_letter_topic=args.dead_letter_topic,
            stop_at_end=args.stop_at_end, commit_interval="200 ms")
    json.dump(stats, sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
