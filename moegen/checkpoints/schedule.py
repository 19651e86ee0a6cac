"""Which decoder layers of a checkpoint's model are MoE layers, as config.json says: the
`layers` rule of the family's entry in the family table (moegen.families, which `moegen init
--from-hf` reads too), run on config.json as this loader reads it.

config.json is untrusted: a value of the wrong type or out of range is a CheckpointError
naming the file and the key, within MAX_LAYER. A key that is absent takes the config class's
default. A multimodal config's sizes are under `text_config`, which is read when the top level
has no layer count; without a layer count at all, the rule runs over MAX_LAYER layers and the
tensors say which are there (moegen.checkpoints.model). Multi-token-prediction modules saved
after the decoder layers (`num_nextn_predict_layers`, DeepSeek-V3's layer 61) are not decoder
layers: `extra` counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegen.checkpoints.families import Loadable
from moegen.checkpoints.loading import MAX_LAYER
from moegen.checkpoints.reader import CheckpointError
from moegen.families import ABSENT, HASH_MOE, count_key

MOE, DENSE, HASH = "moe", "dense", HASH_MOE  # what a layer's MLP is


@dataclass(frozen=True)
class Schedule:
    """The MoE layers config.json gives a model of one family."""

    count: int | None  # decoder layers (num_hidden_layers); None: config.json does not say
    kind: Callable[[int], str]  # layer -> MOE, DENSE or HASH
    rule: str  # what config.json says, for messages ("first_k_dense_replace = 1")
    extra: int = 0  # multi-token-prediction layers saved after the decoder layers


class _Config:
    """config.json's values as the rules read them (a ConfigReader), each refusal a
    CheckpointError naming the file and the key."""

    def __init__(self, config: Mapping[str, Any], path: Path | None, count_key: str) -> None:
        text = config.get("text_config")
        nested = count_key not in config and isinstance(text, Mapping)
        self.values: Mapping[str, Any] = text if nested else config
        self.prefix = "text_config." if nested else ""
        self.path = path
        self.count_key = count_key
        self.count = self._integer(count_key, None, 1)  # None: config.json does not say

    def name(self, key: str) -> str:
        return self.prefix + key

    def fail(self, key: str, why: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {self.name(key)} {why}")

    def raw(self, key: str) -> Any:
        return self.values.get(key, ABSENT)

    def layer_count(self, key: str) -> int:
        count = self.count if key == self.count_key else self._integer(key, None, 1)
        # without a count, every layer this loader reads (the tensors say which are there)
        return MAX_LAYER if count is None else count

    def _integer(self, key: str, default: int | None, minimum: int) -> int | None:
        if key not in self.values:
            return default
        value = self.values[key]
        if type(value) is not int or not minimum <= value < MAX_LAYER:
            raise self.fail(
                key, f"must be an integer in [{minimum}, {MAX_LAYER}), got {value!r:.80}"
            )
        return value

    def integer(self, key: str, default: int, minimum: int = 0) -> int:
        value = self._integer(key, default, minimum)
        assert value is not None  # the default is an int
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.values.get(key, default)
        if type(value) is not bool:
            raise self.fail(key, f"must be true or false, got {value!r:.80}")
        return value

    def text(self, key: str, value: Any) -> str:
        if type(value) is not str or len(value) > MAX_LAYER:
            raise self.fail(key, f"must be a string, got {value!r:.80}")
        return value

    def layer_list(self, key: str, value: Any) -> list[int]:
        if not isinstance(value, list) or len(value) > MAX_LAYER:
            raise self.fail(key, f"must be a list of layer indices, got {value!r:.80}")
        for layer in value:
            if type(layer) is not int or not 0 <= layer < (self.count or MAX_LAYER):
                bound = f"the model's {self.count} layers" if self.count else "a layer index"
                raise self.fail(key, f"lists {layer!r:.40}, which is not {bound}")
        return value

    def types(self, key: str, value: Any, known: tuple[str, ...]) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, f"must be a list of strings, one per layer, got {value!r:.80}")
        unknown = sorted({v for v in value if v not in known})
        if unknown:
            raise self.fail(key, f"has {unknown!r:.80}; known: {', '.join(known)}")
        self.per_layer(key, value, self.layer_count(self.count_key))
        if not value:
            raise self.fail(key, "lists 0 layers")
        return value

    def per_layer(self, key: str, value: Any, total: int) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(key, f"must be a list, one entry per layer, got {value!r:.80}")
        if len(value) > MAX_LAYER:
            raise self.fail(key, f"lists {len(value)} layers, over {MAX_LAYER}")
        if self.count is not None and len(value) != self.count:
            raise self.fail(key, f"lists {len(value)} layers but the model has {self.count}")
        return value


def schedule_of(family: Loadable, config: Mapping[str, Any] | None, path: Path | None) -> Schedule:
    """The MoE layers `config` (config.json, or None without one) gives a `family` model."""
    if config is None:  # nothing says which layers are MoE: the expert tensors will
        return Schedule(None, lambda layer: MOE, "no config.json")
    rule = family.moe_layers
    values = _Config(config, path, count_key(rule))
    found = rule.moe_layers(values)
    extra = values.integer("num_nextn_predict_layers", 0)
    moe, hashed = found.moe, found.hashed

    def kind(layer: int) -> str:
        return MOE if layer in moe else HASH if layer in hashed else DENSE

    # a per-layer list of types says how many layers there are where no count does
    count = values.count if values.count is not None else found.listed
    return Schedule(count, kind, f"{path}: {found.how}", extra)
