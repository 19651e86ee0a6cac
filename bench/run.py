"""Benchmark: generated layers against two plain-JAX baselines, and the tool's own speed.

    python -m bench.run [--specs NAME ...] [--out bench/RESULTS.md] [--repeats 5]

For each example spec (by name, from specs/):

1. TPU counters: forward+backward (gradients of sum(y) with respect to the parameters and x)
   of the generated module and of both baselines (bench/baselines.py) is compiled for the
   spec's slice on compile-only devices (libtpu, no TPU), each compile in a fresh process.
   Counters come from `moegen.verify.counters.compiled_counters`: compiled flops and bytes
   accessed, per-device peak memory, collectives with or without compute scheduled inside.
   Useful FLOPs are the plan's `cost.train_flops` (per device).
2. CPU wall time of the twins: the spec's shrunken twin (its own dtypes, the same mesh on
   fake CPU devices; Pallas kernels in interpret mode) and both baselines at the twin's shapes,
   forward+backward, median of `--repeats` runs after a warm-up, in one process per spec.
3. The tool's own speed: `moegen check` over all specs, `moegen build --no-verify` per spec,
   and `moegen build` (verification included) for the cpu specs.

Everything lands in one markdown file (--out) with the command, the date and the versions.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = REPO_ROOT / "specs"
DEFAULT_OUT = REPO_ROOT / "bench" / "RESULTS.md"
DEFAULT_SPECS = (
    "mixtral_8x7b_v5e",
    "mixtral_8x7b_ep_a2a_v5e",
    "qwen3_30b_a3b_v6e",
    "qwen3_30b_a3b_ring_v6e",
    "llama4_scout_v5e",
    "gpt_oss_120b_v6e",
)
VARIANTS = ("moegen", "dense_dispatch", "ragged_dot")
BASELINE_NAMES = VARIANTS[1:]
COMPILE_TIMEOUT_S = 1200
TIME_TIMEOUT_S = 1200

# ----------------------------------------------------------------------------------------
# Child processes: one TPU compile, or the CPU timing of one spec's twin.
# ----------------------------------------------------------------------------------------


def _import(path: str, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _program(module, variant: str, cfg: dict, mesh):
    """The forward+backward of `variant` for `module`'s shapes."""
    from bench.baselines import baseline, training_step
    from moegen.verify.reference import ReferenceConfig

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
    import jax

    from moegen.verify.counters import compiled_counters
    from moegen.verify.loops import kernel_tile_bytes
    from moegen.verify.worker import target_devices

    module = _import(job["module"], "bench_module")
    variant = "moegen" if job["variant"].startswith("moegen") else job["variant"]
    mesh = _mesh(module, target_devices(module, job["tpu"]), variant)
    layer, step = _program(module, variant, job["cfg"], mesh)
    params, x = module.param_shapes(mesh), module.input_shape(mesh)
    start = time.perf_counter()
    try:
        compiled = jax.jit(step).lower(params, x).compile()
    except jax.errors.JaxRuntimeError as err:
        if "RESOURCE_EXHAUSTED" not in str(err):
            raise
        return {"oom": str(err).strip().splitlines()[0], "seconds": time.perf_counter() - start}
    seconds = time.perf_counter() - start
    result = {
        "counters": compiled_counters(compiled, items=False),
        "kernel_tile_bytes": kernel_tile_bytes(compiled.as_text()),
        "seconds": seconds,
    }
    if job.get("forward"):
        forward = jax.jit(layer).lower(params, x).compile()
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


def _worker_main(kind: str, job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    try:
        result = {"compile": compile_worker, "time": time_worker}[kind](job)
    except Exception:
        result = {"error": traceback.format_exc()[-3000:]}
    print("BENCH-RESULT " + json.dumps(result), flush=True)
    return 0


def _run_child(kind: str, job: dict, env: dict[str, str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="moegen-bench-") as tmp:
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "bench.run", "--worker", kind, str(job_path)],
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
        if line.startswith("BENCH-RESULT "):
            return json.loads(line.removeprefix("BENCH-RESULT "))
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
    from bench.baselines import unsupported
    from moegen.pipeline import load_valid
    from moegen.plan import make_plan
    from moegen.render import render
    from moegen.verify import reference_config
    from moegen.verify.reference import ReferenceConfig
    from moegen.verify.twin import twin_of

    loaded = load_valid(SPEC_DIR / f"{name}.yaml")
    plan = make_plan(loaded)
    cfg = reference_config(plan)
    result: dict[str, Any] = {
        "name": name,
        "hardware": plan.hardware,
        "topology": plan.topology,
        "mesh": dict(plan.mesh_axes),
        "strategy": plan.expert_strategy,
        "kernel": plan.kernel,
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
    if plan.tpu_topology_name is None:
        result["skipped"] = "not a TPU target"
        log(f"{name}: skipped ({result['skipped']})")
        return result
    module_path = workdir / f"{name}.py"
    module_path.write_text(render(plan), encoding="utf-8")
    tpu = {
        "topology_name": plan.tpu_topology_name,
        "chips_per_host_bounds": list(plan.chips_per_host_bounds or ()),
        "num_slices": plan.slices,
    }
    modules = {variant: module_path for variant in VARIANTS}
    result["plan_memory"] = {"moegen": _plan_memory(plan)}
    if plan.ffn_chunks > 1:
        # The trade the spec made: the same layer with the FFN whole, beside it.
        whole = make_plan(_with_ffn_chunks(loaded, 1))
        modules["moegen_whole"] = workdir / f"{name}_whole.py"
        modules["moegen_whole"].write_text(render(whole), encoding="utf-8")
        result["plan_memory"]["moegen_whole"] = _plan_memory(whole)
    for variant, path in modules.items():
        job = {"module": str(path), "variant": variant, "cfg": cfg, "tpu": tpu}
        job["forward"] = variant.startswith("moegen")
        outcome = _run_child("compile", job, _child_env(), COMPILE_TIMEOUT_S)
        result["variants"][variant] = outcome
        log(f"{name}: compiled {variant} for {plan.tpu_topology_name}: {_brief(outcome)}")

    twin = twin_of(loaded, dtype=None)
    twin_plan = make_plan(twin, interpret=True)
    twin_path = workdir / f"{name}_twin.py"
    twin_path.write_text(render(twin_plan), encoding="utf-8")
    job = {
        "module": str(twin_path),
        "cfg": reference_config(twin_plan),
        "variants": list(VARIANTS),
        "repeats": repeats,
        "kernel": "pallas (interpret)" if twin_plan.kernel == "pallas" else twin_plan.kernel,
    }
    if twin_plan.kernel == "pallas":
        # The same twin with kernel xla: the layer's own structure without the interpreter.
        xla_twin = _with_xla_kernel(twin)
        if xla_twin is not None:
            xla_path = workdir / f"{name}_twin_xla.py"
            xla_path.write_text(render(make_plan(xla_twin, interpret=True)), encoding="utf-8")
            job["xla_module"] = str(xla_path)
    result["cpu"] = _run_child("time", job, _child_env(twin_plan.num_devices), TIME_TIMEOUT_S)
    log(f"{name}: timed the CPU twins: {_brief_cpu(result['cpu'])}")
    return result


def _plan_memory(plan) -> dict[str, int]:
    return {
        "forward": plan.memory.forward_peak,
        "train": plan.memory.train_peak,
        "ffn_chunks": plan.ffn_chunks,
    }


def _with_ffn_chunks(loaded, chunks: int):
    """`loaded` with memory.ffn_chunks pinned."""
    from dataclasses import replace

    from moegen.validate import validate

    spec = loaded.spec
    memory = spec.memory.model_copy(update={"ffn_chunks": chunks})
    return validate(replace(loaded, spec=spec.model_copy(update={"memory": memory})))


def _with_xla_kernel(loaded):
    """`loaded` with target.kernel xla (no tiles), or None when that is not a valid spec."""
    from dataclasses import replace

    from moegen.diagnostics import SpecError
    from moegen.validate import validate

    spec = loaded.spec
    target = spec.target.model_copy(update={"kernel": "xla", "tiles": None})
    try:
        return validate(replace(loaded, spec=spec.model_copy(update={"target": target})))
    except SpecError:
        return None


def _brief(outcome: dict) -> str:
    if "error" in outcome:
        return "error: " + outcome["error"].strip().splitlines()[-1]
    if "oom" in outcome:
        return f"does not fit ({outcome['seconds']:.0f} s)"
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
    from moegen.pipeline import default_specs, load_valid
    from moegen.plan import make_plan

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
            if make_plan(load_valid(path)).hardware != "cpu":
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


# ----------------------------------------------------------------------------------------
# The report.
# ----------------------------------------------------------------------------------------

LABELS = {
    "moegen": "moegen",
    "moegen_whole": "moegen, whole FFN (memory.ffn_chunks 1)",
    "moegen_xla": "moegen, kernel xla",
    "dense_dispatch": "dense dispatch",
    "ragged_dot": "ragged_dot",
}


READING_NOTES = (
    "Compiled flops and bytes of a megablox call are the kernel's own static CostEstimate: "
    "2*m*k*n and its operands' bytes over the whole row buffer, whatever the routing. The "
    "kernel's grid only runs the row tiles that hold rows of its groups (megablox's "
    "`num_active_tiles`, computed from the group sizes at run time), so where the plan sizes "
    "the buffer for the worst case (ragged_all_to_all: RECEIVE_ROWS, 4x the routed rows in "
    "mixtral_8x7b_ep_a2a_v5e; ring of experts: every copy of the expert group, 8x in "
    "qwen3_30b_a3b_ring_v6e) the compiled figure is "
    "an upper bound of the work done at run time, and */ useful* shows that bound, not waste "
    "at balanced routing. The XLA figures of the baselines come from XLA's own cost model of "
    "what GSPMD made of them.",
    "The two models also count a matmul differently: megablox's estimate counts its tiles as "
    "it moves them (the rows once per output tile, one expert's weights once per row tile), "
    "XLA counts a dot or a ragged dot as its operands and result once, whatever tiles its "
    "emitter uses. *bytes, kernel operands once* takes from the compiled bytes what each "
    "kernel call's estimate counts beyond one read of its operands and one write of its result "
    "(`moegen.verify.loops.kernel_tile_bytes`, loop trips included), so that the Pallas layers "
    "are counted as XLA counts the baselines; it equals *bytes accessed* for a layer without "
    "Pallas kernels.",
    "Where a baseline's */ useful* is above 1 without a worst-case buffer, GSPMD replicated work: "
    "e.g. ragged_dot on an expert-sharded mesh sorts the global batch and runs the grouped "
    "matmuls unsharded over the expert axis.",
    "*exposed / all collectives* counts static collectives of the scheduled HLO (one inside a "
    "loop body counts once). Synchronous collectives are exposed by definition; an async one "
    "is hidden when any compute is scheduled between its start and its done (XLA:TPU async "
    "collective fusions included). *exposed collective MiB* sums their result buffers (for a "
    "ragged all-to-all, the whole receive buffer: an upper bound of what moves).",
    "Peak memory is per device from the compiler; *fits HBM* compares it with the chip's HBM "
    "per device (moegen/hardware.py).",
    "CPU twin times are tens-of-tokens programs: they measure dispatch overhead and op count, "
    "not arithmetic, and say nothing about TPU speed. Pallas twins run interpreted.",
)


def _counters(spec: dict, variant: str) -> dict | None:
    outcome = spec["variants"].get(variant) or {}
    return outcome.get("counters")


def _operand_bytes(spec: dict, variant: str) -> float | None:
    """Bytes accessed with each kernel call counted as XLA counts a dot: operands and result
    once (moegen.verify.loops.kernel_tile_bytes); the same as bytes accessed without kernels."""
    outcome = spec["variants"].get(variant) or {}
    if "counters" not in outcome:
        return None
    return outcome["counters"]["bytes_accessed"] - outcome.get("kernel_tile_bytes", 0.0)


# The compiled metrics compared with each baseline (ratios, losses): label, value of a variant
# that has counters, format, unit.
COMPARED = (
    ("compiled flops", lambda spec, v: _counters(spec, v)["flops"], "{:.4g} TFLOP", 1e12),
    ("bytes accessed", lambda spec, v: _counters(spec, v)["bytes_accessed"], "{:.4g} GB", 1e9),
    (
        "bytes accessed, kernel operands once",
        lambda spec, v: _operand_bytes(spec, v),
        "{:.4g} GB",
        1e9,
    ),
    ("peak memory", lambda spec, v: _counters(spec, v)["memory"]["peak"], "{:.4g} GiB", 2**30),
    (
        "exposed collective bytes",
        lambda spec, v: _counters(spec, v)["collectives"]["exposed_bytes"],
        "{:.4g} MiB",
        2**20,
    ),
)


def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def _exposed(c: dict) -> tuple[int, int, float]:
    col = c["collectives"]
    return col["exposed"], col["total"], col["exposed_bytes"]


def _times(a: float, b: float) -> str:
    """How much larger a is than b, readable when they are close."""
    if not b:
        return "the baseline has none"
    ratio = a / b
    return f"+{(ratio - 1) * 100:.2g}%" if ratio < 1.005 else f"{ratio:.2f}x"


def losses(spec: dict) -> list[str]:
    """Each metric where a baseline does better than the generated layer, in words."""
    found = []
    mine = _counters(spec, "moegen")
    cpu = (spec.get("cpu") or {}).get("variants", {})
    for base in BASELINE_NAMES:
        theirs = _counters(spec, base)
        label = LABELS[base]
        if mine and theirs:
            for what, value, fmt, unit in COMPARED:
                a, b = value(spec, "moegen"), value(spec, base)
                if a > b:
                    found.append(
                        f"{spec['name']}: {what}: moegen {fmt.format(a / unit)} > "
                        f"{label} {fmt.format(b / unit)} ({_times(a, b)})"
                    )
        for mine_cpu in ("moegen", "moegen_xla"):
            if mine_cpu not in cpu or base not in cpu:
                continue
            a, b = cpu[mine_cpu]["median_s"], cpu[base]["median_s"]
            if a > b:
                kernel = ", kernel xla" if mine_cpu == "moegen_xla" else ""
                found.append(
                    f"{spec['name']}: CPU twin wall time: moegen{kernel} {a * 1e3:.1f} ms > "
                    f"{label} {b * 1e3:.1f} ms ({_times(a, b)})"
                )
    return found


def format_report(results: dict[str, Any]) -> str:
    """The markdown of bench/RESULTS.md from the collected results (pure)."""
    out: list[str] = []
    w = out.append
    w("# Benchmark: generated layers against plain-JAX baselines")
    w("")
    w(f"Produced by one command, from the repository root ({results['date']}):")
    w("")
    w("```sh")
    w(results["command"])
    w("```")
    w("")
    w(f"Total run time: {results['total_seconds']:.0f} s on {results['machine']}.")
    w("Versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()) + ".")
    w("")
    w(
        "Forward+backward (gradients of sum(y) with respect to every parameter and x) of each "
        "layer, compiled for the spec's TPU slice on compile-only devices (libtpu, no TPU), one "
        "fresh process per compile. All figures are **per device**, from the compiled program: "
        "`cost_analysis()` flops and bytes accessed (never `optimal_seconds`), `memory_analysis()` "
        "peak = arguments + outputs + temporaries - aliased, and the collectives of the scheduled "
        "HLO (`moegen.verify.counters`): *exposed* = synchronous, or async with no compute "
        "scheduled between start and done. Useful FLOPs: the plan's `cost.train_flops` (3 x "
        "(router + routed experts at top-k + shared expert), per device, no padding)."
    )
    w("")
    w(
        "Baselines (`bench/baselines.py`), plain `jax.jit` with the module's NamedShardings on "
        "the parameters and x, partitioned by GSPMD:"
    )
    w(
        "- **dense dispatch**: every token through every expert, a one-hot [tokens, experts] "
        "combine matrix folded into the down projection (the dropless GShard-style dense layer);"
    )
    w(
        "- **ragged_dot**: token copies sorted by expert over the global batch, "
        "`jax.lax.ragged_dot` for each projection (no planned padding, no tiles), unsorted and "
        "combined."
    )
    w("")
    w("## TPU compiled counters (per device, forward+backward)")
    w("")
    w(
        "| spec | target | layer | compiled TFLOP | / useful | bytes accessed (GB) | "
        "bytes, kernel operands once (GB) | peak memory (GiB) | fits HBM | "
        "exposed / all collectives | exposed collective MiB | compile (s) |"
    )
    w("|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for spec in results["specs"]:
        target = f"{spec['hardware']} {spec['topology']}"
        if spec.get("skipped"):
            w(
                f"| {spec['name']} | {target} | skipped: {spec['skipped']} "
                "|  |  |  |  |  |  |  |  |  |"
            )
            continue
        for variant in [v for v in LABELS if v in spec["variants"]]:
            outcome = spec["variants"].get(variant) or {}
            label = LABELS[variant]
            if "counters" in outcome:
                c = outcome["counters"]
                exposed, total, exposed_bytes = _exposed(c)
                peak = c["memory"]["peak"]
                fits = "yes" if not spec["hbm_bytes"] or peak <= spec["hbm_bytes"] else "**no**"
                w(
                    f"| {spec['name']} | {target} | {label} | {c['flops'] / 1e12:.2f} | "
                    f"{c['flops'] / spec['useful_train_flops']:.2f} | "
                    f"{c['bytes_accessed'] / 1e9:.1f} | "
                    f"{_operand_bytes(spec, variant) / 1e9:.1f} | {peak / 2**30:.2f} | {fits} | "
                    f"{exposed} / {total} | {exposed_bytes / 2**20:.0f} | "
                    f"{outcome['seconds']:.0f} |"
                )
            elif "oom" in outcome:
                w(
                    f"| {spec['name']} | {target} | {label} | n/a | n/a | n/a | n/a | n/a | "
                    f"**no**: compiler OOM | n/a | n/a | {outcome['seconds']:.0f} |"
                )
            else:
                error = (outcome.get("error") or "not run").strip().splitlines()[-1][:120]
                w(
                    f"| {spec['name']} | {target} | {label} | error: `{error}` "
                    "|  |  |  |  |  |  |  |  |"
                )
    w("")
    w(
        "Useful TFLOP per device: "
        + ", ".join(f"{s['name']} {s['useful_train_flops'] / 1e12:.2f}" for s in results["specs"])
        + "."
    )
    w("")
    out.extend(memory_section(results))
    w("## Ratios: baseline / moegen (above 1: moegen does better)")
    w("")
    w(
        "| spec | baseline | compiled flops | bytes accessed | bytes, kernel operands once | "
        "peak memory | exposed collective bytes | CPU twin time | CPU twin time, moegen with "
        "kernel xla |"
    )
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for spec in results["specs"]:
        if spec.get("skipped"):
            continue
        mine = _counters(spec, "moegen")
        cpu = (spec.get("cpu") or {}).get("variants", {})
        for base in BASELINE_NAMES:
            theirs = _counters(spec, base)
            cells = []
            for _, value, _, _ in COMPARED:
                if mine is None or theirs is None:
                    cells.append("OOM" if "oom" in (spec["variants"].get(base) or {}) else "n/a")
                    continue
                r = _ratio(value(spec, base), value(spec, "moegen"))
                cells.append("inf" if r is None and value(spec, base) else _fmt(r))
            for mine_cpu in ("moegen", "moegen_xla"):
                tr = _ratio(
                    cpu.get(base, {}).get("median_s"), cpu.get(mine_cpu, {}).get("median_s")
                )
                cells.append(_fmt(tr))
            w(f"| {spec['name']} | {LABELS[base]} | " + " | ".join(cells) + " |")
    w("")
    w("## CPU wall time of the twins (forward+backward, median)")
    w("")
    w(
        "Each spec's shrunken twin (its own dtypes and mesh, fake CPU devices) and both "
        "baselines at the twin's shapes and shardings. A pallas twin runs megablox in interpret "
        "mode, so its time measures the interpreter, not the kernel; the row *moegen, kernel "
        "xla* is the same twin generated with `kernel: xla` (jax.lax.ragged_dot in the "
        "generated layer). At twin sizes (tens of tokens) the times measure per-op overhead, not "
        "arithmetic. y rel. err: relative difference of the forward output from the generated "
        "layer's (bfloat16 compute: ~1e-2 is rounding)."
    )
    w("")
    w("| spec | twin | layer | median (ms) | min (ms) | y rel. err |")
    w("|---|---|---|---:|---:|---:|")
    for spec in results["specs"]:
        cpu = spec.get("cpu")
        if not cpu:
            continue
        if "error" in cpu:
            w(
                f"| {spec['name']} | error: `{cpu['error'].strip().splitlines()[-1][:120]}` "
                "|  |  |  |  |"
            )
            continue
        twin = (
            f"{cpu['devices']} devices, {cpu['tokens']} tokens, embed {cpu['embed']}, "
            f"ffn {cpu['ffn']}, {cpu['dtype']}, {cpu['kernel']}"
        )
        for variant, r in cpu["variants"].items():
            w(
                f"| {spec['name']} | {twin} | {LABELS[variant]} | {r['median_s'] * 1e3:.1f} | "
                f"{min(r['runs_s']) * 1e3:.1f} | {r.get('y_rel_err', float('nan')):.1e} |"
            )
            twin = ""
    w("")
    lost = [line for spec in results["specs"] for line in losses(spec)]
    w("## Where moegen loses")
    w("")
    if lost:
        w("Every metric on which a baseline does better than the generated layer, compiled")
        w("counters first:")
        w("")
        for line in sorted(lost, key=lambda line: "CPU twin" in line):
            w(f"- {line}")
    else:
        w("Nowhere: the generated layer does no worse than either baseline on any metric above.")
    w("")
    w("## Reading the figures")
    w("")
    for note in READING_NOTES:
        w(f"- {note}")
    w("")
    tool = results.get("tool")
    if tool:
        w("## The tool's own speed")
        w("")
        check = tool["check"]
        w(
            f"`moegen check` over all {check['specs']} specs: {check['seconds']:.1f} s "
            f"(exit {check['rc']})."
        )
        w("")
        w("| spec | `moegen build --no-verify` (s) | `moegen build` (s) | of which verify (s) |")
        w("|---|---:|---:|---:|")
        for name, r in tool["build_no_verify"].items():
            v = tool["verify"].get(name)
            rc = "" if r["rc"] == 0 else f" (exit {r['rc']})"
            full = (
                ""
                if v is None
                else f"{v['seconds']:.1f}" + ("" if v["rc"] == 0 else f" (exit {v['rc']})")
            )
            verify = "" if v is None else f"{v['verify_seconds']:.1f}"
            w(f"| {name} | {r['seconds']:.1f}{rc} | {full} | {verify} |")
        w("")
        w(
            "Each figure is the wall time of a fresh `python -m moegen` process (interpreter and "
            "import included). `moegen build` with verification is run for the cpu specs only; for "
            "TPU specs the compile times in the first table show the cost of the full-size compile."
        )
        w("")
    return "\n".join(out)


def memory_section(results: dict[str, Any]) -> list[str]:
    """Compiled peak memory per device, forward and forward+backward, beside the plan's."""
    out = [
        "## Memory per device (compiled, and the plan's ledger)",
        "",
        "`memory_analysis()` of the compiled forward and forward+backward programs: peak = "
        "arguments + outputs + temporaries - aliased, in GB (1e9 bytes) and GiB; *plan*: the "
        "peak `moegen plan` estimates from its ledger (the backward pass of the expert FFN), "
        "and how far it is from the compiled one. FFN slices: `memory.ffn_chunks` as planned.",
        "",
        "| spec | layer | FFN slices | forward peak GB (GiB) | forward temporaries GB | "
        "fwd+bwd peak GB (GiB) | fwd+bwd temporaries GB | plan fwd+bwd GiB | plan error |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for spec in results["specs"]:
        for variant, planned in (spec.get("plan_memory") or {}).items():
            outcome = spec["variants"].get(variant) or {}
            if "counters" not in outcome:
                continue
            train = outcome["counters"]["memory"]
            forward = outcome.get("forward_memory") or {}
            error = planned["train"] / train["peak"] - 1
            out.append(
                f"| {spec['name']} | {LABELS[variant]} | {planned['ffn_chunks']} | "
                + (
                    f"{forward['peak'] / 1e9:.3f} ({forward['peak'] / 2**30:.2f}) | "
                    f"{forward['temp'] / 1e9:.3f} | "
                    if forward
                    else "n/a | n/a | "
                )
                + f"{train['peak'] / 1e9:.3f} ({train['peak'] / 2**30:.2f}) | "
                f"{train['temp'] / 1e9:.3f} | {planned['train'] / 2**30:.2f} | {error:+.1%} |"
            )
    out += ["", ""]
    return out


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("moegen", "jax", "jaxlib", "libtpu"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        versions["commit"] = commit + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        pass
    return versions


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return _worker_main(argv[1], argv[2])
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--specs", nargs="+", default=list(DEFAULT_SPECS), metavar="NAME")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-tool-speed", action="store_true", help="skip the tool's own speed")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {message}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    python = Path(sys.executable)
    if python.is_relative_to(REPO_ROOT):
        python = python.relative_to(REPO_ROOT)
    else:
        python = Path("python")
    command = f"{python} -m bench.run" + "".join(f" {shlex.quote(a)}" for a in argv)
    results: dict[str, Any] = {
        "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": _versions(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "specs": [],
    }
    with tempfile.TemporaryDirectory(prefix="moegen-bench-") as tmp:
        for name in args.specs:
            results["specs"].append(bench_spec(name, Path(tmp), args.repeats, log))
    if not args.no_tool_speed:
        results["tool"] = tool_speed(log)
    results["total_seconds"] = time.perf_counter() - started
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    args.out.write_text(format_report(results), encoding="utf-8")
    log(f"wrote {args.out}")
    for line in [line for spec in results["specs"] for line in losses(spec)]:
        print(f"moegen loses: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
