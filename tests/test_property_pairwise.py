"""The option matrix, pairwise: render goldens that cover every pair of options.

The options that pick a different path through the templates (FACTORS) make 1,152 combinations;
a greedy covering set of a few dozen holds every pair of values of every two options (kernel
pallas with quantization fp8, ring of experts with FFN slices and a capacity, ...). Each case
is a spec (spec_builder) loaded, validated, planned and rendered, as `moegen build
--no-verify` does, and compared byte for byte with its goldens in tests/goldens/render/:
`CASE.yaml` (the spec), and `CASE.py` (the module) or, for a combination the rules refuse,
`CASE.expected` (the located diagnostics). A change to one path shows its diff on every case
that takes it. After an intended change:

    MOEGEN_UPDATE_GOLDENS=1 .venv/bin/pytest -n 0 tests/test_property_pairwise.py
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest
from spec_builder import spec_yaml, validated

from moegen.diagnostics import SpecError
from moegen.plan import make_plan
from moegen.render import render

GOLDEN_DIR = Path(__file__).resolve().parent / "goldens" / "render"
UPDATE = os.environ.get("MOEGEN_UPDATE_GOLDENS") == "1"

# option -> its values, in a fixed order (the covering set depends on it)
FACTORS: dict[str, list[Any]] = {
    "kernel": ["xla", "pallas", "te", "tokamax"],
    "strategy": ["replicated", "ragged_all_to_all", "ring_of_experts"],
    "ffn_chunks": [1, 2],
    "ffn": ["gated", "plain"],
    "bias": [False, True],
    "shared": [False, True],
    "quantization": ["none", "fp8", "mxfp8"],
    "capacity": [False, True],
}
# each kernel on a target where it runs: xla on cpu, pallas on a v5e slice, te on Blackwell
# (fp8 and mxfp8), tokamax on Hopper (its only SM); 4 devices each
TARGETS = {
    "xla": {"hardware": "cpu"},
    "pallas": {"hardware": "tpu-v5e", "topology": "2x2"},
    "te": {"hardware": "gpu-b200", "topology": 4},
    "tokamax": {"hardware": "gpu-h200", "topology": 4},
}
SHORT = {"replicated": "rep", "ragged_all_to_all": "a2a", "ring_of_experts": "ring"}


def pairs(case: tuple) -> set[tuple]:
    """The (option, value, option, value) pairs a combination covers."""
    named = list(zip(FACTORS, case, strict=True))
    return {(a, va, b, vb) for (a, va), (b, vb) in itertools.combinations(named, 2)}


def refused(case: tuple) -> bool:
    """The combinations the rules refuse: fp8 and mxfp8 are Transformer Engine recipes
    (moegen/kernels/te.py, quantization_needs_te). The goldens check this: a refused case has an
    .expected golden, any other a module."""
    o = dict(zip(FACTORS, case, strict=True))
    return o["quantization"] != "none" and o["kernel"] != "te"


def greedy_cover(candidates: list[tuple], uncovered: set[tuple]) -> list[tuple]:
    """Take the candidate that covers the most pairs not yet covered, the first in product
    order on ties, until none is left."""
    chosen = []
    while uncovered:
        best = max(candidates, key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered = uncovered - pairs(best)
    return chosen


def covering_set() -> list[tuple]:
    """Every pair that some buildable combination has, covered by buildable ones (so that
    each such pair renders); then the pairs only refused combinations have (xla or pallas
    with fp8 or mxfp8), covered by refused ones."""
    product = list(itertools.product(*FACTORS.values()))
    buildable = [c for c in product if not refused(c)]
    buildable_pairs = set().union(*(pairs(c) for c in buildable))
    refused_only = set().union(*(pairs(c) for c in product if refused(c))) - buildable_pairs
    return greedy_cover(buildable, buildable_pairs) + greedy_cover(
        [c for c in product if refused(c)], refused_only
    )


def case_name(case: tuple) -> str:
    o = dict(zip(FACTORS, case, strict=True))
    return "_".join(
        [
            o["kernel"],
            SHORT[o["strategy"]],
            f"c{o['ffn_chunks']}",
            o["ffn"],
            "bias" if o["bias"] else "nobias",
            "shared" if o["shared"] else "noshared",
            o["quantization"],
            "capacity" if o["capacity"] else "dropless",
        ]
    )


def case_choices(case: tuple) -> dict[str, Any]:
    o = dict(zip(FACTORS, case, strict=True))
    expert_parallel = o["strategy"] != "replicated"
    choices: dict[str, Any] = {
        "description": f"Pairwise render case {case_name(case)}.",
        "experts": 8,
        "embed": 256,
        "ffn": 512,
        "activation": "swiglu" if o["ffn"] == "gated" else "gelu",
        "ffn_bias": o["bias"],
        "top_k": 2,
        "batch": 8,
        "seq_len": 128,
        "axes": {"fsdp": 2, "expert": 2} if expert_parallel else {"data": 2, "fsdp": 2},
        "strategy": o["strategy"],
        "kernel": o["kernel"],
        "quantization": o["quantization"],
        "ffn_chunks": o["ffn_chunks"],
    }
    if o["shared"]:
        choices["shared_ffn"] = 256
    if o["capacity"]:
        choices |= {"load_balance_loss": 0.01, "capacity": (1.25, "probability")}
    return choices | TARGETS[o["kernel"]]


CASES = {case_name(case): case for case in covering_set()}


def rendered(name: str) -> tuple[str, str, str]:
    """(spec text, golden suffix, golden text): the module, or the refusal's diagnostics."""
    text = spec_yaml(case_choices(CASES[name]), modeline=True)
    loaded = validated(text, f"{name}.yaml", name)
    if isinstance(loaded, SpecError):
        assert refused(CASES[name]), f"{name} is refused:\n{loaded}"
        return text, ".expected", "\n".join(d.text() for d in loaded.diagnostics) + "\n"
    assert not refused(CASES[name]), f"{name} validates but should be refused"
    return text, ".py", render(make_plan(loaded))


def test_every_pair_of_options_is_covered() -> None:
    every = set().union(*(pairs(c) for c in itertools.product(*FACTORS.values())))
    covered = set().union(*(pairs(c) for c in CASES.values()))
    assert covered == every
    assert len(CASES) < 30  # a covering set, not the product (1,152)
    for a, b in itertools.combinations(CASES.values(), 2):
        assert a != b


def test_every_golden_is_a_case() -> None:
    names = {path.name for path in GOLDEN_DIR.iterdir()} if GOLDEN_DIR.is_dir() else set()
    expected = {name + ".yaml" for name in CASES}
    assert expected <= names or UPDATE, "missing: run with MOEGEN_UPDATE_GOLDENS=1"
    orphans = {name for name in names if name.split(".")[0] not in CASES}
    assert not orphans, f"goldens of no case (remove them): {sorted(orphans)}"


@pytest.mark.parametrize("name", list(CASES))
def test_pairwise_case_renders_its_golden(name: str) -> None:
    text, suffix, actual = rendered(name)
    stale = ".py" if suffix == ".expected" else ".expected"
    golden = {".yaml": text, suffix: actual}
    if UPDATE:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        for ending, content in golden.items():
            (GOLDEN_DIR / f"{name}{ending}").write_text(content, encoding="utf-8")
        (GOLDEN_DIR / f"{name}{stale}").unlink(missing_ok=True)
    assert not (GOLDEN_DIR / f"{name}{stale}").exists(), f"{name}{stale}: the case is now {suffix}"
    for ending, content in golden.items():
        path = GOLDEN_DIR / f"{name}{ending}"
        if not path.is_file():
            pytest.fail(f"{path} is missing; run with MOEGEN_UPDATE_GOLDENS=1 to create it")
        assert content.encode() == path.read_bytes(), (
            f"{path.name} differs from what renders now; if the change is intended, run "
            "MOEGEN_UPDATE_GOLDENS=1 .venv/bin/pytest -n 0 tests/test_property_pairwise.py"
        )
