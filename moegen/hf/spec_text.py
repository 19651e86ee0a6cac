"""The YAML text of one spec written from config.json: each mapped value with a comment that
names its source key, the placement (shapes, dtypes, mesh, target) from the command line or
commented defaults that validate on a CPU.

The same sources, by line, come with the text (`Draft.origins`): a spec that fails validation
is not written, so its diagnostics' file:line points at nothing the user can open, and they
say instead where the value came from (the config key, or the option).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from moegen.families import Choice
from moegen.hardware import CATALOGUE

COMMENT_COLUMN = 30
MAX_DESCRIPTION = 500  # the schema's limit
# a string YAML reads back as itself unquoted (its booleans and nulls are words of letters)
PLAIN = re.compile(r"(?!(?:true|false|yes|no|on|off|null)\Z)[a-z][a-z0-9_]*", re.IGNORECASE)


# a line of the spec, and where its value came from ("" where moegen fixes it)
Line = tuple[str, str]


@dataclass(frozen=True)
class Draft:
    """A spec's text, and the origin of the value on each line that has one ({1-based line
    number: "config.json: num_experts_per_tok" or "--mesh data=0"})."""

    text: str
    origins: Mapping[int, str]


@dataclass(frozen=True)
class Placement:
    """Where the layer runs: None = the commented default."""

    hardware: str | None = None
    topology: str | None = None
    mesh: Mapping[str, int] | None = None
    batch: int | None = None
    seq_len: int | None = None
    defaults: Mapping[str, Any] = field(
        default_factory=lambda: {
            "hardware": "cpu",
            "mesh": {"data": 2},
            "batch": 8,
            "seq_len": 128,
        }
    )

    def get(self, name: str) -> tuple[Any, str]:
        """(value, comment): the flag's value, or the default and the flag that sets it."""
        value = getattr(self, name)
        if value is not None:
            return value, f"--{name.replace('_', '-')}"
        return self.defaults[name], f"default; --{name.replace('_', '-')} sets it"

    def origin(self, name: str) -> str:
        """Where the value came from: the option as given, or the default."""
        value, flag = getattr(self, name), f"--{name.replace('_', '-')}"
        if value is None:
            return f"moegen's default; {flag} sets it"
        if isinstance(value, Mapping):
            return f"{flag} " + ",".join(f"{k}={v}" for k, v in value.items())
        return f"{flag} {value}"


def scalar(value: Any) -> str:
    """A YAML scalar that reads back as `value` (floats always with a dot: PyYAML reads 1e-05
    as a string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        return text if "." in mantissa or not e else f"{mantissa}.0e{exponent}"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a double-quoted YAML string


def comment_safe(text: str) -> str:
    """One line of comment text: no control characters (a key may come from the file)."""
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)


def line(indent: int, key: str, value: str, comment: str = "") -> str:
    text = f"{'  ' * indent}{key}:" + (f" {value}" if value else "")
    if comment:  # a comment needs a space before its # (YAML)
        text = f"{text + ' ':<{COMMENT_COLUMN}}# {comment_safe(comment)}"
    return text


def section_lines(section: str, choices: list[Choice], order: list[str], origin: str) -> list[Line]:
    """The section's mapped fields in the schema's order, each with its source; `origin`
    names the config file, which each line's origin starts with."""
    found = {c.field.split(".", 1)[1]: c for c in choices if c.field.startswith(section + ".")}
    lines: list[Line] = [(f"{section}:", "")]
    for name in [n for n in order if n in found]:
        choice = found[name]
        source = f"{origin}: {choice.source}"
        if isinstance(choice.value, Mapping):
            lines.append((line(1, name, "", choice.source), source))
            lines += [(line(2, k, scalar(v)), source) for k, v in choice.value.items()]
        elif isinstance(choice.value, str) and PLAIN.fullmatch(choice.value):
            lines.append((line(1, name, choice.value, choice.source), source))
        else:
            lines.append((line(1, name, scalar(choice.value), choice.source), source))
    for name in [n for n in found if n not in order]:  # a field this moegen does not have yet
        choice = found[name]
        note = f"{choice.source} (commented out: this moegen's schema has no {section}.{name})"
        lines.append(("  # " + line(0, name, scalar(choice.value), note), ""))
    return lines


def placement_lines(placement: Placement) -> list[Line]:
    hardware, hardware_note = placement.get("hardware")
    batch, batch_note = placement.get("batch")
    seq_len, seq_note = placement.get("seq_len")
    axes, mesh_note = placement.get("mesh")
    compute = "float32" if hardware == "cpu" else "bfloat16"
    mesh = placement.origin("mesh")
    lines: list[Line] = [
        ("shapes:", ""),
        (line(1, "batch", str(batch), f"global; {batch_note}"), placement.origin("batch")),
        (line(1, "seq_len", str(seq_len), seq_note), placement.origin("seq_len")),
        ("dtypes:", ""),
        (line(1, "params", "float32", "storage"), ""),
        (line(1, "compute", compute, "activations and expert matmuls"), ""),
        ("mesh:", ""),
        (line(1, "axes", "", f"major to minor; {mesh_note}"), mesh),
        *[(line(2, name, str(size)), mesh) for name, size in axes.items()],
    ]
    if "expert" in axes:
        note = "the expert axis; or auto: moegen tune"
        lines += [("parallelism:", ""), (line(1, "experts", "ragged_all_to_all", note), mesh)]
    hardware_line = line(1, "hardware", hardware, hardware_note)
    lines += [("target:", ""), (hardware_line, placement.origin("hardware"))]
    if placement.topology is not None:
        topology = line(1, "topology", json.dumps(placement.topology), "--topology")
        lines.append((topology, placement.origin("topology")))
    if hardware in CATALOGUE and CATALOGUE[hardware].platform == "tpu":
        kernel = line(1, "kernel", "pallas", TPU_KERNEL_NOTE)
        lines.append((kernel, placement.origin("hardware")))
    return lines


# Measured on one v5e chip (bench/TPU_CHECK.md, 2026-12-06): megablox ran the Mixtral 8x7B
# layer 1.75x as fast as jax.lax.ragged_dot (XLA's kernel) and the Qwen3-30B-A3B layer 1.05x.
TPU_KERNEL_NOTE = "megablox: measured faster than xla on a v5e chip (bench/TPU_CHECK.md)"


def spec_text(
    header: list[str], description: str, choices: list[Choice], placement: Placement, origin: str
) -> Draft:
    """The spec's text and its lines' origins; `origin` names the config file."""
    from moegen.spec import Layer, Router

    lines: list[Line] = [("# yaml-language-server: $schema=moegen.schema.json", "")]
    lines += [(f"# {comment_safe(text)}", "") for text in header]
    if len(description) > MAX_DESCRIPTION:
        description = description[: MAX_DESCRIPTION - 3] + "..."
    lines += [("version: 1", ""), (f"description: {json.dumps(description)}", "")]
    lines += section_lines("layer", choices, list(Layer.model_fields), origin)
    lines += section_lines("router", choices, list(Router.model_fields), origin)
    lines += placement_lines(placement)
    text = "\n".join(text for text, _ in lines) + "\n"
    return Draft(text, {n: source for n, (_, source) in enumerate(lines, 1) if source})
