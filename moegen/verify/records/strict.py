"""Steps read back from disk, strictly: every key known, every value of its field's type.

`messages.decode` is lenient on purpose (a worker of another moegen version may add keys);
what comes back from the cache gets no such benefit of the doubt. `strict_step` checks the
JSON of one step against the fields of the class its name selects, recursively through the
nested messages (cases, memory, collectives): unknown or missing keys, a bool where a number
belongs, a string for a figure, a negative count, a float that is not finite: each is a
`BadRecord` that says where.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from moegen.verify.messages import (
    Memory,
    MemoryVerdict,
    Message,
    RecordIgnored,
    Reused,
    Step,
    as_step,
)

# No figure of a compiled program (bytes, FLOPs, seconds, counts) comes near 2**63; a record
# holding one larger was not written by a worker.
MAX_FIGURE = 2**63 - 1
_DERIVED = {Memory: {"peak"}}  # keys to_json adds beside the fields (checked against them)
_PARENT_ONLY = (
    Reused,
    MemoryVerdict,
    RecordIgnored,
)  # written by moegen itself, never by the worker


class BadRecord(ValueError):
    """A recorded step that is not what a worker of this moegen reports."""


def strict_step(data: Any) -> Step:
    """The step `data` holds, or BadRecord saying why it cannot be one."""
    if not isinstance(data, dict) or not isinstance(data.get("step"), str):
        raise BadRecord("a step that is not an object with a name")
    try:
        step = as_step(data)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise BadRecord(str(err)) from None
    if isinstance(step, _PARENT_ONLY):
        raise BadRecord(f"step {step.step!r} is not a worker's")
    _check_message(type(step), data, step.step)
    return step


def _check_message(cls: type[Message], data: Any, where: str) -> None:
    if not isinstance(data, Mapping):
        raise BadRecord(f"{where}: not an object")
    hints = _hints(cls)
    keys = {cls.renamed.get(name, name): name for name in hints}
    unknown = set(data) - set(keys) - _DERIVED.get(cls, set())
    if unknown:
        raise BadRecord(f"{where}: unknown keys {sorted(unknown)}")
    for key, name in keys.items():
        if key in data:
            _check_value(data[key], hints[name], f"{where}.{key}")
        elif _required(cls, name):
            raise BadRecord(f"{where}: {key} missing")
    if cls is Memory and data.get("peak") != Memory.from_json(data).peak:
        raise BadRecord(f"{where}: peak is not arguments + outputs + temporaries - aliased")


@functools.cache
def _hints(cls: type[Message]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {name: hint for name, hint in typing.get_type_hints(cls).items() if name in names}


def _required(cls: type[Message], name: str) -> bool:
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    missing = dataclasses.MISSING
    return field.default is missing and field.default_factory is missing


def _check_value(value: Any, hint: Any, where: str) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return
        [hint] = [a for a in args if a is not type(None)]
        return _check_value(value, hint, where)
    if origin is tuple:  # tuple[X, ...]: a JSON list
        if not isinstance(value, list):
            raise BadRecord(f"{where}: not a list")
        for i, item in enumerate(value):
            _check_value(item, args[0], f"{where}[{i}]")
    elif origin is dict:
        if not isinstance(value, dict):
            raise BadRecord(f"{where}: not an object")
        for key, item in value.items():
            _check_value(item, args[1], f"{where}.{key}")
    elif isinstance(hint, type) and issubclass(hint, Message):
        _check_message(hint, value, where)
    elif hint is str:
        if not isinstance(value, str):
            raise BadRecord(f"{where}: not a string")
    elif hint is int:
        if type(value) is not int or not 0 <= value <= MAX_FIGURE:
            raise BadRecord(f"{where}: not a count")
    elif hint is float:
        # an int past float's range would overflow the figures' arithmetic: bounded first
        number = type(value) in (int, float) and -MAX_FIGURE <= value <= MAX_FIGURE
        if not number or not math.isfinite(value) or value < 0:
            raise BadRecord(f"{where}: not a finite non-negative number")
    elif hint is not Any:
        raise BadRecord(f"{where}: of a type records never hold")
