"""The benchmark's child processes on small layers: one compile for a TPU slice (compile-only
devices, libtpu) and the CPU timing of a twin, each in its own process, through verify's public
API (moegen.verify.worker.compiled in the child). The benchmark itself is not a test."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tpu_cases import pallas_yaml, write_spec

from bench.measure import COMPILE_TIMEOUT_S, TIME_TIMEOUT_S, _child_env, _run_child
from bench.report import VARIANTS
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.render import render
from moegen.verify import plan_twin, reference_config, tpu_target, twin_of

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu")
def test_compile_child_counts_a_small_pallas_layer(tmp_path: Path) -> None:
    plan = make_plan(load_valid(write_spec(tmp_path, "bench_small", pallas_yaml())))
    module = tmp_path / "bench_small.py"
    module.write_text(render(plan), encoding="utf-8")
    job = {
        "module": str(module),
        "variant": "moegen",
        "cfg": reference_config(plan),
        "tpu": tpu_target(plan).to_json(),
        "forward": True,
    }
    outcome = _run_child("compile", job, _child_env(), COMPILE_TIMEOUT_S)
    assert "error" not in outcome, outcome.get("error")
    counters = outcome["counters"]
    assert counters["flops"] > 0 and counters["memory"]["peak"] > 0
    assert outcome["kernel_tile_bytes"] >= 0
    assert 0 < outcome["forward_memory"]["peak"] <= counters["memory"]["peak"]


@pytest.mark.slow
def test_time_child_runs_the_twin_and_both_baselines(tmp_path: Path) -> None:
    loaded = load_valid(REPO_ROOT / "specs" / "mixtral_small_cpu.yaml")
    plan = make_plan(loaded)
    twin_plan = plan_twin(twin_of(loaded, plan, dtype=None), plan)
    module = tmp_path / "twin.py"
    module.write_text(render(twin_plan), encoding="utf-8")
    job = {
        "module": str(module),
        "cfg": reference_config(twin_plan),
        "variants": list(VARIANTS),
        "repeats": 1,
        "kernel": twin_plan.kernel.name,
    }
    cpu = _run_child("time", job, _child_env(twin_plan.mesh.num_devices), TIME_TIMEOUT_S)
    assert "error" not in cpu, cpu.get("error")
    assert set(cpu["variants"]) == set(VARIANTS)
    for variant, result in cpu["variants"].items():
        assert result["median_s"] > 0 and len(result["runs_s"]) == 1
        # the baselines compute the same layer (bfloat16 compute: rounding apart)
        assert result["y_rel_err"] < 5e-2, variant
    assert cpu["devices"] == twin_plan.mesh.num_devices
