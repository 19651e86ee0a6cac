"""One process of a multi-process run of a generated module (see test_multiprocess.py).

argv: process_id num_processes port module_path reference_json out_json. The parent sets
XLA_FLAGS (this process's fake CPU devices) and JAX_PLATFORMS=cpu before Python starts.
"""

from __future__ import annotations

import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from moegen.verify.reference import parity
from moegen.verify.reference.layer import ReferenceConfig, dense_moe
from moegen.verify.worker import child as worker


def local_rows(module, mesh) -> slice:
    """The batch rows this process's devices hold, as one contiguous range."""
    sharding = module.input_sharding(mesh)
    spans = {
        (index[0].start or 0, index[0].stop or module.BATCH)
        for index in sharding.addressable_devices_indices_map(module.INPUT_SHAPE).values()
    }
    starts, stops = zip(*sorted(spans), strict=True)
    assert all(a == b for a, b in zip(stops[:-1], starts[1:], strict=True)), spans
    return slice(starts[0], stops[-1])


def join_cluster(process_id: int, processes: int, port: int) -> None:
    """Join the other processes through the coordinator on 127.0.0.1:port (gloo collectives)."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=processes,
        process_id=process_id,
        initialization_timeout=60,
    )


def place_params(module, mesh, params: dict[str, np.ndarray]) -> dict:
    """The global parameters, each process placing only its own shards."""
    return {
        name: jax.make_array_from_callback(
            value.shape,
            NamedSharding(mesh, module.PARAM_SPECS[name]),
            lambda index, value=value: jnp.asarray(value[index], module.PARAM_DTYPE),
        )
        for name, value in params.items()
    }


def run_layer(module, mesh, placed: dict, placed_x, cot) -> dict:
    """Forward and gradients of sum(y * cot) on the mesh, gathered whole onto every process."""

    def loss(p, xs, c):
        y, _ = module.moe_layer(p, xs, mesh=mesh)
        return jnp.sum(y.astype(jnp.float32) * c)

    with jax.set_mesh(mesh):
        y, aux = jax.jit(functools.partial(module.moe_layer, mesh=mesh))(placed, placed_x)
        grads, grad_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(placed, placed_x, cot)
    return multihost_utils.process_allgather(
        {"y": y, "grad_x": grad_x, "grads": grads, "counts": aux.tokens_per_expert}, tiled=True
    )


def compare_with_reference(
    module, reference_json: str, params: dict, x, cotangent, gathered: dict
) -> tuple[dict[str, float], bool]:
    """(relative errors of y, grad_x and every grad_<param>; whether the counts match) against
    the dense reference on the same inputs, rounded to the module's dtypes."""
    cfg = ReferenceConfig(**json.loads(reference_json))
    host = {k: np.asarray(v, np.float32) for k, v in params.items()}
    host = {k: np.asarray(jnp.asarray(v, module.PARAM_DTYPE), np.float32) for k, v in host.items()}
    host_x = np.asarray(jnp.asarray(x, module.COMPUTE_DTYPE), np.float32)

    def reference_loss(p, xs):
        return jnp.sum(dense_moe(p, xs, cfg)[0] * cotangent)

    ref_y, ref_aux = dense_moe(host, host_x, cfg)
    ref_grads, ref_grad_x = jax.grad(reference_loss, argnums=(0, 1))(host, host_x)
    errors = {
        "y": parity.relative_error(gathered["y"], ref_y),
        "grad_x": parity.relative_error(gathered["grad_x"], ref_grad_x),
    }
    errors |= {f"grad_{k}": parity.relative_error(gathered["grads"][k], ref_grads[k]) for k in host}
    counts_match = bool(
        np.array_equal(np.asarray(gathered["counts"]), np.asarray(ref_aux.tokens_per_expert))
    )
    return errors, counts_match


def main() -> None:
    process_id, processes, port = map(int, sys.argv[1:4])
    module_path, reference_json, out_path = sys.argv[4:7]
    join_cluster(process_id, processes, port)
    module = worker.import_module(module_path, "multiprocess_twin")
    mesh = module.make_mesh()  # every process's devices
    # Every process draws the same global arrays and places only its own shards.
    params, x, cotangent = parity.random_case(module, 0)
    placed = place_params(module, mesh, params)
    rows = local_rows(module, mesh)
    placed_x = module.input_from_process_data(mesh, jnp.asarray(x[rows], module.COMPUTE_DTYPE))
    cot = jax.make_array_from_process_local_data(
        module.input_sharding(mesh), cotangent[rows], module.INPUT_SHAPE
    )
    gathered = run_layer(module, mesh, placed, placed_x, cot)
    errors, counts_match = compare_with_reference(
        module, reference_json, params, x, cotangent, gathered
    )
    result = {
        "process": process_id,
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "rows": [rows.start, rows.stop],
        "errors": errors,
        "counts_match": counts_match,
    }
    with open(out_path, "w", encoding="utf-8") as out:
        json.dump(result, out)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
