"""Which decoder layers of a model are MoE layers, as each family's transformers decoder layer
decides it from config.json (the rest run a dense MLP, or something moegen does not build).

Each rule returns the MoE layers (a LayerSet: runs, never one entry a layer, as
num_hidden_layers may be anything an int holds) and a sentence saying how they were found,
which the written spec keeps in its description.
"""

from __future__ import annotations

from dataclasses import dataclass

from moegen.checkpoints import LayerSet
from moegen.hf.config_file import MAX_LAYERS, MISSING, ConfigView
from moegen.hf.rules import lookup

LAYERS = "num_hidden_layers"


def layer_count(view: ConfigView, key: str) -> int:
    value, source = lookup(view, (key,), 0, MISSING)
    return view.size(source, value)


def _int(view: ConfigView, key: str, default: int) -> int:
    value, _ = lookup(view, (key,), 0, default)
    return view.size(key, value, zero=True)


@dataclass(frozen=True)
class AllLayers:
    count: str = LAYERS

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        total = layer_count(view, self.count)
        how = f"every one of the {total} decoder layers ({self.count})"
        return LayerSet.span(range(total)), how


@dataclass(frozen=True)
class FirstDense:
    """DeepSeek-style: the first `first_k_dense_replace` layers are dense."""

    first: str
    default: int

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        total, dense = layer_count(view, LAYERS), _int(view, self.first, self.default)
        return LayerSet.span(range(dense, total)), f"layers from {self.first} = {dense} on"


@dataclass(frozen=True)
class SparseStep:
    """Qwen-MoE: every `decoder_sparse_step`-th layer, except those in `mlp_only_layers`."""

    step: str = "decoder_sparse_step"
    skip: str = "mlp_only_layers"

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        total, step = layer_count(view, LAYERS), _int(view, self.step, 1)
        if step == 0:
            raise view.fail(self.step, "must be at least 1")
        skipped = view.int_list(self.skip, view.raw(self.skip)) if view.has(self.skip) else []
        layers = LayerSet.span(range(step - 1, total, step)).without(skipped)  # (i + 1) % step
        return layers, f"every {self.step} = {step} layers, less {self.skip}"


@dataclass(frozen=True)
class AllBut:
    """Kolibri 1.1: every layer except those in `skip`; absent or null, the config class
    lists the first `default` layers (as many as there are)."""

    skip: str
    default: int

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        total = layer_count(view, LAYERS)
        listed = view.raw(self.skip) if view.has(self.skip) else None
        if listed is None:
            skipped, how = (
                list(range(min(self.default, total))),
                f"(absent: the first {self.default})",
            )
        else:
            skipped, how = view.int_list(self.skip, listed), ""
        return LayerSet.span(range(total)).without(
            skipped
        ), f"every layer less {self.skip} {how}".strip()


@dataclass(frozen=True)
class Period:
    """Jamba: layer i is MoE when i % expert_layer_period == expert_layer_offset."""

    period: str = "expert_layer_period"
    offset: str = "expert_layer_offset"

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        total = layer_count(view, LAYERS)
        period, offset = _int(view, self.period, 2), _int(view, self.offset, 1)
        if period == 0 or offset >= period:
            raise view.fail(self.offset, f"{offset} must be below {self.period} = {period}")
        layers = LayerSet.span(range(offset, total, period))
        return layers, f"layers i with i % {self.period} = {offset} ({self.offset})"


@dataclass(frozen=True)
class Window:
    """ERNIE 4.5: (i + 1) % interval == 0 and start <= i <= end."""

    start: str = "moe_layer_start_index"
    end: str = "moe_layer_end_index"
    interval: str = "moe_layer_interval"

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        total = layer_count(view, LAYERS)
        start, interval = _int(view, self.start, 1), _int(view, self.interval, 1)
        end = _int(view, self.end, total - 1)
        if interval == 0:
            raise view.fail(self.interval, "must be at least 1")
        first = start + (interval - 1 - start) % interval  # the first i >= start, (i+1) % n == 0
        layers = LayerSet.span(range(first, min(end, total - 1) + 1, interval))
        return layers, f"layers {self.start} to {self.end}, every {self.interval}"


@dataclass(frozen=True)
class Listed:
    """Llama 4: the `moe_layers` list, else every `interleave_moe_layer_step`-th layer."""

    key: str = "moe_layers"
    step: str = "interleave_moe_layer_step"

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        total = layer_count(view, LAYERS)
        if view.has(self.key) and view.raw(self.key) is not None:
            listed = view.int_list(self.key, view.raw(self.key))
            return LayerSet.of(i for i in listed if i < total), f"the {self.key} list"
        step = _int(view, self.step, 1)
        if step == 0:
            raise view.fail(self.step, "must be at least 1")
        return LayerSet.span(range(step - 1, total, step)), f"every {self.step} = {step} layers"


@dataclass(frozen=True)
class DenseFirst:
    """The list a config class derives where mlp_layer_types is not given: the first
    `first` layers dense (that key's value, else `default`; no key: the class fixes
    `default`), then, with `freq`, only layers i with i % freq == 0 or, a list, freq[i] true
    (dots3 note's and A.X K2's moe_layer_freq)."""

    first: str | None
    default: int
    freq: str | None = None

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        total = layer_count(view, LAYERS)
        dense = _int(view, self.first, self.default) if self.first else self.default
        how = f"layers from {self.first or 'the fixed'} {dense} on"
        freq = view.raw(self.freq) if self.freq and view.has(self.freq) else 1
        if type(freq) is list and self.freq:
            if len(freq) < total:
                raise view.fail(self.freq, f"a per-layer list of {len(freq)}, not {total}")
            per_layer_bound(view, self.freq, total)
            layers = LayerSet.of(i for i in range(dense, total) if freq[i])
            return layers, f"{how} where {self.freq}"
        step = view.size(self.freq or "", freq)
        layers = LayerSet.span(range(dense + (-dense) % step, total, step))  # i % step == 0
        return layers, how + (f", i % {self.freq} = 0" if self.freq else "")


def typed_layers(
    view: ConfigView, key: str, types: list[str], moe: str, others: tuple[tuple[str, str], ...]
) -> tuple[LayerSet, str]:
    """The layers whose type is `moe`; the other known types are left out, each for its
    reason (said in the description), an unknown type refused."""
    reasons = dict(others)
    for i, kind in enumerate(types):
        if kind != moe and kind not in reasons:
            known = ", ".join([moe, *reasons])
            raise view.fail(f"{key}[{i}]", f"{kind!r} is not a known type ({known})")
    layers = LayerSet.of(i for i, kind in enumerate(types) if kind == moe)
    left = sorted({kind for kind in types if kind != moe})
    notes = "; ".join(f"{kind} layers left out: {reasons[kind]}" for kind in left)
    return layers, f"{key} '{moe}'" + (f" ({notes})" if notes else "")


@dataclass(frozen=True)
class Typed:
    """DeepSeek-V4: the layers whose `mlp_layer_types` entry is `moe`; the other types are
    left out, each for the reason given in `others` (an unknown type is refused). Without
    the list (absent or null), `fallback` derives it as the config class does; no fallback:
    refused, the decoder layers index the list."""

    key: str
    moe: str
    others: tuple[tuple[str, str], ...]
    fallback: LayerRule | None = None

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        total = layer_count(view, LAYERS)
        if self.fallback is not None and view.raw(self.key) in (MISSING, None):
            layers, how = self.fallback.moe_layers(view)
            return layers, f"{how} ({self.key} not given: the config class derives it so)"
        lookup(view, (self.key,), 0, MISSING)  # refused when absent
        if view.raw(self.key) is None:
            raise view.fail(
                self.key,
                "null: the config class derives no list from it, and "
                "its decoder layers read one entry per layer",
            )
        types = view.text_list(self.key, view.raw(self.key))
        return typed_layers(view, self.key, types[:total], self.moe, self.others)


@dataclass(frozen=True)
class IndexList:
    """Step 3.7's derivation of mlp_layer_types: the MoE layers' indices in the legacy `key`
    (a list, or a comma-separated string), else every layer from `first` on."""

    key: str = "moe_layers_enum"
    first: int = 3

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        total = layer_count(view, LAYERS)
        value = view.raw(self.key)
        if value in (MISSING, None):
            return LayerSet.span(range(self.first, total)), f"layers from the fixed {self.first} on"
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",") if item.strip()]
            # ASCII digits, at most 10 (an index is below 2**31): int() of "²" or of 5,000
            # digits raises, where this is to refuse
            if not all(item.isascii() and item.isdigit() and len(item) <= 10 for item in items):
                raise view.fail(self.key, f"must list layer indices, not {value[:60]!r}")
            value = [int(item) for item in items]
        listed = view.int_list(self.key, value)
        return LayerSet.of(i for i in listed if i < total), f"the {self.key} list"


@dataclass(frozen=True)
class Switched:
    """Gemma 4: every decoder layer builds the MoE block (beside its dense MLP) when the
    `flag` key is true; when it is false no layer has one, and there is nothing to map."""

    flag: str
    default: bool = False

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        total = layer_count(view, LAYERS)
        value, _ = lookup(view, (self.flag,), 0, self.default)
        if not view.flag(self.flag, value):
            absent = "" if view.has(self.flag) else " (absent: the config class's default)"
            raise view.fail(
                self.flag,
                f"is false{absent}: no decoder layer builds the MoE block, so there is no "
                "MoE layer to map",
            )
        layers = LayerSet.span(range(total))
        return layers, f"every one of the {total} decoder layers ({self.flag} true)"


# Nemotron-H's legacy pattern letters and the block type each stands for
_NEMOTRON_LETTERS = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}


@dataclass(frozen=True)
class BlockPattern:
    """Nemotron-H: one block type per decoder layer, the `keys` list, else the legacy
    `pattern` string (a letter a layer), else the config class's default; a layer is MoE
    where its type is `moe`. The decoder-layer count is the list's length (the config class
    ignores num_hidden_layers)."""

    keys: tuple[str, ...]
    pattern: str
    default: tuple[str, ...]
    moe: str
    others: tuple[tuple[str, str], ...]

    def types(self, view: ConfigView) -> tuple[list[str], str]:
        key = next((k for k in self.keys if view.raw(k) not in (MISSING, None)), None)
        if key is not None:
            return view.text_list(key, view.raw(key)), key
        text = view.raw(self.pattern)
        if text in (MISSING, None):
            return list(self.default), f"{self.keys[0]} (absent: the config class's default)"
        text = view.text(self.pattern, text)
        for i, letter in enumerate(text):
            if letter not in _NEMOTRON_LETTERS:
                known = ", ".join(_NEMOTRON_LETTERS)
                where = f"{self.pattern}[{i}]"
                raise view.fail(where, f"{letter!r} is not a block letter ({known})")
        return [_NEMOTRON_LETTERS[letter] for letter in text], self.pattern

    def total(self, view: ConfigView) -> int:
        return len(self.types(view)[0])

    def moe_layers(self, view: ConfigView) -> tuple[LayerSet, str]:
        types, source = self.types(view)
        return typed_layers(view, source, types, self.moe, self.others)


LayerRule = (
    AllLayers
    | FirstDense
    | SparseStep
    | AllBut
    | Period
    | Window
    | Listed
    | Typed
    | DenseFirst
    | IndexList
    | Switched
    | BlockPattern
)


def decoder_layers(rule: LayerRule, view: ConfigView) -> int:
    """How many decoder layers the model has: the rule's own count where its list sets it
    (Nemotron-H), else the count key it reads."""
    if isinstance(rule, BlockPattern):
        return rule.total(view)
    return layer_count(view, getattr(rule, "count", LAYERS))


def per_layer_bound(view: ConfigView, key: str, count: int) -> None:
    """Refuse reading `key` one layer at a time for more than MAX_LAYERS layers: that work
    grows with the layer count, which a hostile file sets as it likes (see MAX_LAYERS)."""
    if count > MAX_LAYERS:
        raise view.fail(
            key,
            f"read one decoder layer at a time, for {count} layers: moegen maps at most "
            f"{MAX_LAYERS} that way (real models have under 200 decoder layers)",
        )
