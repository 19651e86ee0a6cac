"""Which decoder layers of a model are MoE layers, as config.json says (transformers' rules).

Each family's transformers decoder layer picks an MoE block or a dense MLP from its config; the
rules here are the same, read from config.json (transformers 5.x):

- every layer: Mixtral, OLMoE, Granite-MoE, Hunyuan, MiniMax, gpt-oss, DBRX;
- DeepSeek-V2 / V3, GLM-4.5, dots.llm1: layers from `first_k_dense_replace` on (and, as
  DeepSeek's own code does, only every `moe_layer_freq`-th);
- Qwen2-MoE, Qwen3-MoE: layers not in `mlp_only_layers` whose index + 1 is a multiple of
  `decoder_sparse_step` (none when `num_experts` is 0);
- Jamba: `i % expert_layer_period == expert_layer_offset`;
- Llama 4: `moe_layers`, or else every `interleave_moe_layer_step`-th layer;
- ERNIE 4.5: `moe_layer_start_index` to `moe_layer_end_index`, every `moe_layer_interval`-th;
- DeepSeek-V4: `mlp_layer_types`, whose "hash_moe" layers are MoE layers moegen cannot load.

A key that is absent takes the config class's default. config.json is untrusted: a value of the
wrong type or out of range is a CheckpointError naming the file and the key. A multimodal
config's sizes are under `text_config`, which is read when the top level has no layer count.
Multi-token-prediction modules saved after the decoder layers (`num_nextn_predict_layers`,
DeepSeek-V3's layer 61) are not decoder layers: `extra` counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegen.checkpoints.layouts import Family
from moegen.checkpoints.loading import MAX_LAYER
from moegen.checkpoints.match import ranges
from moegen.checkpoints.reader import CheckpointError

MOE, DENSE, HASH = "moe", "dense", "hash_moe"  # what a layer's MLP is


@dataclass(frozen=True)
class Schedule:
    """The MoE layers config.json gives a model of one family."""

    count: int | None  # decoder layers (num_hidden_layers); None: config.json does not say
    kind: Callable[[int], str]  # layer -> MOE, DENSE or HASH
    rule: str  # what config.json says, for messages ("first_k_dense_replace = 1")
    extra: int = 0  # multi-token-prediction layers saved after the decoder layers


class _Config:
    """Typed reads of config.json's values, each refusal naming the file and the key."""

    def __init__(self, config: Mapping[str, Any], path: Path | None, count_key: str) -> None:
        text = config.get("text_config")
        nested = count_key not in config and isinstance(text, Mapping)
        self.values: Mapping[str, Any] = text if nested else config
        self.prefix = "text_config." if nested else ""
        self.path = path

    def name(self, key: str) -> str:
        return self.prefix + key

    def refuse(self, key: str, why: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {self.name(key)} {why}")

    def integer(self, key: str, default: int | None, minimum: int = 0) -> int | None:
        if key not in self.values:
            return default
        value = self.values[key]
        if type(value) is not int or not minimum <= value < MAX_LAYER:
            raise self.refuse(
                key, f"must be an integer in [{minimum}, {MAX_LAYER}), got {value!r:.80}"
            )
        return value

    def layer_list(self, key: str, count: int | None) -> list[int] | None:
        """A list of layer indices (None when absent or null)."""
        value = self.values.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) > MAX_LAYER:
            raise self.refuse(key, f"must be a list of layer indices, got {value!r:.80}")
        for layer in value:
            if type(layer) is not int or not 0 <= layer < (count or MAX_LAYER):
                bound = f"the model's {count} layers" if count else "a layer index"
                raise self.refuse(key, f"lists {layer!r:.40}, which is not {bound}")
        return value

    def kind_list(self, key: str, count: int | None, allowed: Mapping[str, str]) -> list[str]:
        """A per-layer list of MLP kinds, as `allowed` maps config.json's words to kinds."""
        value = self.values.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.refuse(key, f"must be a list of strings, one per layer, got {value!r:.80}")
        unknown = sorted({v for v in value if v not in allowed})
        if unknown:
            raise self.refuse(key, f"has {unknown!r:.80}; known: {', '.join(allowed)}")
        if count is not None and len(value) != count:
            raise self.refuse(key, f"lists {len(value)} layers but the model has {count}")
        if not value or len(value) > MAX_LAYER:
            raise self.refuse(key, f"lists {len(value)} layers")
        return [allowed[v] for v in value]


def _every(config: _Config, count: int | None) -> tuple[Callable[[int], str], str]:
    return (lambda layer: MOE), "every layer is an MoE layer"


def _first_k_dense(default: int) -> Callable[[_Config, int | None], Any]:
    def rule(config: _Config, count: int | None) -> tuple[Callable[[int], str], str]:
        first = config.integer("first_k_dense_replace", default)
        every = config.integer("moe_layer_freq", 1, minimum=1)
        assert first is not None and every is not None

        def kind(layer: int) -> str:
            return MOE if layer >= first and layer % every == 0 else DENSE

        said = f"{config.name('first_k_dense_replace')} = {first}"
        return kind, said + (f", {config.name('moe_layer_freq')} = {every}" if every > 1 else "")

    return rule


def _qwen(config: _Config, count: int | None) -> tuple[Callable[[int], str], str]:
    step = config.integer("decoder_sparse_step", 1, minimum=1)
    dense = set(config.layer_list("mlp_only_layers", count) or ())
    experts = config.integer("num_experts", 1)
    assert step is not None

    def kind(layer: int) -> str:
        sparse = experts and layer not in dense and (layer + 1) % step == 0
        return MOE if sparse else DENSE

    only = f", {config.name('mlp_only_layers')} = {sorted(dense)}" if dense else ""
    return kind, f"{config.name('decoder_sparse_step')} = {step}{only}"


def _kolibri1_1(config: _Config, count: int | None) -> tuple[Callable[[int], str], str]:
    """Kolibri 1.1: the layers in mlp_only_layers dense (absent or null: the first two, as
    Kolibri1_1Config makes them)."""
    listed = config.layer_list("mlp_only_layers", count)
    dense = set((0, 1) if listed is None else listed)
    said = f"{config.name('mlp_only_layers')} = {sorted(dense)}"
    return (lambda layer: DENSE if layer in dense else MOE), said


def _jamba(config: _Config, count: int | None) -> tuple[Callable[[int], str], str]:
    period = config.integer("expert_layer_period", 2, minimum=1)
    offset = config.integer("expert_layer_offset", 1)
    experts = config.integer("num_experts", 16)
    assert period is not None and offset is not None and experts is not None

    def kind(layer: int) -> str:
        return MOE if experts > 1 and layer % period == offset else DENSE

    said = f"{config.name('expert_layer_period')} = {period}, "
    return kind, said + f"{config.name('expert_layer_offset')} = {offset}"


def _llama4(config: _Config, count: int | None) -> tuple[Callable[[int], str], str]:
    listed = config.layer_list("moe_layers", count)
    if listed is not None:
        chosen = set(listed)
        return (lambda layer: MOE if layer in chosen else DENSE), (
            f"{config.name('moe_layers')} = {sorted(chosen)}"
        )
    step = config.integer("interleave_moe_layer_step", 1, minimum=1)
    assert step is not None
    return (lambda layer: MOE if (layer + 1) % step == 0 else DENSE), (
        f"{config.name('interleave_moe_layer_step')} = {step}"
    )


def _ernie(config: _Config, count: int | None) -> tuple[Callable[[int], str], str]:
    start = config.integer("moe_layer_start_index", 1)
    end = config.integer("moe_layer_end_index", -1, minimum=-1)
    interval = config.integer("moe_layer_interval", 1, minimum=1)
    assert start is not None and end is not None and interval is not None
    last = (MAX_LAYER if count is None else count - 1) if end == -1 else end

    def kind(layer: int) -> str:
        return MOE if (layer + 1) % interval == 0 and start <= layer <= last else DENSE

    said = f"{config.name('moe_layer_start_index')} = {start}, "
    said += f"{config.name('moe_layer_end_index')} = {end}, "
    return kind, said + f"{config.name('moe_layer_interval')} = {interval}"


def _deepseek_v4(config: _Config, count: int | None) -> tuple[Callable[[int], str], str]:
    if "mlp_layer_types" in config.values:
        kinds = config.kind_list("mlp_layer_types", count, {"moe": MOE, "hash_moe": HASH})
        hashed = [layer for layer, kind in enumerate(kinds) if kind == HASH]
        said = f"{config.name('mlp_layer_types')} has 'hash_moe' at " + (
            f"layers {ranges(hashed)}" if hashed else "no layer"
        )
        return (lambda layer: kinds[layer] if layer < len(kinds) else DENSE), said
    # transformers' default: the first num_hash_layers layers are hash-routed
    hashed = config.integer("num_hash_layers", 3)
    assert hashed is not None
    return (lambda layer: HASH if layer < hashed else MOE), (
        f"{config.name('num_hash_layers')} = {hashed}"
    )


def _layer_types(config: _Config, count: int | None) -> tuple[Callable[[int], str], str]:
    """MiniCPM5-MoE and A.X K1: mlp_layer_types where config.json has it (save_pretrained
    writes it), else the first first_k_dense_replace layers (default 1) dense, then every
    moe_layer_freq-th."""
    if "mlp_layer_types" not in config.values:
        return _first_k_dense(1)(config, count)
    kinds = config.kind_list("mlp_layer_types", count, {"sparse": MOE, "dense": DENSE})
    said = f"{config.name('mlp_layer_types')}"
    return (lambda layer: kinds[layer] if layer < len(kinds) else DENSE), said


RULES: Mapping[str, Callable[[_Config, int | None], tuple[Callable[[int], str], str]]] = {
    **dict.fromkeys(
        ("mixtral", "olmoe", "granitemoe", "hunyuan_v1_moe", "minimax", "gpt_oss", "dbrx"),
        _every,
    ),
    "deepseek_v3": _first_k_dense(3),
    "glm4_moe": _first_k_dense(1),
    "dots1": _first_k_dense(0),
    "deepseek_v2": _first_k_dense(0),
    "qwen2_moe": _qwen,
    "qwen3_moe": _qwen,
    "jamba": _jamba,
    "llama4": _llama4,
    "ernie4_5_moe": _ernie,
    "deepseek_v4": _deepseek_v4,
    "minicpm5_moe": _layer_types,
    "axk1": _layer_types,
    "kolibri1": _every,
    "kolibri1_1": _kolibri1_1,
}
COUNT_KEYS = {"dbrx": "n_layers"}  # the key of the layer count, where not num_hidden_layers


def schedule_of(family: Family, config: Mapping[str, Any] | None, path: Path | None) -> Schedule:
    """The MoE layers `config` (config.json, or None without one) gives a `family` model."""
    if config is None:  # nothing says which layers are MoE: the expert tensors will
        return Schedule(None, lambda layer: MOE, "no config.json")
    count_key = COUNT_KEYS.get(family.name, "num_hidden_layers")
    values = _Config(config, path, count_key)
    count = values.integer(count_key, None, minimum=1)
    kind, said = RULES[family.name](values, count)
    extra = values.integer("num_nextn_predict_layers", 0)
    assert extra is not None
    if count is None and family.name == "deepseek_v4" and "mlp_layer_types" in values.values:
        count = len(values.values["mlp_layer_types"])
    return Schedule(count, kind, f"{path}: {said}", extra)
