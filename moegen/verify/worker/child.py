"""Runs inside a fresh Python process with fake CPU devices: import, parity, compile.

Invoked as `python -m moegen.verify.worker.child JOB.json` by `moegen.verify`, with a
`messages.Job`. The parent sets XLA_FLAGS before this process starts, since JAX reads the
device count once. Each step prints one JSON line on stdout, a `messages.Step`; a failure
prints a `messages.WorkerFailed` ({"error": ...}) and exits 1.
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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from moegen.kernels import KernelNotInstalled, kernel
from moegen.verify.hlo.overlap import hidden_transfers
from moegen.verify.messages import (
    PROGRAMS,
    CollectiveTotals,
    Compiled,
    CompilerOutOfMemory,
    CudaTarget,
    Imported,
    Job,
    Lowered,
    Memory,
    Message,
    TpuTarget,
    TwinParity,
    WorkerFailed,
    encode,
)
from moegen.verify.records.evidence import least_kernel_calls
from moegen.verify.reference.layer import ReferenceConfig
from moegen.verify.reference.parity import AUX_LOSSES, twin_parity
from moegen.verify.worker.compiled import (
    CheckFailed,
    OutOfMemory,
    compile_program,
    compiled_counters,
    target_devices,
)


def emit(message: Message) -> None:
    print(encode(message), flush=True)


def import_module(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Shape(NamedTuple):
    """One static shape of a module: the main one, or a shape variant's (its name)."""

    layer: Callable[..., Any]  # moe_layer, or moe_layer_NAME
    input_shape: tuple[int, int, int]  # INPUT_SHAPE, or INPUT_SHAPE_NAME
    abstract_input: Callable[[Any], Any]  # input_shape, or input_shape_NAME
    label: str  # "" or " (NAME)", added to the steps' names


def shape_of(module: ModuleType, variant: str | None = None) -> Shape:
    if variant is None:
        return Shape(module.moe_layer, module.INPUT_SHAPE, module.input_shape, "")
    return Shape(
        getattr(module, f"moe_layer_{variant}"),
        getattr(module, f"INPUT_SHAPE_{variant.upper()}"),
        getattr(module, f"input_shape_{variant}"),
        f" ({variant})",
    )


def run_twin(
    path: str, cfg: ReferenceConfig, tolerance: float, label: str, variant: str | None = None
) -> None:
    start = time.perf_counter()
    module = import_module(path, f"moegen_twin_{label}")
    shape = shape_of(module, variant)
    cases = twin_parity(module, shape.layer, shape.input_shape, cfg, tolerance)
    seconds = time.perf_counter() - start
    name = f"twin parity ({label})" if variant is None else f"twin parity ({label}, {variant})"
    emit(TwinParity(name, seconds, cases))


def full_size_programs(
    module: ModuleType, devices: list[Any], shape: Shape | None = None
) -> tuple[dict, Any, dict[str, Callable[..., Any]]]:
    """Abstract full-size params and x on `devices`, and the programs verified: the forward,
    and forward+backward (gradients of sum(y) plus the spec's losses with respect to every
    parameter and x), of the main shape or of `shape`."""
    shape = shape_of(module) if shape is None else shape
    mesh = module.make_mesh(devices)
    params, x = module.param_shapes(mesh), shape.abstract_input(mesh)
    forward = functools.partial(shape.layer, mesh=mesh)

    def loss(p: dict, xs: Any) -> Any:
        # The program a user trains: the balance and z losses the spec sets join the loss, so
        # their gradients through the router are compiled, counted and fitted too.
        y, aux = forward(p, xs)
        losses = [getattr(aux, name) for name in AUX_LOSSES if name in aux._fields]
        return jnp.sum(y.astype(jnp.float32)) + sum(losses)

    programs = {"forward": forward, "forward+backward": jax.grad(loss, argnums=(0, 1))}
    return params, x, programs


CACHE_MAX_BYTES = 2 * 2**30


def use_compilation_cache(directory: str | None) -> None:
    """JAX's persistent compilation cache in `directory` for this worker's CPU compiles (the
    twins' programs; the full-size ones of cpu targets), every program however quick."""
    if directory is None:
        return
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)


def compile_full(
    module: ModuleType,
    tpu: TpuTarget | None,
    names: tuple[str, ...] = PROGRAMS,
    variant: str | None = None,
) -> None:
    if tpu is not None:
        # A compile-only TPU executable cannot be read back ("PjRtCompiler must be constructed
        # with a Client to call DeserializeLoadedExecutable"): its entries would only fill the
        # cache. The verification record is what spares an unchanged TPU module its compile.
        jax.config.update("jax_enable_compilation_cache", False)
    shape = shape_of(module, variant)
    params, x, programs = full_size_programs(module, target_devices(module, tpu), shape)
    for name in names:
        step = f"compile {name}{shape.label}"
        start = time.perf_counter()
        compiled = compile_program(programs[name], params, x)
        if isinstance(compiled, OutOfMemory):
            # The compiler itself proved the program cannot fit: a verdict, not a crash.
            seconds, refused = time.perf_counter() - start, compiled
            emit(
                CompilerOutOfMemory(
                    step, seconds, refused.first_line, refused.memory_space, refused.call
                )
            )
            return
        counters = compiled_counters(compiled, items=False)
        collectives = {k: v for k, v in counters["collectives"].items() if k != "by_kind"}
        hidden = total = None
        if tpu is not None and getattr(module, "OVERLAP_CHUNKS", 1) > 1:
            hidden, total = hidden_transfers(compiled.as_text())
        emit(
            Compiled(
                step,
                time.perf_counter() - start,
                Memory.from_json(counters["memory"]),
                counters["flops"],
                counters["bytes_accessed"],
                CollectiveTotals.from_json(collectives),
                hidden,
                total,
            )
        )


def prepare_cuda(want: CudaTarget) -> None:
    """Load what lowering the kernel for CUDA needs (its package, prepared by its module)."""
    from moegen.verify.worker import cuda

    try:
        cuda.prepare_kernel(want.kernel, want.sm)
    except KernelNotInstalled as err:
        raise CheckFailed(f"kernel {want.kernel}: {err}") from None


def lower_for_cuda(
    module: ModuleType, want: CudaTarget, names: tuple[str, ...], variant: str | None = None
) -> None:
    """Lower the full-size programs for CUDA (no GPU) and check the kernel's calls are in them.

    Each grouped-matmul call site lowers to the kernel's custom call (its registry entry's
    CudaLowering: how many per site with the backward, whether a quantized spec quantizes
    with grouped quantize calls, whether XLA's own ragged dot beside it means the kernel was
    bypassed).
    """
    from moegen.verify.worker import cuda

    shape = shape_of(module, variant)
    params, x, programs = full_size_programs(module, jax.devices()[: module.NUM_DEVICES], shape)
    lowering = kernel(want.kernel).cuda_lowering
    kernel_call = lowering.custom_call
    for name in names:
        start = time.perf_counter()
        text = cuda.lower_for_cuda(programs[name], params, x)
        calls = cuda.count_custom_calls(text)
        gemms = calls.get(kernel_call, 0)
        quantizes = sum(n for target, n in calls.items() if "grouped_quantize" in target)
        least = least_kernel_calls(want, name)
        if gemms < least:
            raise CheckFailed(
                f"{name} lowered for CUDA has {gemms} {kernel_call} calls, expected at least "
                f"{least} ({want.call_sites} grouped-matmul call sites): {dict(calls)}"
            )
        if lowering.excludes_ragged_dot and cuda.XLA_RAGGED_DOT.search(text):
            raise CheckFailed(
                f"{name} lowered for CUDA holds XLA's ragged dot beside {want.kernel}'s"
            )
        if (want.quantization != "none") != (quantizes > 0):
            raise CheckFailed(
                f"{name}: quantization {want.quantization} but {quantizes} TE grouped "
                f"quantize calls in the lowered module: {dict(calls)}"
            )
        kernel_calls = {
            k: v for k, v in sorted(calls.items()) if k.startswith(lowering.call_prefix)
        }
        seconds = time.perf_counter() - start
        emit(Lowered(f"lower {name} for cuda{shape.label}", seconds, want.sm, kernel_calls))


def main(job_path: str) -> int:
    job = Job.from_json(json.loads(Path(job_path).read_text()))
    use_compilation_cache(job.compilation_cache)
    try:
        start = time.perf_counter()
        # A module lowered for CUDA imports its kernel's package, which only the CUDA lowering
        # needs: the twins (their substitute kernel) run without it.
        if job.compile or job.cuda is None:
            if job.cuda is not None:
                prepare_cuda(job.cuda)  # before the module imports transformer_engine
            module = import_module(job.module, "moegen_full")
            emit(Imported("import", time.perf_counter() - start))
        for twin in job.twins:
            cfg = ReferenceConfig(**twin.reference)
            run_twin(twin.path, cfg, twin.tolerance, twin.label, twin.variant)
        for variant in (None, *job.variants) if job.compile else ():
            if job.cuda is not None:
                lower_for_cuda(module, job.cuda, job.programs, variant)
            else:
                compile_full(module, job.tpu, job.programs, variant)
    except CheckFailed as err:
        emit(WorkerFailed(str(err)))
        return 1
    except Exception:  # anything else is a bug in generated code; report it whole
        emit(WorkerFailed(traceback.format_exc()))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
