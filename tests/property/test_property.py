"""Every valid spec builds: a seeded property test over the whole spec space.

Specs are drawn by `spec_strategies.choices` (every option of the schema, every target,
kernel and strategy, real models' sizes and tiny ones, and one time in four a mistake) and
written by `spec_builder.spec_yaml`. Each one that validates must plan (and report), render
(ruff format and ruff check inside render) and import, and so must the twins a build of it
would verify (derived, planned, rendered); each one that does not must be refused with
diagnostics located in the file. Fixed seed (derandomize), a bounded number of examples.

`--hypothesis-show-statistics` prints the share of valid specs and the mix of targets.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from spec_builder import spec_yaml, validated
from spec_strategies import choices

from moegen.diagnostics import SpecError
from moegen.kernels import KERNELS
from moegen.load import LoadedSpec
from moegen.plan import format_plan, make_plan
from moegen.render import render
from moegen.verify import plan_twin, twins_of

DISPLAY = "specs/drawn.yaml"
MODULE = "drawn"
# MOEGEN_PROPERTY_EXAMPLES=N draws more (or fewer) for a longer campaign
EXAMPLES = int(os.environ.get("MOEGEN_PROPERTY_EXAMPLES", "500"))

pytestmark = pytest.mark.usefixtures("hypothesis_seed_only")

PROPERTY = settings(
    max_examples=EXAMPLES,
    derandomize=True,  # the same examples on every run and every machine
    database=None,  # nothing written beside the tests
    deadline=None,  # an example that imports JAX the first time takes seconds
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


def loaded_or_refusal(text: str) -> LoadedSpec | SpecError:
    return validated(text, DISPLAY, MODULE)


def assert_located(error: SpecError, text: str) -> None:
    """Every diagnostic names the file and a line and column inside it."""
    lines = text.splitlines()
    assert error.diagnostics, "a SpecError without diagnostics"
    for d in error.diagnostics:
        assert d.file == DISPLAY, d.text()
        assert 1 <= d.line <= len(lines), f"{d.text()} (the spec has {len(lines)} lines)"
        assert 1 <= d.column <= len(lines[d.line - 1]) + 1, f"{d.text()}\n{lines[d.line - 1]}"
        assert d.message, d.text()


def import_module(source: str, directory: Path) -> object:
    """Write `source` as a module file and import it under its own name."""
    path = directory / f"{MODULE}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module  # dataclasses and NamedTuples look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[MODULE]
    return module


def builds_without_verify(text: str, kernel: str) -> None:
    """Plan, render and import a valid spec, as `moegen build --no-verify` would plus import;
    and the plan's report, and the twins verification would run (derived, planned, rendered),
    so that a twin that cannot be made shows here, not only in a build."""
    loaded = loaded_or_refusal(text)
    assert isinstance(loaded, LoadedSpec)
    plan = make_plan(loaded)
    source = render(plan)
    assert format_plan(plan) and json.dumps(plan.to_dict())  # moegen plan [--json]
    for twin in twins_of(loaded, plan):
        twin_source = render(plan_twin(twin.loaded, plan))
        compile(twin_source, f"{MODULE}_twin.py", "exec")
    if KERNELS[kernel].cuda_lowering is not None:
        # A module of a kernel lowered for CUDA (te, tokamax) imports its GPU library at the
        # top, which CI's test run lacks (and TE needs a CUDA driver or moegen's stub to load):
        # compile the source instead of importing it, the same on every machine (a replayed
        # example must not change verdict). test_te_lowering imports and lowers such modules
        # where the library is installed.
        compile(source, f"{MODULE}.py", "exec")
        return
    with tempfile.TemporaryDirectory() as directory:
        module = import_module(source, Path(directory))
    for name in ("moe_layer", "init_params", "make_mesh", "param_shapes", "input_shape"):
        assert callable(getattr(module, name)), name


@PROPERTY
@given(drawn=choices())
def test_every_drawn_spec_builds_or_is_refused_where_it_is_wrong(drawn: dict) -> None:
    text = spec_yaml(drawn)
    loaded = loaded_or_refusal(text)
    if isinstance(loaded, SpecError):
        event("refused")
        event(f"refused at {loaded.diagnostics[0].field or '(file)'}")
        assert_located(loaded, text)
        return
    spec = loaded.spec
    event("valid")
    event(f"valid: {spec.target.hardware} {spec.target.kernel} {spec.parallelism.experts}")
    builds_without_verify(text, spec.target.kernel)
