#!/usr/bin/env python3
"""Prints a sessionizer Delta table as the Python `deltalake` package reads it, so that a
test can compare a reader's view of a `--delta-table` run with the JSON-lines output of
the same run.

usage: delta-read.py TABLE                 the rows, as JSON lines
       delta-read.py TABLE --key K         the rows of key K
       delta-read.py TABLE --start-from T  the rows whose start is T (RFC 3339) or later
       delta-read.py TABLE --files         the table's data files, one path a line, sorted
       delta-read.py TABLE --stored        the Parquet files stored at the table's root
                                           (listed by pyarrow, not by the table's log)
       delta-read.py TABLE --txn APP_ID    the table's transaction version of APP_ID
                                           (`none` when it has none)

Each row is printed as the record the JSON encoder writes with `--emit final`: its
columns in table order, `start` and `end` in RFC 3339 with milliseconds, UTC; the
collect, first and last columns (known by their field metadata `sessionizer.aggregate`)
as the JSON text they hold; a sum, min or max as scripts/parquet-read.py prints it. Rows
come in the order the table's scan gives them: compare them as a set. --key and
--start-from are filters the package applies with the files' statistics (it skips the
files whose bounds rule them out), so they check those statistics too.

TABLE is a directory or an s3://bucket/path URL; for S3 the endpoint and keys come from
AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION.
"""
import argparse
from datetime import datetime
import importlib.util
import json
import os
import signal
import sys

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

AGGREGATE_METADATA = "sessionizer.aggregate"


def parquet_reader():
    """scripts/parquet-read.py, for its rendering of values as the encoder writes them."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parquet-read.py")
    spec = importlib.util.spec_from_file_location("parquet_read", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(table, render, where):
    kinds = {f.name: (f.metadata or {}).get(AGGREGATE_METADATA, "")
             for f in table.schema().fields}
    data = table.to_pyarrow_table(filters=where)
    names = data.column_names
    columns = []
    times = set()
    for name in names:
        column = data.column(name)
        if pa.types.is_timestamp(column.type):
            # As integers (Python's datetime stops at year 9999), in milliseconds.
            times.add(name)
            column = column.cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64())
        columns.append(column.to_pylist())
    for values in zip(*columns):
        fields = [(n, render(v, kinds.get(n, ""), n in times)) for n, v in zip(names, values)]
        yield "{" + ",".join(f"{json.dumps(n, ensure_ascii=False)}:{v}"
                             for n, v in fields) + "}"


def s3_options():
    """The deltalake package's storage options for the S3 server of the environment."""
    options = {"AWS_REGION": os.environ.get("AWS_REGION", "us-east-1")}
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        if name in os.environ:
            options[name] = os.environ[name]
    if options.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    return options


def stored(location):
    """The names of the Parquet files at the table's root, as the storage lists them."""
    import pyarrow.fs as pafs
    if location.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
        scheme, _, host = endpoint.partition("://")
        fs = pafs.S3FileSystem(
            access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
            secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
            region=os.environ.get("AWS_REGION", "us-east-1"),
            endpoint_override=host or None,
            scheme=scheme or "https",
        )
        root = location[len("s3://"):].rstrip("/")
    else:
        fs = pafs.LocalFileSystem()
        root = os.path.realpath(location)
    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    return sorted(i.base_name for i in infos
                  if i.type == pafs.FileType.File and i.base_name.endswith(".parquet"))


def main():
    # Piped into head: stop quietly when the reader has enough.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", help="the Delta table's directory or s3:// URL")
    parser.add_argument("--files", action="store_true",
                        help="print the table's data files instead of its rows")
    parser.add_argument("--stored", action="store_true",
                        help="print the Parquet files stored at the table's root")
    parser.add_argument("--txn", metavar="APP_ID",
                        help="print the table's transaction version of APP_ID")
    parser.add_argument("--key", help="only the rows of this key")
    parser.add_argument("--start-from", metavar="TIME",
                        help="only the rows whose start is TIME (RFC 3339) or later")
    args = parser.parse_args()
    out = sys.stdout
    if args.stored:
        for name in stored(args.table):
            out.write(name + "\n")
        return
    remote = args.table.startswith("s3://")
    table = DeltaTable(args.table, storage_options=s3_options() if remote else None)
    if args.txn is not None:
        version = table.transaction_version(args.txn)
        out.write(("none" if version is None else str(version)) + "\n")
        return
    if args.files:
        if remote:
            root = args.table.rstrip("/") + "/"
            for uri in sorted(table.file_uris()):
                out.write(uri[len(root):] if uri.startswith(root) else uri)
                out.write("\n")
            return
        root = os.path.realpath(args.table)
        for uri in sorted(table.file_uris()):
            path = uri[len("file://"):] if uri.startswith("file://") else uri
            out.write(os.path.relpath(os.path.realpath(path), root) + "\n")
        return
    where = None
    if args.key is not None:
        where = pc.field("key") == args.key
    if args.start_from is not None:
        since = datetime.fromisoformat(args.start_from.replace("Z", "+00:00"))
        start = pa.scalar(since, type=pa.timestamp("us", tz="UTC"))
        later = pc.field("start") >= start
        where = later if where is None else where & later
    render = parquet_reader().render
    for line in rows(table, render, where):
        out.write(line + "\n")


if __name__ == "__main__":
    main()
    # The deltalake package's threads sometimes abort the interpreter's teardown
    # ("terminate called without an active exception", exit 134) after everything was
    # read and printed: leave without it.
    sys.stdout.flush()
    os._exit(0)
