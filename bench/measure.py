"""The benchmark's measurements: each spec's layer and baselines compiled for its TPU slice
and timed as CPU twins (in child processes, bench.children), and the tool's own speed.

The results are plain JSON-able dicts; bench.report turns them into bench/RESULTS.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.baselines import unsupported
from bench.children import RESULT_PREFIX
from bench.report import VARIANTS
from moegen.diagnostics import SpecError
from moegen.pipeline import default_specs, load_valid
from moegen.plan import make_plan
from moegen.render import render
from moegen.variants import derive
from moegen.verify import plan_twin, reference_config, tpu_target, twin_of
from moegen.verify.reference.layer import ReferenceConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = REPO_ROOT / "specs"
COMPILE_TIMEOUT_S = 1200
TIME_TIMEOUT_S = 1200

# ----------------------------------------------------------------------------------------
# Child processes: one TPU compile, or the CPU timing of one spec's twin.
# ----------------------------------------------------------------------------------------


def _run_child(kind: str, job: dict, env: dict[str, str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="moegen-bench-") as tmp:
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "bench.children", kind, str(job_path)],
                cwd=REPO_ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line.removeprefix(RESULT_PREFIX))
    return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-3000:]}"}


def _child_env(devices: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if devices:
        flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    return env


# ----------------------------------------------------------------------------------------
# One spec.
# ----------------------------------------------------------------------------------------


def bench_spec(name: str, workdir: Path, repeats: int, log) -> dict[str, Any]:
    loaded = load_valid(SPEC_DIR / f"{name}.yaml")
    plan = make_plan(loaded)
    cfg = reference_config(plan)
    result: dict[str, Any] = {
        "name": name,
        "hardware": plan.hardware,
        "topology": plan.mesh.topology,
        "mesh": dict(plan.mesh.axes),
        "strategy": plan.experts.strategy,
        "kernel": plan.kernel.name,
        "useful_train_flops": plan.cost.train_flops,
        "hbm_bytes": plan.memory.hbm_bytes_per_device,
        "variants": {},
        "cpu": None,
    }
    reason = unsupported(ReferenceConfig(**cfg))
    if reason:
        result["skipped"] = f"the baselines do not cover {reason}"
        log(f"{name}: skipped ({result['skipped']})")
        return result
    if plan.mesh.tpu_topology_name is None:
        result["skipped"] = "not a TPU target"
        log(f"{name}: skipped ({result['skipped']})")
        return result
    module_path = workdir / f"{name}.py"
    module_path.write_text(render(plan), encoding="utf-8")
    tpu = tpu_target(plan).to_json()
    modules = {variant: module_path for variant in VARIANTS}
    result["plan_memory"] = {"moegen": _plan_memory(plan)}
    if plan.ffn.chunks > 1:
        # The trade the spec made: the same layer with the FFN whole, beside it.
        whole = make_plan(derive(loaded, {("memory", "ffn_chunks"): 1}))
        modules["moegen_whole"] = workdir / f"{name}_whole.py"
        modules["moegen_whole"].write_text(render(whole), encoding="utf-8")
        result["plan_memory"]["moegen_whole"] = _plan_memory(whole)
    for variant, path in modules.items():
        job = {"module": str(path), "variant": variant, "cfg": cfg, "tpu": tpu}
        job["forward"] = variant.startswith("moegen")
        outcome = _run_child("compile", job, _child_env(), COMPILE_TIMEOUT_S)
        result["variants"][variant] = outcome
        log(f"{name}: compiled {variant} for {plan.mesh.tpu_topology_name}: {_brief(outcome)}")

    result["cpu"] = _time_twins(name, loaded, plan, workdir, repeats)
    log(f"{name}: timed the CPU twins: {_brief_cpu(result['cpu'])}")
    return result


def _time_twins(name: str, loaded: Any, plan: Any, workdir: Path, repeats: int) -> dict:
    """The spec's CPU twin timed beside the baselines (and, for pallas, its kernel-xla twin)."""
    twin = twin_of(loaded, plan, dtype=None)
    twin_plan = plan_twin(twin, plan)
    twin_path = workdir / f"{name}_twin.py"
    twin_path.write_text(render(twin_plan), encoding="utf-8")
    job = {
        "module": str(twin_path),
        "cfg": reference_config(twin_plan),
        "variants": list(VARIANTS),
        "repeats": repeats,
        "kernel": "pallas (interpret)"
        if twin_plan.kernel.name == "pallas"
        else twin_plan.kernel.name,
    }
    if twin_plan.kernel.name == "pallas":
        # The same twin with kernel xla: the layer's own structure without the interpreter.
        xla_twin = _with_xla_kernel(twin)
        if xla_twin is not None:
            xla_path = workdir / f"{name}_twin_xla.py"
            xla_path.write_text(render(make_plan(xla_twin, interpret=True)), encoding="utf-8")
            job["xla_module"] = str(xla_path)
    return _run_child("time", job, _child_env(twin_plan.mesh.num_devices), TIME_TIMEOUT_S)


def _plan_memory(plan) -> dict[str, int]:
    return {
        "forward": plan.memory.forward_peak,
        "train": plan.memory.train_peak,
        "ffn_chunks": plan.ffn.chunks,
    }


def _with_xla_kernel(loaded):
    """`loaded` with target.kernel xla (no tiles), or None when that is not a valid spec."""
    try:
        return derive(loaded, {("target", "kernel"): "xla", ("target", "tiles"): None})
    except SpecError:
        return None


def _brief(outcome: dict) -> str:
    if "error" in outcome:
        return "error: " + outcome["error"].strip().splitlines()[-1]
    if "oom" in outcome:
        where = "scoped VMEM" if outcome.get("memory_space") == "vmem" else "HBM"
        return f"does not fit {where} ({outcome['seconds']:.0f} s)"
    c = outcome["counters"]
    return (
        f"{c['flops'] / 1e12:.2f} TFLOP, {c['bytes_accessed'] / 1e9:.1f} GB accessed, "
        f"peak {c['memory']['peak'] / 2**30:.2f} GiB ({outcome['seconds']:.0f} s)"
    )


def _brief_cpu(cpu: dict) -> str:
    if "error" in cpu:
        return "error: " + cpu["error"].strip().splitlines()[-1]
    return ", ".join(f"{v} {r['median_s'] * 1e3:.1f} ms" for v, r in cpu["variants"].items())


# ----------------------------------------------------------------------------------------
# The tool's own speed.
# ----------------------------------------------------------------------------------------

_STEP = re.compile(r"^\s+(verify: .+?)\s+(\d+\.\d+) s")


def tool_speed(log) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("MOEGEN_DEBUG", None)
    moegen = [sys.executable, "-m", "moegen"]

    def timed(args: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
        start = time.perf_counter()
        proc = subprocess.run(
            moegen + args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False
        )
        return time.perf_counter() - start, proc

    specs = default_specs(SPEC_DIR)
    seconds, proc = timed(["check"])
    result: dict[str, Any] = {
        "check": {"seconds": seconds, "rc": proc.returncode, "specs": len(specs)},
        "build_no_verify": {},
        "verify": {},
    }
    log(f"moegen check: {seconds:.1f} s (exit {proc.returncode})")
    with tempfile.TemporaryDirectory(prefix="moegen-bench-build-") as tmp:
        for path in specs:
            seconds, proc = timed(["build", "--no-verify", "--out", tmp, str(path)])
            result["build_no_verify"][path.stem] = {"seconds": seconds, "rc": proc.returncode}
            log(f"moegen build --no-verify {path.name}: {seconds:.1f} s (exit {proc.returncode})")
        for path in specs:
            if load_valid(path).spec.target.hardware != "cpu":
                continue
            seconds, proc = timed(["build", "--out", tmp, str(path)])
            steps = {
                m.group(1): float(m.group(2))
                for m in map(_STEP.match, proc.stderr.splitlines())
                if m
            }
            result["verify"][path.stem] = {
                "seconds": seconds,
                "rc": proc.returncode,
                "verify_seconds": sum(steps.values()),
                "steps": steps,
            }
            log(f"moegen build {path.name}: {seconds:.1f} s, verify {sum(steps.values()):.1f} s")
    return result
