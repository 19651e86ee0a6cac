"""The generated population of TPU specs the memory ledger is measured on (bench.population):
seeded and stable, every spec valid, spread over the space users write."""

from __future__ import annotations

import collections

import yaml

from bench.population import FAMILIES, SLICES, population
from moegen.load import load_spec_bytes
from moegen.plan import make_plan
from moegen.validate import validate

SPECS = population(60, 0)


def test_a_seed_gives_the_same_specs_whatever_the_count() -> None:
    assert population(10, 0) == SPECS[:10]
    assert population(10, 1) != SPECS[:10]


def test_every_spec_is_valid_and_plans() -> None:
    for name, text in SPECS:
        plan = make_plan(validate(load_spec_bytes(text.encode(), f"{name}.yaml", name)))
        assert plan.memory.hbm_bytes_per_device > 0  # a TPU target, judged against HBM


def test_the_population_spreads_over_the_space() -> None:
    trees = [yaml.safe_load(text) for _, text in SPECS]
    seen = collections.defaultdict(set)
    for tree in trees:
        seen["hardware"].add(tree["target"]["hardware"])
        seen["kernel"].add(tree["target"]["kernel"])
        seen["strategy"].add(tree["parallelism"]["experts"])
        seen["family"].add(tree["description"].split()[1])
        seen["axes"].update(tree["mesh"]["axes"])
        memory = tree.get("memory", {})
        seen["trade"].add(
            ("slices" if "ffn_chunks" in memory else "")
            + ("chunks" if memory.get("token_chunks", 1) > 1 else "")
        )
    assert seen["hardware"] == set(SLICES)
    assert seen["kernel"] == {"pallas", "xla"}
    assert seen["strategy"] == {"ragged_all_to_all", "ring_of_experts", "replicated"}
    assert seen["axes"] == {"data", "fsdp", "expert", "tensor", "sequence"}
    assert seen["trade"] == {"", "slices", "chunks", "sliceschunks"}
    assert len(seen["family"]) >= len(FAMILIES) - 2
