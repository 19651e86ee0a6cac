"""The plan's certified ragged all-to-all receive buffer (RECEIVE_ROWS) against brute force, and the TPU example's CPU twin emulating the collective."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from ragged_model import REPO_ROOT, distinct_choices, load, max_received, spec_text

from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.render import render
from moegen.verify.twin import twin_of

# (expert shards, local experts, top_k, tokens per device)
BOUND_SHAPES = [
    (2, 2, 1, 1),
    (2, 2, 2, 1),
    (2, 2, 3, 1),
    (2, 1, 2, 2),
    (4, 1, 3, 1),
    (4, 2, 3, 2),
    (4, 4, 2, 3),
    (2, 4, 8, 2),
    (8, 2, 4, 4),
    (8, 8, 8, 2),
]


@pytest.mark.parametrize("shape", BOUND_SHAPES, ids=lambda s: "S{}-L{}-K{}-T{}".format(*s))
def test_receive_rows_is_the_brute_force_maximum(shape: tuple[int, int, int, int]) -> None:
    shards, local, top_k, per_device = shape
    experts = shards * local
    plan = make_plan(
        load(
            spec_text(
                experts=experts,
                top_k=top_k,
                axes={"expert": shards},
                batch=shards,
                seq_len=per_device,
            )
        )
    )
    group = shards * per_device
    assert plan.experts.group_tokens == group
    bound = plan.experts.receive_rows
    assert bound == group * min(top_k, local)  # the documented formula
    assert plan.experts.ffn_rows == bound

    if math.comb(experts, top_k) ** group <= 20_000:  # every routing of the group
        subsets = list(itertools.combinations(range(experts), top_k))
        best = max(
            max_received(np.array(choice), shards, local)
            for choice in itertools.product(subsets, repeat=group)
        )
        assert best == bound
        return
    rng = np.random.default_rng(0)
    adversarial = []
    for target in range(shards):
        mine = list(range(target * local, (target + 1) * local))
        others = [e for e in range(experts) if e not in mine]
        take = min(top_k, local)
        adversarial.append(
            np.array(
                [
                    distinct_choices(rng, mine, take) + distinct_choices(rng, others, top_k - take)
                    for _ in range(group)
                ]
            )
        )
    randoms = [
        np.array([distinct_choices(rng, list(range(experts)), top_k) for _ in range(group)])
        for _ in range(50)
    ]
    assert max(max_received(r, shards, local) for r in adversarial) == bound
    assert all(max_received(r, shards, local) == bound for r in adversarial)
    assert max(max_received(r, shards, local) for r in randoms) <= bound
    # Nothing can beat the bound: a token sends one device at most min(top_k, local) copies.
    assert all(
        max(sum(e // local == d for e in choice) for d in range(shards)) <= min(top_k, local)
        for choice in itertools.islice(itertools.combinations(range(experts), top_k), 2000)
    )


def test_receive_rows_with_a_data_axis_counts_the_expert_group_only() -> None:
    plan = make_plan(
        load(spec_text(experts=8, top_k=3, axes={"data": 2, "expert": 4}, batch=8, seq_len=5))
    )
    # 8 sequences over 8 devices: 5 tokens each; the group is the 4 devices of one data row.
    assert plan.local_tokens == 5
    assert plan.experts.group_tokens == 20
    assert plan.experts.receive_rows == 20 * min(3, 2)
    assert math.prod(dict(plan.mesh.axes).values()) == 8


def test_twin_of_the_tpu_example_emulates_the_collective() -> None:
    """The TPU module calls jax.lax.ragged_all_to_all; its CPU twin uses the emulation."""
    path = REPO_ROOT / "specs" / "mixtral_8x7b_ep_a2a_v5e.yaml"
    if not path.exists():
        pytest.skip("example spec not present")
    loaded = load_valid(path)
    full = make_plan(loaded)
    assert full.experts.strategy == "ragged_all_to_all"
    assert not full.experts.emulates_collective
    source = render(full)
    assert "jax.lax.ragged_all_to_all(" in source and "def _ragged_all_to_all(" not in source
    twin_plan = make_plan(twin_of(loaded), interpret=True)
    assert twin_plan.experts.emulates_collective
    twin_source = render(twin_plan)
    assert "def _ragged_all_to_all(" in twin_source
    assert "jax.lax.ragged_all_to_all(" not in twin_source
    local = twin_plan.local_experts
    assert twin_plan.experts.receive_rows == twin_plan.experts.group_tokens * min(
        twin_plan.router.top_k, local
    )
    assert f"RECEIVE_ROWS = {twin_plan.experts.receive_rows}" in twin_source
