"""The benchmark's child processes: one TPU compile of a layer, or the CPU timing of a twin.

    python -m bench.children compile|time JOB.json

Each runs in a fresh process (bench.measure starts it): a compile holds the devices of one
slice, and the CPU timing needs as many fake devices as the twin's mesh, fixed when JAX
starts. The result is the last stdout line, `BENCH-RESULT <json>`; a failure is its
`{"error": traceback}`.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from moegen.verify.reference.layer import ReferenceConfig

RESULT_PREFIX = "BENCH-RESULT "


def _import(path: str, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _program(module, variant: str, cfg: dict, mesh):
    """The forward+backward of `variant` for `module`'s shapes."""
    from bench.baselines import baseline, training_step

    if variant == "moegen":
        layer = functools.partial(module.moe_layer, mesh=mesh)
        return layer, training_step(layer, returns_aux=True)
    layer = baseline(variant, module, ReferenceConfig(**cfg))
    return layer, training_step(layer, returns_aux=False)


def _mesh(module, devices, variant: str):
    """The module's mesh; for a baseline the same devices with Auto axes, so that GSPMD
    partitions it (jax.make_mesh gives Explicit axes, under which jit refuses ambiguous
    shardings instead of choosing)."""
    from jax.sharding import AxisType, Mesh

    mesh = module.make_mesh(devices)
    if variant == "moegen":
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def compile_worker(job: dict) -> dict:
    """Compile one variant's forward+backward for the TPU slice; its counters."""
    from moegen.verify.worker.compiled import (
        OutOfMemory,
        compile_program,
        compiled_counters,
        kernel_tile_bytes,
        target_devices,
    )

    module = _import(job["module"], "bench_module")
    variant = "moegen" if job["variant"].startswith("moegen") else job["variant"]
    mesh = _mesh(module, target_devices(module, job["tpu"]), variant)
    layer, step = _program(module, variant, job["cfg"], mesh)
    params, x = module.param_shapes(mesh), module.input_shape(mesh)
    start = time.perf_counter()
    compiled = compile_program(step, params, x)
    seconds = time.perf_counter() - start
    if isinstance(compiled, OutOfMemory):  # which memory: HBM (a verdict) or VMEM (a defect)
        return {
            "oom": compiled.first_line,
            "memory_space": compiled.memory_space,
            "seconds": seconds,
        }
    result = {
        "counters": compiled_counters(compiled, items=False),
        "kernel_tile_bytes": kernel_tile_bytes(compiled.as_text()),
        "seconds": seconds,
    }
    if job.get("forward"):
        forward = compile_program(layer, params, x)
        if not isinstance(forward, OutOfMemory):
            result["forward_memory"] = compiled_counters(forward, items=False)["memory"]
    return result


def time_worker(job: dict) -> dict:
    """Median CPU wall time of forward+backward of the twin and both baselines at its shapes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding

    module = _import(job["module"], "bench_twin")
    # "moegen_xla": the same twin with kernel xla, when the spec's kernel is pallas.
    modules = (
        {"moegen_xla": _import(job["xla_module"], "bench_twin_xla")}
        if job.get("xla_module")
        else {}
    )
    rng = np.random.default_rng(0)
    host_params = {
        name: rng.normal(0.0, module.INIT_SCALES[name] or 0.1, shape)
        for name, shape in module.PARAM_SHAPES.items()
    }
    host_x = rng.normal(0.0, 1.0, module.INPUT_SHAPE)
    results: dict[str, Any] = {}
    outputs = {}
    for variant in [*job["variants"], *modules]:
        layer_module = modules.get(variant, module)
        kind = "moegen" if variant in modules else variant
        mesh = _mesh(layer_module, jax.devices()[: module.NUM_DEVICES], kind)
        params = {
            name: jax.device_put(
                jnp.asarray(value, module.PARAM_DTYPE),
                NamedSharding(mesh, module.PARAM_SPECS[name]),
            )
            for name, value in host_params.items()
        }
        x = jax.device_put(jnp.asarray(host_x, module.COMPUTE_DTYPE), module.input_sharding(mesh))
        layer, step = _program(layer_module, kind, job["cfg"], mesh)
        y = jax.jit(layer)(params, x)
        outputs[variant] = np.asarray((y[0] if kind == "moegen" else y), np.float32)
        step = jax.jit(step)
        jax.block_until_ready(step(params, x))  # compile and warm up
        runs = []
        for _ in range(job["repeats"]):
            start = time.perf_counter()
            jax.block_until_ready(step(params, x))
            runs.append(time.perf_counter() - start)
        results[variant] = {"median_s": statistics.median(runs), "runs_s": runs}
    if "moegen" in outputs:
        want = outputs["moegen"]
        scale = max(float(np.linalg.norm(want)), 1e-30)
        for variant, got in outputs.items():
            results[variant]["y_rel_err"] = float(np.linalg.norm(got - want)) / scale
    return {
        "variants": results,
        "devices": module.NUM_DEVICES,
        "tokens": math.prod(module.INPUT_SHAPE[:2]),
        "embed": module.EMBED_DIM,
        "ffn": module.FFN_DIM,
        "dtype": str(np.dtype(module.COMPUTE_DTYPE)),
        "kernel": job.get("kernel", "xla"),
    }


def main(kind: str, job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    try:
        result = {"compile": compile_worker, "time": time_worker}[kind](job)
    except Exception:
        result = {"error": traceback.format_exc()[-3000:]}
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
