"""A generated moegen layer as a Flax NNX module.

    import generated.mixtral_small_cpu as moe
    from moegen.nnx import MoELayer

    mesh = moe.make_mesh(jax.devices()[: moe.NUM_DEVICES])
    layer = MoELayer(moe, rngs=nnx.Rngs(0), mesh=mesh)
    y, aux = layer(x)                          # moe.moe_layer(params, x, mesh=mesh)

`MoELayer` wraps any generated module, reading only its constants (PARAM_SHAPES,
PARAM_SPECS, PARAM_DTYPE, INIT_SCALES, MESH_AXES, MESH_SHAPE) and calling its public
functions; generated modules stay jax-only and import nothing of moegen or flax.

Each parameter is an attribute named as in PARAM_SHAPES (`layer.w_gate`, `layer.router`, ...),
an `nnx.Param` of the module's shape and dtype whose `out_sharding` metadata holds the mesh
axis names of PARAM_SPECS, so `nnx.get_partition_spec(nnx.state(layer))` gives PARAM_SPECS
back and `nnx.jit`, `nnx.Optimizer` and orbax checkpointing of `nnx.state(model)` see the
layout without extra code. Values start as the module's `init_params` draws them: one key
from `rngs.params()`, split over PARAM_SHAPES in order, normal with std INIT_SCALES[name],
zeros where the scale is 0, ones for INIT_ONES (norm weights and scales). `routing_bias`
(specs with router.routing_bias) is a `RoutingBias`, a Variable that is not a Param:
`nnx.Optimizer(model, tx, wrt=nnx.Param)` and `nnx.grad` over `nnx.Param` leave it alone,
and `layer.update_routing_bias(aux.tokens_per_expert, rate)` applies the module's
aux-loss-free balancing step to it.

Pretrained weights replace the initial ones with `layer.load_params(params)`, e.g. params =
`moegen.checkpoints.load_layer_params(moe, path, layer=3, mesh=mesh)`, or make the layer
from them without drawing initial values: one per MoE layer of a model,
`{i: MoELayer.from_params(moe, p, mesh=mesh) for i, p in load_model_params(moe, path).items()}`.

The mesh is the one passed, or else the one set by `jax.set_mesh` (the usual NNX pattern:
create the model inside `nnx.jit` under the mesh, and every parameter is created already
sharded; there only the abstract mesh is known, so `layer.mesh` is None and moe_layer takes
x's). It must have every axis of the layer's mesh with the layer's size; whether a mesh with
more axes is accepted is the module's moe_layer's decision. Each Variable also carries the
mesh as metadata, so `nnx.Optimizer` can create its state outside a mesh context.

This module needs flax (the `flax` extra); it is a runtime library, not a pipeline stage.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["MoELayer", "RoutingBias"]

# What MoELayer reads of a generated module.
REQUIRED = (
    "PARAM_SHAPES",
    "PARAM_SPECS",
    "PARAM_DTYPE",
    "INIT_SCALES",
    "INPUT_SHAPE",
    "MESH_AXES",
    "MESH_SHAPE",
    "NUM_DEVICES",
    "make_mesh",
    "moe_layer",
)
BIAS = "routing_bias"
Params = dict[str, jax.Array]


class RoutingBias(nnx.Variable):
    """The router's balancing bias [NUM_EXPERTS]: it only steers expert selection (its
    gradient is zero), so it is no `nnx.Param` and no optimizer over `nnx.Param` updates it;
    `MoELayer.update_routing_bias` does."""


@dataclass(frozen=True, eq=False)
class _Generated:
    """The generated module, held as static data of the layer: equal (and hashed) by the
    module's identity, so layers of one module share nnx.jit compilations, and not copied by
    copy.deepcopy (Python modules cannot be)."""

    module: ModuleType

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Generated) and other.module is self.module

    def __hash__(self) -> int:
        return id(self.module)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Generated:
        return self


class MoELayer(nnx.Module):
    """One generated MoE layer: `layer(x) -> (y, aux)` is `module.moe_layer(params, x)`.

    Args:
      module: the imported generated module (e.g. `import generated.mixtral_small_cpu`).
      rngs: where the initial values' key comes from (`rngs.params()`).
      mesh: a `jax.sharding.Mesh` with the layer's axes and sizes (e.g.
        `module.make_mesh(jax.devices()[: module.NUM_DEVICES])`); None takes the mesh set by
        `jax.set_mesh`.
    """

    def __init__(self, module: ModuleType, *, rngs: nnx.Rngs, mesh: Mesh | None = None) -> None:
        _check_module(module)
        if not isinstance(rngs, nnx.Rngs):
            raise TypeError(f"rngs must be an nnx.Rngs, e.g. nnx.Rngs(0); got {_kind(rngs)}")
        self._generated = _Generated(module)
        self.mesh = _check_mesh(module, mesh)
        values = _initializer(self._generated, self.mesh)(rngs.params())
        for name, value in values.items():
            setattr(self, name, _variable(module, name, value, self.mesh))

    @classmethod
    def from_params(
        cls, module: ModuleType, params: Mapping[str, Any], *, mesh: Mesh | None = None
    ) -> MoELayer:
        """A layer holding `params` (as `load_params` takes them, e.g. one layer of
        `moegen.checkpoints.load_model_params`), made without drawing initial values: the
        layer is built abstractly (`nnx.eval_shape`), then given `params`. Call it outside
        `nnx.jit`; mesh as for `MoELayer(...)`."""
        _check_module(module)
        mesh = _check_mesh(module, mesh)
        if mesh is None:  # only the abstract mesh is known: inside jit, nothing to place on
            raise ValueError("from_params places concrete values: call it outside nnx.jit")
        layer = nnx.eval_shape(lambda: cls(module, rngs=nnx.Rngs(0), mesh=mesh))
        layer.load_params(params)
        return layer

    @property
    def module(self) -> ModuleType:
        """The generated module this layer runs."""
        return self._generated.module

    def __call__(self, x: jax.Array) -> tuple[jax.Array, Any]:
        """y, aux = module.moe_layer(params, x): x is [BATCH, SEQ_LEN, EMBED_DIM] of
        COMPUTE_DTYPE (see the module's INPUT_SHAPE and input_sharding), or of a shape
        variant's shape (its VARIANT_LAYERS), which moe_layer dispatches on x.shape."""
        return self.module.moe_layer(self.param_dict(), x, mesh=self.mesh)

    def param_dict(self) -> Params:
        """The current values as the module's params dict (PARAM_SHAPES order)."""
        return {name: getattr(self, name).get_value() for name in self.module.PARAM_SHAPES}

    def load_params(self, params: Mapping[str, Any]) -> None:
        """Replace every value, e.g. with what `moegen.checkpoints.load_layer_params` returns.

        `params` must have exactly the module's PARAM_SHAPES keys, shapes and PARAM_DTYPE;
        each value is placed as PARAM_SPECS says on the layer's mesh (no copy when it already
        is). Call it outside `nnx.jit`.
        """
        shapes = self.module.PARAM_SHAPES
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be a dict of name -> array, got {_kind(params)}")
        missing, extra = sorted(set(shapes) - set(params)), sorted(set(params) - set(shapes))
        if missing or extra:
            raise ValueError(
                f"params must have exactly the keys {sorted(shapes)} (the module's PARAM_SHAPES);"
                f" missing {missing}, unexpected {extra}"
            )
        dtype = jnp.dtype(self.module.PARAM_DTYPE)
        for name, shape in shapes.items():
            got, want = params[name], tuple(shape)
            got_shape, got_dtype = tuple(getattr(got, "shape", ())), getattr(got, "dtype", None)
            if got_shape != want or got_dtype != dtype:
                cast = "; cast it with .astype(module.PARAM_DTYPE)" if got_shape == want else ""
                raise ValueError(
                    f"params[{name!r}]: expected {dtype.name}{list(shape)}, got "
                    f"{got_dtype}{list(got_shape)}{cast}"
                )
        traced = [*params.values(), *self.param_dict().values()]
        if any(isinstance(value, jax.core.Tracer) for value in traced):
            raise ValueError("load_params replaces concrete values: call it outside nnx.jit")
        for name in shapes:
            variable = getattr(self, name)
            variable.set_value(jax.device_put(params[name], _sharding_of(variable, self.mesh)))

    def update_routing_bias(self, tokens_per_expert: jax.Array, rate: float | jax.Array) -> None:
        """One aux-loss-free balancing step on `routing_bias`, in place: the module's
        `update_routing_bias(bias, aux.tokens_per_expert, rate)`. Call it once per training
        step (inside or outside `nnx.jit`) with the aux of that step's forward."""
        if not hasattr(self.module, "update_routing_bias") or BIAS not in self.module.PARAM_SHAPES:
            raise ValueError(
                f"{_name(self.module)} has no routing bias to update: its spec has no "
                "router.routing_bias (set it to true and rebuild to use aux-loss-free balancing)"
            )
        bias: RoutingBias = getattr(self, BIAS)
        bias.set_value(self.module.update_routing_bias(bias.get_value(), tokens_per_expert, rate))


def _name(module: Any) -> str:
    return getattr(module, "__name__", "the module")


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.60}"


def _check_module(module: Any) -> None:
    """A generated module (not its name, a path, or one of its functions)."""
    if isinstance(module, str | PurePath):
        raise TypeError(
            f"module must be the imported generated module, not {_kind(module)}: "
            "import it first (importlib.import_module('generated.NAME'))"
        )
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        raise TypeError(
            f"module must be a generated moegen module (e.g. `import generated.NAME as moe`); "
            f"{_kind(module)} has no {', '.join(missing)}"
            + ("; pass the module itself, not one of its functions" if callable(module) else "")
        )
    reserved = [name for name in module.PARAM_SHAPES if hasattr(MoELayer, name) or name in _OWN]
    if reserved:  # a future parameter name that would shadow an attribute of the layer
        raise TypeError(f"{_name(module)}: parameter names {reserved} clash with MoELayer's")


_OWN = ("module", "mesh", "_generated")


def _layer_mesh(module: ModuleType) -> dict[str, int]:
    return dict(zip(module.MESH_AXES, module.MESH_SHAPE, strict=True))


def _check_mesh(module: ModuleType, mesh: Any) -> Mesh | None:
    """The mesh given, or else the one jax.set_mesh set (concrete outside jit; None inside,
    where only its abstract form is known), after checking it has the layer's axes."""
    fix = f"module.make_mesh(jax.devices()[:{module.NUM_DEVICES}])"
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh such as {fix}, got {_kind(mesh)}")
    found = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    if found.empty:
        raise ValueError(
            f"MoELayer needs a mesh: pass mesh={fix}, or create the layer under "
            "`with jax.set_mesh(mesh):`"
        )
    sizes = dict(zip(found.axis_names, found.axis_sizes, strict=True))
    wrong = {axis: size for axis, size in _layer_mesh(module).items() if sizes.get(axis) != size}
    if wrong:
        raise ValueError(
            f"mesh {sizes} does not fit {_name(module)}: it needs the axes "
            f"{_layer_mesh(module)} (wrong or missing: {sorted(wrong)}); build the mesh "
            f"with {fix}"
        )
    if mesh is None:
        try:
            mesh = jax.sharding.get_mesh()  # the concrete mesh, outside jit only
        except ValueError:
            return None
    return None if mesh.empty else mesh


@functools.cache
def _initializer(generated: _Generated, mesh: Mesh | None) -> Callable[[jax.Array], Params]:
    """key -> the initial values, as module.init_params(key, mesh) draws them; jitted to
    create them sharded when the mesh is known (without one, inside nnx.jit under
    jax.set_mesh, the Variables shard them). One per module and mesh: later layers reuse its
    compilation."""
    module = generated.module
    shapes = module.PARAM_SHAPES

    # norm weights and scales start at one (modules rendered before INIT_ONES have none)
    ones = getattr(module, "INIT_ONES", ())

    def init(key: jax.Array) -> Params:
        keys = dict(zip(shapes, jax.random.split(key, len(shapes)), strict=True))
        values = {}
        for name, shape in shapes.items():
            scale = module.INIT_SCALES[name]
            if name in ones:
                values[name] = jnp.ones(shape, module.PARAM_DTYPE)
            elif scale == 0:
                values[name] = jnp.zeros(shape, module.PARAM_DTYPE)
            else:
                normal = jax.random.normal(keys[name], shape, jnp.float32)
                values[name] = (normal * scale).astype(module.PARAM_DTYPE)
        return values

    if mesh is None:
        return init
    return jax.jit(
        init, out_shardings={n: NamedSharding(mesh, module.PARAM_SPECS[n]) for n in shapes}
    )


def _variable(module: ModuleType, name: str, value: Any, mesh: Mesh | None) -> nnx.Variable:
    """An nnx.Param (RoutingBias for routing_bias) carrying PARAM_SPECS[name] as metadata,
    and the mesh: the concrete one when known, else (inside nnx.jit) the context's abstract
    mesh, so that Variables made from it later (nnx.Optimizer's state) need no mesh context."""
    kind = RoutingBias if name == BIAS else nnx.Param
    where = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    return kind(value, out_sharding=tuple(module.PARAM_SPECS[name]), mesh=where)


def _sharding_of(variable: nnx.Variable, mesh: Mesh | None) -> jax.sharding.Sharding:
    """Where a new value of `variable` goes: PARAM_SPECS on the layer's mesh, or (a layer made
    under jax.set_mesh) where its current value already is."""
    if mesh is None:
        return variable.get_value().sharding
    return NamedSharding(mesh, PartitionSpec(*variable.get_metadata()["out_sharding"]))
