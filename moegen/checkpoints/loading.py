"""Load one layer of a published MoE checkpoint into a generated module's parameters.

    from moegen.checkpoints import load_layer_params
    params = load_layer_params(module, "path/to/checkpoint", layer=3, family="mixtral", mesh=mesh)
    y, aux = module.moe_layer(params, x)

`module` is an imported generated module: its PARAM_SHAPES, PARAM_SPECS, PARAM_DTYPE, sizes and
make_mesh() say what to build (generated modules import nothing of moegen; this package reads
their constants). The checkpoint is a safetensors one, single-file or sharded, in either of the
family's layouts (moegen.families.layouts). Each parameter is a global jax.Array sharded by
PARAM_SPECS over the mesh and built with jax.make_array_from_callback: each device's callback
reads only its own region of the checkpoint tensors (transposed, or split out of a fused gate/up
tensor, from the matching region of the source), cast to PARAM_DTYPE. In a multi-process run
each process reads only the shards of its own devices.

A checkpoint that does not fit the module is refused before anything is read, with a
CheckpointError naming the key, the file and the fix (`match.py`). This package imports
neither torch nor transformers; it needs safetensors (the `checkpoints` extra).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from moegen.checkpoints.match import Match, Target, check_config, family_named, match_layer
from moegen.checkpoints.reader import Checkpoint, CheckpointError
from moegen.families import AXIS_NAMES, PARAM_AXES, Source, full_key

MAX_LAYER = 1 << 20


def load_layer_params(
    module: ModuleType,
    path: str | os.PathLike[str],
    *,
    layer: int,
    family: str | None = None,
    mesh: Mesh | None = None,
) -> dict[str, jax.Array]:
    """Layer `layer`'s MoE weights from the checkpoint at `path`, as `module`'s params.

    family: the checkpoint's family (transformers' model_type, e.g. "mixtral", "qwen3_moe",
    "deepseek_v3"; FAMILIES lists them); None takes config.json's model_type.
    mesh: the mesh to shard over (default module.make_mesh()).
    Raises CheckpointError when the checkpoint does not fit the module, saying why.
    """
    target = module_target(module)
    _check_layer(layer)
    with Checkpoint(path) as ckpt:
        found = _match(ckpt, target, layer, family)
        if mesh is None:
            mesh = module.make_mesh()
        if not isinstance(mesh, Mesh):
            raise CheckpointError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        return {
            name: _build(ckpt, found.block, name, found.sources[name], target, mesh)
            for name in target.shapes
        }


def match_checkpoint(
    module: ModuleType, path: str | os.PathLike[str], *, layer: int, family: str | None = None
) -> Match:
    """Which tensors load_layer_params would read for each parameter (nothing is read)."""
    target = module_target(module)
    _check_layer(layer)
    with Checkpoint(path) as ckpt:
        return _match(ckpt, target, layer, family)


def _check_layer(layer: Any) -> None:
    if type(layer) is not int or not 0 <= layer < MAX_LAYER:
        raise CheckpointError(f"layer must be an integer in [0, {MAX_LAYER}), got {layer!r:.80}")


def _match(ckpt: Checkpoint, target: Target, layer: int, family: str | None) -> Match:
    chosen = family_named(family, ckpt.config, ckpt.config_path)
    check_config(chosen, ckpt, target, layer)
    return match_layer(chosen, ckpt, target, layer)


def module_target(module: Any) -> Target:
    """What `module` (a generated moegen module) needs, read from its constants."""
    constants = {}
    for name in (
        "PARAM_SHAPES",
        "PARAM_SPECS",
        "PARAM_DTYPE",
        "NUM_EXPERTS",
        "EMBED_DIM",
        "FFN_DIM",
        "TOP_K",
    ):
        if not hasattr(module, name):
            raise CheckpointError(
                f"{getattr(module, '__name__', module)!r} is not a generated moegen module: it has "
                f"no {name}"
            )
        constants[name] = getattr(module, name)
    if hasattr(module, "LATENT_DIM"):
        raise CheckpointError(
            f"the module's experts run in a latent width (LATENT_DIM = {module.LATENT_DIM!r:.40}, "
            "layer.latent_dim) and no checkpoint family this loader knows has latent "
            "projections (Nemotron-H's checkpoints are not among its layouts); start from "
            "init_params, or remove layer.latent_dim"
        )
    shapes: Mapping[str, tuple[int, ...]] = constants["PARAM_SHAPES"]
    sizes = {"e": module.NUM_EXPERTS, "d": module.EMBED_DIM, "f": module.FFN_DIM}
    if hasattr(module, "SHARED_FFN_DIM"):
        sizes["s"] = module.SHARED_FFN_DIM
    for name, shape in shapes.items():
        axes = PARAM_AXES.get(name)
        if axes is None:
            raise CheckpointError(
                f"the module has params[{name!r}], which this loader does not know how to fill; "
                f"it knows {', '.join(PARAM_AXES)} (is moegen older than the module?)"
            )
        expected = tuple(sizes.get(axis, -1) for axis in axes)
        if tuple(shape) != expected:
            raise CheckpointError(
                f"the module's PARAM_SHAPES[{name!r}] is {list(shape)}, not "
                f"[{', '.join(AXIS_NAMES[a] for a in axes)}] = {list(expected)}"
            )
    return Target(
        shapes={name: tuple(shape) for name, shape in shapes.items()},
        specs=constants["PARAM_SPECS"],
        sizes=sizes,
        dtype=np.dtype(constants["PARAM_DTYPE"]),
        constants={
            name: constants[name] for name in ("NUM_EXPERTS", "EMBED_DIM", "FFN_DIM", "TOP_K")
        },
    )


def _build(
    ckpt: Checkpoint, block: str, name: str, source: Source, target: Target, mesh: Mesh
) -> jax.Array:
    sharding = NamedSharding(mesh, target.specs[name])
    read = region_reader(ckpt, block, name, source, target)
    return array_from_regions(target.shapes[name], sharding, read, name)


Region = tuple[tuple[int, int], ...]  # (start, stop) along each axis of a parameter


def region_reader(
    ckpt: Checkpoint, block: str, name: str, source: Source, target: Target
) -> Callable[[Region], np.ndarray]:
    """region -> that region of params[name], read from the checkpoint and cast to the
    module's dtype: only the matching region of each source tensor is read."""
    axes = PARAM_AXES[name]

    def fetch(key: str, index: tuple[slice, ...]) -> np.ndarray:
        return ckpt.read(full_key(block, key), index)

    def read(region: Region) -> np.ndarray:
        found = source.read(fetch, dict(zip(axes, region, strict=True)), target.sizes, axes)
        return np.ascontiguousarray(found.astype(target.dtype, copy=False))

    return read


def array_from_regions(
    shape: tuple[int, ...],
    sharding: NamedSharding,
    read: Callable[[Region], np.ndarray],
    name: str,
) -> jax.Array:
    """A global array of `shape` placed by `sharding`, each device's shard `read` from its
    own region; devices that hold the same region (replicas) read it once."""
    cache: dict[Region, np.ndarray] = {}

    def region_of(index: tuple[slice, ...]) -> Region:
        region = []
        for part, size in zip(index, shape, strict=True):
            start, stop, step = part.indices(size)
            if step != 1:
                raise AssertionError(f"{name}: a shard with step {step}")
            region.append((start, stop))
        return tuple(region)

    def callback(index: tuple[slice, ...]) -> np.ndarray:
        region = region_of(index)
        if region not in cache:
            cache[region] = read(region)
        return cache[region]

    try:
        return jax.make_array_from_callback(shape, sharding, callback)
    finally:
        cache.clear()
