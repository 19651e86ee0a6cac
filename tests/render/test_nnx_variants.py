"""moegen.nnx.MoELayer on a module with shape variants: the layer takes every shape the
module's moe_layer dispatches (the main one and each of VARIANT_LAYERS), eagerly and under
nnx.jit, with the mesh passed or taken from jax.set_mesh, and gives what the variant's own
function gives, forward and gradients; another shape is refused naming the accepted ones.
Skipped without flax (the `flax` extra)."""

from __future__ import annotations

from types import ModuleType

import pytest

nnx = pytest.importorskip("flax.nnx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from oracle import moegen_side  # noqa: E402
from spec_builder import tiny  # noqa: E402
from test_nnx import generated, mesh_of  # noqa: E402

from moegen.nnx import MoELayer  # noqa: E402

moegen_side.provide_cpu_devices(8)

THREE_SHAPES = tiny(
    params_dtype="float32",
    compute_dtype="float32",
    load_balance_loss=0.01,
    variants={"eval": {"batch": 16, "seq_len": 4}, "prefill": {"batch": 4, "seq_len": 64}},
)


@pytest.fixture(scope="module")
def three_shapes() -> ModuleType:
    source = moegen_side.rendered_source(THREE_SHAPES, "nnx_variants")
    return moegen_side.import_source(source, "nnx_variants")


def shapes_of(module: ModuleType) -> dict[tuple[int, ...], object]:
    """Each accepted shape -> the module function that runs it."""
    return {tuple(module.INPUT_SHAPE): None, **module.VARIANT_LAYERS}


def input_of(module: ModuleType, mesh, shape, seed: int = 1) -> jax.Array:
    x = jax.random.normal(jax.random.key(seed), shape, jnp.float32)
    return jax.device_put(x.astype(module.COMPUTE_DTYPE), module.input_sharding(mesh))


def assert_same(got, want, what: str) -> None:
    for left, right in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(left), np.asarray(right), err_msg=what)


@pytest.mark.slow
def test_the_layer_takes_every_shape(three_shapes: ModuleType) -> None:
    """A jitted call gives the variant's own jitted function bit for bit; an eager call gives
    it to float32 rounding (op by op, XLA fuses differently), as the own function eager would
    (the one the layer calls; running it eagerly again would double the test's time)."""
    module = three_shapes
    mesh = mesh_of(module)
    layer = MoELayer(module, rngs=nnx.Rngs(0), mesh=mesh)
    params = layer.param_dict()
    assert len(shapes_of(module)) == 3
    for seed, (shape, function) in enumerate(shapes_of(module).items()):
        x = input_of(module, mesh, shape, seed)
        y, aux = layer(x)
        assert y.shape == shape, shape
        assert int(aux.tokens_per_expert.sum()) == shape[0] * shape[1] * module.TOP_K, shape
        own = jax.jit(function or module.moe_layer)(params, x)
        jitted = nnx.jit(lambda model, xs: model(xs))(layer, x)
        assert_same(jitted, own, f"jit {shape}")
        assert_same(aux.tokens_per_expert, own[1].tokens_per_expert, f"eager routing {shape}")
        for got, want in zip(jax.tree.leaves((y, aux)), jax.tree.leaves(own), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"eager {shape}")


def test_gradients_of_each_variant_are_its_functions(three_shapes: ModuleType) -> None:
    module = three_shapes
    mesh = mesh_of(module)
    layer = MoELayer(module, rngs=nnx.Rngs(0), mesh=mesh)

    def loss(y, aux):
        return jnp.sum(y.astype(jnp.float32) ** 2) + aux.load_balance_loss

    with jax.set_mesh(mesh):
        for shape, function in module.VARIANT_LAYERS.items():
            x = input_of(module, mesh, shape)
            grads = nnx.jit(nnx.grad(lambda model, xs: loss(*model(xs))))(layer, x)
            want = jax.jit(jax.grad(lambda p, xs, f=function: loss(*f(p, xs))))(
                layer.param_dict(), x
            )
            for name in module.PARAM_SHAPES:
                got = np.asarray(grads[name].get_value())
                np.testing.assert_array_equal(got, np.asarray(want[name]), err_msg=name)


def test_a_layer_made_under_set_mesh_takes_every_shape(three_shapes: ModuleType) -> None:
    module = three_shapes
    mesh = mesh_of(module)
    with jax.set_mesh(mesh):
        layer = nnx.jit(lambda: MoELayer(module, rngs=nnx.Rngs(0)))()
        forward = nnx.jit(lambda model, xs: model(xs))
        for shape, function in shapes_of(module).items():
            x = input_of(module, mesh, shape)
            own = function or module.moe_layer
            assert_same(forward(layer, x), jax.jit(own)(layer.param_dict(), x), f"{shape}")


def test_another_shape_is_refused_naming_the_accepted_ones(three_shapes: ModuleType) -> None:
    module = three_shapes
    mesh = mesh_of(module)
    layer = MoELayer(module, rngs=nnx.Rngs(0), mesh=mesh)
    x = input_of(module, mesh, (module.BATCH, module.SEQ_LEN // 2, module.EMBED_DIM))
    with pytest.raises(ValueError) as refused:
        layer(x)
    for shape in shapes_of(module):
        assert str(list(shape)) in str(refused.value), refused.value


@pytest.mark.slow
def test_the_committed_example_layer_takes_every_shape() -> None:
    module = generated("mixtral_small_variants_cpu")
    mesh = mesh_of(module)
    layer = MoELayer(module, rngs=nnx.Rngs(0), mesh=mesh)
    forward = nnx.jit(lambda model, xs: model(xs))
    for shape, function in shapes_of(module).items():
        x = input_of(module, mesh, shape)
        y, aux = forward(layer, x)
        assert y.shape == shape and y.dtype == module.COMPUTE_DTYPE, shape
        own = function or module.moe_layer
        assert_same((y, aux), jax.jit(own)(layer.param_dict(), x), f"example {shape}")
