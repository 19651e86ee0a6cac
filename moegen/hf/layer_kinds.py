"""The kinds of a model's MoE layers (layers whose spec choices are the same), found without
running the rules once a layer: num_hidden_layers may be 2**31 - 1.

A layer's choices depend on the layer only through the values the rules read for it: the
element of a per-layer list (`at_layer`) and its per_layer_config entry (`layer_override`).
Layers that read the same values get the same choices, so the layers are grouped by those
values (their signature) and the rules run once a group, on its first layer. Which keys the
rules read is learnt by running them (a Switch reads the keys of the case it picks): the
grouping is redone whenever a run reads a key it did not know, until nothing new is read.

Layers past the longest per-layer list and without a per_layer_config entry read the same
values, one group whatever its size (a run of a LayerSet); the others are single layers,
as many as the file spells out, and refused past MAX_LAYERS (moegen.families.config_file).

The rules run in ascending order of first layer, as they did one layer at a time, so the
first refusal and each kind's comments (its first layer's) are the same as then.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from moegen.families import MISSING, Choice, ConfigView, HfConfigError, LayerSet
from moegen.hf.layers import per_layer_bound

# Specs one config.json may make (one a kind): real models have one to three (Hunyuan's
# per-layer top-k, Step 3.7's clamped layers); a file that makes more writes a folder of
# specs nobody asked for.
MAX_KINDS = 64

Choose = Callable[[ConfigView, int], tuple[Choice, ...]]
Outcome = tuple[Choice, ...] | HfConfigError
Kind = tuple[tuple[Choice, ...], LayerSet]  # a kind's choices (its first layer's) and layers


@dataclass(frozen=True)
class _Traced(ConfigView):
    """The view, noting each key the rules read (has, raw and per_layer_config look-ups)."""

    read: set[str] = field(default_factory=set, compare=False)

    def raw(self, key: str) -> Any:
        self.read.add(key)
        return super().raw(key)

    def layer_override(self, key: str, layer: int) -> Any:
        self.read.add(key)
        return super().layer_override(key, layer)


def layer_kinds(view: ConfigView, moe: LayerSet, choose: Choose) -> list[Kind]:
    """[(choices, layers)] of each kind, in order of its first layer; HfConfigError for the
    first layer the rules refuse."""
    traced = _Traced(view.file, view.data, view.prefix)
    overrides = {i: o for i, o in view.overrides.items() if i in moe}
    per_layer_bound(view, "per_layer_config", len(overrides))
    done: dict[int, Outcome] = {}
    keys: frozenset[str] = frozenset()
    while True:
        groups = _groups(view, moe, overrides, keys)
        grown = _run(groups, done, traced, overrides, keys, choose)
        if grown is None:
            return _kinds(groups, done)
        keys = grown


def _relevant(traced: _Traced, overrides: Mapping[int, Any]) -> frozenset[str]:
    """The keys read that set a layer apart: per-layer lists, and with per_layer_config any
    key (an entry may override it)."""
    if overrides:
        return frozenset(traced.read)
    return frozenset(key for key in traced.read if type(traced.raw(key)) is list)


def _run(
    groups: dict[int, LayerSet],
    done: dict[int, Outcome],
    traced: _Traced,
    overrides: Mapping[int, Any],
    keys: frozenset[str],
    choose: Choose,
) -> frozenset[str] | None:
    """Each group's first layer's choices (kept in `done`); the keys now known when a run read
    one that regroups the layers (None: none did), else the first refusal raised. Kinds are
    counted as they come: each is a real layer's, so past MAX_KINDS the file is refused
    without running the rules for the rest."""
    kinds: set[str] = set()
    for first in sorted(groups):
        if first not in done:
            try:
                done[first] = choose(traced, first)
            except HfConfigError as err:
                done[first] = err
        grown = _relevant(traced, overrides)
        if not grown <= keys:
            return keys | grown
        outcome = done[first]
        if isinstance(outcome, HfConfigError):
            raise outcome
        kinds.add(_kind_key(outcome))
        if len(kinds) > MAX_KINDS:
            raise HfConfigError(
                f"{traced.file}: its MoE layers differ in more than {MAX_KINDS} ways (layer "
                f"{first} starts kind {MAX_KINDS + 1}): moegen writes one spec a kind, at "
                f"most {MAX_KINDS} (real models have one to three)"
            )
    return None


def _kind_key(choices: tuple[Choice, ...]) -> str:
    """What makes two layers one kind: their fields' values (not the comments)."""
    return json.dumps([(c.field, c.value) for c in choices], sort_keys=True)


def _groups(
    view: ConfigView, moe: LayerSet, overrides: Mapping[int, Mapping[str, Any]], keys: frozenset
) -> dict[int, LayerSet]:
    """{first layer: layers} of the layers that read the same values of `keys`."""
    lists = [(key, value) for key in sorted(keys) if type(value := view.raw(key)) is list]
    bound = max((len(value) for _, value in lists), default=0)
    head = moe.below(bound)
    if lists:
        longest = max(lists, key=lambda item: len(item[1]))[0]
        per_layer_bound(view, longest, len(head))
    alike: dict[tuple, list[int]] = {}
    for layer in sorted({*head, *overrides}):
        values = tuple(_frozen(v[layer]) if layer < len(v) else None for _, v in lists)
        entry = overrides.get(layer)
        own = None if entry is None else tuple(_frozen(entry.get(k, MISSING)) for k in sorted(keys))
        alike.setdefault((values, own), []).append(layer)
    groups = {layers[0]: LayerSet.of(layers) for layers in alike.values()}
    tail = moe.from_(bound).without(overrides)  # reads no list element, no entry: one group
    if tail:
        groups[tail.first()] = tail
    return groups


def _frozen(value: Any) -> str | None:
    """A value as comparable text: JSON tells 1, 1.0 and true apart, which == does not."""
    return None if value is MISSING else json.dumps(value, sort_keys=True)


def _kinds(groups: dict[int, LayerSet], done: dict[int, Outcome]) -> list[Kind]:
    found: dict[str, tuple[tuple[Choice, ...], list[LayerSet]]] = {}
    for first in sorted(groups):
        choices = done[first]
        assert not isinstance(choices, HfConfigError), "raised by _run"
        found.setdefault(_kind_key(choices), (choices, []))[1].append(groups[first])
    return [(choices, LayerSet.joined(sets)) for choices, sets in found.values()]
