"""moegen.placement and `moegen rebalance`: redundant-expert slots placed for a measured load
(issue 30). Every placement against the layer's rules, the Zipf loads the issue names,
hostile load files, the command end to end, and a layer built from its placement file that
computes what the layer without replicas does."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moegen.placement import (
    SHARE_UNITS,
    LoadError,
    Placement,
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


def assert_layer_takes(placement: Placement, experts: int, devices: int, extra: int) -> None:
    """The rules the layer holds a placement to (moegen.validate.replicas), and its file."""
    local = experts // devices
    assert (placement.experts, placement.devices) == (experts, devices)
    assert len(placement.extra) == devices
    totals: Counter[int] = Counter()
    for device, slots in enumerate(placement.extra):
        assert len(slots) == extra, (device, slots)
        held = [expert for expert, _ in slots]
        assert len(set(held)) == len(held), f"an expert twice on device {device}"
        for expert, units in slots:
            assert 0 <= expert < experts and expert // local != device, (device, expert)
            assert type(units) is int and 1 <= units <= SHARE_UNITS, (device, expert, units)
            totals[expert] += units
    assert all(units <= SHARE_UNITS for units in totals.values()), totals
    data = json.loads(json.dumps(placement.as_json("test")))
    assert data["format"] == "moegen-placement-2" and set(data) <= {"format", "placement", "source"}
    shares = [
        [(r["expert"], round(r["share"] * SHARE_UNITS)) for r in d] for d in data["placement"]
    ]
    assert shares == [list(slots) for slots in placement.extra]


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[float], int, int]:
    devices = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    experts = devices * draw(st.integers(1, 6))
    small = st.floats(0, 1e6, allow_nan=False) | st.sampled_from([0.0, 1.0])
    load = draw(st.lists(small, min_size=experts, max_size=experts))
    extra = draw(st.integers(0, min(4, experts - experts // devices)))
    return load, devices, extra


@settings(max_examples=300, deadline=None)
@given(requests())
def test_every_placement_is_one_the_layer_takes_and_no_worse_than_none(request) -> None:
    load, devices, extra = request
    placement = place(load, devices, extra)
    assert_layer_takes(placement, len(load), devices, extra)
    rows = placement.rows(load)
    assert sum(rows) == pytest.approx(sum(load), rel=1e-9, abs=1e-6)
    assert min(rows) >= -1e-6
    # Balancing never raises the busiest device; only the forced 1/1024 fills of the slots
    # left over can, by at most a 1024th of an expert per slot.
    allowance = extra * max(load) / SHARE_UNITS + 1e-9 * (sum(load) + 1)
    assert max(rows) <= max(contiguous(len(load), devices).rows(load)) + allowance
    assert place(load, devices, extra) == placement  # deterministic


def test_a_small_placement_by_hand() -> None:
    # Device 0 holds 4 of 4 copies: the mean is 2. Expert 0 ships the most: 682/1024 of 3
    # copies (2 rounded down to 1024ths) to device 1; device 0's slot takes 1/1024 of
    # expert 2 (no copies: the fill that moves the fewest rows).
    placement = place([3.0, 1.0, 0.0, 0.0], 2, 1)
    assert placement.extra == (((2, 1),), ((0, 682),))
    assert placement.rows([3.0, 1.0, 0.0, 0.0]) == pytest.approx(
        [4 - 682 * 3 / 1024, 682 * 3 / 1024]
    )


def test_filling_every_slot_can_cost_a_1024th_when_the_load_is_already_even() -> None:
    # Both devices hold pi copies. Device 1 must take at least 1/1024 of expert 0 or 1, and
    # device 0 can give back only 1/1024ths of pi (expert 2) or nothing (expert 3): no whole
    # numbers of them cancel, so some device ends over pi; the fill keeps that to a 1024th.
    load = [1.0, math.pi - 1, math.pi, 0.0]
    placement = place(load, 2, 1)
    assert_layer_takes(placement, 4, 2, 1)
    assert math.pi < max(placement.rows(load)) <= math.pi + 1 / SHARE_UNITS


ZIPF_CASES = [(e, d, s) for e, d in [(128, 8), (256, 16)] for s in (0.8, 1.0, 1.2)]


@pytest.mark.parametrize(("experts", "devices", "s"), ZIPF_CASES)
def test_one_extra_slot_per_device_brings_zipf_loads_within_1_15_of_the_mean(
    experts, devices, s, capsys
) -> None:
    figures = []
    for seed in range(5):
        load = zipf(experts, s, seed)
        placement = place(load, devices, 1)
        assert_layer_takes(placement, experts, devices, 1)
        before = contiguous(experts, devices).busiest_over_mean(load)
        figures.append((before, placement.busiest_over_mean(load)))
    with capsys.disabled():
        print(
            f"\n{experts} experts / {devices}, Zipf {s}: busiest/mean before -> after, seeds 0-4:"
        )
        print("  " + ", ".join(f"{b:.3f} -> {a:.3f}" for b, a in figures))
    assert all(before > 1.3 for before, _ in figures)  # the skew is real
    assert all(after < 1.15 for _, after in figures), figures


def test_a_uniform_load_keeps_every_device_at_the_mean() -> None:
    load = [1000.0] * 128
    placement = place(load, 8, 2)
    assert_layer_takes(placement, 128, 8, 2)
    assert all(units == 1 for slots in placement.extra for _, units in slots)
    assert placement.busiest_over_mean(load) <= 1 + 2 * 1000 / SHARE_UNITS / 16000


@pytest.mark.parametrize(
    ("load", "devices", "extra", "words"),
    [
        ([1.0] * 6, 4, 1, "6 experts do not split over 4 devices"),
        ([1.0] * 8, 4, -1, "must be >= 0"),
        ([1.0] * 8, 4, 7, "each of the 6 experts that live on other devices"),
        ([1.0] * 8, 1, 1, "one device holds every expert"),
        ([1.0, math.nan, 1.0, 1.0], 2, 1, "load[1] = nan"),
        ([1.0, -1.0, 1.0, 1.0], 2, 1, "load[1] = -1.0"),
        ([1.0] * 2048, 2048, 1, "at most 1025 devices"),
    ],
)
def test_impossible_requests_are_value_errors_saying_why(load, devices, extra, words) -> None:
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        place(load, devices, extra)


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


def test_rebalance_writes_a_placement_file_the_spec_then_names(tmp_path, invoke_main) -> None:
    from moegen.pipeline import load_valid
    from moegen.plan import make_plan

    spec = _spec(tmp_path, "expert: 4", "ragged_all_to_all")
    (tmp_path / "load.json").write_text(json.dumps({"tokens_per_expert": zipf(16, 1.2)}))
    args = ("rebalance", "layer.yaml", "--load", "load.json", "--out", "placement.json")
    result = invoke_main(*args, cwd=tmp_path)
    assert result.code == 0, result.stderr
    assert "busiest device:" in result.stdout and "rows before" in result.stdout
    assert "water-filling" in result.stdout
    assert "  redundant_experts: 4\n  placement: placement.json\n" in result.stdout
    assert len(json.loads((tmp_path / "placement.json").read_text())["placement"]) == 4
    # The spec with the two lines printed: valid, and its plan carries the replicas.
    text = spec.read_text().replace(
        "{experts: ragged_all_to_all}",
        "{experts: ragged_all_to_all, redundant_experts: 4, placement: placement.json}",
    )
    spec.write_text(text)
    assert make_plan(load_valid(spec)).experts.replicas.extra_per_device == 1
    # Rebalancing that spec again: its placement is "before", its slots the default.
    again = invoke_main("rebalance", "layer.yaml", "--load", "load.json", cwd=tmp_path)
    assert again.code == 0 and "before: the spec's placement" in again.stdout
    before, after = again.stdout.split("busiest device: ")[1].split("x the mean before, ")
    assert before == after.split("x after")[0]  # the same load, the same placement


@pytest.mark.parametrize(
    ("axes", "strategy", "load", "extra", "words"),
    [
        ("data: 2", "replicated", [1.0] * 16, (), "no expert axis"),
        ("expert: 4", "ragged_all_to_all", [1.0] * 8, (), "8 counts for a layer of 16 experts"),
        ("expert: 4", "ragged_all_to_all", [1.0] * 16, ("--slots", "13"), "the 12 experts"),
        ("expert: 4", "ragged_all_to_all", [1.0] * 16, ("--slots", "0"), "--slots 0 places"),
        ("expert: 4", "ragged_all_to_all", [1.0] * 16, ("--out", "sub/p.json"), "beside the spec"),
        ("expert: 4", "ragged_all_to_all", [1.0] * 16, ("--out", "p.txt"), "a plain name"),
        ("expert: 4", "ragged_all_to_all", [1.0] * 16, ("--out", "load.json"), "the load file"),
    ],
    ids=["replicated", "wrong length", "too many slots", "no slots", "elsewhere", "name", "load"],
)
def test_rebalance_refuses_with_the_reason_and_writes_nothing(
    tmp_path, invoke_main, axes, strategy, load, extra, words
) -> None:
    _spec(tmp_path, axes, strategy)
    (tmp_path / "sub").mkdir()
    (tmp_path / "load.json").write_text(json.dumps({"tokens_per_expert": load}))
    extra = extra if "--out" in extra else (*extra, "--out", "placement.json")
    result = invoke_main("rebalance", "layer.yaml", "--load", "load.json", *extra, cwd=tmp_path)
    assert result.code == 2 and words in result.stderr and "nothing written" in result.stderr
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["layer.yaml", "load.json", "sub"]
    assert json.loads((tmp_path / "load.json").read_text())["tokens_per_expert"] == load


ROUND_TRIP_SPEC = """version: 1
layer: {num_experts: 8, embed_dim: 8, ffn_dim: 16}
router: {top_k: 2}
shapes: {batch: 4, seq_len: 64}
mesh: {axes: {expert: 4}}
parallelism: {experts: ragged_all_to_all}
dtypes: {params: float32, compute: float32}
target: {hardware: cpu, kernel: xla}
"""

# Both modules on one batch routed by `load` (identity router, x = log p + Gumbel noise:
# the Gumbel top-k trick samples experts in proportion to p), forward and gradients.
ROUND_TRIP = textwrap.dedent(
    """
    import importlib.util, json, sys
    import jax, jax.numpy as jnp, numpy as np

    def module(path):
        spec = importlib.util.spec_from_file_location(path.split("/")[-1][:-3], path)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return loaded

    plain, replicas = module(sys.argv[1]), module(sys.argv[2])
    p = np.asarray(json.load(open(sys.argv[3]))["tokens_per_expert"])
    mesh = plain.make_mesh()
    params = plain.init_params(jax.random.key(0), mesh)
    params["router"] = jax.device_put(jnp.eye(8), params["router"].sharding)
    gumbel = np.random.default_rng(1).gumbel(size=plain.INPUT_SHAPE)
    x = jax.device_put(jnp.asarray(np.log(p / p.sum()) + gumbel, jnp.float32),
                       plain.input_sharding(mesh))
    probe = jnp.asarray(np.random.default_rng(2).normal(size=plain.INPUT_SHAPE), jnp.float32)
    out = {"same_shapes": plain.PARAM_SHAPES == replicas.PARAM_SHAPES}
    for name, m in (("plain", plain), ("replicas", replicas)):
        with jax.set_mesh(mesh):  # jitted: a shard_map called eagerly runs op by op
            y, aux = jax.jit(lambda w: m.moe_layer(w, x))(params)
            grads = jax.jit(jax.grad(lambda w: jnp.sum(m.moe_layer(w, x)[0] * probe)))(params)
        out[name] = {"y": np.asarray(y).tolist(), "received_rows": int(aux.received_rows),
                     "tokens": np.asarray(aux.tokens_per_expert).tolist(),
                     "grads": {k: np.asarray(v).tolist() for k, v in grads.items()}}
    print(json.dumps(out))
    """
)


def _relative(got, want) -> float:
    got, want = np.asarray(got), np.asarray(want)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


@pytest.mark.slow
def test_a_rebalanced_layer_computes_what_the_layer_without_replicas_does(
    tmp_path, invoke_main, run_moegen
) -> None:
    (tmp_path / "plain.yaml").write_text(ROUND_TRIP_SPEC)
    save_load(tmp_path / "load.json", zipf(8, 1.2, total=4096), steps=1)
    args = ("rebalance", "plain.yaml", "--load", "load.json", "--out", "placement.json")
    assert invoke_main(*args, cwd=tmp_path).code == 0
    lines = "redundant_experts: 4, placement: placement.json}"
    text = ROUND_TRIP_SPEC.replace("ragged_all_to_all}", f"ragged_all_to_all, {lines}")
    (tmp_path / "replicas.yaml").write_text(text)
    # the layer without replicas is the baseline (verified elsewhere): written, not verified
    plain = run_moegen("build", "--no-verify", "plain.yaml", "--out", "gen", cwd=tmp_path)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    built = run_moegen("build", "replicas.yaml", "--out", "gen", cwd=tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr  # twin parity included
    (tmp_path / "check.py").write_text(ROUND_TRIP)
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    paths = [tmp_path / "gen" / "plain.py", tmp_path / "gen" / "replicas.py"]
    result = subprocess.run(
        [sys.executable, "check.py", *map(str, paths), "load.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    plain, replicas = out["plain"], out["replicas"]
    assert out["same_shapes"]  # a checkpoint of one loads into the other unchanged
    assert replicas["tokens"] == plain["tokens"]
    assert _relative(replicas["y"], plain["y"]) < 1e-5
    for name, grad in plain["grads"].items():
        assert _relative(replicas["grads"][name], grad) < 1e-5, name
    # The replicas took rows off the busiest device.
    assert replicas["received_rows"] < plain["received_rows"], (replicas, plain)
