"""The committed modules as a user calls them: clear errors at the call, training works.

Runs in a child process because the device count of JAX is fixed at its first import.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import importlib.util, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    spec = importlib.util.spec_from_file_location("layer", sys.argv[1])
    moe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moe)

    def expect(fragment, call):
        try:
            call()
        except ValueError as err:
            assert fragment in str(err), (fragment, str(err))
            print("ok:", fragment)
        else:
            raise AssertionError(f"no error, expected {fragment!r}")

    mesh = moe.make_mesh(jax.devices()[: moe.NUM_DEVICES])
    params = moe.init_params(jax.random.key(0), mesh)
    x = jax.device_put(jnp.ones(moe.INPUT_SHAPE, moe.COMPUTE_DTYPE), moe.input_sharding(mesh))

    # Training works: gradients for every parameter and the input, with their shardings.
    def loss(p, xs):
        y, aux = moe.moe_layer(p, xs)
        return jnp.sum(y.astype(jnp.float32) ** 2)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
    for name, g in grads[0].items():
        assert g.shape == moe.PARAM_SHAPES[name] and g.sharding.spec == moe.PARAM_SPECS[name]
    y, aux = moe.moe_layer(params, x)
    assert y.shape == moe.INPUT_SHAPE and y.dtype == moe.COMPUTE_DTYPE
    assert int(aux.tokens_per_expert.sum()) == moe.BATCH * moe.SEQ_LEN * moe.TOP_K
    print("ok: training step")

    expect("x: expected", lambda: moe.moe_layer(params, x[:, :-1]))
    expect("x: expected", lambda: moe.moe_layer(params, x.astype(jnp.float16)))
    expect("params must have keys", lambda: moe.moe_layer({"router": params["router"]}, x))
    bad = dict(params, w_up=params["w_up"][:, :, :-1])
    expect("params['w_up']: expected", lambda: moe.moe_layer(bad, x))
    expect("no mesh", lambda: moe.moe_layer(params, np.asarray(x)))
    expect("place it on the mesh first", lambda: moe.moe_layer(params, np.asarray(x), mesh=mesh))
    replicated = jax.device_put(x, NamedSharding(mesh, P()))
    if moe.INPUT_SPEC != P():
        expect("x is laid out as", lambda: moe.moe_layer(params, replicated))
    expect("jax_num_cpu_devices", lambda: moe.make_mesh(jax.devices()[: moe.NUM_DEVICES - 1]))
    expect("to use a subset", lambda: moe.make_mesh(jax.devices()[:1] * (moe.NUM_DEVICES + 1)))
    if moe.NUM_DEVICES > 1:
        other = jax.make_mesh((moe.NUM_DEVICES,), ("other",), devices=jax.devices()[: moe.NUM_DEVICES])
        expect("does not hold this layer", lambda: moe.moe_layer(params, x, mesh=other))
    print("all ok")
    """
)

SMALL_MODULES = ["mixtral_small_cpu", "sigmoid_top1_data_cpu", "qwen3_moe_fsdp_cpu"]


@pytest.mark.parametrize("name", SMALL_MODULES)
@pytest.mark.slow
def test_generated_module_trains_and_rejects_bad_calls(name: str, tmp_path: Path) -> None:
    script = tmp_path / "call.py"
    script.write_text(SCRIPT)
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    result = subprocess.run(
        [sys.executable, str(script), str(REPO / "generated" / f"{name}.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all ok" in result.stdout


@pytest.mark.parametrize("name", SMALL_MODULES)
def test_make_mesh_advises_by_how_many_devices_are_missing_or_extra(name: str) -> None:
    """Too few devices: how to make them (a subset cannot help); too many: take a subset. The
    count alone decides, before any device is touched, so one CPU device stands in for any."""
    import jax

    spec = importlib.util.spec_from_file_location(
        f"layer_{name}", REPO / "generated" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    moe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moe)
    n, one = moe.NUM_DEVICES, jax.devices()[:1]
    mesh = str(dict(zip(moe.MESH_AXES, moe.MESH_SHAPE, strict=True)))
    needs = f"this layer needs exactly {n} devices for mesh {mesh}, got"
    if n > 1:
        with pytest.raises(ValueError) as fewer:
            moe.make_mesh(one)
        assert str(fewer.value) == (
            f"{needs} 1: on a CPU host, make {n} fake devices with "
            f'jax.config.update("jax_num_cpu_devices", {n}) before jax first runs; '
            f"on accelerators, run on a slice of {n} devices"
        )
    with pytest.raises(ValueError, match=re.escape(f"{needs} {n + 1}; ")) as more:
        moe.make_mesh(one * (n + 1))
    assert str(more.value).endswith(f"pass devices=jax.devices()[:{n}] to use a subset")
