"""Load every MoE layer of a published checkpoint at once: a whole model's MoE parameters.

    from moegen.checkpoints import load_model_params
    by_layer = load_model_params(module, "path/to/model", mesh=mesh)  # {3: params, 4: ...}
    layers, stacked = load_model_params(module, "path/to/model", mesh=mesh, stacked=True)

`layers=None` loads every MoE layer of the model. Which layers those are comes from config.json
(`schedule.py`, running the `layers` rule of the family's entry in the family table,
moegen.families, which `moegen init --from-hf` reads too: first_k_dense_replace,
decoder_sparse_step, mlp_only_layers, moe_layers, mlp_layer_types, ... as the family's
transformers decoder layer reads them), and is cross-checked against the checkpoint's tensors: a
layer config.json makes an MoE layer without expert tensors, or expert tensors in a layer it
makes dense or beyond its layer count, is a CheckpointError naming both. Without config.json,
the layers holding expert tensors are the MoE layers. DeepSeek-V4's hash-routed layers are MoE
layers moegen cannot run: `layers=None` leaves them out (the keys say which layers came back)
and asking for one is refused.

Every layer is matched (`match.py`) before anything is read, so a load either returns every
layer asked for or reads nothing. Each parameter is built as load_layer_params builds it: each
device's callback reads only its own region of the checkpoint. With `stacked=True` each
parameter has a leading layer axis, unsharded (PARAM_SPECS[name] after it), for a
scan-over-layers model; `StackedParams.layers` says which checkpoint layer each index holds.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from moegen.checkpoints import loading
from moegen.checkpoints.families import Loadable
from moegen.checkpoints.loading import (
    MAX_LAYER,
    array_from_regions,
    module_target,
    region_reader,
)
from moegen.checkpoints.match import (
    Match,
    Target,
    check_config,
    check_model_type,
    family_named,
    match_layer,
    moe_layers_in,
    ranges,
)
from moegen.checkpoints.reader import Checkpoint, CheckpointError
from moegen.checkpoints.schedule import DENSE, HASH, MOE, Schedule, schedule_of

Params = dict[str, jax.Array]


class StackedParams(NamedTuple):
    """Every loaded layer's parameters stacked: params[name][k] is layer layers[k]'s."""

    layers: tuple[int, ...]  # the checkpoint's layer index of each position of the layer axis
    params: Params  # name -> [len(layers), *PARAM_SHAPES[name]]


def load_model_params(
    module: ModuleType,
    path: str | os.PathLike[str],
    *,
    layers: Sequence[int] | None = None,
    family: str | None = None,
    mesh: Mesh | None = None,
    stacked: bool = False,
) -> dict[int, Params] | StackedParams:
    """Every MoE layer's weights from the checkpoint at `path`, as `module`'s params.

    layers: the layer indices to load, in the order wanted (a list, tuple or range); None
    loads every MoE layer of the model, in ascending order (see `find_moe_layers`).
    family, mesh: as for load_layer_params.
    stacked: False returns {layer: params}; True returns StackedParams(layers, params) with a
    leading layer axis on each parameter (unsharded; PARAM_SPECS shards the others).
    Raises CheckpointError before anything is read when a layer asked for is not an MoE layer
    of the checkpoint, or when any layer does not fit the module, saying why.
    """
    target = module_target(module)
    asked = _layers_argument(layers)
    if type(stacked) is not bool:
        raise CheckpointError(f"stacked must be True or False, got {stacked!r:.80}")
    with Checkpoint(path) as ckpt:
        chosen = family_named(family, ckpt.config, ckpt.config_path)
        model_layers = _model_moe_layers(chosen, ckpt)
        wanted = model_layers.loadable if asked is None else model_layers.check(asked)
        matches = [_match(chosen, ckpt, target, layer) for layer in wanted]
        if mesh is None:
            mesh = module.make_mesh()
        if not isinstance(mesh, Mesh):
            raise CheckpointError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        if stacked:
            return StackedParams(wanted, _stacked(ckpt, matches, target, mesh))
        return {
            layer: {
                name: loading._build(ckpt, found.block, name, found.sources[name], target, mesh)
                for name in target.shapes
            }
            for layer, found in zip(wanted, matches, strict=True)
        }


def find_moe_layers(path: str | os.PathLike[str], *, family: str | None = None) -> tuple[int, ...]:
    """The layers load_model_params(layers=None) would load: config.json's MoE layers, checked
    against the checkpoint's tensors (no weight is read)."""
    with Checkpoint(path) as ckpt:
        return _model_moe_layers(family_named(family, ckpt.config, ckpt.config_path), ckpt).loadable


def _match(family: Loadable, ckpt: Checkpoint, target: Target, layer: int) -> Match:
    check_config(family, ckpt, target, layer)
    return match_layer(family, ckpt, target, layer)


def _layers_argument(layers: Any) -> tuple[int, ...] | None:
    """`layers` as a tuple of distinct indices, refused before the checkpoint is opened."""
    if layers is None:
        return None
    if not isinstance(layers, list | tuple | range):
        raise CheckpointError(
            f"layers must be a list of layer indices (or None for every MoE layer), got "
            f"{type(layers).__name__} {layers!r:.80}"
        )
    if not layers:
        raise CheckpointError("layers is empty; pass None to load every MoE layer")
    for layer in layers:
        if type(layer) is not int or not 0 <= layer < MAX_LAYER:
            raise CheckpointError(
                f"layers must hold integers in [0, {MAX_LAYER}), got {layer!r:.80} in "
                f"{layers!r:.80}"
            )
    twice = sorted(layer for layer, times in Counter(layers).items() if times > 1)
    if twice:
        raise CheckpointError(f"layers lists {twice} more than once; list each layer once")
    return tuple(layers)


class _ModelLayers(NamedTuple):
    """The MoE layers of a checkpoint, config.json's and the tensors' agreeing."""

    schedule: Schedule
    moe: tuple[int, ...]  # every MoE layer, hash-routed ones included
    where: str  # the checkpoint, for messages

    @property
    def loadable(self) -> tuple[int, ...]:
        found = tuple(layer for layer in self.moe if self.schedule.kind(layer) == MOE)
        if not found:
            raise CheckpointError(
                f"{self.where}: no MoE layer moegen can load ({self.schedule.rule}; "
                f"MoE layers: {ranges(self.moe) if self.moe else 'none'})"
            )
        return found

    def check(self, asked: tuple[int, ...]) -> tuple[int, ...]:
        """`asked`, after refusing any layer that is not a loadable MoE layer."""
        count, rule = self.schedule.count, self.schedule.rule
        moe = ranges(self.moe) if self.moe else "none"
        for layer in asked:
            if count is not None and layer >= count:
                mtp = layer < count + self.schedule.extra
                raise CheckpointError(
                    f"{self.where}: layer {layer} is out of range: the model has {count} "
                    f"layers (0-{count - 1})"
                    + (
                        "; it is a multi-token-prediction module (num_nextn_predict_layers), "
                        "not a decoder layer: load it alone with load_layer_params"
                        if mtp
                        else ""
                    )
                )
            if layer not in self.moe:
                what = "has no expert weights" if count is None else "is a dense layer"
                raise CheckpointError(
                    f"{self.where}: layer {layer} {what}, not an MoE layer ({rule}); the MoE "
                    f"layers are {moe}"
                )
            if self.schedule.kind(layer) == HASH:
                raise CheckpointError(
                    f"{self.where}: layer {layer} is hash-routed ({rule}), which moegen's "
                    f"routers do not do; its top-k layers are {ranges(self.loadable)}"
                )
        return asked


def _model_moe_layers(family: Loadable, ckpt: Checkpoint) -> _ModelLayers:
    """The model's MoE layers by config.json, refused where the tensors disagree."""
    if ckpt.config is not None:  # a wrong family would misread config.json's layer keys
        check_model_type(family, ckpt.config, ckpt.config_path)
    schedule = schedule_of(family, ckpt.config, ckpt.config_path)
    found = moe_layers_in(family, ckpt)
    where, count = ckpt.description, schedule.count
    if count is None:  # no layer count: the tensors say which, the rule must agree
        listed, in_model = found, found
    else:
        listed = [i for i in range(count) if schedule.kind(i) != DENSE]
        in_model = [i for i in found if i < count]
        beyond = [i for i in found if i >= count + schedule.extra]
        if beyond:
            raise CheckpointError(
                f"{where}: the checkpoint holds {family.title} expert weights for layer(s) "
                f"{ranges(beyond)}, but config.json gives the model {count} layers: "
                "config.json is not this checkpoint's"
            )
    dense = [i for i in in_model if schedule.kind(i) == DENSE]
    if dense:
        raise CheckpointError(
            f"{where}: the checkpoint holds {family.title} expert weights in layer(s) "
            f"{ranges(dense)}, which config.json makes dense ({schedule.rule}): "
            "config.json is not this checkpoint's, or the family is wrong"
        )
    missing = sorted(set(listed) - set(found))
    if missing:
        raise CheckpointError(
            f"{where}: config.json makes layer(s) {ranges(missing)} MoE layers "
            f"({schedule.rule}) but the checkpoint has no {family.title} expert weights for "
            f"them (looked for {_marker(family, missing[0])}); the checkpoint is incomplete "
            "(a shard left out of the index?) or config.json is not its own"
        )
    return _ModelLayers(schedule, tuple(listed), where)


def _marker(family: Loadable, layer: int) -> str:
    """The key whose presence makes `layer` an MoE layer (as moe_layers_in looks for it)."""
    prefix = family.layers[0].format(L=layer)
    return " or ".join(
        f"{prefix}{layout.block}.{layout.params['w_down'].key_of(0)}" for layout in family.layouts
    )


def _stacked(ckpt: Checkpoint, matches: list[Match], target: Target, mesh: Mesh) -> Params:
    """Each parameter with a leading, unsharded layer axis: a device's callback reads its
    region of each layer's tensors and stacks them."""
    out = {}
    for name, shape in target.shapes.items():
        readers = [
            region_reader(ckpt, found.block, name, found.sources[name], target) for found in matches
        ]

        def read(region: loading.Region, readers: list[Any] = readers) -> np.ndarray:
            (first, stop), inner = region[0], region[1:]
            return np.stack([readers[k](inner) for k in range(first, stop)])

        sharding = NamedSharding(mesh, PartitionSpec(None, *target.specs[name]))
        out[name] = array_from_regions((len(matches), *shape), sharding, read, name)
    return out
