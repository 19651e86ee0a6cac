"""Lower GPU targets on a CPU-only CI: NVIDIA Transformer Engine (JAX) grouped GEMMs for CUDA.

No GPU and no NVIDIA driver is needed: TE 2.20.2 is imported against a stub libcuda.so.1 (every
driver call fails), its compute-capability query answers the target's SM, and the program is
lowered for CUDA (`lowering_platforms=("cuda",)`) to StableHLO, where TE's kernels show as FFI
custom calls (`te_grouped_gemm_ffi`, ...). Nothing is compiled or run: numerics of TE code paths
need a GPU with TE installed. Works with JAX_PLATFORMS=cpu (the CUDA plugin need not be
initialised); `prepare_te` changes process-wide state, so call it in a process of its own
(the verify worker, a test) rather than in moegen's main process.

Install TE first with `scripts/install-te` (see TE_INSTALL_HINT).

Kernel tokamax (tokamax's Pallas Mosaic GPU ragged_dot) lowers the same way with less: tokamax
0.0.17 (pure Python) and jaxlib's own Mosaic GPU lowering, no TE, no CUDA plugin, no stub. Its
kernel choice asks the default device for its compute capability, and its op checks the device
(CPU here): `prepare_tokamax` answers the target's SM and turns on tokamax's cross-compile
option, and each kernel lowers to a `mosaic_gpu_v2` custom call holding its Mosaic GPU module.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

# the pins, install hints and custom calls are the kernels' own (their registry entries name
# them too)
from moegen.kernels.te import TE_INSTALL_HINT, TE_VERSION
from moegen.kernels.tokamax import TOKAMAX_INSTALL_HINT, TOKAMAX_VERSION

STUB_ENV = "MOEGEN_CUDA_STUB"  # overrides where the stub libcuda.so.1 is looked for
STUB_RELATIVE = Path("lib/moegen-te/libcuda.so.1")  # under the venv (sys.prefix)
# Libraries TE's loader would look for under folder names the cu12 wheels do not use.
_PRELOAD = (
    "cuda_runtime/lib/libcudart.so.12",
    "cublas/lib/libcublasLt.so.12",
    "cublas/lib/libcublas.so.12",
    "nccl/lib/libnccl.so.2",
)
XLA_RAGGED_DOT = re.compile(r"\bchlo\.ragged_dot\b")  # jax.lax.ragged_dot lowered: not tokamax's
_CUSTOM_CALL = re.compile(r'custom_call\s*@([\w.$-]+)|call_target_name\s*=\s*"([^"]+)"')

_target_sm = 0
_handles: list[ctypes.CDLL] = []


class TENotInstalled(RuntimeError):
    """Transformer Engine (JAX) or the stub libcuda is missing; the message says how to install."""


def stub_libcuda_path() -> Path:
    """Where the stub libcuda.so.1 built by scripts/install-te is (it may not exist)."""
    override = os.environ.get(STUB_ENV)
    return Path(override) if override else Path(sys.prefix) / STUB_RELATIVE


def _te_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for dist in ("transformer_engine", "transformer_engine_cu12", "transformer_engine_jax"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def missing_te() -> list[str]:
    """What keeps TE from loading here, without importing it (empty when all is in place)."""
    missing = [
        f"{dist}=={TE_VERSION} (found {found or 'none'})"
        for dist, found in _te_versions().items()
        if found != TE_VERSION
    ]
    if importlib.util.find_spec("nvidia") is None:
        missing.append("the nvidia-*-cu12 wheels (jax[cuda12])")
    if not stub_libcuda_path().is_file():
        missing.append(f"the stub libcuda.so.1 at {stub_libcuda_path()}")
    return missing


def te_available() -> bool:
    """Whether `prepare_te` can work here; cheap: reads package metadata, imports nothing."""
    return not missing_te()


def require_te() -> None:
    """Raise TENotInstalled, saying what is missing and how to install it, unless TE is usable."""
    missing = missing_te()
    if missing:
        raise TENotInstalled(f"missing: {'; '.join(missing)}.\n{TE_INSTALL_HINT}")


def _nvidia_dir() -> Path:
    spec = importlib.util.find_spec("nvidia")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def _load_libraries() -> None:
    """The stub driver first, then the CUDA 12 libraries TE's loader cannot find by itself.

    NVRTC_HOME/CURAND_HOME point TE's loader at the pip wheels: it searches those before
    CUDA_HOME and /usr/local/cuda, where a toolkit of another CUDA version may be; finding them
    also stops it looking for cudart under folder names the cu12 wheels do not use.
    """
    if _handles:
        return
    nvidia = _nvidia_dir()
    for name, folder in (("NVRTC", "cuda_nvrtc"), ("CURAND", "curand")):
        os.environ.setdefault(f"{name}_HOME", str(nvidia / folder))
    _handles.append(ctypes.CDLL(str(stub_libcuda_path()), mode=ctypes.RTLD_GLOBAL))
    for library in _PRELOAD:
        _handles.append(ctypes.CDLL(str(nvidia / library), mode=ctypes.RTLD_GLOBAL))


def _compute_capability(gpu_id: int = 0) -> int:
    """Stands in for transformer_engine_jax.get_device_compute_capability (needs a driver)."""
    del gpu_id
    return _target_sm


def prepare_te(sm: int) -> ModuleType:
    """Import transformer_engine.jax without a GPU, as if every device had compute capability `sm`.

    `sm` is 90 for H100/H200 (Hopper), 100 for B200 (Blackwell). TE asks the driver for it while
    tracing (cuBLAS workspace size, FP8 layouts, which kernel versions exist); here it is the
    target's. Callable again with another SM: TE's cached answers are cleared.
    """
    global _target_sm
    require_te()
    if _target_sm and _target_sm != sm:
        import jax

        jax.clear_caches()  # traces made for the previous SM must not be reused
    _target_sm = int(sm)
    try:
        _load_libraries()
        import transformer_engine.jax as te
        import transformer_engine_jax
    except (ImportError, OSError) as error:
        raise TENotInstalled(
            f"Transformer Engine is installed but does not load: {error}\n{TE_INSTALL_HINT}"
        ) from error

    # By module path: cpp_extensions re-exports a function named `gemm` over its submodule.
    gemm = importlib.import_module("transformer_engine.jax.cpp_extensions.gemm")
    device_utils = importlib.import_module("transformer_engine.jax.quantize.device_utils")
    helper = importlib.import_module("transformer_engine.jax.quantize.helper")

    # misc.py and device_utils look the query up on the extension module at call time;
    # gemm.py imported it by name.
    transformer_engine_jax.get_device_compute_capability = _compute_capability
    gemm.get_device_compute_capability = _compute_capability
    for cached in (
        device_utils.get_device_compute_capability,
        device_utils.is_fp8_gemm_with_all_layouts_supported,
        gemm._v2_grouped_gemm_supports_per_group_alpha_beta,
    ):
        cached.cache_clear()
    helper._is_scaling_mode_supported = None  # its own per-process cache of the SM checks
    return te


QUANTIZATIONS = ("none", "fp8", "mxfp8")


def te_supports(quantization: str) -> tuple[bool, str]:
    """Whether TE allows `quantization` on the SM given to `prepare_te`, and why not.

    TE's own rule (is_scaling_mode_supported): "fp8" (current scaling) needs SM 89+, "mxfp8"
    (block scaling) SM 100+. Lowering does not check it: an MXFP8 program lowers for SM 90 too,
    and would fail only on the GPU.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    from transformer_engine.jax.quantize import ScalingMode, helper

    mode = {
        "none": ScalingMode.NO_SCALING,
        "fp8": ScalingMode.CURRENT_TENSOR_SCALING,
        "mxfp8": ScalingMode.MXFP8_1D_SCALING,
    }[quantization]
    return helper.is_scaling_mode_supported(mode, gpu_id=0)


def lower_for_cuda(fn: Callable[..., Any], *abstract_args: Any) -> str:
    """StableHLO text of `jax.jit(fn)` lowered for CUDA from abstract args (ShapeDtypeStructs).

    Lowering needs no GPU; compiling would, so this stops at the lowered module.
    """
    import jax

    traced = jax.jit(fn).trace(*abstract_args)
    return traced.lower(lowering_platforms=("cuda",)).as_text()


def count_custom_calls(text: str) -> dict[str, int]:
    """Custom call target name -> number of calls in a StableHLO (or HLO) text."""
    names = (pretty or generic for pretty, generic in _CUSTOM_CALL.findall(text))
    return dict(Counter(names))


class TokamaxNotInstalled(RuntimeError):
    """tokamax is missing or of another version; the message says how to install it."""


def missing_tokamax() -> list[str]:
    """What keeps kernel tokamax from lowering here, without importing it (empty: nothing)."""
    try:
        found = importlib.metadata.version("tokamax")
    except importlib.metadata.PackageNotFoundError:
        found = None
    return (
        []
        if found == TOKAMAX_VERSION
        else [f"tokamax=={TOKAMAX_VERSION} (found {found or 'none'})"]
    )


def tokamax_available() -> bool:
    """Whether `prepare_tokamax` can work here; cheap: reads package metadata."""
    return not missing_tokamax()


def prepare_tokamax(sm: int) -> ModuleType:
    """Import tokamax to trace its GPU kernels here, as if every device had compute capability
    `sm` (90: Hopper). Process-wide, like `prepare_te`: call it in a process of its own.

    tokamax picks the kernel family by the default device's compute capability (private
    `gpu_utils._compute_capability`, None on CPU) and refuses devices without Mosaic GPU unless
    its `cross_compile` option is on (the backward kernels are built without a device bypass).
    """
    missing = missing_tokamax()
    if missing:
        raise TokamaxNotInstalled(f"missing: {'; '.join(missing)}.\n{TOKAMAX_INSTALL_HINT}")
    try:
        import tokamax
        from tokamax._src import gpu_utils
    except ImportError as error:
        raise TokamaxNotInstalled(
            f"tokamax is installed but does not load: {error}\n{TOKAMAX_INSTALL_HINT}"
        ) from error
    capability = sm / 10
    gpu_utils._compute_capability = lambda device=None: capability
    tokamax.config.cross_compile.config.set_global(True)
    return tokamax


def prepare_package(package: str, sm: int) -> ModuleType:
    """Prepare the package a kernel lowers through (its registry preflight's), as if every
    device had compute capability `sm`."""
    prepare = {"transformer_engine": prepare_te, "tokamax": prepare_tokamax}
    return prepare[package](sm)
