"""moegen.placement and `moegen rebalance`: redundant-expert slots placed for a measured load
(issue 30, its first part). Properties over drawn loads, the apportionment against a brute
force, the Zipf case the issue names, hostile load files, and the command end to end."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moegen.placement import (
    LoadError,
    accumulate_load,
    contiguous,
    place,
    read_load,
    save_load,
)


def zipf(experts: int, s: float, seed: int = 0, total: float = 1e6) -> list[float]:
    """Zipf(s) copies over the experts, hot experts at random places."""
    weights = 1.0 / np.arange(1, experts + 1) ** s
    shuffled = np.random.default_rng(seed).permutation(weights)
    return list(shuffled / weights.sum() * total)


@st.composite
def loads(draw: st.DrawFn) -> tuple[list[float], int, int]:
    devices = draw(st.sampled_from([1, 2, 4, 8]))
    experts = devices * draw(st.integers(1, 6))
    load = draw(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=experts, max_size=experts))
    if not sum(load) > 0:
        load[0] = 1.0
    extra = draw(st.integers(0, min(3, experts * (devices - 1) // devices)))
    return load, devices, extra


@settings(max_examples=200, deadline=None)
@given(loads())
def test_every_placement_holds_its_slots_and_its_load(case) -> None:
    load, devices, extra = case
    placement = place(load, devices, extra)
    experts = len(load)
    assert len(placement.slots) == devices
    assert all(len(slots) == experts // devices + extra for slots in placement.slots)
    held = [e for slots in placement.slots for e in slots]
    assert sorted(set(held)) == list(range(experts)), "every expert has a slot"
    assert [held.count(e) for e in range(experts)] == list(placement.replicas)
    assert all(1 <= r <= devices for r in placement.replicas)
    assert all(len(set(slots)) == len(slots) for slots in placement.slots), "a replica twice"
    assert sum(placement.rows(load)) == pytest.approx(sum(load))


def _best_largest_share(load: list[float], devices: int, extra: int) -> float:
    """The smallest largest copies-per-replica any assignment of the extra slots reaches."""
    best = float("inf")
    for counts in itertools.product(range(devices), repeat=len(load)):
        if sum(counts) == extra:
            best = min(best, max(w / (1 + c) for w, c in zip(load, counts, strict=True)))
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 100), min_size=4, max_size=4), st.integers(0, 4))
def test_the_extra_replicas_minimise_the_largest_share(counts: list[int], extra: int) -> None:
    load = [float(c) for c in counts]
    load[0] += 1.0
    placement = place(load, 2, extra // 2)
    largest = max(w / r for w, r in zip(load, placement.replicas, strict=True))
    assert largest == pytest.approx(_best_largest_share(load, 2, 2 * (extra // 2)))


@pytest.mark.parametrize(
    ("experts", "devices"), [(128, 8), (256, 16)], ids=["qwen3-30b-a3b/ep8", "deepseek-v3/ep16"]
)
def test_one_extra_slot_brings_the_busiest_device_near_the_mean_on_zipf_1(experts, devices):
    load = zipf(experts, 1.0)
    mean = sum(load) / devices
    before = max(contiguous(experts, devices).rows(load)) / mean
    after = max(place(load, devices, 1).rows(load)) / mean
    assert before > 1.3, before  # the skew is real
    assert after < 1.15, after


def test_load_files_round_trip_through_a_jitted_accumulation(tmp_path: Path) -> None:
    import jax
    import jax.numpy as jnp

    step_counts = [jnp.array([3, 0, 5, 1], jnp.int32), jnp.array([1, 2, 0, 4], jnp.int32)]
    total = jnp.zeros(4, jnp.float32)
    add = jax.jit(accumulate_load)
    for counts in step_counts:
        total = add(total, counts)
    save_load(tmp_path / "load.json", total, steps=2)
    assert read_load(tmp_path / "load.json", 4) == [4.0, 2.0, 5.0, 5.0]


HOSTILE = {
    "missing": (None, "cannot be read"),
    "not json": (b"{tokens", "not JSON"),
    "a list": (b"[1, 2]", '"tokens_per_expert" list'),
    "no counts": (b'{"steps": 3}', '"tokens_per_expert" list'),
    "too few": (b'{"tokens_per_expert": [1, 2]}', "2 counts for a layer of 4 experts"),
    "negative": (b'{"tokens_per_expert": [1, -2, 3, 4]}', "tokens_per_expert[1]"),
    "nan": (b'{"tokens_per_expert": [1, NaN, 3, 4]}', "tokens_per_expert[1]"),
    "a boolean": (b'{"tokens_per_expert": [1, true, 3, 4]}', "tokens_per_expert[1]"),
    "a string": (b'{"tokens_per_expert": [1, "2", 3, 4]}', "tokens_per_expert[1]"),
    "all zero": (b'{"tokens_per_expert": [0, 0, 0, 0]}', "every count is 0"),
    "deep": (b"[" * 100000, "not JSON"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_bad_load_file_is_a_load_error_naming_it(name: str, tmp_path: Path) -> None:
    content, words = HOSTILE[name]
    path = tmp_path / "load.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(LoadError) as raised:
        read_load(path, 4)
    assert str(path) in str(raised.value) and words in str(raised.value)


def test_an_oversized_load_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "load.json"
    with path.open("wb") as handle:
        handle.truncate((16 << 20) + 1)
    with pytest.raises(LoadError, match="a load file is at most"):
        read_load(path, 4)


SPEC = """version: 1
layer: {num_experts: 16, embed_dim: 64, ffn_dim: 96}
router: {top_k: 2}
shapes: {batch: 8, seq_len: 16}
mesh: {axes: {AXES}}
parallelism: {experts: STRATEGY}
target: {hardware: cpu, kernel: xla}
"""


def _spec(tmp_path: Path, axes: str, strategy: str) -> Path:
    path = tmp_path / "layer.yaml"
    path.write_text(SPEC.replace("AXES", axes).replace("STRATEGY", strategy))
    return path


def test_rebalance_prints_the_rows_and_writes_the_placement(tmp_path, invoke_main) -> None:
    spec = _spec(tmp_path, "expert: 4", "ragged_all_to_all")
    (tmp_path / "load.json").write_text(json.dumps({"tokens_per_expert": zipf(16, 1.2)}))
    out = tmp_path / "placement.json"
    result = invoke_main(
        "rebalance", str(spec), "--load", "load.json", "--out", str(out), cwd=tmp_path
    )
    assert result.code == 0, result.stderr
    assert "busiest device:" in result.stdout and "rows before" in result.stdout
    slots = json.loads(out.read_text())["slots"]
    assert len(slots) == 4 and all(len(s) == 5 for s in slots)


@pytest.mark.parametrize(
    ("axes", "strategy", "load", "words"),
    [
        ("data: 2", "replicated", [1.0] * 16, "no expert axis"),
        ("expert: 4", "ragged_all_to_all", [1.0] * 8, "8 counts for a layer of 16 experts"),
    ],
    ids=["replicated", "wrong length"],
)
def test_rebalance_refuses_with_the_reason_and_writes_nothing(
    tmp_path, invoke_main, axes, strategy, load, words
) -> None:
    spec = _spec(tmp_path, axes, strategy)
    (tmp_path / "load.json").write_text(json.dumps({"tokens_per_expert": load}))
    out = tmp_path / "placement.json"
    result = invoke_main(
        "rebalance", str(spec), "--load", "load.json", "--out", str(out), cwd=tmp_path
    )
    assert result.code == 2 and words in result.stderr and "nothing written" in result.stderr
    assert not out.exists()
