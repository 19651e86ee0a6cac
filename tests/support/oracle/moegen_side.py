"""moegen's side of the oracle test: a spec rendered in-process, imported, run on CPU.

As tests/property/test_property.py does: validate, plan, render (moegen's stages, no `moegen build`
child process, no twins), then import the source from a temporary directory. The module runs
on fake CPU devices: `provide_cpu_devices` asks JAX for them before its backend starts.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from spec_builder import spec_yaml, validated

from moegen.diagnostics import SpecError
from moegen.plan import make_plan
from moegen.render import render

DISPLAY = "specs/oracle.yaml"


def provide_cpu_devices(count: int) -> None:
    """At least `count` CPU devices, unless the process already chose (XLA_FLAGS, or a
    backend already started): the cases that need more then say so."""
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    if jax.config.jax_num_cpu_devices >= count:
        return
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # a JAX computation already ran in this process
        pass


def rendered_source(choices: dict[str, Any], name: str) -> str:
    """The module source of the spec `choices` describe (a refusal fails with its
    diagnostics)."""
    text = spec_yaml(choices)
    loaded = validated(text, DISPLAY, name)
    if isinstance(loaded, SpecError):
        found = "\n".join(d.text() for d in loaded.diagnostics)
        raise AssertionError(f"moegen refuses the spec:\n{found}\n--- spec ---\n{text}")
    return render(make_plan(loaded))


def import_source(source: str, name: str) -> ModuleType:
    """Write `source` as `name`.py in a temporary directory and import it."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"{name}.py"
        path.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and NamedTuples look their module up
        try:
            spec.loader.exec_module(module)
        finally:
            del sys.modules[name]
    return module


Runner = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def placed_params(module: ModuleType, weights: dict[str, np.ndarray]) -> tuple[Any, dict]:
    """The module's mesh, and the weights (float32) placed on it as PARAM_SPECS says."""
    mesh = module.make_mesh(jax.devices()[: module.NUM_DEVICES])
    params = {
        name: jax.device_put(
            jnp.asarray(value, jnp.float32), NamedSharding(mesh, module.PARAM_SPECS[name])
        )
        for name, value in weights.items()
    }
    return mesh, params


def runner(module: ModuleType, weights: dict[str, np.ndarray]) -> Runner:
    """x -> (y, d sum(y) / dx) of the module with these parameters, jitted once."""
    assert set(weights) == set(module.PARAM_SHAPES), (
        f"mapped {sorted(weights)}, the module takes {sorted(module.PARAM_SHAPES)}"
    )
    for name, shape in module.PARAM_SHAPES.items():
        assert weights[name].shape == tuple(shape), (name, weights[name].shape, shape)
    mesh, params = placed_params(module, weights)

    def total(x: jax.Array, p: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        y, _aux = module.moe_layer(p, x)
        return jnp.sum(y), y

    step = jax.jit(jax.value_and_grad(total, has_aux=True))

    def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        placed = jax.device_put(jnp.asarray(x, jnp.float32), module.input_sharding(mesh))
        (_, y), grad = step(placed, params)
        return np.asarray(y), np.asarray(grad)

    return run


def aux_of(module: ModuleType, weights: dict[str, np.ndarray], x: np.ndarray) -> Any:
    """The module's aux on x."""
    mesh, params = placed_params(module, weights)
    placed = jax.device_put(jnp.asarray(x, jnp.float32), module.input_sharding(mesh))
    return jax.jit(module.moe_layer)(params, placed)[1]


def dropped_copies(module: ModuleType, weights: dict[str, np.ndarray], x: np.ndarray) -> int:
    """Copies the module's capacity drops on x (its aux.dropped_per_expert, summed)."""
    return int(np.sum(np.asarray(aux_of(module, weights, x).dropped_per_expert)))


def identity_copies(module: ModuleType, weights: dict[str, np.ndarray], x: np.ndarray) -> int:
    """Copies the module routes to its identity experts on x (aux.tokens_per_expert's last
    IDENTITY_EXPERTS counts)."""
    counts = np.asarray(aux_of(module, weights, x).tokens_per_expert)
    return int(np.sum(counts[module.NUM_EXPERTS :]))


def loss_runner(module: ModuleType, weights: dict[str, np.ndarray], loss: str) -> Runner:
    """x -> (aux.<loss>, d aux.<loss> / dx) of the module with these parameters."""
    mesh, params = placed_params(module, weights)

    def value(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
        _y, aux = module.moe_layer(p, x)
        return getattr(aux, loss)

    step = jax.jit(jax.value_and_grad(value))

    def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        placed = jax.device_put(jnp.asarray(x, jnp.float32), module.input_sharding(mesh))
        got, grad = step(placed, params)
        return np.asarray(got), np.asarray(grad)

    return run


def weight_gradients(
    module: ModuleType, weights: dict[str, np.ndarray], x: np.ndarray
) -> dict[str, np.ndarray]:
    """d sum(y) / d each parameter of the module with these parameters, at x."""
    mesh, params = placed_params(module, weights)

    def total(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        y, _aux = module.moe_layer(p, x)
        return jnp.sum(y)

    placed = jax.device_put(jnp.asarray(x, jnp.float32), module.input_sharding(mesh))
    grads = jax.jit(jax.grad(total))(params, placed)
    return {name: np.asarray(value) for name, value in grads.items()}
