"""The committed shape-variant module as a user calls it: `moe_layer` dispatches each shape
(the main one and every variant's) to its own function (the same jaxpr, forward and
gradients), runs it forward and backward, and refuses any other shape with a ValueError naming
the accepted ones.

Runs in a child process on 8 fake CPU devices (the device count of JAX is fixed at its first
import), as tests/render/test_generated_module.py does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "generated" / "mixtral_small_variants_cpu.py"

SCRIPT = textwrap.dedent(
    """
    import importlib.util, sys
    import jax, jax.numpy as jnp

    spec = importlib.util.spec_from_file_location("layer", sys.argv[1])
    moe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moe)

    mesh = moe.make_mesh(jax.devices()[: moe.NUM_DEVICES])
    params = moe.init_params(jax.random.key(0), mesh)

    def input_of(shape, seed):
        x = jax.random.normal(jax.random.key(seed), shape, jnp.float32)
        return jax.device_put(x.astype(moe.COMPUTE_DTYPE), moe.input_sharding(mesh))

    def loss_fn(layer):
        def loss(p, xs):
            y, aux = layer(p, xs)
            return jnp.sum(y.astype(jnp.float32) ** 2) + aux.load_balance_loss
        return loss

    def loss_of(layer):
        return jax.jit(jax.grad(loss_fn(layer), argnums=(0, 1)))

    shapes = {"main": (moe.INPUT_SHAPE, None)}
    for shape, function in moe.VARIANT_LAYERS.items():
        shapes[function.__name__.removeprefix("moe_layer_")] = (shape, function)
    assert moe.INPUT_SHAPE not in moe.VARIANT_LAYERS
    print("shapes:", {name: list(shape) for name, (shape, _) in shapes.items()})

    with jax.set_mesh(mesh):
        for seed, (name, (shape, function)) in enumerate(shapes.items()):
            x = input_of(shape, seed + 1)
            y, aux = jax.jit(moe.moe_layer)(params, x)
            assert y.shape == shape and y.dtype == moe.COMPUTE_DTYPE, (name, y.shape)
            copies = shape[0] * shape[1] * moe.TOP_K
            assert int(aux.tokens_per_expert.sum()) == copies, (name, aux.tokens_per_expert)
            grads = loss_of(moe.moe_layer)(params, x)
            assert grads[1].shape == shape, name
            if function is not None:
                assert function is getattr(moe, f"moe_layer_{name}")
                # The program moe_layer traces for this shape is the variant's own, forward
                # and gradients: the same jaxpr computes the same bits (no second compile).
                for trace in (jax.make_jaxpr, lambda f: jax.make_jaxpr(jax.grad(loss_fn(f)))):
                    dispatched = trace(moe.moe_layer)(params, x)
                    assert str(dispatched) == str(trace(function)(params, x)), name
            print("ok:", name, list(shape))

        unknown = (moe.BATCH, moe.SEQ_LEN // 2, moe.EMBED_DIM)
        try:
            moe.moe_layer(params, input_of(unknown, 9))
        except ValueError as err:
            message = str(err)
        else:
            raise AssertionError(f"no error for {unknown}")
        for shape, _ in shapes.values():
            assert str(list(shape)) in message, (shape, message)
        assert str(list(unknown)) in message, message
        print("ok: unknown shape:", message)
    print("all ok")
    """
)


@pytest.mark.slow
def test_moe_layer_dispatches_every_shape_and_refuses_others(tmp_path: Path) -> None:
    script = tmp_path / "call.py"
    script.write_text(SCRIPT)
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    result = subprocess.run(
        [sys.executable, str(script), str(MODULE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("main", "eval", "prefill"):
        assert f"ok: {name} " in result.stdout, result.stdout
    assert "ok: unknown shape" in result.stdout and "all ok" in result.stdout
