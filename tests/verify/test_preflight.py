"""Preflight (moegen.verify.preflight): a missing libtpu or Transformer Engine is reported at
the spec's target line, with the fix, before any twin runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO_ROOT, assert_no_traceback

import moegen.verify.verification
from moegen.kernels import te as te_kernel
from moegen.pipeline import generate
from moegen.verify import preflight

TPU_SPEC = "specs/mixtral_8x7b_v5e.yaml"
TE_SPEC = "specs/mixtral_8x7b_h100.yaml"
CPU_SPEC = "specs/mixtral_small_cpu.yaml"


def _line_of(spec: str, key: str) -> int:
    lines = (REPO_ROOT / spec).read_text(encoding="utf-8").splitlines()
    target = lines.index("target:")
    return (
        next(i for i, line in enumerate(lines) if i > target and line.strip().startswith(key)) + 1
    )


@pytest.fixture
def no_libtpu(monkeypatch):
    real = preflight.module_installed
    monkeypatch.setattr(preflight, "module_installed", lambda name: name != "libtpu" and real(name))


@pytest.fixture
def no_te(monkeypatch):
    monkeypatch.setattr(
        te_kernel, "missing_te", lambda: ["transformer_engine_jax==2.20.2 (found none)"]
    )


@pytest.fixture
def no_worker(monkeypatch):
    def worker(*args, **kwargs):
        raise AssertionError("a verify worker started (a twin would run)")

    monkeypatch.setattr(moegen.verify.verification, "_run_worker", worker)


def _problems(spec: str):
    generated = generate(REPO_ROOT / spec)
    return preflight.preflight_problems(generated.loaded, generated.plan)


def test_missing_libtpu_is_located_at_the_target_hardware_line(no_libtpu):
    [problem] = _problems(TPU_SPEC)
    assert problem.line == _line_of(TPU_SPEC, "hardware:")
    assert problem.field == "target.hardware"
    assert "needs libtpu" in problem.message
    assert "pip install 'moegen[tpu]'" in problem.message


def test_missing_te_is_located_at_the_target_kernel_line(no_te):
    [problem] = _problems(TE_SPEC)
    assert problem.line == _line_of(TE_SPEC, "kernel:")
    assert "transformer_engine_jax==2.20.2 (found none)" in problem.message
    assert "make te" in problem.message


def test_cpu_targets_need_neither(no_libtpu, no_te):
    assert _problems(CPU_SPEC) == []


def test_without_compiles_nothing_is_needed(no_libtpu):
    generated = generate(REPO_ROOT / TPU_SPEC)
    assert preflight.preflight_problems(generated.loaded, generated.plan, compiles=False) == []


def test_verify_stops_before_its_worker(no_libtpu, no_worker):
    generated = generate(REPO_ROOT / TPU_SPEC)
    with pytest.raises(preflight.MissingVerifier, match="needs libtpu"):
        moegen.verify.verify(generated.loaded, generated.source, plan=generated.plan)


def test_build_reports_it_before_any_twin_of_any_spec(
    no_libtpu, no_worker, tmp_project, invoke_main
):
    """The CPU spec comes first, but its twins must not run: the TPU spec cannot be verified."""
    result = invoke_main("build", CPU_SPEC, TPU_SPEC, cwd=tmp_project)
    assert result.code == 4, result.output
    assert "cannot verify here; nothing written:" in result.stderr
    line = _line_of(TPU_SPEC, "hardware:")
    assert f"{TPU_SPEC}:{line}:" in result.stderr
    assert "pip install 'moegen[tpu]'" in result.stderr
    assert "verify:" not in result.stderr
    assert_no_traceback(result.output)


def test_build_without_verification_needs_no_libtpu(no_libtpu, no_worker, tmp_project, invoke_main):
    out = Path("elsewhere")
    result = invoke_main("build", "--no-verify", "--out", out, TPU_SPEC, cwd=tmp_project)
    assert result.code == 0, result.output
    assert (tmp_project / out / "mixtral_8x7b_v5e.py").is_file()


def test_the_libtpu_fix_names_the_pinned_version():
    import tomllib

    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert extras["optional-dependencies"]["tpu"] == [preflight.LIBTPU_PIN]


EP_TE_SPEC = "specs/mixtral_8x7b_ep_h100_fp8.yaml"


def _on_xla(tmp_path: Path, strategy: str) -> Path:
    """The expert-parallel H100 example on jax.lax.ragged_dot (kernel xla), `strategy`."""
    text = (REPO_ROOT / EP_TE_SPEC).read_text(encoding="utf-8")
    text = text.replace("  kernel: te\n  quantization: fp8\n", "  kernel: xla\n")
    text = text.replace("experts: ragged_all_to_all", f"experts: {strategy}")
    path = tmp_path / "ep_xla.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_collective_xla_cpu_lacks_on_a_gpu_compiled_there_is_refused_located(tmp_path):
    """A GPU module on kernel xla is verified by compiling it with XLA:CPU, which has no
    ragged all-to-all: said before any twin, at the strategy's line (drawn by a campaign:
    every such build failed after its twins with XLA's UNIMPLEMENTED and a traceback)."""
    generated = generate(_on_xla(tmp_path, "ragged_all_to_all"))
    [problem] = preflight.preflight_problems(generated.loaded, generated.plan)
    assert problem.field == "parallelism.experts"
    assert "with kernel xla compiles the full-size layer with XLA:CPU" in problem.message
    assert "use a kernel lowered for CUDA (te or tokamax), or ring_of_experts" in problem.message
    ring = generate(_on_xla(tmp_path, "ring_of_experts"))
    assert preflight.preflight_problems(ring.loaded, ring.plan) == []


def test_it_does_not_stop_a_build_without_verification(tmp_path, invoke_main):
    spec = _on_xla(tmp_path, "ragged_all_to_all")
    refused = invoke_main("build", spec.name, cwd=tmp_path)
    assert refused.code == 4 and "cannot verify here; nothing written" in refused.stderr
    assert "ep_xla.yaml:" in refused.stderr and not (tmp_path / "generated").exists()
    assert_no_traceback(refused.stderr)
    built = invoke_main("build", "--no-verify", spec.name, cwd=tmp_path)
    assert built.code == 0, built.stderr
