"""The book's PySpark query, on real PySpark: the function of
examples/python/spark_sessions.py run by ``applyInPandasWithState`` over a directory of
JSON-lines files, one micro-batch per file (in file order); every output row as JSON
(Spark's to_json, session time zone UTC) to a file.

    python pyspark_job.py INPUT_DIR OUTPUT CHECKPOINT_DIR

The function is `module:name` in $SPARK_SESSIONS_FUNCTION (on the PYTHONPATH), the
example's by default (scripts/bench-spark.sh gives one without its prints).
"""

import importlib
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql.types import (ArrayType, LongType, StringType, StructField, StructType,
                               TimestampType)


def main(input_dir, output, checkpoint):
    module, name = os.environ.get("SPARK_SESSIONS_FUNCTION",
                                  "spark_sessions:map_visits_to_session").split(":")
    map_visits_to_session = getattr(importlib.import_module(module), name)
    spark = (SparkSession.builder.master("local[2]")
             .config("spark.sql.shuffle.partitions", 2)
             .config("spark.sql.session.timeZone", "UTC")
             # One DataFrame per key and micro-batch, as sessionizer.spark hands them: by
             # default PySpark cuts a key's rows at its Arrow batches' 10,000-row
             # boundaries, and the book's function keeps only the last frame's rows.
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", 10_000_000)
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
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
    sessions = (spark.readStream.schema(visit_schema).option("maxFilesPerTrigger", 1)
                .json(input_dir)
                .withWatermark("event_time", "1 minute")
                .groupBy("visit_id")
                .applyInPandasWithState(
                    func=map_visits_to_session,
                    outputStructType=StructType([
                        StructField("visit_id", StringType()),
                        StructField("user_id", StringType()),
                        StructField("start_time", TimestampType()),
                        StructField("end_time", TimestampType()),
                        StructField("visited_pages", visited_pages_type),
                        StructField("duration_in_milliseconds", LongType())
                    ]),
                    stateStructType=StructType([
                        StructField("visits", visited_pages_type),
                        StructField("user_id", StringType())
                    ]),
                    outputMode="update",
                    timeoutConf="EventTimeTimeout"))

    def write(batch, batch_id):
        rows = batch.toJSON().collect()
        with open(output, "a", encoding="utf-8") as f:
            for row in rows:
                f.write(row + "\n")

    query = (sessions.writeStream.outputMode("update").foreachBatch(write)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    open(sys.argv[2], "w").close()
    main(os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3])
