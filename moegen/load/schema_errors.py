"""Pydantic's schema errors as located, human messages with did-you-mean hints."""

from __future__ import annotations

import dataclasses
import difflib
import heapq
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from moegen.diagnostics import MAX_REPORTED, Diagnostic
from moegen.load.source import FieldPath, Locations, SpecSource, dotted
from moegen.load.yaml_limits import shown
from moegen.spec import UNSUPPORTED_CHOICES, Spec

# pydantic's names for the members of the `X | Literal["auto"]` unions of the spec
_AUTO_TAG = "literal['auto']"
_UNION_TAGS = {"constrained-int", "Tiles", _AUTO_TAG}
# the tags of unions whose member is chosen by the value's type (moegen.spec_parallelism)
_CHOSEN_TAGS = {"placement-inline", "placement-file"}
_DID_YOU_MEAN_CUTOFF = 0.8  # close enough to be a typo, not a different (unsupported) choice
# Spellings other tools use for the values moegen names differently.
_COMMON_SPELLINGS = {
    "bf16": "bfloat16", "fp32": "float32", "f32": "float32", "float": "float32",
    "v5e": "tpu-v5e", "tpu-v5lite": "tpu-v5e", "v5litepod": "tpu-v5e", "v5p": "tpu-v5p",
    "v6e": "tpu-v6e", "trillium": "tpu-v6e", "v7x": "tpu7x", "tpu-v7x": "tpu7x",
    "tpu-v7": "tpu7x", "ironwood": "tpu7x",
    "a100": "gpu-a100", "h100": "gpu-h100", "h200": "gpu-h200", "b200": "gpu-b200",
    "float8": "fp8", "mx_fp8": "mxfp8",
}  # fmt: skip


def schema_diagnostics(
    err: ValidationError, source: SpecSource, locations: Locations, *, hint_all: bool = False
) -> list[Diagnostic]:
    """Every schema error of `err`, located. SpecError shows the first MAX_REPORTED of them in
    file order and only counts the rest, so an unknown key's hint (a did-you-mean, or the keys
    expected), which costs a difflib search per key, is given to those it will show only (the
    rest say "unknown key 'x'"), unless `hint_all`: 6,500 unknown keys (64 KiB) took 0.4 s
    of hints."""
    out = []
    # The keys written in each mapping, once: asking per unknown key was quadratic (5,000
    # unknown keys took 13 s).
    written: dict[FieldPath, set] = {}
    for key in locations.keys:
        written.setdefault(key[:-1], set()).add(key[-1])
    hints: dict[int, tuple[str, FieldPath, str]] = {}  # index in out -> (key, mapping, suffix)
    for error in err.errors(include_url=False):
        loc: FieldPath = tuple(error["loc"])
        # A field that also takes `auto` fails once per alternative: report the value's own
        # problem once, at the field, and say that auto would do too.
        if _AUTO_TAG in loc:
            continue
        or_auto = bool(loc) and loc[-1] in _UNION_TAGS  # the value itself is wrong
        suffix = " (or auto, for `moegen tune` to choose)" if or_auto else ""
        loc = tuple(part for part in loc if part not in _UNION_TAGS | _CHOSEN_TAGS)
        at_key = False
        if loc and loc[-1] == "[key]":  # a bad key of a free-form mapping (mesh.axes)
            loc, at_key = (*loc[:-2], loc[-2]), True
        kind = error["type"]
        if kind == "missing":
            field, (line, col) = loc[:-1], locations.of_value(loc[:-1])
            message = f"required key '{loc[-1]}' is missing"
        elif kind == "extra_forbidden":
            field, (line, col) = loc[:-1], locations.of_key(loc)
            hints[len(out)] = (str(loc[-1]), loc[:-1], suffix)
            message = f"unknown key {shown(str(loc[-1]))}"
        else:
            field = loc
            line, col = locations.of_key(loc) if at_key else locations.of_value(loc)
            message = _value_message(error)
        out.append(Diagnostic(source.display, line, col, dotted(field), message + suffix))
    for index in hints if hint_all else _shown_by_spec_error(out):
        if index in hints:
            key, mapping, suffix = hints[index]
            message = _unknown_key_message(key, _model_at(mapping), written.get(mapping, set()))
            out[index] = dataclasses.replace(out[index], message=message + suffix)
    return out


def _shown_by_spec_error(diagnostics: list[Diagnostic]) -> list[int]:
    """The indices of the diagnostics SpecError shows whole: it sorts them in file order (a
    stable sort: ties keep their order, as here) and keeps the first MAX_REPORTED, and one
    more (whole if it is the last one, else only where it stands)."""

    def file_order(index: int) -> tuple[str, int, int, str]:
        found = diagnostics[index]
        return found.file, found.line, found.column, found.field

    return heapq.nsmallest(MAX_REPORTED + 1, range(len(diagnostics)), key=file_order)


def _model_at(path: FieldPath) -> type[BaseModel] | None:
    model: Any = Spec
    for part in path:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        section = _section_of(field.annotation) if field else None
        if section is None:
            return None
        model = section
    return model


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: `Section`, or the section of an optional `Section | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    sections = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return sections[0] if len(sections) == 1 else None


def _unknown_key_message(key: str, model: type[BaseModel] | None, written: set) -> str:
    # A key the mapping already has is no fix: suggesting it would make a duplicate, and
    # suggesting the next closest one instead would point away from what was meant.
    fields = list(model.model_fields) if model else []
    message = f"unknown key {shown(key)}"
    close = _suggest(key, fields)
    if close and close[0] not in written:
        return f"{message}; did you mean '{close[0]}'?"
    if fields:
        return f"{message}; expected one of: {', '.join(fields)}"
    return message


def choice_message(
    value: Any,
    options: list[str],
    *,
    spellings: Mapping[str, str] = MappingProxyType({}),
    expected: str = "",
) -> str:
    """ "must be 'a', 'b' or 'c', got 'x'", with the option `value` was probably meant to be
    (`spellings`: other tools' names for the options, beside the common ones)."""
    expected = expected or _one_of(options)
    message = f"must be {expected}, got {describe(value)}"
    close = _suggest(value, options, spellings) if isinstance(value, str) else []
    return f"{message}; did you mean '{close[0]}'?" if close and close[0] != value else message


def _one_of(options: list[str]) -> str:
    quoted = [f"'{option}'" for option in options]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _suggest(
    written: str, options: list[str], spellings: Mapping[str, str] = MappingProxyType({})
) -> list[str]:
    """The option `written` was probably meant to be: a known other spelling, a close typo,
    the same letters swapped, or a longer name that contains it ('experts' -> 'num_experts')."""
    for known in (spellings, _COMMON_SPELLINGS):
        if known.get(written) in options:
            return [known[written]]
    close = difflib.get_close_matches(written, options, n=1, cutoff=_DID_YOU_MEAN_CUTOFF)
    if close:
        return close
    swapped = [o for o in options if sorted(o) == sorted(written)]
    containing = [o for o in options if len(written) >= 4 and written in o]
    return (swapped or containing)[:1]


def describe(value: Any) -> str:
    """A YAML-flavoured description of a user value for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return shown(value) if isinstance(value, str) else shown(repr(value), quoted=False)


def _number(bound: Any) -> str:
    """A bound as a user writes it: 0 and 1000000, not 0.0 and 1000000.0."""
    if isinstance(bound, float) and bound.is_integer():
        return str(int(bound))
    return str(bound)


def _value_message(error: Any) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    got = describe(value)
    simple = {
        "greater_than": lambda: f"must be > {_number(ctx.get('gt'))}, got {got}",
        "greater_than_equal": lambda: f"must be >= {_number(ctx.get('ge'))}, got {got}",
        "less_than_equal": lambda: f"must be <= {_number(ctx.get('le'))}, got {got}",
        "int_type": lambda: f"must be an integer, got {got}",
        "float_type": lambda: f"must be a number, got {got}",
        "finite_number": lambda: f"must be a finite number, got {got}",
        "bool_type": lambda: f"must be true or false, got {got}",
        "string_type": lambda: f"must be a string, got {got}",
        "dict_type": lambda: f"must be a mapping, got {got}",
        "model_type": lambda: f"must be a mapping, got {got}",
        "list_type": lambda: f"must be a list, got {got}",
        "too_short": lambda: (
            "must not be empty"
            if ctx.get("min_length") == 1
            else f"must have at least {ctx.get('min_length')} entries"
        ),
        "string_too_long": lambda: f"must be at most {ctx.get('max_length')} characters",
        # the one pattern of the spec: a placement file's name
        "string_pattern_mismatch": lambda: (
            "must name a .json file beside the spec (letters, "
            f"digits, '_', '.', '-'; no directory), got {got}"
        ),
    }
    if kind in simple:
        return simple[kind]()
    if kind == "value_error":
        return f"{ctx.get('error', error['msg'])!s}, got {got}"
    if kind == "literal_error":
        expected = ctx.get("expected", "")
        options = [part.strip(" '") for part in expected.replace(" or ", ",").split(",")]
        refused = isinstance(value, str) and UNSUPPORTED_CHOICES.get((error["loc"], value))
        if refused:
            return f"must be {expected}, got {got}: {refused}"
        return choice_message(value, options, expected=expected)
    return f"{error['msg'][0].lower()}{error['msg'][1:]}, got {got}"
