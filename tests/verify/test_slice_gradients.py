"""FFN slices in token chunks with parameters wider than the compute dtype: the slices'
backward pass is written out (p.ffn.slice_grads_by_hand), each token chunk's sliced weight
gradients placed in a compute-dtype buffer, not summed into a second parameter-dtype copy
beside the sum over the chunks (bench/MAXTEXT.md: a_mixtral_s2048, 32 token chunks x 16
slices, 2.222 -> 1.869 GB per device, 0.37x MaxText's).

Checked here: when the plan writes it out and what the ledger counts for it; that the layer
written out gives the derived layer's output and input gradient bit for bit, and its weight
gradients to bfloat16's rounding, on a mesh of fake CPU devices; and a twin matches the dense
reference."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import assert_twin_parity
from spec_builder import spec_yaml, tiny, validated

from moegen.diagnostics import SpecError
from moegen.plan import make_plan
from moegen.render import render
from moegen.verify import verify

BF16 = {"params_dtype": "float32", "compute_dtype": "bfloat16"}
FLOAT32 = {"params_dtype": "float32", "compute_dtype": "float32"}
SLICED_CHUNKS = {"ffn_chunks": 2, "token_chunks": 2}
# Written out: each is a mesh and layer the slices' code differs on.
CASES = {
    "fsdp_regathers": tiny(**SLICED_CHUNKS, **BF16),
    "expert_biases_casts_per_slice": tiny(
        axes={"expert": 4}, strategy="ragged_all_to_all", ffn_bias=True,
        weight_casts="per_slice", **SLICED_CHUNKS, **BF16,
    ),
    "tensor_plain_ffn": tiny(
        axes={"data": 2, "tensor": 2}, activation="gelu", strategy="replicated",
        **SLICED_CHUNKS, **BF16,
    ),
}  # fmt: skip
BUFFER_ITEM = "one token chunk's gradients of the sliced weights, before the sum over chunks"


def _plan(choices: dict):
    loaded = validated(spec_yaml(choices), "spec.yaml", "layer")
    assert not isinstance(loaded, SpecError), loaded
    return loaded, make_plan(loaded)


@pytest.mark.parametrize(
    ("choices", "by_hand"),
    [
        (tiny(**SLICED_CHUNKS, **BF16), True),
        (tiny(ffn_chunks=2, **BF16), False),  # no token chunks: the derived sum is the gradient
        (tiny(token_chunks=2, **BF16), False),  # no slices: no scan over them
        (tiny(**SLICED_CHUNKS, **FLOAT32), False),  # no narrower dtype to hold it in
    ],
    ids=["sliced_chunks_bf16", "slices_alone", "chunks_alone", "float32"],
)
def test_written_out_only_where_it_saves_a_copy(choices: dict, by_hand: bool) -> None:
    _, plan = _plan(choices)
    assert plan.ffn.slice_grads_by_hand is by_hand
    assert ("_sum_of_slices_backward" in render(plan)) is by_hand


def test_the_ledger_counts_the_chunks_buffer_in_the_compute_dtype() -> None:
    _, by_hand = _plan(tiny(**SLICED_CHUNKS, **BF16))
    _, float32 = _plan(tiny(**SLICED_CHUNKS, **FLOAT32))
    # The same stored shards: 2 bytes an element written out, 4 in float32 parameters.
    assert 2 * dict(by_hand.memory.ledger)[BUFFER_ITEM] == dict(float32.memory.ledger)[BUFFER_ITEM]
    # The same FLOPs: the same slices are recomputed, in the same order.
    assert by_hand.cost.recompute_flops == float32.cost.recompute_flops > 0


CHILD = textwrap.dedent(
    """
    import importlib.util, sys
    import jax, jax.numpy as jnp, numpy as np

    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def run(moe):
        mesh = moe.make_mesh(jax.devices()[: moe.NUM_DEVICES])
        params = moe.init_params(jax.random.key(0), mesh)
        shape = moe.input_shape(mesh)
        x = jax.random.normal(jax.random.key(1), shape.shape, jnp.float32).astype(shape.dtype)
        x = jax.device_put(x, moe.input_sharding(mesh))
        probe = jax.random.normal(jax.random.key(2), x.shape, jnp.float32)

        def loss(params, x):
            y, _ = moe.moe_layer(params, x, mesh=mesh)
            return jnp.sum(y.astype(jnp.float32) * probe), y

        (_, y), grads = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(params, x)
        return np.asarray(y, np.float32), jax.tree.map(lambda g: np.asarray(g, np.float32), grads)

    def worst(got, want):
        return float(np.abs(got - want).max() / np.abs(want).max())

    for by_hand, derived in zip(sys.argv[1::2], sys.argv[2::2]):
        (y1, (p1, x1)), (y2, (p2, x2)) = run(load(by_hand, "a")), run(load(derived, "b"))
        np.testing.assert_array_equal(y1, y2)  # the same forward pass
        np.testing.assert_array_equal(x1, x2)  # the rows' gradient summed as derived
        # Written out, each token chunk's weight gradient is rounded to bfloat16 (as megablox
        # returns it); derived, XLA on CPU folds that convert into ragged_dot and keeps float32.
        errors = {name: worst(p1[name], p2[name]) for name in p1}
        # A sum of chunks' bfloat16 roundings: within a few of its ulps.
        assert max(errors.values()) <= 2**-7, (by_hand, errors)
        print("same", by_hand, errors)
    """
)


@pytest.mark.slow
def test_written_out_gives_the_derived_layers_output_and_gradients(tmp_path: Path) -> None:
    paths = []
    for name, choices in CASES.items():
        _, plan = _plan(choices)
        assert plan.ffn.slice_grads_by_hand, name
        derived = replace(plan, ffn=replace(plan.ffn, slice_grads_by_hand=False))
        for tag, each in (("by_hand", plan), ("derived", derived)):
            path = tmp_path / f"{name}_{tag}.py"
            path.write_text(render(each), encoding="utf-8")
            paths.append(str(path))
    script = tmp_path / "compare.py"
    script.write_text(CHILD)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    result = subprocess.run(
        [sys.executable, str(script), *paths],
        capture_output=True,
        text=True,
        env=dict(env, JAX_PLATFORMS="cpu"),
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    print(result.stdout)  # each case's worst relative difference, by parameter
    assert result.stdout.count("same") == len(CASES)


@pytest.mark.slow
def test_a_twin_written_out_matches_the_dense_reference() -> None:
    loaded, plan = _plan(CASES["expert_biases_casts_per_slice"])
    report = verify(loaded, render(plan), plan=plan, run_compiles=False)
    steps = [step["step"] for step in assert_twin_parity(report)]
    assert "twin parity (bfloat16 compute, float32 params)" in steps  # where it is written out
