#!/usr/bin/env python3
"""Appends JSON lines to a Delta table with the Python `deltalake` package (not our code),
as an upstream job would fill the table a sessionizer job reads with --delta-input.

usage: delta-append.py TABLE FILE [FROM [TO]]   rows FROM..TO (0-based, TO exclusive) of
                                                  the JSON-lines FILE, as one commit
       delta-append.py TABLE --delete-key KEY   delete the rows whose visit_id is KEY
                                                  (a commit that removes data files)

TABLE is a directory or an s3://bucket/path URL; for S3 the endpoint and keys come from
AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION, and commits use
S3's conditional put.
"""
import importlib.util
import json
import os
import sys

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake


def options(table):
    """delta-read.py's storage options for S3 (none for a directory), with S3's
    conditional put for the commits."""
    if not table.startswith("s3://"):
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delta-read.py")
    spec = importlib.util.spec_from_file_location("delta_read", path)
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    return {**reader.s3_options(), "conditional_put": "etag"}


def main():
    table = sys.argv[1]
    if sys.argv[2] == "--delete-key":
        key = sys.argv[3].replace("'", "''")
        DeltaTable(table, storage_options=options(table)).delete(f"visit_id = '{key}'")
        return
    with open(sys.argv[2]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    start = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    end = int(sys.argv[4]) if len(sys.argv) > 4 else len(rows)
    write_deltalake(table, pa.Table.from_pylist(rows[start:end]), mode="append",
                    storage_options=options(table))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
