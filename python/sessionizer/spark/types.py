"""The data types of a schema, named as in ``pyspark.sql.types``: a job ported from
PySpark changes ``from pyspark.sql.types import ...`` into
``from sessionizer.spark.types import ...`` and keeps its schemas as written.

A schema says what the function receives (the input's columns and their types), what
its state holds and what its output rows are. Values are converted as Spark converts
them between the JVM and Python: a struct becomes a :class:`~sessionizer.spark.Row`
(attribute access by field name), an array a list, a timestamp a ``datetime``. In the
output files, a timestamp is written as RFC 3339 text in UTC with milliseconds
(``2024-01-01T10:00:00.000Z``), a struct as an object, an array as a list.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

__all__ = [
    "DataType",
    "StringType",
    "LongType",
    "IntegerType",
    "ShortType",
    "ByteType",
    "DoubleType",
    "FloatType",
    "BooleanType",
    "TimestampType",
    "ArrayType",
    "StructField",
    "StructType",
]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


class DataType:
    """A column's type."""

    def simpleString(self) -> str:
        return type(self).__name__.removesuffix("Type").lower()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def to_python(self, value: Any) -> Any:
        """`value` as Spark hands this type to Python."""
        return value

    def to_json(self, value: Any) -> Any:
        """`value` as the output file holds it."""
        return value


def _missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return isinstance(value, float) and math.isnan(value) or _is_nat(value)
    except TypeError:
        return False


def _is_nat(value: Any) -> bool:
    return type(value).__name__ == "NaTType"


class StringType(DataType):
    def to_python(self, value: Any) -> Any:
        return None if _missing(value) else str(value)

    to_json = to_python


class _Integral(DataType):
    def to_python(self, value: Any) -> Any:
        if _missing(value):
            return None
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, float) and not value.is_integer():
            raise TypeError(f"{value!r} is not a value of {self.simpleString()}")
        return int(value)

    to_json = to_python


class LongType(_Integral):
    def simpleString(self) -> str:
        return "bigint"


class IntegerType(_Integral):
    def simpleString(self) -> str:
        return "int"


class ShortType(_Integral):
    def simpleString(self) -> str:
        return "smallint"


class ByteType(_Integral):
    def simpleString(self) -> str:
        return "tinyint"


class _Fractional(DataType):
    def to_python(self, value: Any) -> Any:
        return None if _missing(value) else float(value)

    to_json = to_python


class DoubleType(_Fractional):
    pass


class FloatType(_Fractional):
    pass


class BooleanType(DataType):
    def to_python(self, value: Any) -> Any:
        return None if _missing(value) else bool(value)

    to_json = to_python


def _as_utc(value: Any) -> datetime.datetime:
    """A timestamp value (datetime, pandas Timestamp, epoch milliseconds, RFC 3339
    text) as an aware UTC datetime; a naive one is taken as UTC."""
    if hasattr(value, "to_pydatetime"):
        value = value.to_pydatetime()
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            return value.replace(tzinfo=datetime.timezone.utc)
        return value.astimezone(datetime.timezone.utc)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _EPOCH + datetime.timedelta(milliseconds=value)
    if isinstance(value, str):
        return _as_utc(datetime.datetime.fromisoformat(value.replace("Z", "+00:00")))
    if hasattr(value, "item"):  # numpy.datetime64
        return _as_utc(value.item())
    raise TypeError(f"{value!r} is not a timestamp")


class TimestampType(DataType):
    """A point in time. Python sees a naive ``datetime`` in UTC (Spark's, with the
    session time zone UTC); pandas frames a ``datetime64`` column."""

    def to_python(self, value: Any) -> Any:
        if _missing(value):
            return None
        return _as_utc(value).replace(tzinfo=None)

    def to_json(self, value: Any) -> Any:
        if _missing(value):
            return None
        t = _as_utc(value)
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


class ArrayType(DataType):
    def __init__(self, elementType: DataType, containsNull: bool = True) -> None:
        self.elementType = elementType
        self.containsNull = containsNull

    def simpleString(self) -> str:
        return f"array<{self.elementType.simpleString()}>"

    def __repr__(self) -> str:
        return f"ArrayType({self.elementType!r}, {self.containsNull})"

    def to_python(self, value: Any) -> Any:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        return [self.elementType.to_python(v) for v in value]

    def to_json(self, value: Any) -> Any:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        return [self.elementType.to_json(v) for v in value]


class StructField:
    def __init__(
        self,
        name: str,
        dataType: DataType,
        nullable: bool = True,
        metadata: dict | None = None,
    ) -> None:
        self.name = name
        self.dataType = dataType
        self.nullable = nullable
        self.metadata = metadata or {}

    def __repr__(self) -> str:
        return f"StructField({self.name!r}, {self.dataType!r}, {self.nullable})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, StructField)
            and (self.name, self.dataType, self.nullable)
            == (other.name, other.dataType, other.nullable)
        )

    def __hash__(self) -> int:
        return hash(self.name)


class StructType(DataType):
    def __init__(self, fields: list[StructField] | None = None) -> None:
        self.fields = list(fields or [])

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def fieldNames(self) -> list[str]:
        return self.names

    def add(self, field: str | StructField, data_type: DataType | None = None, nullable: bool = True) -> "StructType":
        if isinstance(field, StructField):
            self.fields.append(field)
        else:
            self.fields.append(StructField(field, data_type, nullable))
        return self

    def simpleString(self) -> str:
        inner = ",".join(f"{f.name}:{f.dataType.simpleString()}" for f in self.fields)
        return f"struct<{inner}>"

    def __repr__(self) -> str:
        return f"StructType([{', '.join(map(repr, self.fields))}])"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StructType) and self.fields == other.fields

    def __hash__(self) -> int:
        return hash(tuple(self.names))

    def __iter__(self):
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def _values(self, value: Any) -> list[Any]:
        """The field values of `value` in field order: a dict or a Row with field
        names by name, a tuple or list by position."""
        from sessionizer.spark.row import Row

        if isinstance(value, dict):
            return [value.get(f.name) for f in self.fields]
        if isinstance(value, Row) and value._fields is not None:
            d = value.asDict()
            return [d.get(f.name) for f in self.fields]
        if hasattr(value, "_asdict"):  # a namedtuple
            d = value._asdict()
            return [d.get(f.name) for f in self.fields]
        values = list(value)
        if len(values) != len(self.fields):
            raise ValueError(
                f"{len(values)} values for the {len(self.fields)} fields of {self.simpleString()}"
            )
        return values

    def to_python(self, value: Any) -> Any:
        from sessionizer.spark.row import Row

        if value is None:
            return None
        values = self._values(value)
        names = self.__dict__.get("_names")
        if names is None:
            names = self._names = tuple(self.names)
        return Row._make(names, [f.dataType.to_python(v) for f, v in zip(self.fields, values)])

    def to_json(self, value: Any) -> Any:
        if value is None:
            return None
        values = self._values(value)
        return {f.name: f.dataType.to_json(v) for f, v in zip(self.fields, values)}


def _of(schema: Any) -> StructType | None:
    """A schema given as our StructType, or as PySpark's (converted by its JSON form)."""
    if schema is None or isinstance(schema, StructType):
        return schema
    if hasattr(schema, "jsonValue"):
        return _from_json(schema.jsonValue())
    raise TypeError(f"a schema is a StructType, not {type(schema).__name__}")


_SIMPLE = {
    "string": StringType,
    "long": LongType,
    "bigint": LongType,
    "integer": IntegerType,
    "int": IntegerType,
    "short": ShortType,
    "byte": ByteType,
    "double": DoubleType,
    "float": FloatType,
    "boolean": BooleanType,
    "timestamp": TimestampType,
}


def _from_json(value: Any) -> DataType:
    if isinstance(value, str):
        try:
            return _SIMPLE[value]()
        except KeyError:
            raise TypeError(f"the type {value!r} is not supported") from None
    kind = value.get("type")
    if kind == "struct":
        return StructType(
            [
                StructField(f["name"], _from_json(f["type"]), f.get("nullable", True))
                for f in value["fields"]
            ]
        )
    if kind == "array":
        return ArrayType(_from_json(value["elementType"]), value.get("containsNull", True))
    raise TypeError(f"the type {kind!r} is not supported")
