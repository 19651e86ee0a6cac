"""A spec's shape variants (`shapes.variants`) as specs of their own: the spec with a
variant's batch and seq_len in place of the main ones. Validation runs every rule on each
(moegen.validate.shape_variants) and the plan plans each (moegen.plan.variants)."""

from __future__ import annotations

from dataclasses import replace

from moegen.load.loader import LoadedSpec
from moegen.load.source import Locations
from moegen.spec import Shapes

SHAPE_FIELDS = ("batch", "seq_len")


def shape_variant(loaded: LoadedSpec, name: str) -> LoadedSpec:
    """The spec as it runs shape variant `name`, not validated: its batch and seq_len in place
    of the main ones, no variants of its own, and the locations of shapes.batch and
    shapes.seq_len moved to the variant's fields, so that a rule the variant breaks points
    at the line that sets it."""
    variant = loaded.spec.shapes.variants[name]
    shapes = Shapes(batch=variant.batch, seq_len=variant.seq_len)
    values, keys = dict(loaded.locations.values), dict(loaded.locations.keys)
    for field in SHAPE_FIELDS:
        at = ("shapes", "variants", name, field)
        values[("shapes", field)] = loaded.locations.of_value(at)
        keys[("shapes", field)] = loaded.locations.of_key(at)
    return replace(
        loaded,
        spec=loaded.spec.model_copy(update={"shapes": shapes}),
        locations=Locations(values=values, keys=keys),
    )


def shape_variants(loaded: LoadedSpec) -> list[tuple[str, LoadedSpec]]:
    """Every shape variant of the spec, in the order written (see `shape_variant`)."""
    return [(name, shape_variant(loaded, name)) for name in loaded.spec.shapes.variants or {}]
