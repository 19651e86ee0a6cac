"""libtpu agrees with `moegen.tiling`'s VMEM model: its tiles compile for compile-only TPU chips, forward and backward (no TPU needed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from tiling_cases import MIB, choose

from moegen.hardware import CATALOGUE
from moegen.tiling import Tile, tile_problems, usable_vmem, vmem_bytes

_COMPILE_PROBE = """
import json, sys
import jax
import jax.numpy as jnp
from jax.experimental import topologies
from jax.experimental.pallas.ops.tpu import megablox
from jax.sharding import SingleDeviceSharding

topology, (m, k, n, groups), tilings = json.loads(sys.argv[1])
device = topologies.get_topology_desc(
    platform="tpu",
    topology_name=topology,
    chip_config_name="default",
    chips_per_host_bounds=(1, 1, 1),
    num_slices=1,
).devices[0]
on_device = SingleDeviceSharding(device)
args = (
    jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=on_device),
    jax.ShapeDtypeStruct((groups, k, n), jnp.bfloat16, sharding=on_device),
    jax.ShapeDtypeStruct((groups,), jnp.int32, sharding=on_device),
)
result = {}
for tiling in tilings:
    def loss(lhs, rhs, group_sizes, tiling=tuple(tiling)):
        out = megablox.gmm(lhs, rhs, group_sizes, jnp.bfloat16, tiling)
        return out.astype(jnp.float32).sum()

    # forward (gmm), input gradient (gmm) and weight gradient (tgmm) in one module
    step = jax.jit(jax.grad(loss, argnums=(0, 1)))
    try:
        step.lower(*args).compile()
        result[str(tiling)] = "ok"
    except Exception as error:  # CompileTimeScopedVmemOom and the like
        result[str(tiling)] = f"{type(error).__name__}: {str(error)[:400]}"
print("MOEGEN-COMPILE " + json.dumps(result))
"""


@pytest.mark.slow
def test_v5e_tiles_compile_forward_and_backward() -> None:
    """Mixtral-like gate/up projection (8192 rows, 4096 -> 14336, 8 experts) on v5e.

    Two tiles at the very edge of v5e's usable 12 MiB: choose_tile's (512, 1024, 1024), whose
    weight-gradient (tgmm) step needs exactly 12 MiB, and (1024, 512, 1024), whose forward
    (gmm) step does (see test_vmem_bytes_by_hand). Both must compile, gradients included, for
    libtpu's compile-only v5e device (about 5 s each).
    """
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install 'moegen[tpu]')")
    m, k, n, groups = 8192, 4096, 14336, 8
    budget = CATALOGUE["tpu-v5e"].vmem_bytes_for_tiles
    assert budget == 16 * MIB
    chosen = choose(m, k, n, "bfloat16", "tpu-v5e", groups)
    assert chosen.as_tuple() == (512, 1024, 1024)
    edge = Tile(1024, 512, 1024)
    for tile in (chosen, edge):
        assert tile_problems(tile, "bfloat16", budget) == []
        assert vmem_bytes(tile, "bfloat16") == usable_vmem(budget) == 12 * MIB
        # both divide the problem: no partial tiles
        assert (m % tile.rows, k % tile.contraction, n % tile.output) == (0, 0, 0)
    assert _compile_verdicts("v5e:1x1", (m, k, n, groups), [chosen, edge]) == ["ok", "ok"]


@pytest.mark.slow
def test_v6e_wide_ring_tile_compiles_forward_and_backward() -> None:
    """The qwen3 ring's gate and up side by side on v6e (32768 rows, 2048 -> 1536, 16 experts):
    the chosen (512, 1024, 2048), a 2048-lane output tile over a 1536-wide output (masked) and
    22 MiB of the 24 usable, compiles, gradients included."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install 'moegen[tpu]')")
    problem = (32768, 2048, 1536, 16)
    chosen = choose(*problem[:3], "bfloat16", "tpu-v6e", problem[3])
    assert chosen.as_tuple() == (512, 1024, 2048)
    assert vmem_bytes(chosen, "bfloat16") == 22 * MIB
    assert _compile_verdicts("v6e:1x1", problem, [chosen]) == ["ok"]


def _compile_verdicts(topology: str, problem: tuple[int, ...], tiles: list[Tile]) -> list[str]:
    """Compile megablox forward and backward for one compile-only TPU chip, per tile."""
    tilings = [list(tile.as_tuple()) for tile in tiles]
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"  # compile-only TPU devices need no TPU backend
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # share libtpu with a concurrent verify
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE_PROBE, json.dumps([topology, list(problem), tilings])],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("MOEGEN-COMPILE ")]
    assert result.returncode == 0 and len(lines) == 1, result.stdout + result.stderr[-4000:]
    compiled = json.loads(lines[0].removeprefix("MOEGEN-COMPILE "))
    return [compiled[str(tiling)] for tiling in tilings]
