"""moegen.nnx: a generated layer as a Flax NNX module (issue 19, item 3).

On the committed CPU modules (mixtral_small_cpu: data 2 x fsdp 4, qwen3_moe_fsdp_cpu: fsdp 4)
and on a tiny layer rendered here with the routing bias (sigmoid top-2 of 8, data 2 x fsdp
2): the parameters' partition specs are PARAM_SPECS; values start as init_params draws them;
`nnx.jit` init under the mesh creates every parameter with its NamedSharding; the nnx.jit
forward is module.moe_layer's; optax steps through nnx.Optimizer lower a loss and leave the
RoutingBias alone; orbax StandardSave/StandardRestore of nnx.state round-trips exactly;
checkpoint weights load; misuse is refused with the fix. The Flax example runs as a user
would run it. Skipped without flax (the `flax` extra).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")
ocp = pytest.importorskip("orbax.checkpoint")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from oracle import moegen_side  # noqa: E402
from spec_builder import tiny  # noqa: E402

from moegen.nnx import MoELayer, RoutingBias  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "decoder_block_nnx.py"
moegen_side.provide_cpu_devices(8)  # before the backend starts (mixtral_small_cpu: 8)

# sigmoid scores with the aux-loss-free bias: the module has update_routing_bias
BIASED = tiny(
    score="sigmoid",
    routing_bias=True,
    params_dtype="float32",
    compute_dtype="float32",
    hardware="cpu",
    kernel="xla",
)

# parameters that start at one (INIT_ONES): Gemma 4's norm weights and scales, a router scale,
# A.X-K1's output norm weight, Ergo's per-expert and shared expert output norm weights
SCALED = BIASED | {
    "input_norm_eps": 1e-6,
    "per_expert_scale": True,
    "expert_input_norm_eps": 1e-6,
    "learned_scale": True,
    "output_norm_eps": 1e-6,
    "expert_output_norm_eps": 1e-6,
    "shared_ffn": 64,
    "shared_output_norm_eps": 1e-6,
}


def generated(name: str) -> ModuleType:
    path = REPO_ROOT / "generated" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its NamedTuples look it up
    spec.loader.exec_module(module)
    return module


def mesh_of(module: ModuleType) -> jax.sharding.Mesh:
    if len(jax.devices()) < module.NUM_DEVICES:
        pytest.skip(f"needs {module.NUM_DEVICES} CPU devices; this process has {jax.devices()}")
    return module.make_mesh(jax.devices()[: module.NUM_DEVICES])


def input_for(module: ModuleType, mesh: jax.sharding.Mesh, seed: int = 1) -> jax.Array:
    x = jax.random.normal(jax.random.key(seed), module.INPUT_SHAPE, jnp.float32)
    return jax.device_put(x.astype(module.COMPUTE_DTYPE), module.input_sharding(mesh))


@pytest.fixture(scope="module")
def mixtral() -> ModuleType:
    return generated("mixtral_small_cpu")


@pytest.fixture(scope="module")
def qwen3() -> ModuleType:
    return generated("qwen3_moe_fsdp_cpu")


@pytest.fixture(scope="module")
def biased() -> ModuleType:
    return moegen_side.import_source(moegen_side.rendered_source(BIASED, "nnx_bias"), "nnx_bias")


def values(layer: Any) -> dict[str, np.ndarray]:
    return {name: np.asarray(value) for name, value in layer.param_dict().items()}


@pytest.mark.parametrize("name", ["mixtral", "qwen3", "biased"])
def test_params_carry_the_modules_specs_shapes_and_dtypes(name: str, request) -> None:
    module = request.getfixturevalue(name)
    mesh = mesh_of(module)
    abstract = nnx.eval_shape(lambda: MoELayer(module, rngs=nnx.Rngs(0), mesh=mesh))
    state = nnx.state(abstract)
    specs = nnx.get_partition_spec(state)
    assert set(state.keys()) == set(module.PARAM_SHAPES)
    for param, shape in module.PARAM_SHAPES.items():
        variable = state[param]
        kind = RoutingBias if param == "routing_bias" else nnx.Param
        assert type(variable) is kind, (param, type(variable))
        assert variable.get_value().shape == tuple(shape), param
        assert variable.get_value().dtype == jnp.dtype(module.PARAM_DTYPE), param
        assert variable.get_metadata()["out_sharding"] == tuple(module.PARAM_SPECS[param])
        assert specs[param].get_value() == module.PARAM_SPECS[param], param
    assert ("routing_bias" in module.PARAM_SHAPES) == (name == "biased")
    assert not isinstance(getattr(abstract, "routing_bias", None), nnx.Param)


@pytest.fixture(scope="module")
def scaled() -> ModuleType:
    return moegen_side.import_source(
        moegen_side.rendered_source(SCALED, "nnx_scaled"), "nnx_scaled"
    )


@pytest.mark.parametrize("name", ["biased", "scaled"])
def test_values_start_as_init_params_draws_them(name: str, request) -> None:
    module = request.getfixturevalue(name)
    mesh = mesh_of(module)
    layer = MoELayer(module, rngs=nnx.Rngs(params=3), mesh=mesh)
    expected = module.init_params(nnx.Rngs(params=3).params(), mesh)
    for param, value in values(layer).items():
        np.testing.assert_array_equal(value, np.asarray(expected[param]), err_msg=param)
        if param in getattr(module, "INIT_ONES", ()):
            assert (value == 1).all(), param
        elif module.INIT_SCALES[param] == 0:
            assert not value.any(), param
    assert (name == "scaled") == bool(getattr(module, "INIT_ONES", ()))


@pytest.mark.parametrize("name", ["qwen3", "biased"])
def test_sharded_init_under_the_mesh(name: str, request) -> None:
    """nnx.jit init under jax.set_mesh (no mesh argument), and with the mesh passed outside any
    context: every parameter is created with NamedSharding(mesh, PARAM_SPECS[name])."""
    module = request.getfixturevalue(name)
    mesh = mesh_of(module)
    with jax.set_mesh(mesh):
        in_context = nnx.jit(lambda: MoELayer(module, rngs=nnx.Rngs(0)))()
    passed = nnx.jit(lambda: MoELayer(module, rngs=nnx.Rngs(0), mesh=mesh))()
    for layer in (in_context, passed):
        for param, value in layer.param_dict().items():
            want = NamedSharding(mesh, module.PARAM_SPECS[param])
            assert value.sharding.is_equivalent_to(want, value.ndim), (param, value.sharding)
            assert value.sharding.mesh.devices.tolist() == mesh.devices.tolist(), param
    np.testing.assert_array_equal(in_context.param_dict()["w_up"], passed.param_dict()["w_up"])
    # inside jit only the abstract mesh is known: moe_layer takes x's, and the optimizer's
    # state is created without a mesh context
    assert in_context.mesh is None and passed.mesh == mesh
    optimizer = nnx.Optimizer(in_context, optax.sgd(0.1), wrt=nnx.Param)
    assert nnx.state(optimizer)["step"].get_value() == 0
    with jax.set_mesh(mesh):
        eager = MoELayer(module, rngs=nnx.Rngs(0))  # outside jit: the concrete mesh
    assert eager.mesh == mesh


def test_layers_copy_and_share_compilations(biased: ModuleType) -> None:
    mesh = mesh_of(biased)
    first, second = (MoELayer(biased, rngs=nnx.Rngs(seed), mesh=mesh) for seed in (0, 1))
    assert nnx.graphdef(first) == nnx.graphdef(second)  # static parts equal: one nnx.jit trace
    copied = copy.deepcopy(first)
    assert copied.module is biased and copied.mesh == mesh
    np.testing.assert_array_equal(copied.param_dict()["router"], first.param_dict()["router"])


def test_nnx_jit_forward_is_the_modules(mixtral: ModuleType) -> None:
    mesh = mesh_of(mixtral)
    layer = MoELayer(mixtral, rngs=nnx.Rngs(0), mesh=mesh)  # eager: created sharded too
    for param, value in layer.param_dict().items():
        want = NamedSharding(mesh, mixtral.PARAM_SPECS[param])
        assert value.sharding.is_equivalent_to(want, value.ndim), (param, value.sharding)
    x = input_for(mixtral, mesh)
    y, aux = nnx.jit(lambda layer, x: layer(x))(layer, x)
    y_ref, aux_ref = jax.jit(mixtral.moe_layer)(layer.param_dict(), x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_ref))
    np.testing.assert_array_equal(aux.tokens_per_expert, aux_ref.tokens_per_expert)
    assert y.sharding.is_equivalent_to(mixtral.input_sharding(mesh), y.ndim)


def train(layer: Any, module: ModuleType, mesh: Any, steps: int) -> tuple[list[float], Any]:
    """`steps` Adam steps on a regression to tanh(x); the losses and the optimizer."""
    x = input_for(module, mesh)
    target = jnp.tanh(2 * x)
    optimizer = nnx.Optimizer(layer, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(layer: Any, optimizer: Any) -> tuple[jax.Array, jax.Array]:
        def loss_fn(layer: Any) -> tuple[jax.Array, Any]:
            y, aux = layer(x)
            return jnp.mean((y - target) ** 2), aux

        (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(layer)
        optimizer.update(layer, grads)
        return loss, aux.tokens_per_expert

    losses = []
    for _ in range(steps):
        loss, load = step(layer, optimizer)
        losses.append(float(loss))
    return losses, (optimizer, load)


def test_optimizer_lowers_the_loss_and_leaves_the_routing_bias(biased: ModuleType) -> None:
    mesh = mesh_of(biased)
    layer = MoELayer(biased, rngs=nnx.Rngs(0), mesh=mesh)
    layer.load_params(layer.param_dict() | {"routing_bias": jnp.linspace(-0.1, 0.1, 8)})
    bias = np.asarray(layer.routing_bias.get_value())
    before = values(layer)
    losses, (optimizer, load) = train(layer, biased, mesh, steps=4)
    assert losses[-1] < 0.8 * losses[0], losses
    np.testing.assert_array_equal(layer.routing_bias.get_value(), bias)
    optimized = {path[-1] for path, _ in nnx.to_flat_state(nnx.state(optimizer.opt_state))}
    assert optimized >= {"router", "w_gate"} and "routing_bias" not in optimized, optimized
    assert {p for p in before if not np.array_equal(before[p], values(layer)[p])} == {
        "router",
        "w_gate",
        "w_up",
        "w_down",
    }
    for param, value in layer.param_dict().items():  # still laid out as PARAM_SPECS says
        assert value.sharding.spec == biased.PARAM_SPECS[param], param
    # the balancing step is the module's, applied in place
    layer.update_routing_bias(load, 0.01)
    np.testing.assert_array_equal(
        layer.routing_bias.get_value(), biased.update_routing_bias(jnp.asarray(bias), load, 0.01)
    )
    assert not np.array_equal(layer.routing_bias.get_value(), bias)


def test_orbax_round_trip_is_exact(biased: ModuleType, tmp_path: Path) -> None:
    mesh = mesh_of(biased)
    layer = MoELayer(biased, rngs=nnx.Rngs(0), mesh=mesh)
    layer.update_routing_bias(jnp.arange(8, dtype=jnp.int32), 0.5)
    with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as checkpointer:
        checkpointer.save(tmp_path / "state", args=ocp.args.StandardSave(nnx.state(layer)))
        graphdef, abstract = nnx.get_abstract_model(
            lambda: MoELayer(biased, rngs=nnx.Rngs(1), mesh=mesh), mesh
        )
        restored_state = checkpointer.restore(
            tmp_path / "state", args=ocp.args.StandardRestore(abstract)
        )
    restored = nnx.merge(graphdef, restored_state)
    assert type(restored.routing_bias) is RoutingBias
    for param, value in restored.param_dict().items():
        np.testing.assert_array_equal(np.asarray(value), layer.param_dict()[param])
        assert value.sharding == getattr(layer, param).get_value().sharding, param
    x = input_for(biased, mesh)
    forward = nnx.jit(lambda layer, x: layer(x)[0])
    np.testing.assert_array_equal(forward(restored, x), forward(layer, x))


def test_load_params_from_a_checkpoint(biased: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    from moegen.checkpoints import load_layer_params

    e, d, f = biased.NUM_EXPERTS, biased.EMBED_DIM, biased.FFN_DIM
    rng = np.random.default_rng(0)
    prefix = "model.layers.0.mlp."
    tensors = {  # DeepSeek-V3's layout (fused gate/up)
        "gate.weight": rng.normal(size=(e, d)),
        "gate.e_score_correction_bias": rng.normal(size=(e,)),
        "experts.gate_up_proj": rng.normal(size=(e, 2 * f, d)),
        "experts.down_proj": rng.normal(size=(e, d, f)),
    }
    tensors = {prefix + k: (0.1 * v).astype(np.float32) for k, v in tensors.items()}
    (tmp_path / "ck").mkdir()
    save_file(tensors, str(tmp_path / "ck" / "model.safetensors"))
    mesh = mesh_of(biased)
    params = load_layer_params(biased, tmp_path / "ck", layer=0, family="deepseek_v3", mesh=mesh)
    layer = MoELayer(biased, rngs=nnx.Rngs(0), mesh=mesh)
    layer.load_params(params)
    for param, value in layer.param_dict().items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(params[param]))
        assert value.sharding.spec == biased.PARAM_SPECS[param], param
    np.testing.assert_array_equal(
        layer.routing_bias.get_value(), tensors[prefix + "gate.e_score_correction_bias"]
    )
    # host arrays are placed as PARAM_SPECS says
    layer.load_params({k: np.asarray(v) for k, v in params.items()})
    assert layer.w_down.get_value().sharding.spec == biased.PARAM_SPECS["w_down"]


def test_misuse_is_refused_with_the_fix(qwen3: ModuleType, biased: ModuleType) -> None:
    mesh = mesh_of(qwen3)
    rngs = nnx.Rngs(0)
    with pytest.raises(TypeError, match=r"import it first"):
        MoELayer("generated.qwen3_moe_fsdp_cpu", rngs=rngs, mesh=mesh)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"not one of its functions"):
        MoELayer(qwen3.moe_layer, rngs=rngs, mesh=mesh)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"nnx\.Rngs"):
        MoELayer(qwen3, rngs=0, mesh=mesh)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"jax\.sharding\.Mesh"):
        MoELayer(qwen3, rngs=rngs, mesh={"fsdp": 4})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"needs a mesh.*jax\.set_mesh"):
        MoELayer(qwen3, rngs=rngs)
    wrong = jax.make_mesh((2, 2), ("data", "fsdp"), devices=jax.devices()[:4])
    with pytest.raises(ValueError, match=re.escape("make_mesh(jax.devices()[:4])")) as error:
        MoELayer(qwen3, rngs=rngs, mesh=wrong)
    assert "{'fsdp': 4}" in str(error.value) and "['fsdp']" in str(error.value)
    layer = MoELayer(qwen3, rngs=rngs, mesh=mesh)
    with pytest.raises(ValueError, match=r"no routing bias.*router\.routing_bias"):
        layer.update_routing_bias(jnp.zeros(qwen3.NUM_EXPERTS, jnp.int32), 0.1)
    params = layer.param_dict()
    with pytest.raises(ValueError, match=r"missing \['w_up'\], unexpected \['extra'\]"):
        layer.load_params({k: v for k, v in params.items() if k != "w_up"} | {"extra": 1})
    with pytest.raises(ValueError, match=r"params\['router'\]: expected float32\[256, 128\]"):
        layer.load_params(params | {"router": np.asarray(params["router"])[:8]})
    with pytest.raises(ValueError, match=r"cast it with \.astype\(module\.PARAM_DTYPE\)"):
        layer.load_params(params | {"router": params["router"].astype(jnp.bfloat16)})
    with pytest.raises(TypeError, match=r"dict of name -> array"):
        layer.load_params([params])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"outside nnx\.jit"):
        nnx.jit(lambda layer, params: layer.load_params(params))(layer, params)
    with pytest.raises(TypeError, match=r"has no PARAM_SHAPES"):
        MoELayer(SimpleNamespace(moe_layer=None), rngs=rngs, mesh=mesh)  # type: ignore[arg-type]


STEP = re.compile(r"^step +(\d+) +loss (\S+)$", re.MULTILINE)


@pytest.mark.slow
def test_the_flax_example_trains_saves_and_restores() -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONIOENCODING="utf-8")
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "8"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    losses = [float(m[2]) for m in STEP.finditer(result.stdout)]
    assert len(losses) == 8, output
    assert losses[-1] < 0.75 * losses[0], losses
    assert "restored state and outputs identical: True" in result.stdout, output
