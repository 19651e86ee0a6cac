"""Rules of shape variants (`shapes.variants`): other static input shapes, same parameters.

A variant is the spec with its batch and seq_len in place of the main ones (`shape_variant`),
so it obeys every rule the main shape obeys: each rule runs on it, and what it breaks is
reported at the variant's own line. Its name becomes part of Python names in the module
(moe_layer_NAME, LOCAL_TOKENS_NAME), hence the naming rule.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable
from dataclasses import replace

from moegen.diagnostics import Diagnostic
from moegen.load import SHAPE_FIELDS, LoadedSpec, shape_variants
from moegen.spec import ShapeVariant

VARIANT_NAME = re.compile(r"[a-z][a-z0-9_]*")
# Names the module's API already gives a meaning to, beside the variants' own functions.
RESERVED_NAMES = frozenset({"main", "default", "shard", "for"})


def variant_names_are_identifiers(loaded: LoadedSpec) -> list[Diagnostic]:
    """A variant's name is a lowercase Python identifier, free in the module's API: it names
    moe_layer_NAME and the variant's constants (LOCAL_TOKENS_NAME)."""
    out = []
    for name in loaded.spec.shapes.variants or {}:
        problem = _name_problem(name)
        if problem:
            path = ("shapes", "variants", name)
            out.append(loaded.diagnostic(path, problem, at_key=True))
    return out


def _name_problem(name: str) -> str:
    fixed = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")
    fixed = fixed if fixed and fixed[0].isalpha() else f"v_{fixed}".rstrip("_")
    if not VARIANT_NAME.fullmatch(name):
        return (
            "a shape variant's name must be a lowercase identifier (letters, digits, _; "
            f"a letter first): it names moe_layer_NAME; write {fixed}"
        )
    if keyword.iskeyword(name) or name in RESERVED_NAMES:
        return f"'{name}' is reserved in the generated module; name it e.g. {name}_shape"
    return ""


def variant_shapes_are_distinct(loaded: LoadedSpec) -> list[Diagnostic]:
    """moe_layer dispatches on x.shape: no two shape sets may have the same shape."""
    shapes = loaded.spec.shapes
    seen = {(shapes.batch, shapes.seq_len): "the main shape (shapes.batch, shapes.seq_len)"}
    out = []
    for name, variant in (shapes.variants or {}).items():
        shape = (variant.batch, variant.seq_len)
        if shape in seen:
            out.append(
                loaded.diagnostic(
                    ("shapes", "variants", name),
                    f"batch {shape[0]}, seq_len {shape[1]} is already {seen[shape]}: "
                    "moe_layer dispatches on x.shape; change batch or seq_len, or remove it",
                    at_key=True,
                )
            )
        seen.setdefault(shape, f"variant {name}")
    return out


def variant_shapes_obey_the_rules(
    rules: Callable[[LoadedSpec], list[Diagnostic]],
) -> Callable[[LoadedSpec], list[Diagnostic]]:
    """The rule that runs every rule of `rules` on each shape variant (see below)."""

    def variants_obey_every_shape_rule(loaded: LoadedSpec) -> list[Diagnostic]:
        """Each shape variant obeys every rule the main shape obeys (batch over the batch
        shards, capacity, tiles, memory...): what it breaks is reported at its batch or
        seq_len line, or, for a rule about another field, prefixed by the variant's name."""
        if not loaded.spec.shapes.variants:
            return []
        main = {(d.field, d.message) for d in rules(loaded)}
        out = []
        for name, variant in shape_variants(loaded):
            for found in rules(variant):
                if (found.field, found.message) not in main:
                    out.append(_located(found, name, loaded.spec.shapes.variants[name]))
        return out

    return variants_obey_every_shape_rule


def _located(found: Diagnostic, name: str, variant: ShapeVariant) -> Diagnostic:
    field = found.field.removeprefix("shapes.")
    if field in SHAPE_FIELDS:
        return replace(found, field=f"shapes.variants.{name}.{field}")
    where = f"shape variant {name} (batch {variant.batch}, seq_len {variant.seq_len})"
    return replace(found, message=f"{where}: {found.message}")


SHAPE_VARIANT_RULES = (variant_names_are_identifiers, variant_shapes_are_distinct)
