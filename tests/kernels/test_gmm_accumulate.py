"""_gmm_add, the overlapped ring's in-place partial sums (templates/kernels/pallas.jinja), as a
generated module defines it, run interpreted on CPU and checked like megablox's own kernels:
against a plain NumPy reference over group sizes that leave groups empty, share row tiles,
fill every row or leave rows of no group, over one and several contraction and output tiles;
its gradients against jax.grad of a ragged_dot reference; and the plan's tiles for it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from expert_parallel_cases import Case
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moegen.kernels.tiling import LANES, Tile
from moegen.kernels.tiling_kernels import accumulate_tile
from moegen.plan import make_plan
from moegen.render import render
from moegen.verify.twin import twin_of

ROWS, GROUPS = 64, 3
ROW_TILE = 16
# (contraction, output, tiling): one tile each way; two contraction tiles; two output tiles
SHAPES = {
    "one tile": (128, 128, (ROW_TILE, 128, 128)),
    "two contraction tiles": (256, 128, (ROW_TILE, 128, 128)),
    "two output tiles": (128, 256, (ROW_TILE, 128, 128)),
    "narrow output": (128, 24, (ROW_TILE, 128, 24)),
}
GROUP_SIZES = {
    "every row, tiles shared": [10, 30, 24],
    "rows of no group": [5, 0, 20],
    "all in the last group": [0, 0, 64],
    "all in the first, tile-aligned": [32, 0, 0],
    "no rows at all": [0, 0, 0],
}


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    """A generated overlapped-ring module (Pallas interpreted) that defines _gmm_add."""
    case = Case(
        "ring_of_experts",
        {"expert": 4},
        chunks=2,
        embed=256,
        ffn=128,
        batch=4,
        seq_len=8,
        hardware="tpu-v5e",
        topology="2x2",
        kernel="pallas",
    )
    plan = make_plan(twin_of(case.load("ring_accumulate")), interpret=True)
    assert plan.kernel.accumulates_in_kernel
    path = tmp_path_factory.mktemp("gmm_add") / f"{plan.module_name}.py"
    path.write_text(render(plan), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("gmm_add_module", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def _inputs(depth: int, width: int, seed: int):
    rng = np.random.default_rng(seed)
    lhs = rng.normal(size=(ROWS, depth)).astype(np.float32)
    rhs = rng.normal(size=(GROUPS, depth, width)).astype(np.float32)
    total = rng.normal(size=(ROWS, width)).astype(np.float32)
    return lhs, rhs, total


def _expected(lhs, rhs, total, sizes):
    out = total.astype(np.float64).copy()
    start = 0
    for group, size in enumerate(sizes):
        out[start : start + size] += lhs[start : start + size] @ rhs[group].astype(np.float64)
        start += size
    return out


def _with_tiling(module, monkeypatch, tiling) -> None:
    monkeypatch.setattr(module, "ACCUMULATE_TILING", tiling)
    monkeypatch.setattr(module, "GATE_UP_TILING", module.Tiling(tiling, tiling, tiling))


@pytest.mark.parametrize("sizes", GROUP_SIZES.values(), ids=GROUP_SIZES.keys())
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_adds_each_groups_product_and_keeps_the_other_rows(module, monkeypatch, shape, sizes):
    depth, width, tiling = shape
    _with_tiling(module, monkeypatch, tiling)
    lhs, rhs, total = _inputs(depth, width, seed=sum(sizes) + depth + width)
    got = module._gmm_add(lhs, rhs, jnp.asarray(sizes, jnp.int32), total)
    np.testing.assert_allclose(got, _expected(lhs, rhs, total, sizes), rtol=1e-5, atol=1e-4)
    past = sum(sizes)
    np.testing.assert_array_equal(np.asarray(got)[past:], total[past:])  # bit for bit


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(cuts=st.lists(st.integers(0, ROWS), min_size=GROUPS, max_size=GROUPS))
def test_any_group_sizes(module, monkeypatch, cuts) -> None:
    """Group sizes from sorted cut points: any split of up to ROWS rows into GROUPS groups."""
    _with_tiling(module, monkeypatch, SHAPES["two output tiles"][2])
    ends = sorted(cuts)
    sizes = [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    lhs, rhs, total = _inputs(128, 256, seed=7)
    got = module._gmm_add(lhs, rhs, jnp.asarray(sizes, jnp.int32), total)
    np.testing.assert_allclose(got, _expected(lhs, rhs, total, sizes), rtol=1e-5, atol=1e-4)


def _reference(lhs, rhs, sizes, total):
    rows = jnp.arange(lhs.shape[0]) < sizes.sum()
    product = jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32)
    return total + jnp.where(rows[:, None], product, 0.0)


@pytest.mark.parametrize("sizes", [[10, 30, 24], [5, 0, 20]], ids=["every row", "rows past"])
def test_gradients_match_a_ragged_dot_reference(module, monkeypatch, sizes) -> None:
    _with_tiling(module, monkeypatch, SHAPES["two contraction tiles"][2])
    lhs, rhs, total = _inputs(256, 128, seed=3)
    groups = jnp.asarray(sizes, jnp.int32)
    cotangent = np.random.default_rng(4).normal(size=total.shape).astype(np.float32)
    got_y, got_vjp = jax.vjp(lambda a, b, t: module._gmm_add(a, b, groups, t), lhs, rhs, total)
    want_y, want_vjp = jax.vjp(lambda a, b, t: _reference(a, b, groups, t), lhs, rhs, total)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-5, atol=1e-4)
    (got_lhs, got_rhs, got_total), (want_lhs, want_rhs, want_total) = (
        got_vjp(cotangent),
        want_vjp(cotangent),
    )
    np.testing.assert_array_equal(got_total, want_total)  # the sum passes its gradient on
    # megablox's input gradient leaves rows of no group unwritten: the module selects them away
    past = sum(sizes)
    np.testing.assert_allclose(got_lhs[:past], want_lhs[:past], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got_rhs, want_rhs, rtol=1e-5, atol=1e-4)


def test_a_kernel_that_overwrites_instead_of_adding_fails_here(module, monkeypatch) -> None:
    """Sensitivity: megablox's existing_out keeps the rows of no group but overwrites the rest;
    used as the running sum it drops every earlier chunk, and these tests see it."""
    tiling = SHAPES["one tile"][2]
    _with_tiling(module, monkeypatch, tiling)
    lhs, rhs, total = _inputs(128, 128, seed=1)
    sizes = jnp.asarray([10, 30, 24], jnp.int32)
    overwritten = module.megablox_gmm(
        lhs, rhs, sizes, jnp.float32, tiling, existing_out=jnp.asarray(total), interpret=True
    )
    want = _expected(lhs, rhs, total, [10, 30, 24])
    assert not np.allclose(overwritten, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("gate_up", "contraction", "output", "want"),
    [
        (Tile(512, 768, 768), 512, 768, Tile(512, 512, 768)),  # Qwen3 ring, 4 chunks
        (Tile(32, 128, 128), 128, 24, Tile(32, 128, 24)),  # a twin's narrow FFN: one block
        (Tile(512, 1024, 1024), 1024, 28672, Tile(512, 512, 896)),  # Mixtral gate_up, VMEM
    ],
)
def test_accumulate_tiles_divide_the_chunk_and_fit_vmem(gate_up, contraction, output, want):
    tile = accumulate_tile(gate_up, contraction, output, "bfloat16", 16 * 2**20)
    assert tile == want
    for width, lanes in ((contraction, tile.contraction), (output, tile.output)):
        assert width % lanes == 0 and (lanes % LANES == 0 or lanes == width)


def test_only_the_overlapped_pallas_ring_plans_in_place_sums(tmp_path: Path) -> None:
    def kernel_of(**changes):
        case = Case("ring_of_experts", {"expert": 4}, embed=256, ffn=128, **changes)
        return make_plan(case.load("ring_kernel")).kernel

    tpu = {"hardware": "tpu-v5e", "topology": "2x2", "kernel": "pallas"}
    # one 128-lane chunk of the embedding; gate and up side by side, 2 x 128 lanes
    assert kernel_of(chunks=2, **tpu).config.accumulate_tile == (16, 128, 256)
    assert not kernel_of(chunks=1, **tpu).accumulates_in_kernel
    assert not kernel_of(chunks=2).accumulates_in_kernel  # xla: total + ragged_dot
