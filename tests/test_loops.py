"""moegen.verify.loops: completing cost_analysis() with the trips of while loops.

cost_analysis counts a loop body once; a real TPU compile (compile-only devices, libtpu) of
the same matmuls in a lax.scan and unrolled shows it, and the correction must close the gap.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from moegen.verify.loops import loop_corrections

SCAN_VS_UNROLLED = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding
    from moegen.verify.counters import compiled_counters

    device = topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:2x2", chip_config_name="default",
        chips_per_host_bounds=(2, 2, 1), num_slices=1,
    ).devices[0]
    on = SingleDeviceSharding(device)
    x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=on)
    w = jax.ShapeDtypeStruct((TRIPS, 1024, 1024), jnp.bfloat16, sharding=on)

    def unrolled(x, w):
        return sum(jnp.dot(x, w[i], preferred_element_type=jnp.float32) for i in range(TRIPS))

    def scanned(x, w):
        def step(total, wi):
            return total + jnp.dot(x, wi, preferred_element_type=jnp.float32), None
        return jax.lax.scan(step, jnp.zeros((1024, 1024), jnp.float32), w)[0]

    out = {}
    for f in (unrolled, scanned):
        compiled = jax.jit(f).lower(x, w).compile()
        counters = compiled_counters(compiled, items=False)
        raw = compiled.cost_analysis()
        out[f.__name__] = {
            "flops": counters["flops"], "raw_flops": raw["flops"], "loops": counters["loops"]
        }
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("trips", [4, 7])
def test_scan_counts_every_trip_like_the_unrolled_loop(tmp_path, trips: int) -> None:
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("compiling for TPU needs libtpu")
    script = tmp_path / "scan.py"
    script.write_text(SCAN_VS_UNROLLED.replace("TRIPS", str(trips)), encoding="utf-8")
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    matmul = 2 * 1024**3
    assert out["unrolled"]["flops"] >= trips * matmul
    # the compiler alone counts one trip of the scan...
    assert out["scanned"]["raw_flops"] < 1.1 * matmul
    # ...the counters all of them
    assert out["scanned"]["loops"]["completed"] >= 1
    assert out["scanned"]["loops"]["unknown_trips"] == 0
    assert out["scanned"]["flops"] == pytest.approx(out["unrolled"]["flops"], rel=0.01)


def _loop_module(condition_root: str, start: int = 0, limit: int = 8) -> str:
    """A module whose loop runs one kernel (CostEstimate 1000 FLOPs, 64 bytes) per trip."""
    return textwrap.dedent(
        f"""\
        HloModule m

        %cond (p: (s32[], f32[16])) -> pred[] {{
          %p = (s32[], f32[16]) parameter(0)
          %i = s32[] get-tuple-element(%p), index=0
          %n = s32[] constant({limit})
          ROOT %c = pred[] {condition_root}
        }}

        %body (q: (s32[], f32[16])) -> (s32[], f32[16]) {{
          %q = (s32[], f32[16]) parameter(0)
          %j = s32[] get-tuple-element(%q), index=0
          %v = f32[16] get-tuple-element(%q), index=1
          %k = f32[16] custom-call(%v), custom_call_target="tpu_custom_call", backend_config={{"custom_call_config": {{"cost_estimate":{{"flops":"1000","transcendentals":"0","bytes_accessed":"64"}}}}}}
          %one = s32[] constant(1)
          %next = s32[] add(%j, %one)
          ROOT %t = (s32[], f32[16]) tuple(%next, %k)
        }}

        ENTRY %main (x: f32[16]) -> f32[16] {{
          %x = f32[16] parameter(0)
          %zero = s32[] constant({start})
          %init = (s32[], f32[16]) tuple(%zero, %x)
          %w = (s32[], f32[16]) while(%init), condition=%cond, body=%body
          ROOT %r = f32[16] get-tuple-element(%w), index=1
        }}
        """
    )


@pytest.mark.parametrize(
    ("root", "start", "trips"),
    [
        ("compare(%i, %n), direction=LT", 0, 8),
        ("compare(%i, %n), direction=LT", 3, 5),
        ("compare(%i, %n), direction=LE", 0, 9),
        ("compare(%n, %i), direction=GT", 0, 8),
    ],
)
def test_trip_count_from_the_condition(root: str, start: int, trips: int) -> None:
    correction = loop_corrections(_loop_module(root, start))
    assert (correction.loops, correction.unknown_trips) == (1, 0)
    assert correction.flops == (trips - 1) * 1000
    # the kernel's bytes, plus the add of the induction variable (3 s32 scalars)
    assert correction.bytes == (trips - 1) * (64 + 12)


def test_unreadable_trip_count_is_counted_once_and_reported() -> None:
    correction = loop_corrections(_loop_module("compare(%i, %i), direction=NE"))
    assert (correction.loops, correction.unknown_trips) == (1, 1)
    assert correction.flops == correction.bytes == 0
