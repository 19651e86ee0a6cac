"""Kernel tokamax (tokamax 0.0.17's Pallas Mosaic GPU ragged_dot, Hopper) on a CPU-only machine.

The plan and the module need nothing installed. Lowering for CUDA and the interpret-mode
numerics need tokamax 0.0.17 in the running venv (`make gpu-kernels`); without it those tests
are skipped, or fail when MOEGEN_REQUIRE_TOKAMAX=1 (CI: `make test-te`). No TE, no CUDA plugin:
jaxlib lowers Mosaic GPU kernels itself. Nothing here runs a kernel on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from moegen.kernels import tokamax as tokamax_kernel
from moegen.load import LoadedSpec
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.render import render
from moegen.verify import VerifyError, verify
from moegen.verify.twin import twin_of

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC = "mixtral_8x7b_h200_tokamax"


def _load(monkeypatch: pytest.MonkeyPatch, name: str = SPEC) -> LoadedSpec:
    monkeypatch.chdir(REPO_ROOT)
    return load_valid(Path(f"specs/{name}.yaml"))


def test_plan_and_module_of_the_tokamax_spec(monkeypatch) -> None:
    plan = make_plan(_load(monkeypatch))
    assert (
        plan.kernel.name == "tokamax"
        and plan.kernel.tiles is None
        and plan.kernel.row_padding is None
    )
    assert (plan.kernel.config.implementation, plan.kernel.config.cuda_sm) == ("mosaic_gpu", 90)
    assert plan.kernel.vma_unchecked_reason.startswith("tokamax's Pallas Mosaic GPU")
    source = render(plan)
    assert "\nimport tokamax\n" in source and 'TOKAMAX_IMPLEMENTATION = "mosaic_gpu"' in source
    assert source.count("_tokamax_grouped_matmul(") == 1 + 3  # defined once, one per projection
    assert "jax.lax.ragged_dot(" not in source and "transformer_engine" not in source


def test_only_a_tokamax_module_imports_tokamax(monkeypatch) -> None:
    for name in ("mixtral_8x7b_h100", "mixtral_small_cpu", "mixtral_8x7b_v5e"):
        assert "tokamax" not in render(make_plan(_load(monkeypatch, name)))


def test_twin_runs_the_portable_kernel(monkeypatch) -> None:
    loaded = _load(monkeypatch)
    twin = twin_of(loaded)
    assert twin.spec.target.kernel == "xla" and twin.spec.target.hardware == "gpu-h200"
    source = render(make_plan(twin, interpret=True))
    assert "import tokamax" not in source and "_tokamax_grouped_matmul" not in source
    assert "jax.lax.ragged_dot(" in source


def test_missing_tokamax_is_located_with_the_fix(monkeypatch) -> None:
    loaded = _load(monkeypatch)
    monkeypatch.setattr(tokamax_kernel, "missing_tokamax", lambda: ["tokamax==0.0.17 (found none)"])
    with pytest.raises(VerifyError) as info:
        verify(loaded, render(make_plan(loaded)), run_twins=False)
    message = str(info.value)
    assert "target.kernel: kernel tokamax: missing: tokamax==0.0.17" in message
    assert "make gpu-kernels" in message and "Traceback" not in message


@pytest.mark.gpu_library("tokamax")
def test_lowered_for_cuda_with_mosaic_gpu_kernels(monkeypatch) -> None:
    """Full size, SM 9.0: gate, up, down one Mosaic GPU kernel each forward; tokamax's VJP adds
    the input-gradient and weight-gradient kernels (9); XLA's ragged dot nowhere."""
    loaded = _load(monkeypatch)
    report = verify(loaded, render(make_plan(loaded)), run_twins=False)
    lowered = {s["step"]: s for s in report.steps if s["step"].startswith("lower ")}
    forward = lowered["lower forward for cuda"]
    training = lowered["lower forward+backward for cuda"]
    assert forward["sm"] == training["sm"] == 90
    assert forward["te_calls"] == {"mosaic_gpu_v2": 3}
    assert training["te_calls"] == {"mosaic_gpu_v2": 9}
    verdict = report.steps[-1]["verdict"]
    assert verdict.startswith("not compiled here (lowered for CUDA only); plan estimate")


@pytest.mark.gpu_library("tokamax")
@pytest.mark.slow
def test_latent_experts_lower_with_mosaic_gpu_kernels(tmp_path, monkeypatch) -> None:
    """The experts in a latent width (Nemotron-H's moe_latent_size): tokamax's kernels see the
    latent rows, the projections around them are plain dots; the same 3 + 6 kernels."""
    text = (REPO_ROOT / "specs" / f"{SPEC}.yaml").read_text(encoding="utf-8")
    text = text.replace("  ffn_dim: 14336\n", "  ffn_dim: 14336\n  latent_dim: 1024\n")
    assert "latent_dim: 1024" in text
    (tmp_path / "latent.yaml").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    loaded = load_valid(Path("latent.yaml"))
    source = render(make_plan(loaded))
    assert "latent = _latent_in(tokens, weights)" in source
    report = verify(loaded, source, run_twins=False)
    lowered = {s["step"]: s for s in report.steps if s["step"].startswith("lower ")}
    assert lowered["lower forward for cuda"]["te_calls"] == {"mosaic_gpu_v2": 3}
    assert lowered["lower forward+backward for cuda"]["te_calls"] == {"mosaic_gpu_v2": 9}


# The module's _tokamax_grouped_matmul run by Mosaic GPU's interpret mode on CPU: tokamax's SM 9.0
# forward kernel itself (its wgmma, TMA copies and barriers interpreted), against
# jax.lax.ragged_dot, with an empty group and rows past the groups (the kernel leaves those
# unwritten: the module zeroes them). The backward kernels do not run in interpret mode (jax
# 0.12.0.1: the ragged-contracting kernel's wgmma callback fails on a shape), so gradients are
# the twin's (kernel xla) and the lowering's.
INTERPRET_SCRIPT = """
import importlib.util, json, sys
import jax, jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu
from moegen.kernels import tokamax as tokamax_kernel
tokamax_kernel.prepare_tokamax(90)
spec = importlib.util.spec_from_file_location("tokamax_module", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
kx, kw = jax.random.split(jax.random.key(0))
x = jax.random.normal(kx, (256, 128), jnp.bfloat16)
w = jax.random.normal(kw, (4, 128, 128), jnp.float32)
sizes = jnp.array([32, 0, 128, 64], jnp.int32)  # 224 of 256 rows
want = jax.lax.ragged_dot(x, w.astype(jnp.bfloat16), sizes, preferred_element_type=jnp.float32)
with plgpu.force_gpu_interpret_mode():
    got = jax.jit(module._tokamax_grouped_matmul)(x, w, sizes)
got = got.astype(jnp.float32)
print(json.dumps({
    "error": float(jnp.max(jnp.abs(got[:224] - want[:224])) / jnp.max(jnp.abs(want))),
    "tail": float(jnp.max(jnp.abs(got[224:]))),
    "finite": bool(jnp.isfinite(got).all()),
}))
"""


@pytest.mark.gpu_library("tokamax")
@pytest.mark.slow
def test_the_forward_kernel_in_mosaic_gpu_interpret_mode(monkeypatch) -> None:
    module = REPO_ROOT / "generated" / f"{SPEC}.py"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(INTERPRET_SCRIPT), str(module)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["finite"] and figures["tail"] == 0.0
    assert figures["error"] < 1e-2  # bf16 output rounding of sums of 128 products
