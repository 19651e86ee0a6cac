"""Runs inside a fresh Python process with fake CPU devices: import, parity, compile.

Invoked as `python -m moegen.verify.worker JOB.json` by `moegen.verify`. The parent sets
XLA_FLAGS before this process starts, since JAX reads the device count once. Each step
prints one JSON line on stdout: {"step": ..., "seconds": ..., ...}; a failure prints
{"error": ...} and exits 1.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from moegen.verify.counters import compiled_counters
from moegen.verify.overlap import hidden_transfers
from moegen.verify.reference import ReferenceConfig, dense_moe


class CheckFailed(Exception):
    pass


def emit(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def import_module(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def relative_error(got: Any, want: Any) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.linalg.norm(want)), 1e-30)
    return float(np.linalg.norm(got - want)) / scale


def _place(module: ModuleType, mesh: Any, params: dict, x: Any) -> tuple[dict, Any]:
    from jax.sharding import NamedSharding

    placed = {
        name: jax.device_put(
            jnp.asarray(value, module.PARAM_DTYPE), NamedSharding(mesh, module.PARAM_SPECS[name])
        )
        for name, value in params.items()
    }
    return placed, jax.device_put(jnp.asarray(x, module.COMPUTE_DTYPE), module.input_sharding(mesh))


def _random_case(module: ModuleType, seed: int) -> tuple[dict, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    # Parameters that start at zero (biases) get small random values: zeros would hide them.
    params = {
        name: rng.normal(0.0, module.INIT_SCALES[name] or 0.1, shape).astype(np.float32)
        for name, shape in module.PARAM_SHAPES.items()
    }
    x = rng.normal(0.0, 1.0, module.INPUT_SHAPE).astype(np.float32)
    cotangent = rng.normal(0.0, 1.0, module.INPUT_SHAPE).astype(np.float32)
    return params, x, cotangent


def _starved_case(module: ModuleType, seed: int) -> tuple[dict, np.ndarray, np.ndarray, list[int]]:
    """Positive tokens and router columns of one sign: negative columns never win top-k."""
    params, x, cotangent = _random_case(module, seed)
    experts, top_k = module.NUM_EXPERTS, module.TOP_K
    starved = list(range(1, experts, 2))[: experts - top_k]
    x = np.abs(x) + 0.1
    # Small logits keep the scores away from saturation, where gradients vanish.
    router = 0.25 * np.abs(params["router"])
    router[:, starved] *= -1.0
    params["router"] = router
    if "routing_bias" in params:
        params["routing_bias"] = np.zeros_like(params["routing_bias"])
    return params, x, cotangent, starved


AUX_LOSSES = ("load_balance_loss", "router_z_loss")
AUX_COUNTS = ("tokens_per_expert", "dropped_per_expert")


def check_parity(
    module: ModuleType,
    cfg: ReferenceConfig,
    params: dict,
    x: np.ndarray,
    cotangent: np.ndarray,
    tolerance: float,
    case: str,
) -> dict[str, Any]:
    """Forward, aux and gradients of the module against the dense reference."""
    mesh = module.make_mesh(jax.devices()[: module.NUM_DEVICES])
    placed_params, placed_x = _place(module, mesh, params, x)

    # The balance losses join the loss, so that their gradients are checked too.
    def module_loss(p: dict, xs: Any) -> Any:
        y, aux = module.moe_layer(p, xs, mesh=mesh)
        losses = [getattr(aux, name) for name in AUX_LOSSES if name in aux._fields]
        return jnp.sum(y.astype(jnp.float32) * cotangent) + sum(losses)

    def reference_loss(p: dict, xs: Any) -> Any:
        y, aux = dense_moe(p, xs, cfg)
        return jnp.sum(y * cotangent) + aux.load_balance_loss + aux.router_z_loss

    with jax.set_mesh(mesh):
        y, aux = jax.jit(functools.partial(module.moe_layer, mesh=mesh))(placed_params, placed_x)
        grads, grad_x = jax.jit(jax.grad(module_loss, argnums=(0, 1)))(placed_params, placed_x)
    # The reference sees exactly the values the module saw (after any dtype rounding).
    host_params = {k: np.asarray(v, np.float32) for k, v in placed_params.items()}
    host_x = np.asarray(placed_x, np.float32)
    ref_y, ref_aux = dense_moe(host_params, host_x, cfg)
    ref_grads, ref_grad_x = jax.grad(reference_loss, argnums=(0, 1))(host_params, host_x)

    errors = {"y": relative_error(y, ref_y), "grad_x": relative_error(grad_x, ref_grad_x)}
    errors |= {f"grad_{k}": relative_error(grads[k], ref_grads[k]) for k in ref_grads}
    errors |= {
        name: relative_error(getattr(aux, name), getattr(ref_aux, name))
        for name in AUX_LOSSES
        if name in aux._fields
    }
    for name in AUX_COUNTS:
        if name not in aux._fields:
            continue
        got, want = np.asarray(getattr(aux, name)), np.asarray(getattr(ref_aux, name))
        if not np.array_equal(got, want):
            raise CheckFailed(f"{case}: aux.{name} {got.tolist()} != {want.tolist()}")
    counts = np.asarray(aux.tokens_per_expert)
    worst = max(errors, key=errors.get)
    if not errors[worst] < tolerance:
        raise CheckFailed(
            f"{case}: {worst} differs from the dense reference: relative error "
            f"{errors[worst]:.3e} >= {tolerance:.0e}; all: "
            + ", ".join(f"{k}={v:.2e}" for k, v in errors.items())
        )
    result = {
        "case": case,
        "max_relative_error": errors[worst],
        "tokens_per_expert": counts.tolist(),
    }
    if "dropped_per_expert" in aux._fields:
        result["dropped"] = int(np.sum(aux.dropped_per_expert))
    return result


def run_twin(path: str, cfg: ReferenceConfig, tolerance: float, label: str) -> None:
    start = time.perf_counter()
    module = import_module(path, f"moegen_twin_{label}")
    results = [check_parity(module, cfg, *_random_case(module, 0), tolerance, "random routing")]
    if module.NUM_EXPERTS > module.TOP_K:
        params, x, cotangent, starved = _starved_case(module, 1)
        result = check_parity(module, cfg, params, x, cotangent, tolerance, "starved experts")
        if any(result["tokens_per_expert"][e] for e in starved):
            raise CheckFailed(f"starved experts {starved} received tokens: {result}")
        results.append(result | {"starved_experts": starved})
    emit(step=f"twin parity ({label})", seconds=time.perf_counter() - start, cases=results)


def target_devices(module: ModuleType, tpu: dict[str, Any] | None) -> list[Any]:
    """Fake CPU devices, or compile-only devices of the TPU slice (libtpu, no TPU needed)."""
    if tpu is None:
        return jax.devices()[: module.NUM_DEVICES]
    if importlib.util.find_spec("libtpu") is None:
        raise CheckFailed(
            "compiling for TPU needs libtpu: pip install 'moegen[tpu]' (libtpu==0.0.51)"
        )
    from jax.experimental import topologies

    return topologies.get_topology_desc(
        platform="tpu",
        topology_name=tpu["topology_name"],
        chip_config_name="default",
        chips_per_host_bounds=tuple(tpu["chips_per_host_bounds"]),
        num_slices=tpu.get("num_slices", 1),
    ).devices


def full_size_programs(
    module: ModuleType, devices: list[Any]
) -> tuple[dict, Any, dict[str, Callable[..., Any]]]:
    """Abstract full-size params and x on `devices`, and the programs verified: the forward,
    and forward+backward (gradients of sum(y) with respect to every parameter and x)."""
    mesh = module.make_mesh(devices)
    params, x = module.param_shapes(mesh), module.input_shape(mesh)
    forward = functools.partial(module.moe_layer, mesh=mesh)

    def loss(p: dict, xs: Any) -> Any:
        return jnp.sum(forward(p, xs)[0].astype(jnp.float32))

    programs = {"forward": forward, "forward+backward": jax.grad(loss, argnums=(0, 1))}
    return params, x, programs


def compile_full(
    module: ModuleType,
    tpu: dict[str, Any] | None,
    names: tuple[str, ...] = ("forward", "forward+backward"),
) -> None:
    params, x, programs = full_size_programs(module, target_devices(module, tpu))
    for name in names:
        program = programs[name]
        start = time.perf_counter()
        try:
            compiled = jax.jit(program).lower(params, x).compile()
        except jax.errors.JaxRuntimeError as err:
            if "RESOURCE_EXHAUSTED" not in str(err):
                raise
            # The compiler itself proved the program cannot fit: a verdict, not a crash.
            first_line = str(err).strip().splitlines()[0]
            emit(step=f"compile {name}", seconds=time.perf_counter() - start, oom=first_line)
            return
        counters = compiled_counters(compiled, items=False)
        collectives = counters["collectives"]
        overlap = {}
        if tpu is not None and getattr(module, "OVERLAP_CHUNKS", 1) > 1:
            hidden, total = hidden_transfers(compiled.as_text())
            overlap = {"hidden_transfers": hidden, "transfers": total}
        emit(
            step=f"compile {name}",
            seconds=time.perf_counter() - start,
            memory=counters["memory"],
            flops=counters["flops"],
            bytes_accessed=counters["bytes_accessed"],
            collectives={k: v for k, v in collectives.items() if k != "by_kind"},
            **overlap,
        )


def prepare_cuda(sm: int) -> None:
    from moegen.verify import cuda

    try:
        cuda.prepare_te(sm)
    except cuda.TENotInstalled as err:
        raise CheckFailed(f"kernel te: {err}") from None


def lower_for_cuda(module: ModuleType, want: dict[str, Any], names: tuple[str, ...]) -> None:
    """Lower the full-size programs for CUDA (no GPU) and check TE's grouped GEMMs are in them.

    Each grouped-matmul call site lowers to one te_grouped_gemm_ffi forward; its VJP adds the
    input-gradient and weight-gradient GEMMs; a quantized spec quantizes its operands with TE's
    grouped quantize. XLA's own dot for an expert matmul would mean TE was bypassed.
    """
    from moegen.verify import cuda

    params, x, programs = full_size_programs(module, jax.devices()[: module.NUM_DEVICES])
    for name in names:
        start = time.perf_counter()
        calls = cuda.count_custom_calls(cuda.lower_for_cuda(programs[name], params, x))
        gemms = calls.get("te_grouped_gemm_ffi", 0)
        quantizes = sum(n for target, n in calls.items() if "grouped_quantize" in target)
        least = want["call_sites"] * (1 if name == "forward" else 2)
        if gemms < least:
            raise CheckFailed(
                f"{name} lowered for CUDA has {gemms} TE grouped GEMMs, expected at least "
                f"{least} ({want['call_sites']} grouped-matmul call sites): {dict(calls)}"
            )
        if (want["quantization"] != "none") != (quantizes > 0):
            raise CheckFailed(
                f"{name}: quantization {want['quantization']} but {quantizes} TE grouped "
                f"quantize calls in the lowered module: {dict(calls)}"
            )
        emit(
            step=f"lower {name} for cuda",
            seconds=time.perf_counter() - start,
            sm=want["sm"],
            te_calls={k: v for k, v in sorted(calls.items()) if k.startswith("te_")},
        )


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    try:
        start = time.perf_counter()
        compiles = job.get("compile", True)
        # A te module imports Transformer Engine, which only the CUDA lowering needs: the
        # twins (kernel xla) run without it.
        if compiles or not job.get("cuda"):
            if job.get("cuda"):
                prepare_cuda(job["cuda"]["sm"])  # before the module imports transformer_engine
            module = import_module(job["module"], "moegen_full")
            emit(step="import", seconds=time.perf_counter() - start)
        for twin in job["twins"]:
            cfg = ReferenceConfig(**twin["reference"])
            run_twin(twin["path"], cfg, twin["tolerance"], twin["label"])
        programs = tuple(job.get("programs", ("forward", "forward+backward")))
        if compiles and job.get("cuda"):
            lower_for_cuda(module, job["cuda"], programs)
        elif compiles:
            compile_full(module, job["tpu"], programs)
    except CheckFailed as err:
        emit(error=str(err))
        return 1
    except Exception:  # anything else is a bug in generated code; report it whole
        emit(error=traceback.format_exc())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
