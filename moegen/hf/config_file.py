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
from pathlib import Path
from typing import Any

CONFIG_NAME = "config.json"
MAX_BYTES = 4 * 1024 * 1024  # published configs are a few KiB; a bigger one is not a config
MAX_SIZE = 2**31 - 1  # a spec's sizes are int32 (moegen.spec_placement.INT32_MAX)
MAX_LAYERS = 100_000  # decoder layers: a list is built per layer
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
    try:
        data = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as err:
        raise HfConfigError(f"{path}:{err.lineno}:{err.colno}: not JSON: {err.msg}") from None
    except ValueError as err:  # the constants refused below
        raise HfConfigError(f"{path}: {err}") from None
    except RecursionError:
        raise HfConfigError(f"{path}: nested too deeply to be a model config") from None
    if not isinstance(data, dict):
        raise HfConfigError(f"{path}: holds a JSON {type(data).__name__}, not an object")
    return data


def _no_constants(name: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON does not have
    raise ValueError(f"{name} is not a JSON number")


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
        table = self.data.get("per_layer_config")
        if not isinstance(table, Mapping):
            return MISSING
        for index, overrides in table.items():
            if isinstance(overrides, Mapping) and index.isdigit() and int(index) == layer:
                return overrides.get(key, MISSING)
        return MISSING

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
            raise self.fail(key, f"must be an integer from {low} to {MAX_SIZE}, not {value!r}")
        return value

    def number(self, key: str, value: Any) -> float:
        if type(value) not in (int, float) or not math.isfinite(value) or abs(value) > 1e6:
            raise self.fail(key, f"must be a number of magnitude at most 1e6, not {value!r}")
        return float(value)

    def flag(self, key: str, value: Any) -> bool:
        if type(value) is not bool:
            raise self.fail(key, f"must be true or false, not {value!r}")
        return value

    def text(self, key: str, value: Any) -> str:
        if type(value) is not str or len(value) > 200:
            raise self.fail(key, f"must be a short string, not {_short(value)}")
        return value

    def int_list(self, key: str, value: Any, *, zero: bool = True) -> list[int]:
        if type(value) is not list or len(value) > MAX_LAYERS:
            raise self.fail(key, f"must be a list of at most {MAX_LAYERS} integers")
        return [self.size(f"{key}[{i}]", item, zero=zero) for i, item in enumerate(value)]

    def text_list(self, key: str, value: Any) -> list[str]:
        if type(value) is not list or len(value) > MAX_LAYERS:
            raise self.fail(key, f"must be a list of at most {MAX_LAYERS} strings")
        return [self.text(f"{key}[{i}]", item) for i, item in enumerate(value)]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
