"""The full-size program verification compiles is the one a user trains: the gradient of the
output's sum plus the spec's balance and z losses, not of the output alone (issue 54).

Runs in a child process: JAX's device count is fixed at its first import.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from spec_builder import spec_yaml, tiny

CHILD = textwrap.dedent(
    """
    import sys
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    import jax.numpy as jnp
    import numpy as np
    from moegen.verify.worker.child import full_size_programs, import_module

    module = import_module(sys.argv[1], "trained_layer")
    devices = jax.devices()[: module.NUM_DEVICES]
    _, _, programs = full_size_programs(module, devices)
    mesh = module.make_mesh(devices)
    params = module.init_params(jax.random.key(0), mesh)
    x = jax.random.normal(jax.random.key(1), module.INPUT_SHAPE, jnp.float32)
    x = jax.device_put(x.astype(module.COMPUTE_DTYPE), module.input_sharding(mesh))

    def output_only(p, xs):
        return jnp.sum(module.moe_layer(p, xs, mesh=mesh)[0].astype(jnp.float32))

    def losses_only(p, xs):
        aux = module.moe_layer(p, xs, mesh=mesh)[1]
        return aux.load_balance_loss + aux.router_z_loss

    trained, _ = jax.jit(programs["forward+backward"])(params, x)
    output, _ = jax.jit(jax.grad(output_only, argnums=(0, 1)))(params, x)
    losses, _ = jax.jit(jax.grad(losses_only, argnums=(0, 1)))(params, x)
    router = "router"
    loss_part = np.asarray(losses[router], np.float64)
    assert np.abs(loss_part).max() > 0, "the spec's losses have no router gradient here"
    # the compiled program's router gradient holds the losses' part beside the output's (the
    # output's alone would leave err at 1; the rest is rounding of the two large sums, each
    # summed in its own program)
    got = np.asarray(trained[router], np.float64) - np.asarray(output[router], np.float64)
    err = np.abs(got - loss_part).max() / np.abs(loss_part).max()
    assert err < 0.05, err
    # the experts' weights get no gradient from the losses: the same as the output's alone
    np.testing.assert_allclose(trained["w_up"], output["w_up"], rtol=1e-6, atol=1e-7)
    print("ok", err)
    """
)


@pytest.mark.parametrize("params_dtype", ["float32"])
def test_the_compiled_training_program_includes_the_router_losses(
    params_dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moegen.pipeline import generate

    choices = tiny(load_balance_loss=0.01, z_loss=0.001, params_dtype=params_dtype)
    (tmp_path / "layer.yaml").write_text(spec_yaml(choices))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "layer.py").write_text(generate(Path("layer.yaml")).source)
    (tmp_path / "child.py").write_text(CHILD)
    result = subprocess.run(
        [sys.executable, "child.py", str(tmp_path / "layer.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok"), result.stdout
