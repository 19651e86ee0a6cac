"""One spec builder for the tests: a flat dict of choices -> the YAML text of a spec.

Each choice names one field of the schema (`moegen/spec.py`) by a short key (FIELDS below);
a choice left out is not written, so the schema's default applies. Sections and fields come
out in the schema's order, one field per line (lists in flow style), so the text, and the
line and column of every diagnostic about it, depend on the choices alone:

    spec_yaml({"experts": 8, "embed": 64, "ffn": 128, "top_k": 2, "batch": 8, "seq_len": 16,
               "axes": {"data": 2, "fsdp": 2}})

Nested choices are dicts or tuples: `axes` / `dcn_axes` are {axis: size} in mesh order
(major to minor), `group_limit` is (groups, keep), `capacity` is (factor, drop), `tiles` is
"auto" or {"gate_up": [rows, contraction, output], "down": [...]}, `variants` is
{name: {"batch": B, "seq_len": S}} (shapes.variants, written in block style).

`spec_positions(choices)` says where that text holds each field, by the dotted name the
diagnostics use ("router.top_k", "mesh.axes.expert", "mesh.batch_axes[1]"): the line and
column of its key and of its value, counted while the text is written, so that a test can
check the loader's positions against them instead of against numbers typed by hand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from moegen.diagnostics import SpecError
from moegen.load import LoadedSpec, load_spec_bytes
from moegen.validate import validate

# choice -> (section, field); the order is the schema's (Spec, then each section's fields)
FIELDS: dict[str, tuple[str, ...]] = {
    "version": ("version",),
    "description": ("description",),
    "experts": ("layer", "num_experts"),
    "embed": ("layer", "embed_dim"),
    "ffn": ("layer", "ffn_dim"),
    "activation": ("layer", "activation"),
    "glu": ("layer", "glu"),
    "shared_glu": ("layer", "shared_glu"),
    "ffn_bias": ("layer", "ffn_bias"),
    "shared_ffn": ("layer", "shared_ffn_dim"),
    "shared_expert_gate": ("layer", "shared_expert_gate"),
    "shared_ffn_bias": ("layer", "shared_ffn_bias"),
    "latent": ("layer", "latent_dim"),
    "latent_bias": ("layer", "latent_bias"),
    "top_k": ("router", "top_k"),
    "score": ("router", "score"),
    "score_after_top_k": ("router", "score_after_top_k"),
    "linear_bias": ("router", "linear_bias"),
    "logit_softcap": ("router", "logit_softcap"),
    "input_norm_eps": ("router", "input_norm_eps"),
    "per_expert_scale": ("router", "per_expert_scale"),
    "expert_input_norm_eps": ("layer", "expert_input_norm_eps"),
    "output_norm_eps": ("layer", "output_norm_eps"),
    "expert_output_norm_eps": ("layer", "expert_output_norm_eps"),
    "shared_output_norm_eps": ("layer", "shared_output_norm_eps"),
    "gelu_approximation": ("layer", "gelu_approximation"),
    "renormalize": ("router", "renormalize"),
    "renormalize_epsilon": ("router", "renormalize_epsilon"),
    "routing_bias_on": ("router", "routing_bias_on"),
    "routed_scaling": ("router", "routed_scaling"),
    "group_limit": ("router", "group_limit"),
    "identity_experts": ("router", "identity_experts"),
    "zero_experts": ("router", "zero_experts"),
    "weighs_shared_experts": ("router", "weighs_shared_experts"),
    "learned_scale": ("router", "learned_scale"),
    "shared_experts": ("layer", "shared_experts"),
    "routing_bias": ("router", "routing_bias"),
    "weighting": ("router", "weighting"),
    "load_balance_loss": ("router", "load_balance_loss"),
    "load_balance_form": ("router", "load_balance_form"),
    "z_loss": ("router", "z_loss"),
    "capacity": ("router", "capacity"),
    "batch": ("shapes", "batch"),
    "seq_len": ("shapes", "seq_len"),
    "variants": ("shapes", "variants"),
    "params_dtype": ("dtypes", "params"),
    "compute_dtype": ("dtypes", "compute"),
    "axes": ("mesh", "axes"),
    "batch_axes": ("mesh", "batch_axes"),
    "dcn_axes": ("mesh", "dcn_axes"),
    "expert_over_dcn": ("mesh", "expert_over_dcn"),
    "strategy": ("parallelism", "experts"),
    "overlap_chunks": ("parallelism", "overlap_chunks"),
    "redundant_experts": ("parallelism", "redundant_experts"),
    "placement": ("parallelism", "placement"),
    "hardware": ("target", "hardware"),
    "topology": ("target", "topology"),
    "slices": ("target", "slices"),
    "kernel": ("target", "kernel"),
    "quantization": ("target", "quantization"),
    "tiles": ("target", "tiles"),
    "ffn_chunks": ("memory", "ffn_chunks"),
    "token_chunks": ("memory", "token_chunks"),
    "weight_casts": ("memory", "weight_casts"),
    "fit_check": ("memory", "fit_check"),
}

# Choices given as tuples, written as the mapping the schema expects.
_PAIRS = {"group_limit": ("groups", "keep"), "capacity": ("factor", "drop")}

_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*\Z|[0-9]+(x[0-9]+)+\Z")  # names, 2x4, 2x2x1
_RESERVED = re.compile(r"(?:true|false|null|yes|no|on|off|~)\Z", re.IGNORECASE)


def scalar(value: Any) -> str:
    """One YAML scalar: booleans and numbers as themselves, safe names plain, other text in
    double quotes (JSON's escapes are YAML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        if re.fullmatch(r"-?[0-9]+e[-+][0-9]+", text):  # 1e-06: YAML 1.1 needs the point
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        assert re.fullmatch(r"-?[0-9]+\.[0-9]+(e[-+][0-9]+)?", text), text
        return text
    if isinstance(value, str):
        if _PLAIN.match(value) and not _RESERVED.match(value):
            return value
        return json.dumps(value)
    raise TypeError(f"not a YAML scalar: {value!r}")


# Where a field was written: (line, column) of its key and of its value, 1-based as the
# loader reports them. An item of a flow list has no key of its own (key is None), and a
# block mapping's value starts at its first key, where YAML puts the node.
class Position(NamedTuple):
    key: tuple[int, int] | None
    value: tuple[int, int]


def _field_path(path: str, key: Any) -> str:
    """`path` and `key` joined as the diagnostics name fields: a key that is no identifier
    (a variant named "Eval-1") in brackets, as the loader shows a user's key."""
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _write(value: Mapping, indent: int, path: str, lines: list[str], where: dict) -> None:
    """Append the block lines of mapping `value`, `indent` spaces in (lists in flow style),
    to `lines`, and record where each field's key and value went in `where` (dotted paths,
    list items as `path[i]`). The line numbers count from the start of `lines`."""
    for key, item in value.items():
        dotted = _field_path(path, key)
        head = " " * indent + f"{key}:"
        at_key = (len(lines) + 1, indent + 1)
        if isinstance(item, Mapping):
            lines.append(head)
            where[dotted] = Position(at_key, (len(lines) + 1, indent + 3))
            _write(item, indent + 2, dotted, lines, where)
            continue
        text = head + " "
        where[dotted] = Position(at_key, (at_key[0], len(text) + 1))
        lines.append(text + _flow(item, dotted, at_key[0], len(text), where))


def _flow(value: Any, path: str, line: int, before: int, where: dict) -> str:
    """`value` in flow style, starting after `before` characters of line `line`: scalars,
    lists and mappings within lists (a placement), each item's position recorded."""
    if isinstance(value, Mapping):
        text = "{"
        for index, (key, item) in enumerate(value.items()):
            text += (", " if index else "") + f"{key}: "
            at = (line, before + len(text) + 1)
            where[f"{path}.{key}"] = Position((line, at[1] - len(key) - 2), at)
            text += _flow(item, f"{path}.{key}", line, before + len(text), where)
        return text + "}"
    if not isinstance(value, list | tuple):
        return scalar(value)
    text = "["
    for index, element in enumerate(value):
        text += ", " if index else ""
        where[f"{path}[{index}]"] = Position(None, (line, before + len(text) + 1))
        text += _flow(element, f"{path}[{index}]", line, before + len(text), where)
    return text + "]"


def spec_tree(choices: Mapping[str, Any]) -> dict[str, Any]:
    """The nested mapping the choices stand for, in the schema's order (version 1 unless a
    `version` choice says otherwise)."""
    unknown = set(choices) - set(FIELDS)
    assert not unknown, f"unknown choices: {sorted(unknown)}"
    tree: dict[str, Any] = {"version": choices.get("version", 1)}
    for name, path in FIELDS.items():
        if name not in choices or name == "version":
            continue
        value = choices[name]
        if name in _PAIRS and isinstance(value, tuple):
            value = dict(zip(_PAIRS[name], value, strict=True))
        if len(path) == 1:
            tree[path[0]] = value
        else:
            tree.setdefault(path[0], {})[path[1]] = value
    return tree


_MODELINE = "# yaml-language-server: $schema=moegen.schema.json"


def _written(choices: Mapping[str, Any], modeline: bool) -> tuple[list[str], dict[str, Position]]:
    """The lines of the spec `choices` describe, and where each field went in them."""
    lines = [_MODELINE] if modeline else []
    where: dict[str, Position] = {}
    _write(spec_tree(choices), 0, "", lines, where)
    return lines, where


def spec_yaml(choices: Mapping[str, Any], *, modeline: bool = False) -> str:
    """The YAML text of the spec `choices` describe (see the module docstring)."""
    return "\n".join(_written(choices, modeline)[0]) + "\n"


def spec_positions(choices: Mapping[str, Any], *, modeline: bool = False) -> dict[str, Position]:
    """Where `spec_yaml(choices)` writes each field, by dotted path ("router.top_k",
    "mesh.axes.expert", "mesh.batch_axes[1]"), known from the writing and not from a parse,
    so that a test can check the loader's positions against it."""
    return _written(choices, modeline)[1]


def tiny(**choices: Any) -> dict[str, Any]:
    """The choices of a small valid cpu spec (8 experts, top-2, data 2 x fsdp 2), updated with
    `choices`."""
    base: dict[str, Any] = {
        "experts": 8,
        "embed": 64,
        "ffn": 128,
        "top_k": 2,
        "batch": 8,
        "seq_len": 16,
        "axes": {"data": 2, "fsdp": 2},
    }
    return base | choices


def validated(text: str, display: str, name: str) -> LoadedSpec | SpecError:
    """The spec `text` loaded and validated as the file `display` (module `name`), or the
    SpecError that refuses it."""
    try:
        return validate(load_spec_bytes(text.encode(), display, name))
    except SpecError as error:
        return error
