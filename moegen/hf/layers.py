"""Which decoder layers of a model are MoE layers, as each family's transformers decoder layer
decides it from config.json (the rest run a dense MLP, or something moegen does not build).

Each rule returns the MoE layers' indices and a sentence saying how they were found, which the
written spec keeps in its description.
"""

from __future__ import annotations

from dataclasses import dataclass

from moegen.hf.config_file import MISSING, ConfigView
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

    def moe_layers(self, view: ConfigView) -> tuple[list[int], str]:
        total = layer_count(view, self.count)
        return list(range(total)), f"every one of the {total} decoder layers ({self.count})"


@dataclass(frozen=True)
class FirstDense:
    """DeepSeek-style: the first `first_k_dense_replace` layers are dense."""

    first: str
    default: int

    def moe_layers(self, view: ConfigView) -> tuple[list[int], str]:
        total, dense = layer_count(view, LAYERS), _int(view, self.first, self.default)
        return list(range(dense, total)), f"layers from {self.first} = {dense} on"


@dataclass(frozen=True)
class SparseStep:
    """Qwen-MoE: every `decoder_sparse_step`-th layer, except those in `mlp_only_layers`."""

    step: str = "decoder_sparse_step"
    skip: str = "mlp_only_layers"

    def moe_layers(self, view: ConfigView) -> tuple[list[int], str]:
        total, step = layer_count(view, LAYERS), _int(view, self.step, 1)
        if step == 0:
            raise view.fail(self.step, "must be at least 1")
        skipped = (
            set(view.int_list(self.skip, view.raw(self.skip))) if view.has(self.skip) else set()
        )
        layers = [i for i in range(total) if (i + 1) % step == 0 and i not in skipped]
        return layers, f"every {self.step} = {step} layers, less {self.skip}"


@dataclass(frozen=True)
class Period:
    """Jamba: layer i is MoE when i % expert_layer_period == expert_layer_offset."""

    period: str = "expert_layer_period"
    offset: str = "expert_layer_offset"

    def moe_layers(self, view: ConfigView) -> tuple[list[int], str]:
        total = layer_count(view, LAYERS)
        period, offset = _int(view, self.period, 2), _int(view, self.offset, 1)
        if period == 0 or offset >= period:
            raise view.fail(self.offset, f"{offset} must be below {self.period} = {period}")
        layers = [i for i in range(total) if i % period == offset]
        return layers, f"layers i with i % {self.period} = {offset} ({self.offset})"


@dataclass(frozen=True)
class Window:
    """ERNIE 4.5: (i + 1) % interval == 0 and start <= i <= end."""

    start: str = "moe_layer_start_index"
    end: str = "moe_layer_end_index"
    interval: str = "moe_layer_interval"

    def moe_layers(self, view: ConfigView) -> tuple[list[int], str]:
        total = layer_count(view, LAYERS)
        start, interval = _int(view, self.start, 1), _int(view, self.interval, 1)
        end = _int(view, self.end, total - 1)
        if interval == 0:
            raise view.fail(self.interval, "must be at least 1")
        layers = [i for i in range(total) if (i + 1) % interval == 0 and start <= i <= end]
        return layers, f"layers {self.start} to {self.end}, every {self.interval}"


@dataclass(frozen=True)
class Listed:
    """Llama 4: the `moe_layers` list, else every `interleave_moe_layer_step`-th layer."""

    key: str = "moe_layers"
    step: str = "interleave_moe_layer_step"

    def moe_layers(self, view: ConfigView) -> tuple[list[int], str]:
        total = layer_count(view, LAYERS)
        if view.has(self.key) and view.raw(self.key) is not None:
            listed = view.int_list(self.key, view.raw(self.key))
            return sorted({i for i in listed if i < total}), f"the {self.key} list"
        step = _int(view, self.step, 1)
        if step == 0:
            raise view.fail(self.step, "must be at least 1")
        return list(range(step - 1, total, step)), f"every {self.step} = {step} layers"


@dataclass(frozen=True)
class DenseFirst:
    """The list a config class derives where mlp_layer_types is not given: the first
    `first` layers dense (that key's value, else `default`; no key: the class fixes
    `default`), then, with `freq`, only layers i with i % freq == 0 or, a list, freq[i] true
    (dots3 note's and A.X K2's moe_layer_freq)."""

    first: str | None
    default: int
    freq: str | None = None

    def moe_layers(self, view: ConfigView) -> tuple[list[int], str]:
        total = layer_count(view, LAYERS)
        dense = _int(view, self.first, self.default) if self.first else self.default
        how = f"layers from {self.first or 'the fixed'} {dense} on"
        freq = view.raw(self.freq) if self.freq and view.has(self.freq) else 1
        if type(freq) is list:
            flags = [bool(f) for f in freq]
            if len(flags) < total:
                raise view.fail(self.freq, f"a per-layer list of {len(flags)}, not {total}")
            return [i for i in range(dense, total) if flags[i]], f"{how} where {self.freq}"
        step = view.size(self.freq or "", freq)
        layers = [i for i in range(dense, total) if i % step == 0]
        return layers, how + (f", i % {self.freq} = 0" if self.freq else "")


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

    def moe_layers(self, view: ConfigView) -> tuple[list[int], str]:
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
        reasons = dict(self.others)
        for i, kind in enumerate(types):
            if kind != self.moe and kind not in reasons:
                known = ", ".join([self.moe, *reasons])
                raise view.fail(f"{self.key}[{i}]", f"{kind!r} is not a known type ({known})")
        layers = [i for i, kind in enumerate(types[:total]) if kind == self.moe]
        left = sorted({kind for kind in types[:total] if kind != self.moe})
        notes = "; ".join(f"{kind} layers left out: {reasons[kind]}" for kind in left)
        return layers, f"{self.key} '{self.moe}'" + (f" ({notes})" if notes else "")


LayerRule = AllLayers | FirstDense | SparseStep | Period | Window | Listed | Typed | DenseFirst


def ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    spans: list[list[int]] = []
    for i in layers:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
