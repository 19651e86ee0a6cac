"""The option matrix, pairwise: render goldens that cover every pair of options.

The cases (tests/support/pairwise_cases.py) are a greedy covering set of the options that pick a
different path through the templates; the golden runner (tests/support/golden_runner.py) renders each
and compares it byte for byte with its goldens in tests/goldens/render/: `CASE.yaml` (the
spec), and `CASE.py` (the module) or, for a combination the rules refuse, `CASE.expected` (the
located diagnostics). A change to one path shows its diff on every case that takes it. After
an intended change:

    MOEGEN_UPDATE_GOLDENS=1 .venv/bin/pytest -n 0 tests/render/test_goldens.py
"""

from __future__ import annotations

import itertools

import pytest
from golden_runner import RENDER, expected_file
from pairwise_cases import CASES, FACTORS, SHORT, TARGETS, pairs, refused


def test_every_pair_of_options_is_covered() -> None:
    every = set().union(*(pairs(c) for c in itertools.product(*FACTORS.values())))
    covered = set().union(*(pairs(c) for c in CASES.values()))
    assert covered == every
    assert len(CASES) < 30  # a covering set, not the product (1,152)
    for a, b in itertools.combinations(CASES.values(), 2):
        assert a != b


@pytest.mark.parametrize("name", list(CASES))
def test_a_case_is_refused_exactly_when_the_rules_refuse_it(name: str) -> None:
    """fp8 and mxfp8 are Transformer Engine recipes: a case's golden is the refusal's
    diagnostics where pairwise_cases.refused says so, a module everywhere else."""
    golden = expected_file(RENDER.case(name))
    assert golden.suffix == (".expected" if refused(CASES[name]) else ".py"), golden


def test_every_registered_kernel_and_strategy_has_its_target_and_short_name() -> None:
    """The matrix's kernels and strategies are the registries' (FACTORS reads them): a new one
    needs a target it runs on and a short case name here, or this fails."""
    assert set(TARGETS) == set(FACTORS["kernel"])
    assert set(SHORT) == set(FACTORS["strategy"])
