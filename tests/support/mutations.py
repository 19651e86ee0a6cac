"""Seeded mutations of the example specs: hostile and near-valid inputs for the loader,
the validator, the plan and the renderer.

Two families, mixed: structural mutations (the spec parsed, one or more fields replaced,
removed, renamed, added or swapped, then dumped back) explore the valid spec space and its
edges, with the alternatives the JSON Schema names for each field; textual mutations (bytes
deleted, inserted, duplicated, truncated; YAML tags, anchors, control characters, line
separators, tabs) explore what a parser sees. The same seed gives the same inputs.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from moegen.spec import Spec

REPO_ROOT = Path(__file__).resolve().parents[2]
BASES = {
    path.stem: path.read_text(encoding="utf-8") for path in sorted(REPO_ROOT.glob("specs/*.yaml"))
}

# Values tried in place of any field: wrong types, edges of integer ranges, hostile text.
ODD_VALUES: list[Any] = [
    0, -1, 1, 2, 3, 7, 64, 127, 128, 1000, 4096, 2**31 - 1, 2**31, 2**63, 10**40,
    0.5, -0.0, 1e308, float("inf"), float("nan"), True, False, None, "", "auto", "8",
    "x" * 600, "\u202e", "a\u2028b", "{{ p }}", "'); import os #", [], [1, 2], {}, {"a": 1},
    [[[[1]]]], "bf16", "tpu-v5e", "expert", "data",
]  # fmt: skip
TEXT_INSERTS = [
    "!!int ", "!!str ", "!!bool ", "!!null ", "!!float ", "!!binary ", "!foo ", "&a ", "*a",
    "<<: *a\n", "\t", "\x00", "\x1b[2J", "\u2028", "\u2029", "\x85", "\ufeff", "\r", "\r\n",
    "---\n", "...\n", "? ", ": ", "- ", "[", "]", "{", "}", "'", '"', "#", "%YAML 1.1\n",
    "9" * 5000, "[" * 400, "\u0668", " ", "\n", "\\", "\U0001f600",
]  # fmt: skip


def _schema_alternatives() -> dict[tuple[str, ...], list[Any]]:
    """Field path -> the values the JSON Schema names for it (enums, consts, booleans)."""
    schema = Spec.model_json_schema()
    defs = schema.get("$defs", {})
    out: dict[tuple[str, ...], list[Any]] = {}

    def walk(node: dict[str, Any], path: tuple[str, ...], depth: int) -> None:
        if depth > 6:
            return
        if "$ref" in node:
            walk(defs[node["$ref"].rsplit("/", 1)[-1]], path, depth + 1)
            return
        found: list[Any] = []
        for option in node.get("anyOf", []) + node.get("oneOf", []):
            if "$ref" in option:
                walk(option, path, depth + 1)
            found.extend(option.get("enum", []))
            if "const" in option:
                found.append(option["const"])
            if option.get("type") == "null":
                found.append(None)
        found.extend(node.get("enum", []))
        if node.get("type") == "boolean":
            found.extend([True, False])
        if found:
            out[path] = found
        for name, child in node.get("properties", {}).items():
            walk(child, (*path, name), depth + 1)

    walk(schema, (), 0)
    return out


ALTERNATIVES = _schema_alternatives()
KNOWN_PATHS = sorted(ALTERNATIVES)


def _leaves(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*path, key)
            yield from _leaves(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield (*path, i)
            yield from _leaves(value, (*path, i))


def _get_parent(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data


def _set_path(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = data
    for part in path[:-1]:
        if not isinstance(node, dict):
            return
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return
    if isinstance(node, dict):
        node[path[-1]] = value


def _structural(rng: random.Random, data: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        leaves = list(_leaves(data))
        kind = rng.choice(
            ["alternative", "alternative", "odd", "scale", "delete", "rename", "add", "swap"]
        )
        if kind == "alternative":  # the valid space: a value the schema offers for the field
            path = rng.choice(KNOWN_PATHS)
            _set_path(data, path, rng.choice(ALTERNATIVES[path]))
            continue
        if not leaves:
            break
        path = rng.choice(leaves)
        parent = _get_parent(data, path)
        if kind == "odd":
            parent[path[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))
        elif (
            kind == "scale"
            and isinstance(parent[path[-1]], int)
            and not isinstance(parent[path[-1]], bool)
        ):
            parent[path[-1]] = max(
                0, parent[path[-1]] * rng.choice([2, 3, 4, 8, 1024]) // rng.choice([1, 2, 3, 4])
            )
        elif kind == "delete":
            del parent[path[-1]]
        elif kind == "rename" and isinstance(parent, dict):
            key = path[-1]
            value = parent.pop(key)
            parent[rng.choice([key + "s", key[:-1], key.upper(), f"x_{key}", "auto"])] = value
        elif kind == "add" and isinstance(parent, dict):
            parent[rng.choice(["extra", "num_expert", "topk", "mesh", "1", "__class__"])] = (
                rng.choice(ODD_VALUES)
            )
        elif kind == "swap" and len(leaves) > 1:
            other = rng.choice(leaves)
            other_parent = _get_parent(data, other)
            try:
                parent[path[-1]], other_parent[other[-1]] = (
                    copy.deepcopy(other_parent[other[-1]]),
                    copy.deepcopy(parent[path[-1]]),
                )
            except (KeyError, IndexError, TypeError):
                pass
    return data


def _textual(rng: random.Random, text: str) -> str:
    for _ in range(rng.choice([1, 1, 2, 4])):
        lines = text.splitlines(keepends=True) or [""]
        kind = rng.choice(
            ["insert", "insert", "delete_line", "dup_line", "truncate", "flip", "indent"]
        )
        pos = rng.randrange(len(text) + 1)
        if kind == "insert":
            text = text[:pos] + rng.choice(TEXT_INSERTS) + text[pos:]
        elif kind == "delete_line":
            del lines[rng.randrange(len(lines))]
            text = "".join(lines)
        elif kind == "dup_line":
            i = rng.randrange(len(lines))
            lines.insert(i, lines[i])
            text = "".join(lines)
        elif kind == "truncate":
            text = text[:pos]
        elif kind == "flip" and text:
            i = rng.randrange(len(text))
            text = (
                text[:i]
                + chr(rng.choice([0x20, 0x30, 0x3A, 0x7F, 0xA0, 0x2028, ord(text[i]) ^ 1]))
                + text[i + 1 :]
            )
        elif kind == "indent":
            i = rng.randrange(len(lines))
            lines[i] = rng.choice([" ", "  ", "\t", ""]) + lines[i].lstrip(" ")
            text = "".join(lines)
    return text


def mutated_specs(seed: int, count: int) -> Iterator[tuple[str, bytes]]:
    """`count` (label, spec bytes) pairs for `seed`: about two thirds structural."""
    rng = random.Random(seed)
    names = sorted(BASES)
    for i in range(count):
        base = rng.choice(names)
        text = BASES[base]
        if rng.random() < 0.65:
            data = _structural(rng, yaml.safe_load(text))
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=rng.random() < 0.5)
            if rng.random() < 0.2:
                text = _textual(rng, text)
            label = f"{seed}-{i}-{base}-structural"
        else:
            text = _textual(rng, text)
            label = f"{seed}-{i}-{base}-textual"
        encoded = text.encode("utf-8", errors="surrogatepass")
        if rng.random() < 0.03:  # bytes that are not UTF-8
            cut = rng.randrange(len(encoded) + 1)
            encoded = (
                encoded[:cut] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80"]) + encoded[cut:]
            )
        yield label, encoded
