"""Which decoder layers of a model are MoE layers, for `moegen init --from-hf`: the `layers`
rule of the model_type's entry in the family table (moegen.families, which the checkpoint
loader reads too), run on the config.json this command reads.

`HfReads` is how the rules read it here: as a ConfigView does (a per_layer_config entry for
layer 0 and a per-layer list's first element stand for the layer count's and the rules'
integers, as they did before the rules were shared; counts up to what an int32 holds), each
refusal an HfConfigError naming the file and the key; work done one decoder layer at a time
is bounded by MAX_LAYERS (`per_layer_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moegen.families import (
    ABSENT,
    MAX_LAYERS,
    MAX_SIZE,
    MISSING,
    ConfigView,
    Family,
    HfConfigError,
    Layers,
    lookup,
    short,
)


def layers_of(family: Family, view: ConfigView) -> Layers:
    """The MoE layers the config (`view`: the text model's keys) gives a model of `family`."""
    return family.layers.moe_layers(HfReads(view))


@dataclass(frozen=True)
class HfReads:
    """The config's values as the rules read them (a moegen.families ConfigReader)."""

    view: ConfigView

    def name(self, key: str) -> str:
        return key  # the spec's header names the keys as the text model has them

    def fail(self, key: str, why: str) -> HfConfigError:
        return self.view.fail(key, why)

    def raw(self, key: str) -> Any:
        value = self.view.raw(key)
        return ABSENT if value is MISSING else value

    def layer_count(self, key: str) -> int:
        value, source = lookup(self.view, (key,), 0, MISSING)
        return self.view.size(source, value)

    def integer(self, key: str, default: int, minimum: int = 0) -> int:
        value, _ = lookup(self.view, (key,), 0, default)
        if minimum in (0, 1):
            return self.view.size(key, value, zero=minimum == 0)
        if type(value) is not int or not minimum <= value <= MAX_SIZE:
            raise self.fail(
                key, f"must be an integer from {minimum} to {MAX_SIZE}, not {short(value)}"
            )
        return value

    def flag(self, key: str, default: bool) -> bool:
        value, _ = lookup(self.view, (key,), 0, default)
        return self.view.flag(key, value)

    def text(self, key: str, value: Any) -> str:
        return self.view.text(key, value)

    def layer_list(self, key: str, value: Any) -> list[int]:
        return self.view.int_list(key, value)

    def types(self, key: str, value: Any, known: tuple[str, ...]) -> list[str]:
        types = self.view.text_list(key, value)
        for i, kind in enumerate(types):
            if kind not in known:
                raise self.fail(f"{key}[{i}]", f"{kind!r} is not a known type ({', '.join(known)})")
        return types

    def per_layer(self, key: str, value: Any, total: int) -> list[Any]:
        if type(value) is not list or len(value) < total:
            length = len(value) if type(value) is list else short(value)
            raise self.fail(key, f"a per-layer list of {length}, not {total}")
        per_layer_bound(self.view, key, total)
        return value


def per_layer_bound(view: ConfigView, key: str, count: int) -> None:
    """Refuse reading `key` one layer at a time for more than MAX_LAYERS layers: that work
    grows with the layer count, which a hostile file sets as it likes (see MAX_LAYERS)."""
    if count > MAX_LAYERS:
        raise view.fail(
            key,
            f"read one decoder layer at a time, for {count} layers: moegen maps at most "
            f"{MAX_LAYERS} that way (real models have under 200 decoder layers)",
        )
