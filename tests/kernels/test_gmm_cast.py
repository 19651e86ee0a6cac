"""_gmm_cast, the pallas module's own gmm that reads float32 weights as stored and casts each
block in VMEM (templates/pallas_kernels.jinja), as a generated module defines it, run
interpreted on CPU and checked like megablox's own kernels: against a NumPy reference of the
bfloat16 product over group sizes that leave groups empty, share row tiles, fill every row or
leave rows past them (never read back by the module), over one and several contraction and output tiles, ragged ones
included, weights plain and transposed; its gradients (the module's custom VJP: _gmm_cast
for the input, megablox's tgmm for the float32 weights) against jax's VJP of ragged_dot."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from expert_parallel_cases import Case
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moegen.plan import make_plan
from moegen.render import render

ROWS, GROUPS = 64, 3
ROW_TILE = 16
# (contraction, output, tiles): one tile each way; several each way; ragged last tiles
SHAPES = {
    "one tile": (128, 128, (ROW_TILE, 128, 128)),
    "two contraction tiles": (256, 128, (ROW_TILE, 128, 128)),
    "two output tiles": (128, 256, (ROW_TILE, 128, 128)),
    "ragged contraction": (200, 128, (ROW_TILE, 128, 128)),
    "ragged output": (128, 200, (ROW_TILE, 128, 128)),
    "narrow, one masked tile": (24, 40, (ROW_TILE, 128, 128)),
}
GROUP_SIZES = {
    "every row, tiles shared": [10, 30, 24],
    "rows of no group": [5, 0, 20],
    "all in the last group": [0, 0, 64],
    "all in the first, tile-aligned": [32, 0, 0],
    "no rows at all": [0, 0, 0],
}
# bfloat16 operands, float32 accumulation: the reference rounds both operands the same way
TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    """A generated one-device module of float32 params and bfloat16 compute (Pallas
    interpreted), whose kernels read the weights as stored."""
    case = Case(
        "replicated",
        {"data": 1},
        embed=256,
        ffn=128,
        params="float32",
        compute="bfloat16",
        hardware="tpu-v5e",
        topology="1x1",
        kernel="pallas",
    )
    plan = make_plan(case.load("gmm_cast"), interpret=True)
    assert plan.kernel.config.casts_weights
    path = tmp_path_factory.mktemp("gmm_cast") / f"{plan.module_name}.py"
    path.write_text(render(plan), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("gmm_cast_module", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def _inputs(depth: int, width: int, seed: int, transpose: bool = False):
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.normal(size=(ROWS, depth)), jnp.bfloat16)
    shape = (GROUPS, width, depth) if transpose else (GROUPS, depth, width)
    rhs = rng.normal(size=shape).astype(np.float32)
    return lhs, rhs


def _expected(lhs, rhs, sizes, transpose: bool = False) -> np.ndarray:
    """Each group's rows times its weights rounded to bfloat16; zeros past the groups."""
    left = np.asarray(lhs, np.float64)
    weights = np.asarray(jnp.asarray(rhs, jnp.bfloat16), np.float64)
    if transpose:
        weights = weights.swapaxes(1, 2)
    out = np.zeros((left.shape[0], weights.shape[2]))
    start = 0
    for group, size in enumerate(sizes):
        out[start : start + size] = left[start : start + size] @ weights[group]
        start += size
    return out


def _cast(module, lhs, rhs, sizes, tiles, transpose=False):
    groups = jnp.asarray(sizes, jnp.int32)
    return module._gmm_cast(lhs, rhs, groups, tiles, jnp.float32, transpose_rhs=transpose)


@pytest.mark.parametrize("transpose", [False, True], ids=["weights", "weights transposed"])
@pytest.mark.parametrize("sizes", GROUP_SIZES.values(), ids=GROUP_SIZES.keys())
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_each_group_times_its_cast_weights(module, shape, sizes, transpose):
    depth, width, tiles = shape
    lhs, rhs = _inputs(depth, width, seed=sum(sizes) + depth + width, transpose=transpose)
    got = np.asarray(_cast(module, lhs, rhs, sizes, tiles, transpose))
    past = sum(sizes)  # rows past the groups are left unwritten, as megablox leaves them
    want = _expected(lhs, rhs, sizes, transpose)
    np.testing.assert_allclose(got[:past], want[:past], **TOLERANCE)


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(cuts=st.lists(st.integers(0, ROWS), min_size=GROUPS, max_size=GROUPS))
def test_any_group_sizes(module, cuts) -> None:
    """Group sizes from sorted cut points: any split of up to ROWS rows into GROUPS groups."""
    ends = sorted(cuts)
    sizes = [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    depth, width, tiles = SHAPES["ragged output"]
    lhs, rhs = _inputs(depth, width, seed=7)
    got = np.asarray(_cast(module, lhs, rhs, sizes, tiles))
    past = sum(sizes)
    np.testing.assert_allclose(got[:past], _expected(lhs, rhs, sizes)[:past], **TOLERANCE)


def test_the_weights_are_rounded_to_bfloat16_not_multiplied_in_float32(module) -> None:
    """Sensitivity: weights a bfloat16 rounding changes give the rounded product, not the
    float32 one (what megablox's gmm would compute on float32 weights)."""
    depth, width, tiles = SHAPES["one tile"]
    lhs = jnp.ones((ROWS, depth), jnp.bfloat16)
    rhs = np.full((GROUPS, depth, width), 1 + 2**-10, np.float32)  # rounds to 1.0
    got = np.asarray(_cast(module, lhs, rhs, [ROWS, 0, 0], tiles))
    np.testing.assert_array_equal(got, float(depth))


def _reference(lhs, rhs, sizes):
    rows = jnp.arange(lhs.shape[0]) < sizes.sum()
    product = jax.lax.ragged_dot(
        lhs, rhs.astype(jnp.bfloat16), sizes, preferred_element_type=jnp.float32
    )
    return jnp.where(rows[:, None], product, 0.0)


@pytest.mark.parametrize("sizes", [[10, 30, 24], [5, 0, 20]], ids=["every row", "rows past"])
@pytest.mark.parametrize("shape", ["two contraction tiles", "ragged output"])
def test_gradients_match_a_ragged_dot_reference(module, shape, sizes) -> None:
    depth, width, tiles = SHAPES[shape]
    tiling = module.Tiling(tiles, tiles, tiles)
    lhs, rhs = _inputs(depth, width, seed=3)
    groups = jnp.asarray(sizes, jnp.int32)
    cotangent = np.random.default_rng(4).normal(size=(ROWS, width)).astype(np.float32)

    def layer(a, b):
        return module._gmm(a, b, groups, tiling, jnp.float32)

    got_y, got_vjp = jax.vjp(layer, lhs, rhs)
    want_y, want_vjp = jax.vjp(lambda a, b: _reference(a, b, groups), lhs, rhs)
    past = sum(sizes)  # rows past the groups are never read back by the module
    np.testing.assert_allclose(got_y[:past], want_y[:past], **TOLERANCE)
    (got_lhs, got_rhs), (want_lhs, want_rhs) = got_vjp(cotangent), want_vjp(cotangent)
    assert got_rhs.dtype == jnp.float32  # the weights' own dtype: no bfloat16 round trip
    got_lhs, want_lhs = (np.asarray(g[:past], np.float32) for g in (got_lhs, want_lhs))
    # the row gradient is bfloat16 (the rows' dtype): within its rounding at the largest value
    scale = {"rtol": 0, "atol": 2**-7 * max(np.abs(want_lhs).max(initial=0), 1)}
    np.testing.assert_allclose(got_lhs, want_lhs, **scale)
    np.testing.assert_allclose(got_rhs, want_rhs, **TOLERANCE)
