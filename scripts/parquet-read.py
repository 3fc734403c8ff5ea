#!/usr/bin/env python3
"""Prints the rows of a directory of sessionizer Parquet files as JSON lines, as pyarrow
reads them (pyarrow.dataset, Hive partitioning), so that a test can compare pyarrow's
view of a Parquet output with the JSON-lines output of the same run.

usage: parquet-read.py DIR [--with-partition]

Each row is printed as the record the JSON encoder writes:

* a retraction (retract = true) as {"key":..,"session_id":..,"retract":true};
* a session with its columns in table order, without `retract`; `start` and `end` in
  RFC 3339 with milliseconds, UTC (as the encoder writes them, years past 9999 too);
* the collect, first and last columns (known by their field metadata
  `sessionizer.aggregate`) as the JSON text they hold, inserted as it is;
* a sum, min or max as a JSON number: the table keeps float64, so the JSON 3 comes back
  as 3.0 and a min or max loses the text as written (compare numbers by value); the
  infinities and NaN of a sum as the strings "Infinity", "-Infinity" and "NaN", and a
  min or max past the float range (1e400 in the record) as 1e999 or -1e999.

Files are read one at a time in the order of their names, part-<epoch>-<n>, which is the
order they were written in; with dt= directories the rows of one epoch are therefore
grouped by date, not in the order of the JSON output. Files whose names start with a dot
(staged, not committed) are not read. The `dt` directory value is left out unless
--with-partition is given (a retraction's, under __HIVE_DEFAULT_PARTITION__, is null).
"""
import argparse
import json
import math
import os
import signal
import sys

import pyarrow as pa
import pyarrow.dataset as ds

AGGREGATE_METADATA = b"sessionizer.aggregate"
JSON_TEXT = {"collect", "first", "last"}
MS_PER_DAY = 86_400_000


def civil_from_days(days):
    """(year, month, day) of a day number since 1970-01-01, proleptic Gregorian."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (1 if month <= 2 else 0)
    return year, month, day


def rfc3339_ms(ms):
    """The encoder's form of a time: YYYY-MM-DDTHH:MM:SS.mmmZ, a signed year of at least
    four digits outside 0000-9999."""
    days, in_day = divmod(ms, MS_PER_DAY)
    year, month, day = civil_from_days(days)
    if 0 <= year <= 9999:
        y = f"{year:04d}"
    else:
        y = ("-" if year < 0 else "+") + f"{abs(year):04d}"
    secs, frac = divmod(in_day, 1000)
    return (f"{y}-{month:02d}-{day:02d}T{secs // 3600:02d}:{secs // 60 % 60:02d}:"
            f"{secs % 60:02d}.{frac:03d}Z")


def render(value, kind, is_time):
    if value is None:
        return "null"
    if is_time:
        return json.dumps(rfc3339_ms(value))
    if kind in JSON_TEXT:
        return value
    if isinstance(value, float) and not math.isfinite(value):
        if kind in ("min", "max"):
            # The record had a number past the float range; 1e999 reads back as the
            # same infinity.
            return "1e999" if value > 0 else "-1e999"
        return json.dumps("NaN" if math.isnan(value) else
                          ("Infinity" if value > 0 else "-Infinity"))
    return json.dumps(value, ensure_ascii=False)


def rows(fragment, with_partition):
    schema = fragment.physical_schema
    table = fragment.to_table()
    names = table.column_names
    kinds = {}
    times = set()
    columns = []
    for name in names:
        field = schema.field(name)
        kinds[name] = (field.metadata or {}).get(AGGREGATE_METADATA, b"").decode()
        column = table.column(name)
        if pa.types.is_timestamp(field.type):
            # As integers: Python's datetime stops at year 9999.
            times.add(name)
            column = column.cast(pa.int64())
        columns.append(column.to_pylist())
    partition = ds.get_partition_keys(fragment.partition_expression)
    for values in zip(*columns):
        record = dict(zip(names, values))
        if record.get("retract"):
            shown = ["key", "session_id", "retract"]
        else:
            shown = [n for n in names if n != "retract"]
        fields = [(n, render(record[n], kinds[n], n in times)) for n in shown]
        if with_partition:
            fields.append(("dt", json.dumps(partition.get("dt"))))
        yield "{" + ",".join(f"{json.dumps(n, ensure_ascii=False)}:{v}"
                             for n, v in fields) + "}"


def main():
    # Piped into head: stop quietly when the reader has enough.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="the Parquet output directory")
    parser.add_argument("--with-partition", action="store_true",
                        help="add the dt directory value to each row")
    args = parser.parse_args()
    dataset = ds.dataset(args.dir, format="parquet", partitioning="hive")
    fragments = sorted(dataset.get_fragments(),
                       key=lambda f: (os.path.basename(f.path), f.path))
    out = sys.stdout
    for fragment in fragments:
        for line in rows(fragment, args.with_partition):
            out.write(line + "\n")


if __name__ == "__main__":
    main()
