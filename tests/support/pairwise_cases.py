"""The option matrix, pairwise: the cases of the render corpus (tests/goldens/render/).

The options that pick a different path through the templates (FACTORS) make 1,152 combinations;
a greedy covering set of a few dozen holds every pair of values of every two options (kernel
pallas with quantization fp8, ring of experts with FFN slices and a capacity, ...). Each case is
a spec (spec_builder choices); tests/support/golden_runner.py writes and checks its goldens,
tests/property/test_property_pairwise.py checks the covering.
"""

from __future__ import annotations

import itertools
from typing import Any

from spec_builder import spec_yaml

from moegen.kernels import KERNEL_NAMES
from moegen.strategies import STRATEGIES

# option -> its values, in a fixed order (the covering set depends on it)
FACTORS: dict[str, list[Any]] = {
    "kernel": list(KERNEL_NAMES),  # the registries' order: a new one joins the matrix
    "strategy": list(STRATEGIES),
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


def case_spec_text(name: str) -> str:
    """The spec of case `name`, as its golden input CASE.yaml holds it."""
    return spec_yaml(case_choices(CASES[name]), modeline=True)
