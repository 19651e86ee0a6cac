"""The shared test suite every grouped-matmul kernel passes (moegen.kernels).

A kernel's tests subclass `KernelSuite` (`CpuKernelSuite` where its own code runs in the CPU
twin, which adds twin parity) in tests/kernels/test_kernels.py and say only what is its own:
a realistic spec that runs it, what its config and twin must be, the package its preflight
names, and a change of that spec its rules refuse, at which field. The tests themselves are
written once, here, and run on every kernel; test_every_kernel_has_a_suite keeps the registry
and the subclasses in step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import pytest

from moegen.diagnostics import Diagnostic
from moegen.hardware import hardware
from moegen.kernels import KERNEL_RULES, Kernel, kernel
from moegen.load import FieldPath, LoadedSpec, load_spec
from moegen.plan import Plan, make_plan
from moegen.render import render
from moegen.validate import check_rules, validate
from moegen.variants import unchecked
from moegen.verify import preflight, verify
from moegen.verify.twin import TOLERANCES, twin_of

REPO = Path(__file__).resolve().parents[2]


class KernelSuite:
    """Subclass as Test<Kernel> and set the class attributes; the tests come from here."""

    name: ClassVar[str]  # the kernel's registered name
    spec: ClassVar[str]  # a realistic spec, relative to the repository
    # fields of `spec` changed so that it runs the kernel (none: it does already)
    spec_change: ClassVar[dict[FieldPath, Any]] = {}
    config_type: ClassVar[type | None]  # the type of plan.kernel.config (None: it has none)
    twin_kernel: ClassVar[str]  # the kernel the CPU twin runs in its place
    preflight_package: ClassVar[str | None]  # what verification needs installed (None: nothing)
    # a change of `spec` that validation refuses, the field it is refused at and a part of the
    # message
    bad_change: ClassVar[dict[FieldPath, Any]]
    bad_field: ClassVar[str]
    bad_message: ClassVar[str]

    @pytest.fixture(scope="class")
    @classmethod
    def loaded(cls) -> LoadedSpec:
        return validate(unchecked(load_spec(REPO / cls.spec), cls.spec_change))

    @pytest.fixture(scope="class")
    @classmethod
    def plan(cls, loaded: LoadedSpec) -> Plan:
        return make_plan(loaded)

    @property
    def kernel(self) -> Kernel:
        return kernel(self.name)

    def check_config(self, config: Any, plan: Plan) -> None:
        """What a kernel's config must hold beyond its type (a hook for subclasses)."""

    def test_the_spec_runs_the_kernel(self, loaded: LoadedSpec) -> None:
        assert loaded.spec.target.kernel == self.name

    def test_it_has_a_template(self) -> None:
        """render imports templates/kernels/<name>.jinja for the plan's kernel."""
        assert (REPO / "templates" / "kernels" / f"{self.name}.jinja").is_file()

    def test_its_rules_accept_the_spec(self, loaded: LoadedSpec) -> None:
        assert [d.text() for rule in self.kernel.rules for d in rule(loaded)] == []

    def test_its_rules_are_run_by_validation(self) -> None:
        assert all(rule in KERNEL_RULES for rule in self.kernel.rules)

    def test_validation_refuses_a_bad_change_where_it_is(self, loaded: LoadedSpec) -> None:
        refused = check_rules(unchecked(loaded, self.bad_change))
        at_field = [d for d in refused if d.field == self.bad_field]
        assert at_field, [d.text() for d in refused]
        assert any(self.bad_message in d.message for d in at_field), [d.text() for d in at_field]
        assert all(_located(d, loaded) for d in at_field)

    def test_its_config(self, plan: Plan) -> None:
        config = plan.kernel.config
        if self.config_type is None:
            assert config is None
        else:
            assert isinstance(config, self.config_type)
            self.check_config(config, plan)
        assert plan.kernel.leaves_rows_unwritten == self.kernel.leaves_rows_unwritten

    def test_its_twin_runs_on_cpu(self, loaded: LoadedSpec, plan: Plan) -> None:
        assert self.kernel.twin_kernel == self.twin_kernel
        assert _runs_on_cpu(kernel(self.twin_kernel))
        assert twin_of(loaded, plan).spec.target.kernel == self.twin_kernel

    def test_its_preflight(self, loaded: LoadedSpec, plan: Plan, monkeypatch) -> None:
        declared = self.kernel.preflight
        assert (declared.package if declared else None) == self.preflight_package
        monkeypatch.setattr(preflight, "module_installed", lambda name: True)
        # the kernel as the registry holds it, its package reported missing
        if declared:
            missing = dataclasses.replace(declared, missing=lambda: [f"{declared.package}==0"])
            reported = dataclasses.replace(self.kernel, preflight=missing)
            monkeypatch.setattr(preflight, "kernel", lambda name: reported)
        problems = preflight.preflight_problems(loaded, plan)
        if self.preflight_package is None:
            assert problems == []
        else:
            (problem,) = problems
            assert problem.field == "target.kernel" and _located(problem, loaded)
            assert problem.message.startswith(f"kernel {self.name}: missing: ")
            assert problem.message.endswith(declared.fix)

    def test_it_runs_where_its_spec_targets(self, plan: Plan) -> None:
        chip = hardware(plan.hardware)
        assert self.kernel.runs_on(chip.platform, chip.sm)


class CpuKernelSuite(KernelSuite):
    """The suite of a kernel whose own code runs in the CPU twin (natively or interpreted):
    its grouped matmuls, rendered into the shrunken twin, match the dense reference, outputs
    and every gradient, on random and starved routings."""

    def test_its_twin_matches_the_dense_reference(self, loaded: LoadedSpec, plan: Plan) -> None:
        assert self.twin_kernel == self.name  # the twin runs this kernel's own template
        report = verify(loaded, render(plan), plan=plan, run_compiles=False)
        parity = [step for step in report.steps if step["step"].startswith("twin parity")]
        assert parity, report.steps
        for step in parity:  # the float32 twin and one in the spec's lower precision
            bound = (
                TOLERANCES["float32"]
                if step["step"].startswith("twin parity (float32")
                else TOLERANCES["bfloat16"]
            )
            errors = [case["max_relative_error"] for case in step["cases"]]
            assert errors and max(errors) < bound, step


def _runs_on_cpu(twin: Kernel) -> bool:
    """The twin's kernel runs on CPU, natively or interpreted."""
    return twin.runs_on("cpu") or twin.interpreted_on_cpu


def _located(diagnostic: Diagnostic, loaded: LoadedSpec) -> bool:
    """The diagnostic points into the spec's own file, at a line of it."""
    return diagnostic.file == loaded.source.display and diagnostic.line >= 1
