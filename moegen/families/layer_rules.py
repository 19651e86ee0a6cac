"""Which decoder layers of a model are MoE layers, as the family's transformers decoder layer
(or its config class, deriving a per-layer list) decides it from config.json: the kinds of
rule. Each entry of the family table names one as its `layers`, and both the checkpoint
loader (moegen.checkpoints.schedule) and `moegen init --from-hf` (moegen.hf.layers) run it.

A rule decides what config.json's values mean (which keys, the config class's defaults,
which layers follow); it reads them only through a `ConfigReader` its caller supplies.
config.json is untrusted, and each caller refuses a value of the wrong type or range in its
own terms (a CheckpointError, an HfConfigError), naming the file and the key, within its own
bounds (the loader's MAX_LAYER, init's int32 sizes and its bound on per-layer work).

A rule answers with `Layers`: a LayerSet (runs, never one entry a layer: the layer count may
be 2**31 - 1) and a sentence saying how they were found, in the reader's names of the keys.
The kinds whose layers come from a per-layer list are in moegen.families.layer_types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from moegen.families.layer_set import LayerSet

ABSENT: Any = object()  # what ConfigReader.raw gives for a key config.json does not have
LAYERS = "num_hidden_layers"  # the layer count's key, where the family does not name another


class ConfigReader(Protocol):
    """Typed reads of one config object (config.json, or its text_config); every refusal is
    the caller's exception, naming the file and the key."""

    def name(self, key: str) -> str:
        """The key as the caller's messages name it (with "text_config." where it sits)."""
        ...

    def fail(self, key: str, why: str) -> Exception:
        """The caller's refusal of the key's value, `why` saying what is wrong with it."""
        ...

    def raw(self, key: str) -> Any:
        """The key's value as config.json has it, unchecked; ABSENT when it has none."""
        ...

    def layer_count(self, key: str) -> int:
        """The decoder-layer count `key` gives; a caller that can go without one (the
        tensors then say which layers are there) gives the most layers it reads."""
        ...

    def integer(self, key: str, default: int, minimum: int = 0) -> int:
        """An integer of at least `minimum`; `default` where the key is absent."""
        ...

    def flag(self, key: str, default: bool) -> bool: ...

    def text(self, key: str, value: Any) -> str:
        """`value`, the key's, as a short string."""
        ...

    def layer_list(self, key: str, value: Any) -> list[int]:
        """`value`, the key's (given, not null), as a list of layer indices."""
        ...

    def types(self, key: str, value: Any, known: tuple[str, ...]) -> list[str]:
        """`value`, the key's, as a list of one type a decoder layer, each one of `known`."""
        ...

    def per_layer(self, key: str, value: Any, total: int) -> list[Any]:
        """`value`, the key's, as a list read one decoder layer at a time over `total`."""
        ...


@dataclass(frozen=True)
class Layers:
    """A rule's answer: the MoE layers of a model of `count` decoder layers, and how."""

    moe: LayerSet
    how: str  # "layers from first_k_dense_replace = 3 on", for headers and messages
    count: int  # the decoder layers the rule went by (ConfigReader.layer_count's)
    # layers that hold experts but route them in a way moegen does not (DeepSeek-V4's
    # hash_moe): not MoE layers to map or load, yet not dense either
    hashed: LayerSet = field(default_factory=LayerSet)
    listed: int | None = None  # the length of the per-layer type list the layers come from


def given(value: Any) -> bool:
    """Whether config.json gives the key a value: null is the config class's None, which its
    code takes as not given."""
    return value is not ABSENT and value is not None


@dataclass(frozen=True)
class AllLayers:
    """Every decoder layer is an MoE layer; `count` is the key of their count."""

    count: str = LAYERS

    def moe_layers(self, reader: ConfigReader) -> Layers:
        total = reader.layer_count(self.count)
        return Layers(
            LayerSet.span(range(total)), f"every decoder layer ({reader.name(self.count)})", total
        )


@dataclass(frozen=True)
class FirstDense:
    """The first layers dense, as many as `first` says (absent: `default`; no key: the family
    fixes `default`), the others MoE; with `freq`, only layers i with i % freq == 0
    (DeepSeek's own code, A.X's config classes), or where `freq_list` allows a list, those
    whose entry is true (dots3 note's, MiniMax-M3-VL's)."""

    first: str | None
    default: int
    freq: str | None = None
    freq_list: bool = False

    def moe_layers(self, reader: ConfigReader) -> Layers:
        total = reader.layer_count(LAYERS)
        if self.first is None:
            dense, how = self.default, f"layers from the fixed {self.default} on"
        else:
            dense = reader.integer(self.first, self.default)
            how = f"layers from {reader.name(self.first)} = {dense} on"
        if self.freq is None:
            return Layers(LayerSet.span(range(dense, total)), how, total)
        value = reader.raw(self.freq)
        if self.freq_list and type(value) is list:
            flags = reader.per_layer(self.freq, value, total)
            layers = LayerSet.of(i for i in range(dense, min(total, len(flags))) if flags[i])
            return Layers(layers, f"{how} where {reader.name(self.freq)} is true", total)
        step = reader.integer(self.freq, 1, minimum=1)
        layers = LayerSet.span(range(dense + (-dense) % step, total, step))  # i % step == 0
        name = reader.name(self.freq)
        every = f" with i % {name} = 0, {name} = {step}" if step > 1 else ""
        return Layers(layers, how + every, total)


@dataclass(frozen=True)
class SparseStep:
    """Qwen-MoE: layer i is MoE when (i + 1) % `step` == 0 and i is not in `skip`; with
    `experts`, no layer is when that key is 0 (Qwen2/3-MoE's num_experts)."""

    step: str = "decoder_sparse_step"
    skip: str = "mlp_only_layers"
    experts: str | None = None

    def moe_layers(self, reader: ConfigReader) -> Layers:
        total = reader.layer_count(LAYERS)
        step = reader.integer(self.step, 1, minimum=1)
        listed = reader.raw(self.skip)
        skipped = reader.layer_list(self.skip, listed) if given(listed) else []
        experts = reader.integer(self.experts, 1) if self.experts else 1
        how = f"every {reader.name(self.step)} = {step} layers"
        how += f", less {reader.name(self.skip)}" if skipped else ""
        if not experts:
            return Layers(LayerSet(), f"{how}, but {reader.name(self.experts or '')} = 0", total)
        layers = LayerSet.span(range(step - 1, total, step)).without(skipped)  # (i + 1) % step
        return Layers(layers, how, total)


@dataclass(frozen=True)
class AllBut:
    """Kolibri 1.1: every layer except those in `skip`; absent or null, the config class
    lists the first `default` layers (as many as there are)."""

    skip: str
    default: int

    def moe_layers(self, reader: ConfigReader) -> Layers:
        total = reader.layer_count(LAYERS)
        listed = reader.raw(self.skip)
        how = f"every layer less {reader.name(self.skip)}"
        if given(listed):
            skipped: list[int] | range = reader.layer_list(self.skip, listed)
        else:
            skipped, how = (
                range(min(self.default, total)),
                f"{how} (absent: the first {self.default})",
            )
        return Layers(LayerSet.span(range(total)).without(skipped), how, total)


@dataclass(frozen=True)
class Period:
    """Jamba: layer i is MoE when i % `period` == `offset` (which must be below the period,
    as JambaConfig checks) and the model has more than one expert (`experts`)."""

    period: str = "expert_layer_period"
    offset: str = "expert_layer_offset"
    experts: str = "num_experts"

    def moe_layers(self, reader: ConfigReader) -> Layers:
        total = reader.layer_count(LAYERS)
        period = reader.integer(self.period, 2, minimum=1)
        offset = reader.integer(self.offset, 1)
        if offset >= period:
            raise reader.fail(
                self.offset, f"{offset} must be below {reader.name(self.period)} = {period}"
            )
        experts = reader.integer(self.experts, 16)
        how = f"layers i with i % {period} = {offset} "
        how += f"({reader.name(self.period)}, {reader.name(self.offset)})"
        if experts <= 1:  # JambaDecoderLayer runs a dense MLP where a layer has one expert
            return Layers(LayerSet(), f"{how}, but {reader.name(self.experts)} = {experts}", total)
        return Layers(LayerSet.span(range(offset, total, period)), how, total)


@dataclass(frozen=True)
class Window:
    """ERNIE 4.5: layer i is MoE when (i + 1) % `interval` == 0 and `start` <= i <= `end`
    (-1, the config class's default: the last layer)."""

    start: str = "moe_layer_start_index"
    end: str = "moe_layer_end_index"
    interval: str = "moe_layer_interval"

    def moe_layers(self, reader: ConfigReader) -> Layers:
        total = reader.layer_count(LAYERS)
        start = reader.integer(self.start, 1)
        end = reader.integer(self.end, -1, minimum=-1)
        interval = reader.integer(self.interval, 1, minimum=1)
        last = total - 1 if end == -1 else min(end, total - 1)
        first = start + (interval - 1 - start) % interval  # the first i >= start, (i+1) % n == 0
        layers = LayerSet.span(range(first, last + 1, interval))
        how = f"layers {reader.name(self.start)} = {start} to {reader.name(self.end)} = {end}, "
        return Layers(layers, how + f"every {reader.name(self.interval)} = {interval}", total)


@dataclass(frozen=True)
class Listed:
    """Llama 4: the `key` list of layer indices, else every `step`-th layer."""

    key: str = "moe_layers"
    step: str = "interleave_moe_layer_step"

    def moe_layers(self, reader: ConfigReader) -> Layers:
        total = reader.layer_count(LAYERS)
        value = reader.raw(self.key)
        if given(value):
            listed = reader.layer_list(self.key, value)
            return Layers(
                LayerSet.of(i for i in listed if i < total),
                f"the {reader.name(self.key)} list",
                total,
            )
        step = reader.integer(self.step, 1, minimum=1)
        layers = LayerSet.span(range(step - 1, total, step))  # (i + 1) % step == 0
        return Layers(layers, f"every {reader.name(self.step)} = {step} layers", total)
