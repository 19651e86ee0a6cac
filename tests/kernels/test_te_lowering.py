"""GPU targets lowered on a CPU-only machine: Transformer Engine grouped GEMMs for CUDA.

The TE-dependent tests need TE 2.20.2 (JAX) in the running venv (`scripts/install-te`); without
it they are skipped, or fail when MOEGEN_REQUIRE_TE=1 (CI). They lower, never run: expert
matmuls must become TE's FFI custom calls, forward and forward+backward, for H100/H200 (SM 90)
in bf16 and FP8 (current scaling) and for B200 (SM 100) in MXFP8.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from conftest import require_gpu_library

from moegen.kernels import te as te_kernel
from moegen.kernels.te import TeConfig
from moegen.render import _environment
from moegen.verify.worker import cuda

REPO_ROOT = Path(__file__).resolve().parents[2]

GROUPS, ROWS, EMBED, FFN = 4, 256, 128, 256
ALIGN = {"none": 1, "fp8": 16, "mxfp8": 128}  # rows per group inside the GEMM (te.jinja)
# (quantization, SM) -> TE custom calls of the forward, then of forward+backward (value_and_grad
# with respect to lhs and rhs): grouped GEMM fwd, dgrad, wgrad; quantize x, kernel, then grad.
# At SM 100 with every dim a multiple of 128, TE picks its V2 (CUDA-graph-safe) MXFP8 quantize;
# the cu12 build has no V2 grouped GEMM (it needs cuBLAS 13.3+), so the GEMM stays V1.
CASES = {
    ("none", 90): ({"te_grouped_gemm_ffi": 1}, {"te_grouped_gemm_ffi": 3}),
    ("fp8", 90): (
        {"te_grouped_quantize_ffi": 2, "te_grouped_gemm_ffi": 1},
        {"te_grouped_quantize_ffi": 3, "te_grouped_gemm_ffi": 3},
    ),
    ("mxfp8", 100): (
        {"te_grouped_quantize_v2_ffi": 2, "te_grouped_gemm_ffi": 1},
        {"te_grouped_quantize_v2_ffi": 3, "te_grouped_gemm_ffi": 3},
    ),
}


def te_ragged_dot(lhs, rhs, group_sizes, quantization, out_dtype=None):
    """jax.lax.ragged_dot(lhs [m, k], rhs [G, k, n], group_sizes [G]) through TE grouped_dense.

    The helper of templates/kernels/te.jinja, written by hand: TE wants the groups to cover
    every row and, quantized, each group to be a multiple of ALIGN rows.
    """
    import jax.numpy as jnp
    from transformer_engine.jax import dense as te_dense
    from transformer_engine.jax import quantize as te_quantize

    rows, groups, align = lhs.shape[0], rhs.shape[0], ALIGN[quantization]
    if quantization == "none":
        quantizers = te_quantize.noop_quantizer_set
    else:
        quantizers = te_quantize.QuantizerFactory.create_set(
            scaling_mode=te_quantize.ScalingMode.CURRENT_TENSOR_SCALING
            if quantization == "fp8"
            else te_quantize.ScalingMode.MXFP8_1D_SCALING,
            fwd_dtype=jnp.float8_e4m3fn,
            bwd_dtype=jnp.float8_e5m2 if quantization == "fp8" else jnp.float8_e4m3fn,
            n_groups=groups,
        )
    rhs = rhs.astype(lhs.dtype)
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.cumsum(sizes)
    row = jnp.arange(rows, dtype=jnp.int32)
    group = jnp.minimum(jnp.searchsorted(ends, row, side="right"), groups - 1)
    aligned = (sizes + align - 1) // align * align
    padded = -(-(rows + groups * (align - 1)) // align) * align
    slot = row - (ends - sizes)[group] + (jnp.cumsum(aligned) - aligned)[group]
    slot = jnp.where(row < ends[-1], slot, padded)
    buffer = jnp.zeros((padded, lhs.shape[1]), lhs.dtype).at[slot].set(lhs, mode="drop")
    aligned = aligned.at[-1].add(padded - aligned.sum())
    out = te_dense.grouped_dense(
        buffer, rhs, aligned, preferred_element_type=out_dtype, quantizer_set=quantizers
    )
    return jnp.take(out, slot, axis=0, mode="fill", fill_value=0)


def abstract_args():
    import jax
    import jax.numpy as jnp

    return (
        jax.ShapeDtypeStruct((ROWS, EMBED), jnp.bfloat16),
        jax.ShapeDtypeStruct((GROUPS, EMBED, FFN), jnp.bfloat16),
        jax.ShapeDtypeStruct((GROUPS,), jnp.int32),
    )


def te_calls(text: str) -> dict[str, int]:
    return {k: v for k, v in cuda.count_custom_calls(text).items() if k.startswith("te_")}


def forward_and_backward(matmul):
    """The forward, and forward+backward (value and gradients wrt lhs and rhs) of `matmul`."""
    import jax
    import jax.numpy as jnp

    def loss(lhs, rhs, group_sizes):
        return jnp.sum(matmul(lhs, rhs, group_sizes).astype(jnp.float32) ** 2)

    return matmul, jax.value_and_grad(loss, argnums=(0, 1))


# -- without TE ---------------------------------------------------------------------------


def test_count_custom_calls_reads_pretty_and_generic_stablehlo():
    text = (
        "%0 = stablehlo.custom_call @te_grouped_gemm_ffi(%a) : ...\n"
        "%1 = stablehlo.custom_call @te_grouped_gemm_ffi(%b) {x} : ...\n"
        '%2 = "stablehlo.custom_call"(%c) {call_target_name = "te_grouped_quantize_ffi"}\n'
        "%3 = stablehlo.dot_general %a, %b\n"
    )
    assert cuda.count_custom_calls(text) == {"te_grouped_gemm_ffi": 2, "te_grouped_quantize_ffi": 1}


def test_missing_te_raises_with_the_install_command(monkeypatch):
    monkeypatch.setattr(
        te_kernel, "missing_te", lambda: ["transformer_engine_jax==2.20.2 (found none)"]
    )
    assert not te_kernel.te_available()
    with pytest.raises(te_kernel.TENotInstalled) as caught:
        te_kernel.prepare_te(90)
    message = str(caught.value)
    assert "transformer_engine_jax==2.20.2 (found none)" in message
    assert "scripts/install-te" in message and "moegen[te]" in message


def test_missing_stub_libcuda_makes_te_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv(te_kernel.STUB_ENV, str(tmp_path / "libcuda.so.1"))
    assert any("stub libcuda.so.1" in item for item in te_kernel.missing_te())
    assert not te_kernel.te_available()


def test_absent_distributions_raise_the_clear_error(monkeypatch):
    import importlib.metadata

    def not_found(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_found)
    with pytest.raises(te_kernel.TENotInstalled, match="scripts/install-te"):
        te_kernel.require_te()


def test_te_that_fails_to_import_raises_the_clear_error(monkeypatch):
    """Installed as far as metadata goes, but the import fails (a half-finished install)."""
    monkeypatch.setattr(te_kernel, "missing_te", lambda: [])
    monkeypatch.setattr(te_kernel, "_load_libraries", lambda: None)
    monkeypatch.setitem(sys.modules, "transformer_engine.jax", None)
    with pytest.raises(te_kernel.TENotInstalled, match="does not load") as caught:
        te_kernel.prepare_te(90)
    assert "scripts/install-te" in str(caught.value)


def test_te_tests_skip_without_te_or_fail_when_ci_requires_it(monkeypatch):
    monkeypatch.setattr(te_kernel, "missing_te", lambda: ["transformer_engine_jax==2.20.2"])
    monkeypatch.delenv("MOEGEN_REQUIRE_TE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="make te"):
        require_gpu_library("te")
    monkeypatch.setenv("MOEGEN_REQUIRE_TE", "1")
    with pytest.raises(pytest.fail.Exception, match="MOEGEN_REQUIRE_TE=1.*transformer_engine_jax"):
        require_gpu_library("te")


def test_every_kernel_that_lowers_through_a_gpu_library_is_one_the_tests_know() -> None:
    """conftest's GPU libraries are the registry's kernels with a CUDA lowering (a new one
    needs its CI variable and its install there)."""
    from conftest import GPU_LIBRARIES

    from moegen.kernels import KERNELS

    lowered = {name for name, kernel in KERNELS.items() if kernel.cuda_lowering is not None}
    assert set(GPU_LIBRARIES) == lowered


def test_make_test_te_runs_every_test_that_needs_a_gpu_library():
    """make test skips them (no TE yet); make test-te runs only its files' marked tests."""
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    listed = next(line for line in makefile.splitlines() if line.startswith("TE_TESTS :="))
    marked = {
        path.relative_to(REPO_ROOT).as_posix()
        for path in (REPO_ROOT / "tests").rglob("test_*.py")
        if "mark.gpu_library(" in path.read_text(encoding="utf-8")
    }
    assert marked and marked <= set(listed.split(":=")[1].split())
    assert "-m gpu_library $(TE_TESTS)" in makefile


# -- with TE (lowering only) ----------------------------------------------------------------


@pytest.mark.gpu_library("te")
@pytest.mark.parametrize(("quantization", "sm"), list(CASES), ids=lambda v: str(v))
def test_grouped_dense_lowers_to_te_custom_calls(quantization, sm):
    """TE's public grouped_dense, as it is: forward one GEMM, forward+backward three."""
    te_kernel.prepare_te(sm)
    from transformer_engine.jax import dense as te_dense

    forward_calls, training_calls = CASES[quantization, sm]

    def matmul(lhs, rhs, group_sizes):
        quantizers = _quantizers(quantization)
        return te_dense.grouped_dense(lhs, rhs, group_sizes, quantizer_set=quantizers)

    fwd, train = forward_and_backward(matmul)
    assert te_calls(cuda.lower_for_cuda(fwd, *abstract_args())) == forward_calls
    assert te_calls(cuda.lower_for_cuda(train, *abstract_args())) == training_calls


def _quantizers(quantization):
    import jax.numpy as jnp
    from transformer_engine.jax import quantize as te_quantize

    if quantization == "none":
        return te_quantize.noop_quantizer_set
    return te_quantize.QuantizerFactory.create_set(
        scaling_mode=te_quantize.ScalingMode.CURRENT_TENSOR_SCALING
        if quantization == "fp8"
        else te_quantize.ScalingMode.MXFP8_1D_SCALING,
        fwd_dtype=jnp.float8_e4m3fn,
        bwd_dtype=jnp.float8_e5m2 if quantization == "fp8" else jnp.float8_e4m3fn,
        n_groups=GROUPS,
    )


@pytest.mark.gpu_library("te")
@pytest.mark.parametrize(("quantization", "sm"), list(CASES), ids=lambda v: str(v))
def test_ragged_dot_helper_lowers_to_te_grouped_gemms_only(quantization, sm):
    """The ragged_dot-shaped helper: TE's calls, and no dense matmul left for XLA."""
    te_kernel.prepare_te(sm)
    forward_calls, training_calls = CASES[quantization, sm]
    fwd, train = forward_and_backward(lambda *a: te_ragged_dot(*a, quantization))
    for program, calls in ((fwd, forward_calls), (train, training_calls)):
        text = cuda.lower_for_cuda(program, *abstract_args())
        assert te_calls(text) == calls
        assert "dot_general" not in text and "ragged_dot" not in text


@pytest.mark.gpu_library("te")
def test_template_helper_renders_and_lowers_like_the_hand_written_one():
    """templates/kernels/te.jinja's functions(p) and call macros, rendered and lowered."""
    te_kernel.prepare_te(90)
    template = _environment().get_template("kernels/te.jinja").make_module()
    for quantization, sm in CASES:
        te_kernel.prepare_te(sm)
        align = ALIGN[quantization]
        te = TeConfig(
            quantization=quantization,
            group_align=align,
            aligned_rows=-(-(ROWS + GROUPS * (align - 1)) // align) * align,
            cuda_sm=sm,
        )
        p = types.SimpleNamespace(kernel=types.SimpleNamespace(config=te))
        call = template.grouped_matmul(p, "lhs", "rhs", "group_sizes", "None")
        widened = template.grouped_matmul(p, "lhs", "rhs", "group_sizes", "None", "jnp.float32")
        source = "\n".join(
            [
                "import jax",
                "import jax.numpy as jnp",
                str(template.imports()),
                str(template.constants(p)),
                str(template.functions(p)),
                "def matmul(lhs, rhs, group_sizes):",
                f"    return {call}",
                "def matmul_f32(lhs, rhs, group_sizes):",
                f"    return {widened}",
            ]
        )
        namespace: dict = {}
        exec(compile(source, "te.jinja", "exec"), namespace)
        assert namespace["TE_GROUP_ALIGN"] == ALIGN[quantization]
        forward_calls, training_calls = CASES[quantization, sm]
        fwd, train = forward_and_backward(namespace["matmul"])
        assert te_calls(cuda.lower_for_cuda(fwd, *abstract_args())) == forward_calls
        assert te_calls(cuda.lower_for_cuda(train, *abstract_args())) == training_calls
        text = cuda.lower_for_cuda(namespace["matmul_f32"], *abstract_args())
        assert f"tensor<{ROWS}x{FFN}xf32>" in text


@pytest.mark.gpu_library("te")
def test_te_sm_rules():
    """TE's own rule: MXFP8 needs Blackwell (SM 100); FP8 current scaling runs on Hopper."""
    te_kernel.prepare_te(90)
    assert te_kernel.te_supports("fp8") == (True, "")
    supported, reason = te_kernel.te_supports("mxfp8")
    assert not supported and "9.9 or higher" in reason
    te_kernel.prepare_te(100)
    assert te_kernel.te_supports("mxfp8") == (True, "")


SHARD_MAP_CHILD = textwrap.dedent(
    """
    import json, sys
    sys.path[:0] = {tests!r}
    from moegen.kernels import te as te_kernel
    from moegen.verify.worker import cuda
    te_kernel.prepare_te({sm})
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from test_te_lowering import GROUPS, ROWS, EMBED, FFN, forward_and_backward, te_calls, te_ragged_dot

    mesh = jax.make_mesh((2,), ("expert",), devices=jax.devices()[:2])
    def local(lhs, rhs, group_sizes):
        return te_ragged_dot(lhs, rhs, group_sizes[0], {quantization!r})
    matmul = jax.shard_map(
        local, mesh=mesh, in_specs=(P("expert"),) * 3, out_specs=P("expert"), check_vma=False
    )
    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("expert")))
    args = (spec((2 * ROWS, EMBED), jnp.bfloat16), spec((2 * GROUPS, EMBED, FFN), jnp.bfloat16),
            spec((2, GROUPS), jnp.int32))
    result = {{}}
    for name, program in zip(("forward", "forward+backward"), forward_and_backward(matmul)):
        text = cuda.lower_for_cuda(program, *args)
        result[name] = te_calls(text)
        result["partitions"] = "mhlo.num_partitions = 2" in text
    print(json.dumps(result))
    """
)


@pytest.mark.gpu_library("te")
@pytest.mark.parametrize("quantization", ["none", "fp8"])
def test_helper_inside_shard_map_over_two_devices_lowers_for_cuda(quantization):
    """Inside jax.shard_map (2 CPU devices stand in for 2 GPUs): the per-device calls are TE's.

    An AbstractMesh is not enough: TE's primitives use custom partitioning, which needs devices
    when lowering. A child process gets its two devices (JAX fixes the count at start-up).
    """
    te_kernel.prepare_te(90)
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    env["JAX_PLATFORMS"] = "cpu"
    script = SHARD_MAP_CHILD.format(
        tests=[str(Path(__file__).resolve().parent), str(REPO_ROOT / "tests")]
        + [str(REPO_ROOT / "tests" / "support")],
        sm=90,
        quantization=quantization,
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    forward_calls, training_calls = CASES[quantization, 90]
    assert result == {
        "forward": forward_calls,
        "forward+backward": training_calls,
        "partitions": True,
    }
