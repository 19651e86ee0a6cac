"""moegen.verify.hlo.loops: completing cost_analysis() with the trips of while loops.

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

from moegen.verify.hlo.loops import kernel_tile_bytes, loop_corrections

SCAN_VS_UNROLLED = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding
    from moegen.verify.hlo.counters import compiled_counters

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
@pytest.mark.slow
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


def test_kernel_tile_bytes_are_what_an_estimate_counts_beyond_operands_and_result() -> None:
    """A kernel estimating 1000 bytes for a 64-byte operand and a 64-byte result re-reads
    872 bytes of tiles per call; the loop runs it 8 times."""
    module = _loop_module("compare(%i, %n), direction=LT", 0).replace(
        '"bytes_accessed":"64"', '"bytes_accessed":"1000"'
    )
    assert kernel_tile_bytes(module) == 8 * (1000 - 64 - 64)
    # an estimate below one read and one write counts nothing, never less
    assert kernel_tile_bytes(_loop_module("compare(%i, %n), direction=LT", 0)) == 0


def test_unreadable_trip_count_is_counted_once_and_reported() -> None:
    correction = loop_corrections(_loop_module("compare(%i, %i), direction=NE"))
    assert (correction.loops, correction.unknown_trips) == (1, 1)
    assert correction.flops == correction.bytes == 0


def _convolution_loop(window: str, labels: str, lhs: str, rhs: str, out: str) -> str:
    """One convolution per trip of a 3-trip loop (in the loop so the correction counts it)."""
    return textwrap.dedent(
        f"""\
        HloModule m

        %cond (p: (s32[], {out})) -> pred[] {{
          %p = (s32[], {out}) parameter(0)
          %i = s32[] get-tuple-element(%p), index=0
          %n = s32[] constant(3)
          ROOT %c = pred[] compare(%i, %n), direction=LT
        }}

        %body (q: (s32[], {out})) -> (s32[], {out}) {{
          %q = (s32[], {out}) parameter(0)
          %j = s32[] get-tuple-element(%q), index=0
          %a = {lhs} constant(0)
          %b = {rhs} constant(0)
          %conv = {out} convolution(%a, %b), {window}dim_labels={labels}
          %one = s32[] constant(1)
          %next = s32[] add(%j, %one)
          ROOT %t = (s32[], {out}) tuple(%next, %conv)
        }}

        ENTRY %main (x: {out}) -> {out} {{
          %x = {out} parameter(0)
          %zero = s32[] constant(0)
          %init = (s32[], {out}) tuple(%zero, %x)
          %w = (s32[], {out}) while(%init), condition=%cond, body=%body
          ROOT %r = {out} get-tuple-element(%w), index=1
        }}
        """
    )


def test_a_plain_matmul_convolution() -> None:
    # [64, 32] @ [32, 16] as XLA:TPU writes it: 2 x 64 x 16 x 32 FLOPs a trip
    text = _convolution_loop("", "bf_io->bf", "f32[64,32]", "f32[32,16]", "f32[64,16]")
    assert loop_corrections(text).flops == 2 * (2 * 64 * 16 * 32)


def test_a_batched_matmul_convolution_counts_only_window_positions_inside() -> None:
    # 8 experts: [t=4, e=8, f=32] x [e=8, f=32, o=16] -> [4, 8, 16], the expert dimension a
    # spatial one with window 8, padding 7 on each side and the kernel reversed: each output
    # position meets the input at exactly one kernel position (not 8).
    text = _convolution_loop(
        "window={size=8 pad=7_7 rhs_reversal=1}, ",
        "b0f_0io->b0f",
        "f32[4,8,32]",
        "f32[8,32,16]",
        "f32[4,15,16]",
    )
    # output positions 0..14 over input 0..7: o + k - 7 in [0, 8) for 8 x 8 = 64 pairs
    pairs = sum(1 for o in range(15) for k in range(8) if 0 <= o + k - 7 < 8)
    assert pairs == 64
    assert loop_corrections(text).flops == 2 * (2 * 4 * 16 * 32 * pairs)
