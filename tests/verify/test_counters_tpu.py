"""`moegen.verify.hlo.counters` on one real compile: a tiny shard_map program on 8 compile-only TPU v5e 2x4 devices."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

TINY = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec as P
    from moegen.verify.hlo.counters import compiled_counters

    devices = topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:2x4", chip_config_name="default",
        chips_per_host_bounds=(2, 4, 1), num_slices=1,
    ).devices
    mesh = jax.make_mesh((8,), ("x",), devices=devices)

    def shard(a, w):  # a [256, 512] rows, w [64, 512] gathered to [512, 512]
        full = jax.lax.all_gather(w, "x", axis=0, tiled=True)
        y = jnp.dot(a, full, preferred_element_type=jnp.float32)
        return jax.lax.psum(y, "x")

    f = jax.shard_map(shard, mesh=mesh, in_specs=(P(), P("x", None)), out_specs=P())
    args = (
        jax.ShapeDtypeStruct((256, 512), jnp.bfloat16, sharding=NamedSharding(mesh, P())),
        jax.ShapeDtypeStruct((512, 512), jnp.bfloat16, sharding=NamedSharding(mesh, P("x", None))),
    )
    compiled = jax.jit(f).lower(*args).compile()
    print(json.dumps(compiled_counters(compiled)))
    """
)


@pytest.mark.slow
def test_real_tpu_compile_of_a_tiny_shard_map(tmp_path) -> None:
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("compiling for TPU needs libtpu")
    script = tmp_path / "tiny.py"
    script.write_text(TINY, encoding="utf-8")
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    counters = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(counters) == {
        "flops", "bytes_accessed", "transcendentals", "loops", "memory", "collectives"
    }  # fmt: skip
    assert counters["loops"]["flops_added"] == 0  # no loop of more than one trip here
    # One device's matmul: 2 * 256 * 512 * 512 (the compiler may count a few more for the psum).
    assert 2 * 256 * 512 * 512 <= counters["flops"] < 1.1 * 2 * 256 * 512 * 512
    assert counters["bytes_accessed"] > 0
    memory = counters["memory"]
    assert memory["argument"] == 256 * 512 * 2 + 64 * 512 * 2  # a replicated, w one shard
    assert memory["output"] == 256 * 512 * 4
    assert (
        memory["peak"] == memory["argument"] + memory["output"] + memory["temp"] - memory["alias"]
    )
    collectives = counters["collectives"]
    kinds = set(collectives["by_kind"])
    assert "all-gather" in kinds and "all-reduce" in kinds, collectives
    assert collectives["total"] == collectives["hidden"] + collectives["exposed"] >= 2
    assert collectives["total"] == collectives["async"] + collectives["sync"]
    # The gather feeds the matmul and the psum needs its result: neither can hide behind it.
    assert collectives["hidden_by_matmul"] == 0
    gathered = collectives["by_kind"]["all-gather"]["bytes"]
    assert gathered == 512 * 512 * 2
