"""The expert-parallel strategies as one registry (moegen/strategies/): every strategy is
checked the same way here, so a new one is one module, one template and one row below.

For a realistic sharded layer (Mixtral-sized widths, cut down to build quickly on CPU, 4
experts per device over expert 2) each strategy: validates with its expert axis and is
refused, located, without it (or with one it cannot use); plans the rows and calls its
module counts from the registry's `rows`; moves the bytes its `traffic` says; has the
template its name promises; and the schema offers exactly the registry's names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from spec_builder import spec_positions, spec_yaml, tiny, validated

from moegen.diagnostics import SpecError
from moegen.load import load_spec_bytes
from moegen.plan import make_plan
from moegen.schema import spec_json_schema
from moegen.spec import Parallelism
from moegen.strategies import (
    STRATEGIES,
    STRATEGY_NAMES,
    RowRequest,
    TrafficRequest,
    overlapping_strategies,
    sharding_strategies,
)
from moegen.validate import check_rules

TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "strategies"
SHARDED_AXES = {"data": 2, "expert": 2}
UNSHARDED_AXES = {"data": 2, "fsdp": 2}


def _spec(name: str, axes: dict[str, int], **choices: object):
    text = spec_yaml(tiny(experts=8, embed=256, ffn=512, axes=axes, strategy=name, **choices))
    return validated(text, f"{name}.yaml", name)


def _valid(name: str):
    axes = SHARDED_AXES if STRATEGIES[name].shards_experts else UNSHARDED_AXES
    loaded = _spec(name, axes)
    assert not isinstance(loaded, SpecError), loaded
    return loaded


def test_the_schema_offers_the_registry() -> None:
    """The spec's model types parallelism.experts as a name; the JSON schema an editor reads
    offers the registry's names (and auto), each described as its module does."""
    field = spec_json_schema()["$defs"]["Parallelism"]["properties"]["experts"]
    assert field["enum"] == [*STRATEGY_NAMES, "auto"]
    for name, chosen in STRATEGIES.items():
        assert f"{name} = {chosen.summary}" in field["description"]
    assert Parallelism.model_fields["experts"].default == STRATEGY_NAMES[0]


@pytest.mark.parametrize(
    ("written", "guess"),
    [
        ("ring", "ring_of_experts"),  # a shorter name the intended one contains
        ("replicate", "replicated"),
        ("all_to_all", "ragged_all_to_all"),
        ("ep", None),  # too far from every strategy: the choices only
    ],
)
def test_an_unregistered_strategy_is_refused_alone_with_the_names(written, guess) -> None:
    """Validation asks the registry first: an unknown name is reported alone, at its value."""
    choices = tiny(strategy=written)
    text = spec_yaml(choices)
    (problem,) = check_rules(load_spec_bytes(text.encode(), "spec.yaml", "spec"))
    position = spec_positions(choices)["parallelism.experts"]
    assert (problem.field, (problem.line, problem.column)) == (
        "parallelism.experts",
        position.value,
    )
    names = [f"'{name}'" for name in (*STRATEGY_NAMES, "auto")]
    message = f"must be {', '.join(names[:-1])} or {names[-1]}, got '{written}'"
    assert problem.message == (f"{message}; did you mean '{guess}'?" if guess else message)


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_each_strategy_has_its_template(name: str) -> None:
    assert (TEMPLATES / f"{name}.jinja").is_file()


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_the_rules_refuse_the_wrong_expert_axis_located(name: str) -> None:
    sharded = STRATEGIES[name].shards_experts
    refused = _spec(name, UNSHARDED_AXES if sharded else SHARDED_AXES)
    assert isinstance(refused, SpecError)
    (found,) = [d for d in refused.diagnostics if "expert" in d.message]
    assert found.line > 0 and found.file == f"{name}.yaml"
    if sharded:
        assert found.field == "parallelism.experts" and "add one to mesh.axes" in found.message
    else:
        assert " or ".join(sharding_strategies()) in found.message


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_overlap_chunks_only_where_the_strategy_overlaps(name: str) -> None:
    axes = SHARDED_AXES if STRATEGIES[name].shards_experts else UNSHARDED_AXES
    result = _spec(name, axes, overlap_chunks=2)
    if STRATEGIES[name].overlaps:
        assert not isinstance(result, SpecError), result
        return
    assert isinstance(result, SpecError)
    assert any(
        d.field == "parallelism.overlap_chunks" and overlapping_strategies()[0] in d.message
        for d in result.diagnostics
    )


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_the_plan_counts_rows_and_bytes_by_the_registry(name: str) -> None:
    plan = make_plan(_valid(name))
    experts, chosen = plan.experts, STRATEGIES[name]
    request = RowRequest(
        call_tokens=experts.call_tokens,
        group_tokens=experts.group_tokens,
        per_token=plan.copies_per_device,
        top_k=plan.router.top_k,
        num_experts=plan.num_experts,
        local_experts=experts.local_experts,
        shards=experts.shards,
        overlap_chunks=experts.overlap_chunks,
        capacity=experts.capacity,
    )
    assert chosen.rows(request) == (experts.ffn_rows, experts.ffn_calls)
    # the worst case: a device never runs fewer rows than the copies of its own tokens
    # that can stay with it, nor more than the whole group's copies
    assert experts.ffn_rows >= min(experts.call_rows, experts.call_tokens * experts.local_experts)
    assert experts.ffn_rows <= experts.group_tokens * plan.router.top_k
    assert (experts.receive_rows > 0) == chosen.certifies_receive_buffer
    moved = dict(experts.communication_bytes)
    if not chosen.shards_experts:
        assert moved == {}
        return
    traffic = chosen.traffic(
        TrafficRequest(
            local_tokens=plan.local_tokens,
            top_k=plan.router.top_k,
            embed_dim=plan.embed_dim,
            shards=experts.shards,
            compute_bytes=2 if plan.compute_dtype == "bfloat16" else 4,
        )
    )
    assert moved[name] == traffic > 0
    assert experts.communication_bytes[0][0] == name  # the spec's own strategy first
    kinds = {t.kind for t in plan.network.transfers if t.axis == "expert"}
    assert chosen.collective in kinds
