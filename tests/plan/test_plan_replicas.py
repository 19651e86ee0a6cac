"""Stage 3, `moegen.plan.replicas`: where each replica sits, how its expert's copies split,
and the ppermute rounds that bring the replicas' weights, over generated placements."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from spec_builder import spec_yaml

from moegen.load import load_spec_bytes
from moegen.plan import make_plan
from moegen.plan.replicas import ReplicaPlan
from moegen.validate import validate


@st.composite
def placements(draw) -> tuple[int, int, list[list[dict]]]:
    """(experts, devices, placement): extra slots on every device holding other devices'
    experts, each expert's replicas taking at most all its copies together."""
    devices = draw(st.sampled_from([2, 4, 8]))
    local = draw(st.integers(1, 4))
    experts = devices * local
    extra = draw(st.integers(1, min(3, experts - local)))
    left = Counter()
    placement = []
    for device in range(devices):
        others = [e for e in range(experts) if e // local != device]
        chosen = draw(st.permutations(others))[:extra]
        slots = []
        for expert in chosen:
            units = draw(st.integers(1, max(1, (1024 - left[expert]) // 2)))
            left[expert] += units
            slots.append({"expert": expert, "share": units / 1024})
        placement.append(slots)
    return experts, devices, placement


def plan_of(experts: int, devices: int, placement: list[list[dict]]) -> ReplicaPlan:
    text = spec_yaml(
        {
            "experts": experts,
            "embed": 64,
            "ffn": 32,
            "top_k": 1,
            "batch": devices,
            "seq_len": 8,
            "axes": {"expert": devices},
            "strategy": "ragged_all_to_all",
            "redundant_experts": devices * len(placement[0]),
            "placement": placement,
        }
    )
    return make_plan(validate(load_spec_bytes(text.encode(), "r.yaml", "r"))).experts.replicas


@given(placements())
@settings(max_examples=60, deadline=None)
def test_rounds_bring_every_replica_once_in_as_few_rounds_as_a_device_has_transfers(drawn):
    experts, devices, placement = drawn
    plan = plan_of(experts, devices, placement)
    local = experts // devices
    transfers = [(e["expert"] // local, d) for d, slots in enumerate(placement) for e in slots]
    busiest = max(max(Counter(h for h, _ in transfers).values()), len(placement[0]))
    assert len(plan.rounds) == busiest
    for _, pairs in plan.rounds:  # a partial permutation: one send, one receipt a device
        assert len({h for h, _ in pairs}) == len({r for _, r in pairs}) == len(pairs)
    for holder, slots in enumerate(placement):
        for slot, replica in enumerate(slots):
            sends, pairs = plan.rounds[plan.arrivals[holder][slot]]
            home = replica["expert"] // local
            assert (home, holder) in pairs
            assert home * local + sends[home] == replica["expert"]


@given(placements())
@settings(max_examples=60, deadline=None)
def test_each_expert_splits_its_copies_home_first_in_its_slots(drawn):
    experts, devices, placement = drawn
    plan = plan_of(experts, devices, placement)
    local = experts // devices
    assert (plan.local_slots, plan.slots) == (local + len(placement[0]), devices * plan.local_slots)
    shares = Counter()
    for slots in placement:
        for replica in slots:
            shares[replica["expert"]] += round(replica["share"] * 1024)
    split = dict(plan.split)
    assert sorted(split) == sorted(shares)
    for expert, replicas in split.items():
        starts = [start for _, start in replicas]
        assert starts[0] == 1024 - shares[expert] and starts == sorted(starts)
        for slot, _ in replicas:  # an extra slot of another device than the expert's home
            device, index = divmod(slot, plan.local_slots)
            assert index >= local and device != expert // local
            assert placement[device][index - local]["expert"] == expert
