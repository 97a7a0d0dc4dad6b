"""Reading a JSON document field by field, naming the file and the field when a value is wrong.

``Where`` is a position in a document: the file and the path of keys and indices down to a value
(``plan.json: steps[3].partition``). ``Fields`` wraps one JSON object at its position and reads
its fields by kind (a string, a count, a list of strings, a list or a map of records, ...); a
missing or ill-typed field raises ``ArtifactError`` saying where it is and what was expected, so
a damaged or rewritten file never ends in a raw ``KeyError`` or ``TypeError`` further on.
``runtime/plan_schema.py`` reads plan.json with it; ``optional_json`` is the writing side of
``Fields.record`` / ``records`` (an optional field is left out when it is not set).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from typing import TypeVar

from runtime.errors import ArtifactError

__all__ = ["Where", "Fields", "is_count", "optional_json"]

T = TypeVar("T")


@dataclass(frozen=True)
class Where:
    """Where a JSON value sits: the file and the path of keys and indices down to it."""

    file: str = "plan.json"
    path: str = ""

    def key(self, name: str) -> Where:
        return Where(self.file, f"{self.path}.{name}" if self.path else name)

    def item(self, index: int | str) -> Where:
        return Where(self.file, f"{self.path}[{index!r}]" if isinstance(index, str) else
                     f"{self.path}[{index}]")

    def error(self, message: str) -> ArtifactError:
        return ArtifactError(f"{self.file}: {self.path} {message}" if self.path else
                             f"{self.file}: {message}")

    def wrong(self, wants: str, got: Any) -> ArtifactError:
        text = repr(got)
        return self.error(f"must be {wants}, got {text if len(text) <= 80 else text[:77] + '...'}")


def is_count(value: Any) -> bool:
    """An integer >= 0 (and not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Fields:
    """One JSON object at ``where``, read field by field."""

    data: Mapping[str, Any]
    where: Where

    @classmethod
    def of(cls, data: Any, where: Where) -> Fields:
        if not isinstance(data, dict):
            raise where.wrong("an object", data)
        return cls(data, where)

    def at(self, key: str) -> Where:
        return self.where.key(key)

    def has(self, key: str) -> bool:
        """The field is there and not null."""
        return self.data.get(key) is not None

    def raw(self, key: str) -> Any:
        if key not in self.data:
            raise self.at(key).error("is missing")
        return self.data[key]

    def text(self, key: str) -> str:
        value = self.raw(key)
        if not isinstance(value, str):
            raise self.at(key).wrong("a string", value)
        return value

    def name(self, key: str, what: str) -> str:
        """A string that must not be empty: it names ``what``."""
        value = self.text(key)
        if not value:
            raise self.at(key).error(f"is empty: it must name {what}")
        return value

    def optional_text(self, key: str) -> str | None:
        return self.text(key) if self.has(key) else None

    def count(self, key: str, *, positive: bool = False) -> int:
        value = self.raw(key)
        if not is_count(value) or (positive and value == 0):
            raise self.at(key).wrong("a positive integer" if positive else "an integer >= 0", value)
        return int(value)

    def texts(self, key: str) -> tuple[str, ...]:
        value = self.raw(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.at(key).wrong("a list of strings", value)
        return tuple(value)

    def array(self, key: str) -> list[Any]:
        value = self.raw(key)
        if not isinstance(value, list):
            raise self.at(key).wrong("a list", value)
        return value

    def obj(self, key: str) -> Fields:
        return Fields.of(self.raw(key), self.at(key))

    def records(self, key: str, read: Callable[[Any, Where], T]) -> tuple[T, ...]:
        """A list of records, each read with ``read(item, its position)``."""
        at = self.at(key)
        return tuple(read(item, at.item(k)) for k, item in enumerate(self.array(key)))

    def record(self, key: str, read: Callable[[Any, Where], T]) -> T | None:
        """An optional record (absent or null: None), read with ``read``."""
        return read(self.data[key], self.at(key)) if self.has(key) else None

    def mapping(self, key: str, read: Callable[[str, Any, Where], T]) -> dict[str, T]:
        """An object of name -> record, each read with ``read(name, item, its position)``, in order."""
        items = self.obj(key)
        return {name: read(name, item, items.where.item(name)) for name, item in items.data.items()}


def optional_json(**fields: Any) -> dict[str, Any]:
    """The JSON entries of a record's optional fields, in the order given: a field that is None is
    left out, a record (a value with ``to_json``) is written by it, a tuple of records as a list."""
    out = {}
    for key, value in fields.items():
        if isinstance(value, tuple):
            out[key] = [item.to_json() for item in value]
        elif value is not None:
            out[key] = value.to_json() if hasattr(value, "to_json") else value
    return out
