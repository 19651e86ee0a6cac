"""TPU check, run phase: a module of the manifest loaded, its inputs, and its float32
reference's.

Imports only jax and the standard library, besides the work folder's files (no moegen on the
TPU machine).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import tpu_check_peers as peers
from jax.sharding import SingleDeviceSharding

# bf16 compute (or f32 at the TPU default precision) against the f32 reference: wide enough
# for bf16 rounding over a 14336-wide FFN (Mixtral 8x7B on a v5e chip: y 3.6e-2, the router
# gradient 6.0e-2, identical to 3 digits under kernels pallas and xla), while a wrong path
# (a reference routed differently) measured 0.87 and more.
BF16_TOLERANCE = 1e-1
F32_TOLERANCE = 1e-4  # f32 compute off TPU, against the f32 reference at "highest"


@jax.jit
def relative_error(got: jax.Array, want: jax.Array) -> jax.Array:
    got, want = got.astype(jnp.float32), want.astype(jnp.float32)
    return jnp.linalg.norm(got - want) / jnp.maximum(jnp.linalg.norm(want), 1e-30)


def verdict(errors: dict[str, float], tolerance: float) -> dict[str, Any]:
    """A parity row: every relative error, the worst, and whether all are within tolerance."""
    worst = max(errors, key=errors.get)
    ok = all(v <= tolerance for v in errors.values())  # a NaN fails
    return {
        "ok": ok,
        "tolerance": tolerance,
        "max": errors[worst],
        "worst": worst,
        "errors": errors,
    }


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def tolerance(module: ModuleType) -> float:
    """bf16 compute, or f32 at the TPU default matmul precision: 1e-1; f32 elsewhere: 1e-4."""
    f32 = jnp.dtype(module.COMPUTE_DTYPE) == jnp.float32
    return F32_TOLERANCE if f32 and jax.devices()[0].platform != "tpu" else BF16_TOLERANCE


def reference_fn(entry: dict[str, Any], work: Path, shape: tuple[int, ...]) -> Any:
    """The float32 reference of this module as fn(params, x) -> y like x (see prepare)."""
    choice = entry["reference"]
    cfg = choice["config"]
    if choice["kind"] == "simple":
        return lambda p, x: peers.reference(p, x.reshape(-1, shape[-1]), cfg).reshape(shape)
    if str(work) not in sys.path:
        sys.path.insert(0, str(work))
    ref = importlib.import_module("moegen_reference.layer")
    s = entry["shapes"]
    chunk = s["tokens"] if cfg.get("capacity") is not None else s["seq_len"]
    while chunk > 256 and chunk * s["experts"] * s["ffn"] > 2**27:
        chunk //= 2  # [chunk, experts, ffn] float32 intermediates of at most 512 MiB each
    return lambda p, x: peers.dense_reference(ref, p, x, cfg, chunk)


@dataclass
class Layer:
    """One module of the manifest, loaded: what its programs are made of."""

    module: ModuleType
    mesh: Any
    fn: Any  # fn(params, x) -> y
    ref: Any  # its float32 reference as fn(params, x) -> y, or None where it has none


def load_layer(entry: dict[str, Any], work: Path) -> Layer:
    module = load_module(work / entry["file"], f"tpu_check_{entry['name']}")
    mesh = module.make_mesh()

    def fn(p: Any, xs: jax.Array) -> jax.Array:
        return module.moe_layer(p, xs, mesh=mesh)[0]

    none = entry["reference"]["kind"] == "none"
    ref = None if none else reference_fn(entry, work, tuple(module.INPUT_SHAPE))
    return Layer(module, mesh, fn, ref)


def layer_inputs(layer: Layer, abstract_only: bool = False) -> tuple[Any, Any, Any]:
    """(params, x, ct) of a module, laid out over its mesh (abstract: their shapes alone)."""
    m, sharding = layer.module, layer.module.input_sharding(layer.mesh)
    if abstract_only:
        x = jax.ShapeDtypeStruct(m.INPUT_SHAPE, m.COMPUTE_DTYPE, sharding=sharding)
        ct = jax.ShapeDtypeStruct(m.INPUT_SHAPE, jnp.float32, sharding=sharding)
        return m.param_shapes(layer.mesh), x, ct
    params = m.init_params(jax.random.key(0), layer.mesh)
    x = jax.random.normal(jax.random.key(4), m.INPUT_SHAPE, jnp.float32)
    x = jax.device_put(x.astype(m.COMPUTE_DTYPE), sharding)
    ct = jax.device_put(jax.random.normal(jax.random.key(5), m.INPUT_SHAPE, jnp.float32), sharding)
    return params, x, ct


def reference_inputs(layer: Layer, params: Any, x: Any, ct: Any) -> tuple[Any, Any, Any]:
    """The reference's arguments (or their shapes): plain single-device arrays (the module's
    carry its mesh's sharding types, which the reference's scan and scatters need not
    follow); float32 copies where compute is float32, so that no bf16 rounding of its
    gradients hides in the tolerance."""
    one = SingleDeviceSharding(jax.devices()[0])
    f32 = tolerance(layer.module) == F32_TOLERANCE

    def place(a: Any, dtype: Any = None) -> Any:
        dtype = dtype or (jnp.float32 if f32 else a.dtype)
        if isinstance(a, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(a.shape, dtype, sharding=one)
        return jax.device_put(a, one).astype(dtype)

    return jax.tree.map(place, params), place(x), place(ct, jnp.float32)
