"""Stage 5, verify: prove a rendered module before anything is written.

a. import it; b. run its shrunken twin on fake CPU devices against the dense reference,
forward, aux and gradients (float32, and again in the spec's own dtypes when they differ);
c. compile the full-size forward and forward+backward for the target.

The work runs in a child process (`moegen.verify.worker.child`) because JAX fixes its device
count at start-up, and so that a crash in generated code cannot take moegen down with it.
It is given a `Job` and reports typed steps (moegen.verify.messages).

The public API, beside `verify`: the twins (`twin_of`, `twins_of`, `plan_twin`),
`reference_config`, `tpu_target`, the verdict (`memory_verdict`, `peak_bytes`, `VerifyError`)
and the messages (moegen.verify.messages); in processes that run JAX, the dense reference
(moegen.verify.reference.layer) and `moegen.verify.worker.compiled`, which compiles and counts. The
benchmark uses only these; the rest of the package is its own business.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from moegen import interrupts, provenance
from moegen.fit import own_trade_note
from moegen.kernels import kernel
from moegen.load import LoadedSpec
from moegen.plan import GluPlan, Plan, make_plan
from moegen.render import render
from moegen.verify.memory.verdict import VerifyError, memory_verdict
from moegen.verify.messages import (
    PROGRAMS,
    CudaTarget,
    Job,
    MemoryVerdict,
    RecordIgnored,
    Reused,
    Step,
    TpuTarget,
    TwinJob,
    VerifyReport,
)
from moegen.verify.preflight import require_verifiers
from moegen.verify.records import record
from moegen.verify.records.evidence import judge
from moegen.verify.records.record import VerifyCache
from moegen.verify.twin import TwinSpec, plan_twin, twins_of
from moegen.verify.worker.pool import run_worker as _run_worker

OnStep = Callable[[Step], None]


def _twins(subject: tuple[LoadedSpec, Plan]) -> list[TwinSpec]:
    """The twins to run for (spec, full-size plan). One argument: a seam that tests replace
    with their own twins (`lambda _: [...]`)."""
    return twins_of(*subject)


def verify(
    loaded: LoadedSpec,
    source: str,
    *,
    plan: Plan | None = None,
    on_step: OnStep = lambda step: None,
    timeout_s: float | None = None,
    run_twins: bool = True,
    run_compiles: bool = True,
    compile_forward: bool = True,
    cache: VerifyCache | None = None,
) -> VerifyReport:
    """Verify `source`, rendered from `plan` (the plan of `loaded`); raise VerifyError on the
    first failure. The pipeline passes the plan it rendered; other callers may leave it out,
    and it is made here.

    `run_twins=False` only imports and compiles (what `moegen plan --compile` shows);
    `run_compiles=False` only imports and runs the twins (no memory verdict then);
    `compile_forward=False` compiles forward+backward alone (all `moegen tune` scores).
    `cache` (moegen.verify.records.record): reuse and keep records of passed verifications, and give
    the worker JAX's persistent compilation cache; None: neither.
    """
    plan = make_plan(loaded) if plan is None else plan
    require_verifiers([(loaded, plan)], compiles=run_compiles)  # missing libtpu or TE: before twins
    ignored = None
    with scratch_directory() as tmp:
        job, sources = _write_job(tmp, loaded, source, plan, run_twins, cache)
        job = dataclasses.replace(job, compile=run_compiles, programs=_programs(compile_forward))
        key = record.record_key(job, sources, plan.mesh.num_devices) if cache else ""
        report, ignored = (
            _reused(key, job, plan, source, on_step) if cache and cache.reuse else (None, None)
        )
        fresh = report is None
        if report is None:
            job_path = tmp / "job.json"
            job_path.write_text(json.dumps(job.to_json()), encoding="utf-8")
            report = _run_worker(job_path, plan.mesh.num_devices, on_step, timeout_s)
    verdicts = _verdicts(plan, report) if run_compiles else []
    if cache and fresh:
        record.store_record(record.new_record(key, source, report.steps))
    if ignored is not None:
        report.steps.insert(0, ignored)
    for label, verdict in verdicts:
        if verdict and not label:  # the main shape: the one the spec's memory section is
            verdict += own_trade_note(loaded.spec.memory, plan)
        if verdict:
            report.steps.append(MemoryVerdict(f"memory verdict{label}", 0.0, verdict))
            on_step(report.steps[-1])
    return report


@contextlib.contextmanager
def scratch_directory() -> Iterator[Path]:
    """A private scratch directory in the system's temporary directory, named so that a later
    run can prove it this user's moegen's and remove it should this one be SIGKILLed before
    its worker could (the worker removes it when it outlives moegen)."""
    parent = tempfile.gettempdir()
    provenance.remove_leftovers(parent, interrupts.SCRATCH_PREFIX)
    path = Path(parent) / provenance.owned_name(parent, "", interrupts.SCRATCH_PREFIX)
    os.mkdir(path, 0o700)
    try:
        yield path
    finally:
        provenance.remove_tree(path)


def _verdicts(plan: Plan, report: VerifyReport) -> list[tuple[str, str | None]]:
    """The memory verdict of each shape's compile steps (VerifyError where one fails)."""
    return [
        (label, memory_verdict(shape_plan, VerifyReport(steps=steps)))
        for label, shape_plan, steps in _steps_by_shape(plan, report)
    ]


def _reused(
    key: str, job: Job, plan: Plan, source: str, on_step: OnStep
) -> tuple[VerifyReport | None, RecordIgnored | None]:
    """The report a record of this verification makes, when it proves a pass by the rules a
    fresh verification applies; else (None, the step that says why it was ignored)."""
    try:
        reused = record.load_record(key)
        if reused is None:
            return None, None
        problem = judge(job, plan, reused.steps)
        if problem is None and job.compile:
            _verdicts(plan, VerifyReport(steps=list(reused.steps)))
    except record.UntrustedRecord as err:
        problem = str(err)
    except VerifyError as err:
        problem = str(err).splitlines()[0]
    if problem is not None:
        ignored = RecordIgnored("record ignored", 0.0, problem)
        on_step(ignored)
        return None, ignored
    return _replay(reused, source, on_step), None


def _steps_by_shape(plan: Plan, report: VerifyReport) -> list[tuple[str, Plan, list[Step]]]:
    """The compile steps of each shape, with its plan: the main shape's, then each variant's
    (named "compile forward (NAME)"), so that each is judged against its own plan."""
    labels = {f" ({variant.name})": variant.plan for variant in plan.variants}
    steps: dict[str, list[Step]] = {"": [], **{label: [] for label in labels}}
    for step in report.steps:
        label = next((label for label in labels if step.step.endswith(label)), "")
        steps[label].append(step)
    return [(label, labels.get(label, plan), steps[label]) for label in steps]


def _programs(compile_forward: bool) -> tuple[str, ...]:
    return PROGRAMS if compile_forward else ("forward+backward",)


def _compilation_cache() -> str | None:
    directory = record.compilation_cache_dir()
    return None if directory is None else str(directory)


def _write_job(
    workdir: Path,
    loaded: LoadedSpec,
    source: str,
    plan: Plan,
    run_twins: bool,
    cache: VerifyCache | None,
) -> tuple[Job, dict[str, str]]:
    """The module and its twins written into `workdir`, the job that checks them, and each
    path's text (the record key reads it)."""
    module_path = workdir / f"{plan.module_name}.py"
    module_path.write_text(source, encoding="utf-8")
    sources = {str(module_path): source}
    twins = []
    for i, (label, twin, tolerance) in enumerate(_twins((loaded, plan)) if run_twins else []):
        path = workdir / f"twin_{i}.py"
        twin_plan = plan_twin(twin, plan)
        sources[str(path)] = render(twin_plan)
        path.write_text(sources[str(path)], encoding="utf-8")
        twins.append(TwinJob(str(path), label, tolerance, reference_config(twin_plan)))
        for variant in twin_plan.variants:  # the same twin module, each variant's function
            cfg = reference_config(variant.plan)
            twins.append(TwinJob(str(path), label, tolerance, cfg, variant.name))
    job = Job(
        module=str(module_path),
        twins=tuple(twins),
        cuda=_cuda_target(plan),
        tpu=tpu_target(plan),
        variants=tuple(variant.name for variant in plan.variants),
        compilation_cache=_compilation_cache() if cache else None,
    )
    return job, sources


def _replay(reused: record.Record, source: str, on_step: OnStep) -> VerifyReport:
    """The recorded steps, after a step that says they were reused and from when."""
    same = reused.module_sha256 == record.module_sha256(source)
    reason = "module unchanged" if same else "module unchanged but for its description or header"
    report = VerifyReport()
    for step in (Reused("reused record", 0.0, reused.verified_at, reason), *reused.steps):
        report.steps.append(step)
        on_step(step)
    return report


def _cuda_target(plan: Plan) -> CudaTarget | None:
    """What a kernel lowered for CUDA is lowered for (None: the plan's kernel is not, or its
    target is no GPU)."""
    chosen = kernel(plan.kernel.name)
    config = plan.kernel.config
    if chosen.cuda_lowering is None or config is None or config.cuda_sm is None:
        return None
    quantization = getattr(config, "quantization", "none")  # only some kernels quantize
    return CudaTarget(config.cuda_sm, quantization, plan.ffn.grouped_matmul_sites, chosen.name)


def tpu_target(plan: Plan) -> TpuTarget | None:
    """The slice a TPU plan compiles for (None off TPU)."""
    mesh = plan.mesh
    if mesh.tpu_topology_name is None:
        return None
    return TpuTarget(mesh.tpu_topology_name, tuple(mesh.chips_per_host_bounds or ()), mesh.slices)


def reference_config(plan: Plan) -> dict[str, Any]:
    """What the dense reference must compute for this plan (see reference.ReferenceConfig)."""
    return {
        "top_k": plan.router.top_k,
        "score": plan.router.score,
        "renormalize": plan.router.renormalize,
        "renormalize_epsilon": plan.router.renormalize_epsilon or 0.0,
        "bias_on_logits": plan.router.bias_on_logits,
        "logit_softcap": plan.router.logit_softcap,
        "router_norm_eps": plan.router.input_norm_eps,
        "expert_norm_eps": plan.ffn.input_norm_eps,
        "output_norm_eps": plan.ffn.output_norm_eps,
        "expert_output_norm_eps": plan.ffn.expert_output_norm_eps,
        "shared_output_norm_eps": plan.ffn.shared_output_norm_eps,
        "gelu_tanh": plan.ffn.gelu_tanh,
        "score_after_top_k": plan.router.score_after_top_k,
        "routed_scaling": plan.router.routed_scaling,
        "num_groups": plan.router.expert_groups or 1,
        "top_groups": plan.router.kept_groups or 1,
        "capacity": plan.router.capacity,
        "drop_policy": plan.router.drop_policy or "probability",
        "token_shards": plan.batch_shards * plan.router.capacity_groups,
        "sequence_shards": plan.mesh.sequence_shards,
        "seq_len": plan.seq_len,
        "load_balance_weight": plan.router.load_balance_weight,
        "load_balance_form": plan.router.load_balance_form,
        "z_loss_weight": plan.router.z_loss_weight,
        "activation": plan.ffn.activation,
        "group_top_n": plan.router.group_top_k or 2,
        "weights_on_input": plan.router.weights_on_input,
        "identity_experts": plan.router.identity_experts,
        "zero_experts": plan.router.zero_experts,
        "weighed_shared_experts": plan.router.shared_experts,
        **_glu_reference(plan),
    }


def _glu_reference(plan: Plan) -> dict[str, Any]:
    """The activation parameters as ReferenceConfig's fields (the shared expert's, where they
    are its own, as a mapping of SharedGlu's)."""
    out: dict[str, Any] = _glu_values(plan.ffn.glu) if plan.ffn.glu else {}
    if plan.ffn.shared_glu_differs:
        shared = plan.ffn.shared_glu
        out["shared_glu"] = _glu_values(shared) if shared else {}
    return out


def _glu_values(glu: GluPlan) -> dict[str, Any]:
    return {
        "gate_limit": glu.gate_limit,
        "up_limit": glu.up_limit,
        "sigmoid_scale": glu.sigmoid_scale or 1.0,
        "up_offset": glu.up_offset or 0.0,
        "gate_clamp_after": glu.clamp_after,
        "gate_softcap": glu.gate_softcap,
        "up_softcap": glu.up_softcap,
    }
