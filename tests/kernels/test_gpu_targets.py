"""GPU targets end to end: the example specs for gpu-h100 (bf16), gpu-b200 (mxfp8) and
gpu-h100 with expert parallelism (fp8) build here, without a GPU.

Their twins run the same generated code with the portable grouped matmul in place of
Transformer Engine's (TE needs a GPU), so everything but the TE call is checked numerically
on CPU; the full-size forward and forward+backward are lowered for CUDA with TE and must hold
the TE grouped-GEMM custom calls the spec asks for. Without TE installed the lowering tests
are skipped (they fail under MOEGEN_REQUIRE_TE=1, as in CI: `make test-te`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moegen.load import LoadedSpec
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.render import render
from moegen.verify import VerifyError, verify
from moegen.verify.twin import TOLERANCES, twin_of

REPO_ROOT = Path(__file__).resolve().parents[2]
# spec -> (SM, quantization, the TE quantize custom call, quantize calls forward / training)
GPU_SPECS = {
    "mixtral_8x7b_h100": (90, "none", None, 0, 0),
    "qwen3_30b_a3b_b200_mxfp8": (100, "mxfp8", "te_grouped_quantize_v2_ffi", 6, 9),
    "mixtral_8x7b_ep_h100_fp8": (90, "fp8", "te_grouped_quantize_ffi", 6, 9),
}


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> LoadedSpec:
    monkeypatch.chdir(REPO_ROOT)
    return load_valid(Path(f"specs/{name}.yaml"))


@pytest.mark.parametrize("name", list(GPU_SPECS))
def test_plan_of_a_gpu_spec(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sm, quantization, *_ = GPU_SPECS[name]
    plan = make_plan(_load(name, monkeypatch))
    assert (plan.kernel.name, plan.kernel.config.cuda_sm, plan.kernel.config.quantization) == (
        "te",
        sm,
        quantization,
    )
    assert plan.mesh.tpu_topology_name is None and plan.kernel.row_padding is None
    assert plan.kernel.vma_unchecked_reason.startswith("Transformer Engine")
    source = render(plan)
    assert "from transformer_engine.jax import dense as te_dense" in source
    assert source.count("_te_grouped_matmul(") == 1 + 3  # defined once, called per projection
    assert "megablox" not in source and "jax.lax.ragged_dot(" not in source


@pytest.mark.parametrize("name", list(GPU_SPECS))
@pytest.mark.slow
def test_twin_runs_the_portable_kernel_in_place_of_te(name, monkeypatch) -> None:
    """No TE needed: the twin is the same module with jax.lax.ragged_dot as the kernel."""
    loaded = _load(name, monkeypatch)
    twin = twin_of(loaded)
    assert (twin.spec.target.kernel, twin.spec.target.quantization) == ("xla", "none")
    assert twin.spec.target.hardware == loaded.spec.target.hardware
    twin_source = render(make_plan(twin, interpret=True))
    assert "transformer_engine" not in twin_source and "jax.lax.ragged_dot(" in twin_source
    report = verify(loaded, render(make_plan(loaded)), run_compiles=False)
    parity = [s for s in report.steps if s["step"].startswith("twin parity")]
    assert len(parity) == 2
    for step in parity:
        bound = (
            TOLERANCES["float32"] if step["step"].endswith("(float32)") else TOLERANCES["bfloat16"]
        )
        assert all(case["max_relative_error"] < bound for case in step["cases"])


@pytest.mark.gpu_library("te")
@pytest.mark.parametrize("name", list(GPU_SPECS))
def test_lowered_for_cuda_with_te_grouped_gemms(name, monkeypatch) -> None:
    sm, quantization, quantize_call, forward_q, training_q = GPU_SPECS[name]
    loaded = _load(name, monkeypatch)
    report = verify(loaded, render(make_plan(loaded)), run_twins=False)
    lowered = {s["step"]: s for s in report.steps if s["step"].startswith("lower ")}
    forward = lowered["lower forward for cuda"]
    training = lowered["lower forward+backward for cuda"]
    assert forward["sm"] == training["sm"] == sm
    # gate, up, down: one grouped GEMM each forward; the backward adds dgrad and wgrad
    assert forward["te_calls"]["te_grouped_gemm_ffi"] == 3
    assert training["te_calls"]["te_grouped_gemm_ffi"] == 9
    if quantize_call is None:
        assert not any("quantize" in call for call in training["te_calls"])
    else:
        assert forward["te_calls"][quantize_call] == forward_q  # lhs and rhs of each GEMM
        assert training["te_calls"][quantize_call] == training_q
    verdict = report.steps[-1]["verdict"]
    assert verdict.startswith("not compiled here (lowered for CUDA only); plan estimate")


def test_missing_te_is_a_clear_error_not_a_traceback(monkeypatch, tmp_path) -> None:
    """Without TE (here: without the stub driver it needs), verify says what to install."""
    loaded = _load("mixtral_8x7b_h100", monkeypatch)
    monkeypatch.setenv("MOEGEN_CUDA_STUB", str(tmp_path / "no-libcuda.so.1"))
    with pytest.raises(VerifyError) as info:
        verify(loaded, render(make_plan(loaded)), run_twins=False)
    message = str(info.value)
    assert "kernel te:" in message and "scripts/install-te" in message
    assert "Traceback" not in message
