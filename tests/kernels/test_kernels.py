"""moegen.kernels: every registered kernel passes the shared suite (tests/support/kernel_suite.py), and
the registry agrees with the spec's schema."""

from __future__ import annotations

import functools
import importlib

import pytest
from kernel_suite import CpuKernelSuite, KernelSuite
from spec_builder import spec_positions, spec_yaml, tiny

from moegen.kernels import KERNEL_NAMES, KERNELS
from moegen.kernels.pallas import TWIN_TILE, PallasConfig
from moegen.kernels.te import TeConfig
from moegen.kernels.tokamax import TokamaxConfig
from moegen.load import load_spec_bytes
from moegen.schema import spec_json_schema
from moegen.spec import Target, Tiles
from moegen.validate import check_rules


class TestXla(CpuKernelSuite):
    name = "xla"
    spec = "specs/mixtral_8x7b_cpu.yaml"
    config_type = None
    twin_kernel = "xla"
    preflight_package = None
    # quantization is Transformer Engine's: te's rule refuses it under every other kernel
    bad_change = {("target", "quantization"): "fp8"}
    bad_field = "target.quantization"
    bad_message = "kernel xla computes in dtypes.compute"


class TestPallas(CpuKernelSuite):
    name = "pallas"
    spec = "specs/mixtral_8x7b_v5e.yaml"
    config_type = PallasConfig
    twin_kernel = "pallas"
    preflight_package = None
    bad_change = {("target", "tiles"): Tiles(gate_up=[500, 1024, 1024])}
    bad_field = "target.tiles.gate_up"
    bad_message = "row tile 500 must be a multiple of 16 for bfloat16"

    def check_config(self, config, plan) -> None:
        assert config.padded_rows % config.row_alignment == 0
        assert config.padded_rows >= plan.experts.ffn_rows
        assert not config.interpret  # only the twin interprets

    def test_the_twin_runs_small_interpreted_tiles(self, loaded, plan) -> None:
        from moegen.verify.twin import plan_twin, twin_of

        twin = plan_twin(twin_of(loaded, plan), plan)
        assert twin.kernel.config.interpret
        assert twin.kernel.config.gate_up_tile == tuple(TWIN_TILE)


class TestTe(KernelSuite):
    name = "te"
    spec = "specs/mixtral_8x7b_ep_h100_fp8.yaml"
    config_type = TeConfig
    twin_kernel = "xla"
    preflight_package = "transformer_engine"
    bad_change = {("target", "quantization"): "mxfp8"}
    bad_field = "target.quantization"
    bad_message = "mxfp8 needs Blackwell (SM 10.0) or newer"

    def check_config(self, config, plan) -> None:
        assert (config.quantization, config.group_align, config.cuda_sm) == ("fp8", 16, 90)
        assert config.aligned_rows % config.group_align == 0
        # the recipe is decided in Python; te.jinja lays it out
        recipe = config.recipe
        assert recipe.scaling_mode == "CURRENT_TENSOR_SCALING"
        assert (recipe.forward_dtype, recipe.backward_dtype) == ("float8_e4m3fn", "float8_e5m2")


class TestTokamax(KernelSuite):
    name = "tokamax"
    spec = "specs/mixtral_8x7b_h200_tokamax.yaml"
    config_type = TokamaxConfig
    twin_kernel = "xla"
    preflight_package = "tokamax"
    bad_change = {("dtypes", "compute"): "float32"}
    bad_field = "dtypes.compute"
    bad_message = "kernel tokamax multiplies bfloat16 operands only"

    def check_config(self, config, plan) -> None:
        assert (config.implementation, config.cuda_sm) == ("mosaic_gpu", 90)


def test_every_kernel_has_a_suite() -> None:
    def subclasses(suite: type) -> list[type]:
        return [c for sub in suite.__subclasses__() for c in (sub, *subclasses(sub))]

    named = [suite.name for suite in subclasses(KernelSuite) if "name" in vars(suite)]
    assert sorted(named) == sorted(KERNELS)  # one suite each
    for suite in subclasses(KernelSuite):  # a kernel whose own code runs in the twin checks it
        if "name" in vars(suite) and suite.twin_kernel == suite.name:
            assert issubclass(suite, CpuKernelSuite), suite


def test_the_schema_offers_the_registered_kernels() -> None:
    """The spec's model (stage load, before the registry) types target.kernel as a name; the
    JSON schema an editor reads (moegen schema) offers the registry's names, in order, and
    describes each as its module does."""
    field = spec_json_schema()["$defs"]["Target"]["properties"]["kernel"]
    assert tuple(field["enum"]) == KERNEL_NAMES
    for name, k in KERNELS.items():
        assert f"{name} = {k.summary}" in field["description"]
    assert Target.model_fields["kernel"].default == KERNEL_NAMES[0]
    assert "default" not in field  # it depends on the hardware (below)


@pytest.mark.parametrize(
    ("hardware", "kernel"),
    [("tpu-v5e", "pallas"), ("tpu7x", "pallas"), ("gpu-h100", "xla"), ("cpu", "xla")],
)
def test_an_omitted_kernel_is_the_one_measured_fastest_on_the_target(hardware, kernel) -> None:
    """issue 52: pallas (megablox) ran 1.75x (Mixtral) and 1.18x (Qwen3) xla's speed on a v5e
    chip (bench/TPU_CHECK.md), so a TPU spec that names no kernel gets it; a written kernel
    is kept."""
    assert Target.model_validate({"hardware": hardware}).kernel == kernel
    assert Target.model_validate({"hardware": hardware, "kernel": "xla"}).kernel == "xla"


@pytest.mark.parametrize(
    ("written", "guess"),
    [
        ("megablox", "pallas"),  # other tools' names for a kernel (its module's aliases)
        ("ragged_dot", "xla"),
        ("mosaic-gpu", "tokamax"),
        ("transformer_engine", "te"),
        ("palas", "pallas"),  # typos
        ("xal", "xla"),
        ("triton", None),  # no kernel of that name or like it
    ],
)
def test_an_unregistered_kernel_is_refused_alone_with_the_names(written, guess) -> None:
    """Validation asks the registry first: an unknown name is reported alone (every other
    rule may ask the table about it), at its value's line and column, with the guess."""
    text = spec_yaml(tiny(kernel=written))
    (problem,) = check_rules(load_spec_bytes(text.encode(), "spec.yaml", "spec"))
    position = spec_positions(tiny(kernel=written))["target.kernel"]
    assert (problem.field, (problem.line, problem.column)) == ("target.kernel", position.value)
    names = [f"'{name}'" for name in KERNEL_NAMES]  # the registry's, in order
    message = f"must be {', '.join(names[:-1])} or {names[-1]}, got '{written}'"
    assert problem.message == (f"{message}; did you mean '{guess}'?" if guess else message)


def test_a_kernel_twin_is_its_own_or_one_that_runs_on_cpu() -> None:
    for name, kernel in KERNELS.items():
        assert kernel.twin_kernel in KERNELS, name
        twin = KERNELS[kernel.twin_kernel]
        assert twin.runs_on("cpu") or twin.interpreted_on_cpu, name


def test_a_cuda_lowering_prepares_its_kernels_package(monkeypatch) -> None:
    """The worker prepares what the kernel's registry entry names, for the target's SM; a
    kernel lowered for CUDA names a package and what its lowering holds."""
    from moegen.verify.messages import CudaTarget
    from moegen.verify.worker import child as worker

    prepared = []
    lowered = [name for name, k in KERNELS.items() if k.cuda_lowering is not None]
    for name in lowered:  # each module's own preparation, replaced where it is looked up
        prepare = f"prepare_{name}"
        record = functools.partial(lambda name, sm: prepared.append((name, sm)), name)
        monkeypatch.setattr(importlib.import_module(f"moegen.kernels.{name}"), prepare, record)
    for name in lowered:
        worker.prepare_cuda(CudaTarget(sm=90, quantization="none", call_sites=2, kernel=name))
    assert prepared == [(name, 90) for name in lowered] and lowered
    for name in lowered:
        lowering = KERNELS[name].cuda_lowering
        assert lowering.custom_call.startswith(lowering.call_prefix) and lowering.call_prefix
        assert KERNELS[name].preflight is not None
