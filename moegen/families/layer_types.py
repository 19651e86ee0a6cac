"""The kinds of rule (moegen.families.layer_rules) whose MoE layers come from a list of one
type a decoder layer: mlp_layer_types, which many config classes derive when config.json does
not give it, each in its own way (`fallback`), Step 3.7's legacy index list, Nemotron-H's
block types, and Gemma 4's switch for every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from moegen.families.layer_rules import (
    ABSENT,
    LAYERS,
    AllBut,
    AllLayers,
    ConfigReader,
    FirstDense,
    Layers,
    Listed,
    Period,
    SparseStep,
    Window,
    given,
)
from moegen.families.layer_set import LayerSet

HASH_MOE = "hash_moe"  # DeepSeek-V4's hash-routed layers: experts, but no router moegen has


def typed_layers(
    said: str, types: list[str], moe: str, others: tuple[tuple[str, str], ...], count: int
) -> Layers:
    """The layers whose type is `moe` (the types known: the reader checked them); the others
    are left out, each for its reason, said in the description. `said` names the list."""
    reasons = dict(others)
    layers = LayerSet.of(i for i, kind in enumerate(types) if kind == moe)
    hashed = LayerSet.of(i for i, kind in enumerate(types) if kind == HASH_MOE)
    left = sorted({kind for kind in types if kind != moe})
    notes = "; ".join(f"{kind} layers left out: {reasons[kind]}" for kind in left)
    how = f"{said} '{moe}'" + (f" ({notes})" if notes else "")
    return Layers(layers, how, count, hashed, listed=len(types))


@dataclass(frozen=True)
class FirstHashed:
    """DeepSeek-V4's mlp_layer_types where config.json has none: the first `key` layers (the
    legacy num_hash_layers; absent: `default`) hash-routed, the others top-k MoE layers."""

    key: str = "num_hash_layers"
    default: int = 3

    def moe_layers(self, reader: ConfigReader) -> Layers:
        total = reader.layer_count(LAYERS)
        hashed = reader.integer(self.key, self.default)
        how = f"layers from {reader.name(self.key)} = {hashed} on (those before: {HASH_MOE})"
        moe = LayerSet.span(range(hashed, total))
        return Layers(moe, how, total, LayerSet.span(range(min(hashed, total))))


@dataclass(frozen=True)
class Typed:
    """The layers whose `key` entry is `moe`; the other types are left out, each for the
    reason given in `others` (an unknown type is refused). Without the list (absent or
    null), `fallback` derives it as the config class does; no fallback: refused, the decoder
    layers index the list."""

    key: str
    moe: str
    others: tuple[tuple[str, str], ...]
    fallback: LayerRule | None = None

    def moe_layers(self, reader: ConfigReader) -> Layers:
        total = reader.layer_count(LAYERS)
        value = reader.raw(self.key)
        if self.fallback is not None and not given(value):
            found = self.fallback.moe_layers(reader)
            said = f"{reader.name(self.key)} not given: the config class derives it so"
            return replace(found, how=f"{found.how} ({said})")
        if value is ABSENT:
            raise reader.fail(self.key, "missing, and the family has no default for it")
        if value is None:
            raise reader.fail(
                self.key,
                "null: the config class derives no list from it, and "
                "its decoder layers read one entry per layer",
            )
        types = reader.types(self.key, value, (self.moe, *dict(self.others)))
        found = typed_layers(reader.name(self.key), types[:total], self.moe, self.others, total)
        return replace(found, listed=len(types))


@dataclass(frozen=True)
class IndexList:
    """Step 3.7's derivation of mlp_layer_types: the MoE layers' indices in the legacy `key`
    (a list, or a comma-separated string), else every layer from `first` on."""

    key: str = "moe_layers_enum"
    first: int = 3

    def moe_layers(self, reader: ConfigReader) -> Layers:
        total = reader.layer_count(LAYERS)
        value = reader.raw(self.key)
        if not given(value):
            how = f"layers from the fixed {self.first} on"
            return Layers(LayerSet.span(range(self.first, total)), how, total)
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",") if item.strip()]
            # ASCII digits, at most 10 (an index is below 2**31): int() of "²" or of 5,000
            # digits raises, where this is to refuse
            if not all(item.isascii() and item.isdigit() and len(item) <= 10 for item in items):
                raise reader.fail(self.key, f"must list layer indices, not {value[:60]!r}")
            value = [int(item) for item in items]
        listed = reader.layer_list(self.key, value)
        layers = LayerSet.of(i for i in listed if i < total)
        return Layers(layers, f"the {reader.name(self.key)} list", total)


@dataclass(frozen=True)
class Switched:
    """Gemma 4: every decoder layer builds the MoE block (beside its dense MLP) when the
    `flag` key is true; when it is false no layer has one, which is refused: there is
    nothing to map or load."""

    flag: str
    default: bool = False

    def moe_layers(self, reader: ConfigReader) -> Layers:
        total = reader.layer_count(LAYERS)
        if not reader.flag(self.flag, self.default):
            absent = (
                ""
                if reader.raw(self.flag) is not ABSENT
                else " (absent: the config class's default)"
            )
            raise reader.fail(
                self.flag,
                f"is false{absent}: no decoder layer builds the MoE block, so there is no "
                "MoE layer to map",
            )
        how = f"every decoder layer ({reader.name(self.flag)} true)"
        return Layers(LayerSet.span(range(total)), how, total)


# Nemotron-H's legacy pattern letters and the block type each stands for
NEMOTRON_LETTERS = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}


@dataclass(frozen=True)
class BlockPattern:
    """Nemotron-H: one block type per decoder layer, the first of `keys` given, else the
    legacy `pattern` string (a letter a layer), else the config class's default; a layer is
    MoE where its type is `moe`. The decoder-layer count is the list's length (the config
    class ignores num_hidden_layers)."""

    keys: tuple[str, ...]
    pattern: str
    default: tuple[str, ...]
    moe: str
    others: tuple[tuple[str, str], ...]

    def types(self, reader: ConfigReader) -> tuple[list[str], str]:
        """The block types and how the description names where they came from."""
        key = next((k for k in self.keys if given(reader.raw(k))), None)
        if key is not None:
            known = (self.moe, *dict(self.others))
            return reader.types(key, reader.raw(key), known), reader.name(key)
        text = reader.raw(self.pattern)
        if not given(text):
            return list(
                self.default
            ), f"{reader.name(self.keys[0])} (absent: the config class's default)"
        text = reader.text(self.pattern, text)
        for i, letter in enumerate(text):
            if letter not in NEMOTRON_LETTERS:
                known = ", ".join(NEMOTRON_LETTERS)
                where = f"{self.pattern}[{i}]"
                raise reader.fail(where, f"{letter!r} is not a block letter ({known})")
        return [NEMOTRON_LETTERS[letter] for letter in text], reader.name(self.pattern)

    def moe_layers(self, reader: ConfigReader) -> Layers:
        types, said = self.types(reader)
        return typed_layers(said, types, self.moe, self.others, len(types))


LayerRule = (
    AllLayers
    | FirstDense
    | SparseStep
    | AllBut
    | Period
    | Window
    | Listed
    | FirstHashed
    | Typed
    | IndexList
    | Switched
    | BlockPattern
)


def count_key(rule: LayerRule) -> str:
    """The key of the decoder-layer count the rule reads (where a caller looks for it)."""
    if isinstance(rule, Typed) and rule.fallback is not None:
        return count_key(rule.fallback)  # the list's length is the count the fallback reads
    return rule.count if isinstance(rule, AllLayers) else LAYERS
