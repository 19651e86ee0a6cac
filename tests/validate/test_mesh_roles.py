"""Mesh roles beyond data, fsdp and expert (issue 19): the tensor axis (expert tensor
parallelism: the FFN width of the routed and shared experts sharded over it, the partial
outputs summed) and the sequence axis (tokens split along seq_len), and generated layers that
run on a model's mesh holding their axes among others, in any order.

Plan figures are checked by hand here; the twin parity cases run the whole pipeline's verify
step (forward, aux, every gradient) against the dense reference, which knows nothing of
meshes; the model-mesh case runs a generated module on 8 fake CPU devices.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import assert_twin_parity, generated_from
from spec_builder import spec_yaml, tiny, validated

from moegen.load import LoadedSpec
from moegen.plan import make_plan
from moegen.verify import verify

# (name, choices): every strategy with a tensor axis, and a sequence axis, on both kernels.
TWIN_CASES = {
    "replicated_tensor_sequence_bias_shared": tiny(
        ffn=96, ffn_bias=True, shared_ffn=48, axes={"data": 2, "tensor": 2, "sequence": 2}
    ),
    "a2a_fsdp_tensor_expert_pallas": tiny(
        embed=64, ffn=256, ffn_bias=True, shared_ffn=64, shared_expert_gate=True,
        load_balance_loss=0.01, z_loss=0.001, axes={"fsdp": 2, "tensor": 2, "expert": 2},
        strategy="ragged_all_to_all", hardware="tpu-v5e", topology="2x4", kernel="pallas",
    ),
    "ring_overlapped_tensor_sequence_pallas": tiny(
        embed=256, ffn=128, glu="gpt_oss", ffn_bias=True, weighting="input", batch=4,
        axes={"tensor": 2, "expert": 2, "sequence": 2}, strategy="ring_of_experts",
        overlap_chunks=2, hardware="tpu-v5e", topology="2x4", kernel="pallas",
    ),
    "sliced_tensor_fsdp_capacity": tiny(
        experts=4, ffn=512, ffn_bias=True, score="sigmoid", routing_bias=True,
        capacity=(1.0, "probability"), batch=4, axes={"tensor": 2, "fsdp": 2}, ffn_chunks=2,
        hardware="tpu-v5e", topology="2x2", kernel="pallas",
    ),
    # xla checks varying axes: the received-rows count must not be reduced over tensor
    "a2a_tensor_xla": tiny(
        ffn=96, ffn_bias=True, axes={"data": 2, "tensor": 2, "expert": 2},
        strategy="ragged_all_to_all",
    ),
    "ring_tensor_xla_shared": tiny(
        ffn=96, shared_ffn=48, axes={"expert": 4, "tensor": 2}, strategy="ring_of_experts"
    ),
}  # fmt: skip


def loaded_of(choices: dict, name: str = "layer") -> LoadedSpec:
    result = validated(spec_yaml(choices), f"{name}.yaml", name)
    assert isinstance(result, LoadedSpec), result
    return result


def test_tensor_and_sequence_do_not_shard_the_batch() -> None:
    plan = make_plan(loaded_of(tiny(axes={"data": 2, "tensor": 2, "sequence": 2, "fsdp": 2})))
    assert plan.mesh.batch_axes == ("data", "fsdp")
    assert plan.mesh.token_axes == ("data", "fsdp", "sequence")
    assert plan.input_partition == (("data", "fsdp"), "sequence", None)
    # 8 sequences of 16 over 4 batch shards and 2 sequence shards: 2 x 8 tokens per device
    assert (plan.local_batch, plan.local_seq_len, plan.local_tokens) == (2, 8, 16)


def test_tensor_shards_every_ffn_width_and_nothing_else() -> None:
    choices = tiny(
        ffn=256, ffn_bias=True, shared_ffn=64, shared_expert_gate=True,
        axes={"fsdp": 2, "tensor": 4, "expert": 2}, strategy="ragged_all_to_all",
    )  # fmt: skip
    plan = make_plan(loaded_of(choices))
    params = {p.name: p for p in plan.params}
    assert params["w_gate"].partition == ("expert", "fsdp", "tensor")
    assert params["w_gate"].local_shape == (4, 32, 64)
    assert params["w_down"].partition == ("expert", "tensor", "fsdp")
    assert params["b_up"].partition == ("expert", "tensor")
    assert params["b_down"].partition == ("expert", "fsdp")  # added once, after the sum
    assert params["shared_up"].partition == ("fsdp", "tensor")
    assert params["shared_down"].local_shape == (16, 32)
    assert params["router"].partition == ("fsdp", None)
    assert params["shared_expert_gate"].partition == (None,)
    assert plan.local_ffn_dim == 64


def test_tensor_costs_one_shards_columns() -> None:
    whole = make_plan(loaded_of(tiny(ffn=256, axes={"data": 2})))
    split = make_plan(loaded_of(tiny(ffn=256, axes={"data": 2, "tensor": 4})))
    # the expert matmuls of one device cover a quarter of the columns, on the same rows
    assert split.cost.expert_flops * 4 == whole.cost.expert_flops
    assert split.local_tokens == whole.local_tokens


def test_network_lists_the_tensor_all_reduces() -> None:
    plan = make_plan(loaded_of(tiny(axes={"data": 2, "tensor": 4})))
    transfers = {t.name: t for t in plan.network.transfers}
    # one device's output [local tokens, D] in bfloat16
    output_bytes = plan.local_tokens * plan.embed_dim * 2
    expected = 2 * output_bytes * 3 // 4  # an all-reduce receives 2 (n - 1) / n of it
    for name in (
        "tensor all-reduce of the output, forward",
        "tensor all-reduce of the input gradient",
    ):
        assert transfers[name].axis == "tensor"
        assert transfers[name].ici_bytes == expected
    # the router's gradient differs per tensor shard (each saw its columns' outputs): summed
    assert "gradient all-reduce over tensor" in transfers


def test_rendered_layer_sums_over_tensor_and_counts_over_every_token_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    choices = tiny(ffn=96, ffn_bias=True, load_balance_loss=0.01,
                   axes={"data": 2, "tensor": 2, "sequence": 2})  # fmt: skip
    source = generated_from(choices, tmp_path, monkeypatch).source
    assert "y = jax.lax.psum(y, TENSOR_AXIS)" in source
    assert 'weights["b_down"] = jnp.where(first_shard' in source
    assert "TOKEN_AXES = BATCH_AXES + (SEQUENCE_AXIS,)" in source
    assert "jax.lax.psum(local_counts.astype(jnp.int32), TOKEN_AXES)" in source
    assert 'INPUT_SPEC = P("data", "sequence", None)' in source
    assert "return y.reshape(LOCAL_BATCH, LOCAL_SEQ_LEN, EMBED_DIM), aux" in source


def test_a_layer_without_the_roles_emits_none_of_their_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = generated_from(tiny(ffn_bias=True), tmp_path, monkeypatch).source
    for code in ("TENSOR_AXIS", "SEQUENCE_AXIS", "TOKEN_AXES", "LOCAL_SEQ_LEN", "first_shard"):
        assert code not in source


@pytest.mark.parametrize("case", sorted(TWIN_CASES))
@pytest.mark.slow
def test_twin_matches_the_dense_reference(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generated = generated_from(TWIN_CASES[case], tmp_path, monkeypatch)
    report = verify(generated.loaded, generated.source, run_compiles=False)
    assert_twin_parity(report)


MODEL_MESH_SCRIPT = textwrap.dedent(
    """
    import importlib.util, sys
    import jax, jax.numpy as jnp, numpy as np

    spec = importlib.util.spec_from_file_location("layer", sys.argv[1])
    moe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moe)

    def run(mesh):
        params = moe.init_params(jax.random.key(0), mesh)
        x = jax.random.normal(jax.random.key(1), moe.INPUT_SHAPE, moe.COMPUTE_DTYPE)
        x = jax.device_put(x, moe.input_sharding(mesh))

        def loss(p, xs):
            y, aux = moe.moe_layer(p, xs, mesh=mesh)
            return jnp.sum(y**2), (y, aux)

        with jax.set_mesh(mesh):
            (_, (y, aux)), grads = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(params, x)
        return np.asarray(y), jax.tree.map(np.asarray, grads), aux

    own = run(moe.make_mesh(jax.devices()[:moe.NUM_DEVICES]))
    # A model's mesh: a pipeline axis the layer does not use, its axes in another order.
    model = jax.make_mesh((2, 2, 2), ("tensor", "pipeline", "data"), devices=jax.devices()[:8])
    theirs = run(model)
    np.testing.assert_allclose(theirs[0], own[0], rtol=1e-6, atol=1e-6)
    for a, b in zip(jax.tree.leaves(theirs[1]), jax.tree.leaves(own[1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert (np.asarray(theirs[2].tokens_per_expert) == np.asarray(own[2].tokens_per_expert)).all()
    print("ok: model mesh")

    wrong = jax.make_mesh((4, 2), ("tensor", "data"), devices=jax.devices()[:8])
    try:
        run(wrong)
    except ValueError as err:
        assert "does not hold this layer's axes" in str(err), err
        print("ok: wrong sizes refused")
    else:
        raise AssertionError("a tensor axis of 4 was accepted")
    """
)


@pytest.mark.slow
def test_layer_runs_on_a_model_mesh_with_an_unused_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    choices = tiny(ffn=96, ffn_bias=True, shared_ffn=48, axes={"data": 2, "tensor": 2},
                   compute_dtype="float32", params_dtype="float32")  # fmt: skip
    module = tmp_path / "layer.py"
    module.write_text(generated_from(choices, tmp_path, monkeypatch).source)
    script = tmp_path / "run.py"
    script.write_text(MODEL_MESH_SCRIPT)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    result = subprocess.run(
        [sys.executable, str(script), str(module)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: model mesh" in result.stdout and "ok: wrong sizes refused" in result.stdout
