"""Reading a transformers `config.json` that nobody vouched for: every failure is an
HfConfigError that names the file and the key (or the line and column of bad JSON).

`ConfigView` is the part of the file that describes the text model: the file itself, or its
`text_config` when the family keeps the MoE there (multimodal configs). Its getters check
each value's type, since JSON allows anything anywhere (`true` is not a count, 1e309 is not a
width) and a bool is an int to Python.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

CONFIG_NAME = "config.json"
MAX_BYTES = 4 * 1024 * 1024  # published configs are a few KiB; a bigger one is not a config
MAX_SIZE = 2**31 - 1  # a spec's sizes are int32 (moegen.spec_placement.INT32_MAX)
# Decoder layers moegen reads one at a time (a per-layer list, per_layer_config, a list of
# layer types): real models have under 200 (DeepSeek-V3 61, Llama 3.1 405B 126), so 10,000 is
# 50 times the deepest while each layer's rules (about 40 us) stay under half a second in all.
# A rule over a layer count (first k dense, every n-th) has no bound but MAX_SIZE: it is
# arithmetic (moegen.families.layer_set).
MAX_LAYERS = 10_000
# Digits of a JSON integer: 2**64 has 20, so no count, width or token id needs 100; a longer
# one is refused before int() spends quadratic time on it, or raises past Python's own limit.
MAX_INT_DIGITS = 100
MISSING: Any = object()


class HfConfigError(Exception):
    """A config.json moegen cannot map; the message names the file and what is wrong."""


def config_file(path: Path) -> Path:
    """PATH itself, or PATH/config.json when PATH is a folder."""
    if path.is_dir():
        inside = path / CONFIG_NAME
        if not inside.is_file():
            raise HfConfigError(f"{path} is a folder without a {CONFIG_NAME}")
        return inside
    if not path.exists():
        raise HfConfigError(f"{path}: no such file or folder")
    if not path.is_file():
        raise HfConfigError(f"{path} is not a file")
    return path


def read_json(path: Path) -> dict[str, Any]:
    """The file's top-level JSON object; HfConfigError for anything else."""
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_BYTES + 1)
    except OSError as err:
        raise HfConfigError(f"{path}: cannot read it: {err.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise HfConfigError(f"{path}: over {MAX_BYTES // 1024 // 1024} MiB, not a model config")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise HfConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None
    refused: list[_Refused] = []
    try:
        data = json.loads(
            text,
            parse_constant=_no_constants,
            parse_int=lambda digits: _integer(digits, refused),
            object_pairs_hook=lambda pairs: _unique(pairs, refused),
        )
    except json.JSONDecodeError as err:
        raise HfConfigError(f"{path}:{err.lineno}:{err.colno}: not JSON: {err.msg}") from None
    except ValueError as err:  # the constants refused below
        raise HfConfigError(f"{path}: {err}") from None
    except RecursionError:
        raise HfConfigError(f"{path}: nested too deeply to be a model config") from None
    if refused:  # the first in the file, named by its key (none: the file is that value)
        key, why = _first_refused(data)
        raise HfConfigError(f"{path}: {key}: {why}" if key else f"{path}: {why}")
    if not isinstance(data, dict):
        raise HfConfigError(f"{path}: holds a JSON {type(data).__name__}, not an object")
    return data


def _no_constants(name: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON does not have
    raise ValueError(f"{name} is not a JSON number")


class _Refused:
    """A value read_json refuses, left where it stands in the parsed tree, so that the walk
    after parsing can name its key (a parse hook sees the value, not where it is). `key`: a
    duplicate key of the object that stands here."""

    def __init__(self, why: str, key: str = "") -> None:
        self.why, self.key = why, key


def _integer(digits: str, refused: list[_Refused]) -> Any:
    if len(digits.lstrip("-")) <= MAX_INT_DIGITS:
        return int(digits)
    refused.append(
        _Refused(
            f"an integer of {len(digits.lstrip('-'))} digits, over "
            f"{MAX_INT_DIGITS}: not a value of a model config"
        )
    )
    return refused[-1]


def _unique(pairs: list[tuple[str, Any]], refused: list[_Refused]) -> Any:
    """The object, unless a key repeats: Python keeps the last value, transformers too, but a
    file that says two things of one key has no single meaning to map."""
    found = dict(pairs)
    if len(found) == len(pairs):
        return found
    seen: set[str] = set()
    for key, _ in pairs:  # the first key given again
        if key in seen:
            break
        seen.add(key)
    count = sum(1 for k, _ in pairs if k == key)
    refused.append(_Refused(f"given {count} times in one object: keys must be unique", key))
    return refused[-1]


def _first_refused(data: Any) -> tuple[str, str]:
    """(dotted key, why) of the first refused value in document order: a walk with its own
    stack (the tree is as deep as the parser allowed)."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, _Refused):
            key = f"{where}.{value.key}" if where and value.key else where or value.key
            return key, value.why
        if isinstance(value, dict):
            items = [(f"{where}.{k}" if where else k, v) for k, v in value.items()]
        elif isinstance(value, list):
            items = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
        else:
            continue
        stack.extend(reversed(items))
    raise AssertionError("a refused value the walk did not find")


@dataclass(frozen=True)
class ConfigView:
    """The keys of one config object, `prefix` naming where it sits in the file."""

    file: Path
    data: Mapping[str, Any]
    prefix: str = ""  # "" or "text_config."

    def where(self, key: str) -> str:
        return f"{self.file}: {self.prefix}{key}"

    def has(self, key: str) -> bool:
        return self.raw(key) is not MISSING

    def raw(self, key: str) -> Any:
        """The value at a dotted key (dbrx's ffn_config.moe_top_k), MISSING when absent; a
        part may index a list (ERNIE-4.5-VL's moe_intermediate_size[0], the text experts')."""
        value: Any = self.data
        for part in key.split("."):
            name, _, index = part.partition("[")
            if not isinstance(value, Mapping) or name not in value:
                return MISSING
            value = value[name]
            if index:
                position = int(index.rstrip("]"))
                if type(value) is not list or position >= len(value):
                    return MISSING
                value = value[position]
        return value

    def layer_override(self, key: str, layer: int) -> Any:
        """transformers' per_layer_config (a heterogeneous config): {layer index, written
        zero-padded: {attribute: value}} overrides the key for that layer; MISSING if not."""
        overrides = self.overrides.get(layer)
        return MISSING if overrides is None else overrides.get(key, MISSING)

    @cached_property
    def overrides(self) -> dict[int, Mapping[str, Any]]:
        """per_layer_config by layer index (the first entry of an index, as written twice
        zero-padded differently): indexed once, not searched at every key of every layer.
        An index of over 10 digits (leading zeros aside) is no layer's (they are int32), nor
        is one of other digits ("²"): int() of either would raise, not skip it."""
        table = self.data.get("per_layer_config")
        found: dict[int, Mapping[str, Any]] = {}
        for index, overrides in table.items() if isinstance(table, Mapping) else ():
            digits = index.lstrip("0") or "0"
            if isinstance(overrides, Mapping) and index.isascii() and index.isdigit():
                if len(digits) <= 10:
                    found.setdefault(int(digits), overrides)
        return found

    def first_key(self, keys: tuple[str, ...]) -> str | None:
        return next((key for key in keys if self.has(key)), None)

    def fail(self, key: str, message: str) -> HfConfigError:
        return HfConfigError(f"{self.where(key)}: {message}")

    def size(self, key: str, value: Any, *, zero: bool = False) -> int:
        """A count or width: an integer in [1, 2**31) ([0, ...) with zero)."""
        low = 0 if zero else 1
        if type(value) is float and value.is_integer():
            value = int(value)  # some configs write 4096.0
        if type(value) is not int or not low <= value <= MAX_SIZE:
            raise self.fail(key, f"must be an integer from {low} to {MAX_SIZE}, not {short(value)}")
        return value

    def number(self, key: str, value: Any) -> float:
        if type(value) not in (int, float) or not math.isfinite(value) or abs(value) > 1e6:
            raise self.fail(key, f"must be a number of magnitude at most 1e6, not {short(value)}")
        return float(value)

    def flag(self, key: str, value: Any) -> bool:
        if type(value) is not bool:
            raise self.fail(key, f"must be true or false, not {short(value)}")
        return value

    def text(self, key: str, value: Any) -> str:
        if type(value) is not str or len(value) > 200:
            raise self.fail(key, f"must be a short string, not {short(value)}")
        return value

    def int_list(self, key: str, value: Any, *, zero: bool = True) -> list[int]:
        if type(value) is not list or len(value) > MAX_LAYERS:
            raise self.fail(key, f"must be a list of at most {MAX_LAYERS} integers")
        return [self.size(f"{key}[{i}]", item, zero=zero) for i, item in enumerate(value)]

    def text_list(self, key: str, value: Any) -> list[str]:
        if type(value) is not list or len(value) > MAX_LAYERS:
            raise self.fail(key, f"must be a list of at most {MAX_LAYERS} strings")
        return [self.text(f"{key}[{i}]", item) for i, item in enumerate(value)]


def short(value: Any) -> str:
    """repr(value), cut to 60 characters: a message quotes a value from the file, which may
    be a list of a million entries."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
