"""`Row`, as ``pyspark.sql.Row``: a tuple whose values can also be read by field name."""

from __future__ import annotations

from typing import Any


def _row(fields: tuple[str, ...] | None, values: tuple) -> "Row":
    return Row._make(fields, values)


class Row(tuple):
    """``Row(visit_id="v1", page="home")`` (fields by name, in the order given) or
    ``Row("v1", "home")`` (values only). ``row.page``, ``row["page"]``, ``row[1]`` and
    ``row.asDict()`` read it; it pickles with its field names."""

    _fields: tuple[str, ...] | None

    def __new__(cls, *args: Any, **kwargs: Any) -> "Row":
        if args and kwargs:
            raise ValueError("a Row takes values or fields by name, not both")
        if kwargs:
            return cls._make(list(kwargs), tuple(kwargs.values()))
        return cls._make(None, args)

    @classmethod
    def _make(cls, fields: Any, values: Any) -> "Row":
        row = tuple.__new__(cls, values)
        # A tuple, shared by the rows of one schema (pickle then writes it once).
        row._fields = fields if fields is None or isinstance(fields, tuple) else tuple(fields)
        return row

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_fields":
            raise AttributeError(name)
        fields = self._fields
        if fields is not None and name in fields:
            return tuple.__getitem__(self, fields.index(name))
        raise AttributeError(name)

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, str):
            fields = self._fields
            if fields is None or item not in fields:
                raise KeyError(item)
            return tuple.__getitem__(self, fields.index(item))
        return tuple.__getitem__(self, item)

    def __contains__(self, item: Any) -> bool:
        if self._fields is not None:
            return item in self._fields
        return tuple.__contains__(self, item)

    def asDict(self, recursive: bool = False) -> dict[str, Any]:
        if self._fields is None:
            raise TypeError("this Row has no field names")

        def plain(v: Any) -> Any:
            if isinstance(v, Row) and v._fields is not None:
                return v.asDict(True)
            if isinstance(v, list):
                return [plain(i) for i in v]
            if isinstance(v, dict):
                return {k: plain(i) for k, i in v.items()}
            return v

        values = tuple(self)
        if recursive:
            values = tuple(plain(v) for v in values)
        return dict(zip(self._fields, values))

    def __reduce__(self) -> tuple:
        return (_row, (self._fields, tuple(self)))

    def __repr__(self) -> str:
        if self._fields is None:
            return "<Row(" + ", ".join(repr(v) for v in self) + ")>"
        return "Row(" + ", ".join(f"{k}={v!r}" for k, v in zip(self._fields, self)) + ")"
