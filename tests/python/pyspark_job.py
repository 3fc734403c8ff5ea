"""The book's PySpark query, on real PySpark: the function of
examples/python/spark_sessions.py run by ``applyInPandasWithState`` over a directory of
JSON-lines files, one micro-batch per file (in file order); every output row as JSON
(Spark's to_json, session time zone UTC) to a file.

    python pyspark_job.py INPUT_DIR OUTPUT CHECKPOINT_DIR
"""

import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql.types import (ArrayType, LongType, StringType, StructField, StructType,
                               TimestampType)

from spark_sessions import map_visits_to_session


def main(input_dir, output, checkpoint):
    spark = (SparkSession.builder.master("local[2]")
             .config("spark.sql.shuffle.partitions", 2)
             .config("spark.sql.session.timeZone", "UTC")
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
