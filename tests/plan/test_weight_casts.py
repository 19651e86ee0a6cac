"""memory.weight_casts: per_slice. FFN slices round their float32 weights to bfloat16 one slice
at a time, in integer arithmetic that XLA's bfloat16 propagation does not move out of the
slices' loop, so no bfloat16 copy of every expert weight stays live (bench/MAXTEXT.md: the
a_mixtral_s4096 row, 32 token chunks x 16 slices, 2.702 -> 2.349 GB per device; planned 2.342).

Checked here (its refusals are tests/validate/test_validate_overlap.py's cases): the plan's ledger without the hoisted copy; the rendered
rounding is astype's, bit for bit, on every kind of float32 (ties, subnormals, infinities,
overflow, NaN), with astype's gradient; and a built twin matches the dense reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from conftest import assert_twin_parity
from spec_builder import spec_positions, spec_yaml, tiny, validated

from moegen.plan import format_plan, make_plan
from moegen.render import render
from moegen.verify import verify

BF16 = {"params_dtype": "float32", "compute_dtype": "bfloat16"}


def _loaded(**choices):
    text = spec_yaml(tiny(**choices))
    return validated(text, "spec.yaml", "spec"), spec_positions(tiny(**choices))


def test_the_ledger_drops_the_hoisted_copy_and_nothing_else() -> None:
    once, _ = _loaded(ffn_chunks=2, **BF16)
    per_slice, _ = _loaded(ffn_chunks=2, weight_casts="per_slice", **BF16)
    a, b = make_plan(once), make_plan(per_slice)
    assert (a.ffn.casts_per_slice, b.ffn.casts_per_slice) == (False, True)
    hoisted = "stored expert weights cast to the compute dtype once"
    ledger_a, ledger_b = dict(a.memory.ledger), dict(b.memory.ledger)
    assert ledger_a[hoisted] > 0 and hoisted not in ledger_b
    assert a.memory.train_peak - b.memory.train_peak == ledger_a[hoisted]
    assert a.cost == b.cost  # the same FLOPs: the same rounding, elsewhere
    said = "each slice's weights cast as it runs"  # moegen plan says which
    assert said not in format_plan(a) and said in format_plan(b)


def _rounding(source: str):
    namespace: dict = {}
    exec(compile(source, "<module>", "exec"), namespace)  # noqa: S102 (our own rendered module)
    return namespace["_rounded_to_bfloat16"]


def test_the_rounding_is_astype_bit_for_bit_with_its_gradient() -> None:
    loaded, _ = _loaded(ffn_chunks=2, weight_casts="per_slice", **BF16)
    source = render(make_plan(loaded))
    assert source.count(".astype(jnp.bfloat16)") < render(
        make_plan(_loaded(ffn_chunks=2, **BF16)[0])
    ).count(".astype(jnp.bfloat16)")
    rounded = jax.jit(_rounding(source))
    rng = np.random.default_rng(0)
    special = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
               0x7FFFFFFF, 0xFFFFFFFF, 0x7F7FFFFF, 0x7F7F8000, 0x3F808000, 0x3F818000,
               0x00008000, 0x00018000, 0x00000001, 0x807FFFFF]  # fmt: skip
    bits = np.concatenate([rng.integers(0, 2**32, 200_000, dtype=np.uint64), special])
    x = jnp.asarray(bits.astype(np.uint32).view(np.float32))
    got = np.asarray(jax.lax.bitcast_convert_type(rounded(x), jnp.uint16))
    want = np.asarray(jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16))
    nan = np.isnan(np.asarray(x))
    assert nan.any() and np.array_equal(got[~nan], want[~nan])
    assert np.isnan(np.asarray(rounded(x[nan]).astype(jnp.float32))).all()
    grad = jax.grad(lambda v: jnp.sum(rounded(v).astype(jnp.float32) * 3.0))(jnp.ones(5))
    assert grad.dtype == jnp.float32 and np.array_equal(np.asarray(grad), np.full(5, 3.0))


def test_a_twin_with_casts_per_slice_matches_the_dense_reference() -> None:
    loaded, _ = _loaded(ffn_chunks=2, weight_casts="per_slice", **BF16)
    plan = make_plan(loaded)
    report = verify(loaded, render(plan), plan=plan, run_compiles=False)
    parity = assert_twin_parity(report)
    assert [step["step"] for step in parity] == [
        "twin parity (float32)",  # nothing cast: once
        "twin parity (bfloat16 compute, float32 params)",  # the rounding runs
    ]
