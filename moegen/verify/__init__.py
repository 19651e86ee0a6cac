"""Stage 5, verify: prove a rendered module before anything is written.

a. import it; b. run its shrunken twin on fake CPU devices against the dense reference,
forward, aux and gradients (float32, and again in the spec's own dtypes when they differ);
c. compile the full-size forward and forward+backward for the target.

The work runs in a child process (`moegen.verify.worker`) because JAX fixes its device
count at start-up, and so that a crash in generated code cannot take moegen down with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moegen import interrupts
from moegen.load import LoadedSpec
from moegen.plan import Plan, make_plan
from moegen.render import render
from moegen.verify.twin import twin_of

# float32 twin: the bar. Low-precision twins compare bf16 compute to a float32
# reference, so they only catch gross errors (a wrong path, not rounding).
TOLERANCES = {"float32": 1e-5, "bfloat16": 5e-2}
DEFAULT_TIMEOUT_S = 1800


class VerifyError(Exception):
    """The rendered module failed a verification step."""


@dataclass
class VerifyReport:
    steps: list[dict[str, Any]] = field(default_factory=list)

    def step(self, name: str) -> dict[str, Any]:
        return next(s for s in self.steps if s["step"] == name)


def _twins(loaded: LoadedSpec) -> list[tuple[str, LoadedSpec, float]]:
    twins = [("float32", twin_of(loaded, dtype="float32"), TOLERANCES["float32"])]
    dtypes = loaded.spec.dtypes
    if (dtypes.params, dtypes.compute) != ("float32", "float32"):
        label = f"{dtypes.compute} compute, {dtypes.params} params"
        worst = max(TOLERANCES[dtypes.params], TOLERANCES[dtypes.compute])
        twins.append((label, twin_of(loaded, dtype=None), worst))
    return twins


def verify(
    loaded: LoadedSpec,
    source: str,
    *,
    on_step: Callable[[dict[str, Any]], None] = lambda step: None,
    timeout_s: float | None = None,
    run_twins: bool = True,
    run_compiles: bool = True,
    compile_forward: bool = True,
) -> VerifyReport:
    """Verify the rendered `source` of `loaded`; raise VerifyError on the first failure.

    `run_twins=False` only imports and compiles (what `moegen plan --compile` shows);
    `run_compiles=False` only imports and runs the twins (no memory verdict then);
    `compile_forward=False` compiles forward+backward alone (all `moegen tune` scores).
    """
    plan = make_plan(loaded)
    # Scratch named after this process, so that a later run can remove it should this one be
    # SIGKILLed before its worker could (the worker removes it when it outlives moegen).
    interrupts.remove_leftovers(tempfile.gettempdir(), interrupts.SCRATCH_PREFIX)
    scratch_prefix = f"{interrupts.SCRATCH_PREFIX}{interrupts.owner_token()}-"
    with tempfile.TemporaryDirectory(prefix=scratch_prefix, ignore_cleanup_errors=True) as tmp:
        workdir = Path(tmp)
        module_path = workdir / f"{plan.module_name}.py"
        module_path.write_text(source, encoding="utf-8")
        twins = []
        for i, (label, twin, tolerance) in enumerate(_twins(loaded) if run_twins else []):
            path = workdir / f"twin_{i}.py"
            twin_plan = make_plan(twin, interpret=True)
            path.write_text(render(twin_plan), encoding="utf-8")
            twins.append(
                {
                    "path": str(path),
                    "label": label,
                    "tolerance": tolerance,
                    "reference": reference_config(twin_plan),
                }
            )
        job = {
            "module": str(module_path),
            "twins": twins,
            "compile": run_compiles,
            "programs": ["forward", "forward+backward"]
            if compile_forward
            else ["forward+backward"],
            "cuda": None
            if plan.cuda_sm is None or plan.kernel != "te"
            else {
                "sm": plan.cuda_sm,
                "quantization": plan.te_quantization,
                "call_sites": plan.grouped_matmul_sites,
            },
            "tpu": None
            if plan.tpu_topology_name is None
            else {
                "topology_name": plan.tpu_topology_name,
                "chips_per_host_bounds": list(plan.chips_per_host_bounds or ()),
                "num_slices": plan.slices,
            },
        }
        job_path = workdir / "job.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        report = _run_worker(job_path, plan.num_devices, on_step, timeout_s)
    verdict = memory_verdict(plan, report) if run_compiles else None
    if verdict:
        report.steps.append({"step": "memory verdict", "seconds": 0.0, "verdict": verdict})
        on_step(report.steps[-1])
    return report


def reference_config(plan: Plan) -> dict[str, Any]:
    """What the dense reference must compute for this plan (see reference.ReferenceConfig)."""
    return {
        "top_k": plan.top_k,
        "score": plan.score,
        "renormalize": plan.renormalize,
        "score_after_top_k": plan.score_after_top_k,
        "routed_scaling": plan.routed_scaling,
        "num_groups": plan.expert_groups or 1,
        "top_groups": plan.kept_groups or 1,
        "capacity": plan.capacity,
        "drop_policy": plan.drop_policy or "probability",
        "token_shards": plan.batch_shards,
        "load_balance_weight": plan.load_balance_weight,
        "z_loss_weight": plan.z_loss_weight,
        "activation": plan.activation,
    }


def peak_bytes(memory: dict[str, int]) -> int:
    """Per-device peak of a compiled program: what XLA must hold at once."""
    return memory["argument"] + memory["output"] + memory["temp"] - memory["alias"]


def memory_verdict(plan: Plan, report: VerifyReport) -> str | None:
    """Compiled peaks against the device's HBM (None on targets without fixed memory).

    Raises VerifyError naming the largest buffers and what to change when one does not fit.
    """
    hbm = plan.memory.hbm_bytes_per_device
    if not hbm:
        return None
    largest = "; ".join(f"{name} {size / 2**30:.2f} GiB" for name, size in plan.memory.ledger[:4])
    slices = [
        f"memory.ffn_chunks: {o.chunks} ({o.train_peak / 2**30:.2f} GiB planned)"
        for o in plan.ffn_chunk_options
        if o.chunks > plan.ffn_chunks and o.train_peak < plan.memory.train_peak
    ][:2]
    advice = (
        f"Largest buffers by the plan: {largest}.\n"
        "To fit: shard parameters over more devices (a larger fsdp axis), shorten the "
        "per-device batch (shapes.batch or seq_len, or more batch shards), store parameters "
        "in bfloat16, "
        + (f"run the FFN in slices ({' or '.join(slices)}), " if slices else "")
        + "or pick a larger slice or a generation with more HBM."
    )
    for step in report.steps:
        if "oom" in step:
            raise VerifyError(
                f"{step['step'].removeprefix('compile ')} does not fit {plan.hardware} "
                f"{plan.topology}; the TPU compiler says:\n  {step['oom']}\n{advice}"
            )
    compiled = [s for s in report.steps if "memory" in s]
    if not compiled:  # lowered for CUDA: nothing compiled to measure, only the plan
        return (
            f"not compiled here (lowered for CUDA only); plan estimate: forward "
            f"{plan.memory.forward_peak / 2**30:.2f}, forward+backward "
            f"{plan.memory.train_peak / 2**30:.2f} GiB of {hbm / 2**30:.2f} GiB HBM per device"
        )
    for step in compiled:
        if peak_bytes(step["memory"]) <= hbm:
            continue
        mem = step["memory"]
        raise VerifyError(
            f"{step['step'].removeprefix('compile ')} does not fit {plan.hardware} "
            f"{plan.topology}: {peak_bytes(mem) / 2**30:.2f} GiB per device "
            f"(arguments {mem['argument'] / 2**30:.2f}, outputs {mem['output'] / 2**30:.2f}, "
            f"temporaries {mem['temp'] / 2**30:.2f}) > {hbm / 2**30:.2f} GiB HBM.\n{advice}"
        )
    peaks = ", ".join(
        f"{s['step'].removeprefix('compile ')} {peak_bytes(s['memory']) / 2**30:.2f} GiB"
        for s in compiled
    )
    return (
        f"fits: {peaks} of {hbm / 2**30:.2f} GiB HBM per device "
        f"(plan estimate: forward {plan.memory.forward_peak / 2**30:.2f}, "
        f"forward+backward {plan.memory.train_peak / 2**30:.2f} GiB)"
    )


def _run_worker(
    job_path: Path,
    num_devices: int,
    on_step: Callable[[dict[str, Any]], None],
    timeout_s: float | None,
) -> VerifyReport:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={num_devices}"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    # Compile-only TPU devices need no exclusive hold on libtpu: let verifications run side by side.
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    timeout = timeout_s or float(os.environ.get("MOEGEN_VERIFY_TIMEOUT", DEFAULT_TIMEOUT_S))
    # The worker dies with this process (interrupts.guard_worker, before it imports JAX) and
    # then removes the scratch directory itself.
    env[interrupts.PARENT_ENV] = str(os.getpid())
    env[interrupts.SCRATCH_ENV] = str(job_path.parent)
    command = [sys.executable, "-c", _WORKER_MAIN, str(job_path)]
    report = VerifyReport()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        try:
            stdout, stderr = _collect(proc, report, on_step, timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise VerifyError(f"verification timed out after {timeout:.0f} s") from None
    if proc.returncode != 0:
        errors = [line for line in stdout if "error" in line]
        detail = errors[-1]["error"] if errors else stderr.strip()[-4000:]
        raise VerifyError(detail or f"verifier exited with code {proc.returncode}")
    return report


_WORKER_MAIN = (
    "from moegen.interrupts import guard_worker; guard_worker(); import runpy; "
    "runpy.run_module('moegen.verify.worker', run_name='__main__', alter_sys=True)"
)


def _stop(proc: subprocess.Popen[str]) -> None:
    """End the worker and reap it before its scratch directory goes. SIGKILL: it holds
    nothing to release, and SIGTERM means to it that moegen died (interrupts._leave)."""
    with interrupts.blocked():  # a second Ctrl-C must not leave it running
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _collect(
    proc: subprocess.Popen[str],
    report: VerifyReport,
    on_step: Callable[[dict[str, Any]], None],
    timeout: float,
) -> tuple[list[dict[str, Any]], str]:
    import threading

    events: list[dict[str, Any]] = []
    stderr_chunks: list[str] = []
    drain = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True)
    drain.start()
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # stray output from a library
            events.append(event)
            if "step" in event:
                report.steps.append(event)
                on_step(event)
        proc.wait()
    except BaseException:  # SIGINT, SIGTERM, SIGHUP: the worker goes before its scratch
        _stop(proc)
        raise
    finally:
        timed_out = not timer.is_alive() and proc.returncode not in (0, 1)
        timer.cancel()
        drain.join(timeout=5)
    if timed_out:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return events, "".join(stderr_chunks)
