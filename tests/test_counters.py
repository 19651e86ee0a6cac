"""moegen.verify.counters: compiled flops, bytes, memory and collectives with or without
compute scheduled inside them, on handwritten scheduled HLO and on one real TPU compile."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from moegen.verify.counters import (
    collective_counters,
    compiled_counters,
    parse_hlo,
    parse_instruction,
    shape_bytes,
)

# --------------------------------------------------------------------------------------
# Handwritten scheduled HLO.
# --------------------------------------------------------------------------------------

HEADER = "HloModule jit_f, is_scheduled=true, entry_computation_layout={(bf16[8,128]{1,0})->bf16[8,128]{1,0}}"

FUSED = """\
%fused_dot (p0: bf16[8,128], p1: bf16[128,128]) -> bf16[8,128] {
  %p0 = bf16[8,128]{1,0} parameter(0)
  %p1 = bf16[128,128]{1,0} parameter(1)
  ROOT %convolution.1 = bf16[8,128]{1,0:T(8,128)(2,1)} convolution(%p0, %p1), dim_labels=bf_io->bf
}

%fused_add (q0: bf16[8,128]) -> bf16[8,128] {
  %q0 = bf16[8,128]{1,0} parameter(0)
  ROOT %add.1 = bf16[8,128]{1,0} add(%q0, %q0)
}

%wrapped_all_to_all (w0: bf16[8,128]) -> bf16[8,128] {
  %w0 = bf16[8,128]{1,0} parameter(0)
  ROOT %all-to-all.9 = bf16[8,128]{1,0} all-to-all(%w0), channel_id=3, replica_groups={{0,1}}, dimensions={0}
}

%collective_fusion_body (c0: bf16[4,128]) -> bf16[8,128] {
  %c0 = bf16[4,128]{1,0} parameter(0)
  ROOT %all-gather.9 = bf16[8,128]{1,0} all-gather(%c0), channel_id=4, replica_groups={{0,1}}, dimensions={0}
}

%acf_start (s0: bf16[4,128]) -> (bf16[4,128], bf16[8,128], u32[]) {
  %s0 = bf16[4,128]{1,0} parameter(0)
  %all-gather.10 = bf16[8,128]{1,0} all-gather(%s0), channel_id=6, replica_groups={{0,1}}, dimensions={0}, frontend_attributes={chain_id="0"}
  ROOT %custom-call.10 = (bf16[4,128]{1,0}, bf16[8,128]{1,0}, u32[]) custom-call(%all-gather.10), custom_call_target="AsyncCollectiveStart"
}

%acf_step (k0: bf16[4,128], k1: bf16[8,128], k2: u32[], k3: bf16[8,128], k4: bf16[128,128]) -> (bf16[8,128], bf16[4,128], bf16[8,128], u32[]) {
  %k0 = bf16[4,128]{1,0} parameter(0)
  %k1 = bf16[8,128]{1,0} parameter(1)
  %k2 = u32[] parameter(2)
  %k3 = bf16[8,128]{1,0} parameter(3)
  %k4 = bf16[128,128]{1,0} parameter(4)
  %all-gather.11 = bf16[8,128]{1,0} all-gather(%k0), channel_id=6, replica_groups={{0,1}}, dimensions={0}, frontend_attributes={chain_id="0"}
  %convolution.11 = bf16[8,128]{1,0} convolution(%k3, %k4), dim_labels=bf_io->bf
  ROOT %tuple.11 = (bf16[8,128]{1,0}, bf16[4,128]{1,0}, bf16[8,128]{1,0}, u32[]) tuple(%convolution.11, %k0, %all-gather.11, %k2)
}

%acf_done (d0: bf16[4,128], d1: bf16[8,128], d2: u32[]) -> bf16[8,128] {
  %d0 = bf16[4,128]{1,0} parameter(0)
  %d1 = bf16[8,128]{1,0} parameter(1)
  %d2 = u32[] parameter(2)
  %all-gather.12 = bf16[8,128]{1,0} all-gather(%d0), channel_id=6, replica_groups={{0,1}}, dimensions={0}, frontend_attributes={chain_id="0"}
  ROOT %custom-call.12 = bf16[8,128]{1,0} custom-call(%d0, %d1, %all-gather.12, %d2), custom_call_target="AsyncCollectiveDone"
}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.2 = f32[] add(%a, %b)
}

%loop_body (lp: (s32[], bf16[8,128])) -> (s32[], bf16[8,128]) {
  %lp = (s32[], bf16[8,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%lp), index=0
  %v = bf16[8,128]{1,0} get-tuple-element(%lp), index=1
  %collective-permute-start.7 = (bf16[8,128]{1,0}, bf16[8,128]{1,0}, u32[], u32[]) collective-permute-start(%v), channel_id=5, source_target_pairs={{0,1},{1,0}}
  %fusion.7 = bf16[8,128]{1,0} fusion(%v), kind=kLoop, calls=%fused_add
  %collective-permute-done.7 = bf16[8,128]{1,0} collective-permute-done(%collective-permute-start.7)
  ROOT %t = (s32[], bf16[8,128]{1,0}) tuple(%i, %collective-permute-done.7)
}

%loop_cond (cp: (s32[], bf16[8,128])) -> pred[] {
  %cp = (s32[], bf16[8,128]{1,0}) parameter(0)
  %ci = s32[] get-tuple-element(%cp), index=0
  %limit = s32[] constant(4)
  ROOT %lt = pred[] compare(%ci, %limit), direction=LT
}
"""


def module(*body: str) -> str:
    lines = [
        HEADER,
        "",
        FUSED,
        "ENTRY %main (param: bf16[8,128], w: bf16[128,128]) -> bf16[8,128] {",
        "  %param = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(0)",
        "  %w = bf16[128,128]{1,0:T(8,128)(2,1)} parameter(1)",
        *(f"  {line}" for line in body),
        "}",
        "",
    ]
    return "\n".join(lines)


AG_START = (
    "%all-gather-start.1 = (bf16[4,128]{1,0:T(8,128)(2,1)S(1)}, bf16[8,128]{1,0:T(8,128)(2,1)}) "
    "all-gather-start(%param), channel_id=1, replica_groups={{0,1}}, dimensions={0}, "
    'backend_config={"flag_configs":[]}'
)
AG_DONE = "%all-gather-done.1 = bf16[8,128]{1,0:T(8,128)(2,1)} all-gather-done(%all-gather-start.1)"
DOT_FUSION = "%fusion.1 = bf16[8,128]{1,0} fusion(%param, %w), kind=kOutput, calls=%fused_dot"
ADD_FUSION = "%fusion.2 = bf16[8,128]{1,0} fusion(%param), kind=kLoop, calls=%fused_add"
GMM = (
    '%gmm.1 = bf16[8,128]{1,0} custom-call(%param, %w), custom_call_target="tpu_custom_call", '
    'metadata={op_name="jit(f)/jit(gmm)/pallas_call"}'
)
ALLOCATE = (
    '%custom-call.3 = u32[4]{0:T(128)S(1)} custom-call(), custom_call_target="AllocateBuffer"'
)


def only(counters: dict) -> dict:
    assert len(counters["items"]) == 1, counters["items"]
    return counters["items"][0]


def test_parser_reads_shape_opcode_and_operands() -> None:
    instruction = parse_instruction("  " + AG_START)
    assert instruction is not None
    assert (instruction.name, instruction.opcode) == ("all-gather-start.1", "all-gather-start")
    assert instruction.operands == ("param",)
    assert instruction.shape.startswith("(bf16[4,128]")
    root = parse_instruction("  ROOT %tuple.9 = (f32[2]{0}, s32[]) tuple(%a.1, /*index=5*/%b)")
    assert root is not None and (root.name, root.opcode, root.operands) == (
        "tuple.9",
        "tuple",
        ("a.1", "b"),
    )
    assert parse_instruction(HEADER) is None and parse_instruction("") is None
    parsed = parse_hlo(module("ROOT %n = bf16[8,128]{1,0} negate(%param)"))
    assert parsed.entry == "main"
    assert {"fused_dot", "loop_body", "loop_cond", "main"} <= set(parsed.computations)


def test_shape_bytes_sums_tuples_and_ignores_layouts() -> None:
    assert shape_bytes("bf16[8,128]{1,0:T(8,128)(2,1)S(1)}") == 8 * 128 * 2
    assert shape_bytes("(f32[4,2]{1,0}, s32[]{:T(128)}, u32[]{:S(2)})") == 32 + 4 + 4
    assert shape_bytes("pred[3]") == 3 and shape_bytes("token[]") == 0


def test_async_collective_with_a_matmul_inside_is_hidden() -> None:
    counters = collective_counters(
        module(
            AG_START,
            DOT_FUSION,
            AG_DONE,
            "ROOT %n = bf16[8,128]{1,0} add(%fusion.1, %all-gather-done.1)",
        )
    )
    item = only(counters)
    assert item["kind"] == "all-gather" and item["async"] and item["hidden"]
    assert item["matmul_between"] and item["compute_between"] == 1
    assert item["bytes"] == 8 * 128 * 2  # the done's result
    assert (counters["hidden"], counters["hidden_by_matmul"], counters["exposed"]) == (1, 1, 0)


def test_async_collective_with_only_bookkeeping_inside_is_exposed() -> None:
    counters = collective_counters(
        module(
            AG_START,
            ALLOCATE,  # allocates, computes nothing
            "%bitcast.1 = bf16[8,128]{1,0} bitcast(%param)",
            "%gte.1 = bf16[8,128]{1,0} get-tuple-element(%all-gather-start.1), index=1",
            AG_DONE,
            DOT_FUSION,  # after the done: does not hide it
            "ROOT %n = bf16[8,128]{1,0} add(%fusion.1, %all-gather-done.1)",
        )
    )
    item = only(counters)
    assert item["async"] and not item["hidden"] and item["compute_between"] == 0
    assert (counters["async"], counters["hidden"], counters["exposed"]) == (1, 0, 1)
    assert counters["exposed_bytes"] == counters["bytes"] == 8 * 128 * 2


def test_elementwise_fusion_hides_but_not_by_matmul() -> None:
    counters = collective_counters(
        module(
            AG_START,
            ADD_FUSION,
            AG_DONE,
            "ROOT %n = bf16[8,128]{1,0} add(%fusion.2, %all-gather-done.1)",
        )
    )
    item = only(counters)
    assert item["hidden"] and not item["matmul_between"]
    assert (counters["hidden"], counters["hidden_by_matmul"]) == (1, 0)


def test_synchronous_collectives_are_exposed() -> None:
    counters = collective_counters(
        module(
            "%all-gather.2 = bf16[16,128]{1,0} all-gather(%param), channel_id=1, replica_groups={{0,1}}, dimensions={0}",
            DOT_FUSION,
            "%all-reduce.2 = f32[8]{0} all-reduce(%f), channel_id=2, replica_groups={{0,1}}, to_apply=%sum",
            "%reduce-scatter.2 = bf16[4,128]{1,0} reduce-scatter(%fusion.1), channel_id=3, replica_groups={{0,1}}, dimensions={0}, to_apply=%sum",
            "%fusion.9 = bf16[8,128]{1,0} fusion(%param), kind=kCustom, calls=%collective_fusion_body",
            "ROOT %n = bf16[8,128]{1,0} negate(%fusion.9)",
        )
    )
    assert [i["kind"] for i in counters["items"]] == [
        "all-gather",
        "all-reduce",
        "reduce-scatter",
        "all-gather",  # the collective fusion
    ]
    assert not any(i["async"] or i["hidden"] for i in counters["items"])
    assert (counters["sync"], counters["exposed"], counters["hidden"]) == (4, 4, 0)
    assert counters["by_kind"]["all-gather"]["total"] == 2
    assert counters["by_kind"]["all-reduce"]["bytes"] == 32


def test_windows_match_by_operand_and_nest() -> None:
    counters = collective_counters(
        module(
            "%collective-permute-start = (bf16[8,128]{1,0}, bf16[8,128]{1,0}, u32[], u32[]) collective-permute-start(%param), channel_id=1, source_target_pairs={{0,1},{1,0}}",
            "%collective-permute-start.1 = (bf16[8,128]{1,0}, bf16[8,128]{1,0}, u32[], u32[]) collective-permute-start(%param), channel_id=2, source_target_pairs={{0,1},{1,0}}",
            GMM,
            "%collective-permute-done.1 = bf16[8,128]{1,0} collective-permute-done(%collective-permute-start.1)",
            "%collective-permute-done = bf16[8,128]{1,0} collective-permute-done(%collective-permute-start)",
            "%collective-permute-start.2 = (bf16[8,128]{1,0}, bf16[8,128]{1,0}, u32[], u32[]) collective-permute-start(%param), channel_id=3, source_target_pairs={{0,1},{1,0}}",
            "%collective-permute-done.2 = bf16[8,128]{1,0} collective-permute-done(%collective-permute-start.2)",
            "ROOT %n = bf16[8,128]{1,0} add(%collective-permute-done, %collective-permute-done.2)",
        )
    )
    assert [(i["name"], i["hidden"], i["matmul_between"]) for i in counters["items"]] == [
        ("collective-permute-start.1", True, True),  # finished first: matched by operand
        ("collective-permute-start", True, True),
        ("collective-permute-start.2", False, False),
    ]
    assert counters["by_kind"]["collective-permute"] == {
        "total": 3,
        "async": 3,
        "hidden": 2,
        "hidden_by_matmul": 2,
        "exposed": 1,
        "bytes": 3 * 8 * 128 * 2,
        "exposed_bytes": 8 * 128 * 2,
    }


def test_generic_async_wrapper_with_updates() -> None:
    counters = collective_counters(
        module(
            "%async-start.1 = ((bf16[8,128]{1,0}), bf16[8,128]{1,0}, u32[]) async-start(%param), calls=%wrapped_all_to_all",
            GMM,
            "%async-update.1 = ((bf16[8,128]{1,0}), bf16[8,128]{1,0}, u32[]) async-update(%async-start.1)",
            "%async-done.1 = bf16[8,128]{1,0} async-done(%async-update.1)",
            "ROOT %n = bf16[8,128]{1,0} add(%gmm.1, %async-done.1)",
        )
    )
    item = only(counters)
    assert (item["kind"], item["async"], item["hidden"], item["matmul_between"]) == (
        "all-to-all",
        True,
        True,
        True,
    )


def test_tpu_async_collective_fusion_carries_its_state_through_compute() -> None:
    """start fusion -> a fusion that steps the collective beside a matmul -> done fusion, the
    in-flight state passed along by get-tuple-elements (XLA:TPU async collective fusion)."""
    counters = collective_counters(
        module(
            "%slice.1 = bf16[4,128]{1,0} slice(%param), slice={[0:4], [0:128]}",
            "%async-collective-start = (bf16[4,128]{1,0}, bf16[8,128]{1,0}, u32[]) fusion(%slice.1), kind=kCustom, calls=%acf_start",
            "%g0 = bf16[4,128]{1,0} get-tuple-element(%async-collective-start), index=0",
            "%g1 = bf16[8,128]{1,0} get-tuple-element(%async-collective-start), index=1",
            "%g2 = u32[] get-tuple-element(%async-collective-start), index=2",
            "%fusion.5 = (bf16[8,128]{1,0}, bf16[4,128]{1,0}, bf16[8,128]{1,0}, u32[]) fusion(%g0, %g1, %g2, %param, %w), kind=kCustom, calls=%acf_step",
            "%h1 = bf16[4,128]{1,0} get-tuple-element(%fusion.5), index=1",
            "%h2 = bf16[8,128]{1,0} get-tuple-element(%fusion.5), index=2",
            "%h3 = u32[] get-tuple-element(%fusion.5), index=3",
            "%async-collective-done = bf16[8,128]{1,0} fusion(%h1, %h2, %h3), kind=kCustom, calls=%acf_done",
            "ROOT %n = bf16[8,128]{1,0} negate(%async-collective-done)",
        )
    )
    item = only(counters)
    assert (item["kind"], item["name"], item["async"], item["matched"]) == (
        "all-gather",
        "async-collective-start",
        True,
        True,
    )
    assert item["hidden"] and item["matmul_between"] and item["compute_between"] == 1
    assert item["bytes"] == 8 * 128 * 2


def test_collectives_in_a_loop_body_are_judged_inside_it() -> None:
    counters = collective_counters(
        module(
            "%init = (s32[], bf16[8,128]{1,0}) tuple(%zero, %param)",
            "%while.1 = (s32[], bf16[8,128]{1,0}) while(%init), condition=%loop_cond, body=%loop_body",
            "ROOT %n = bf16[8,128]{1,0} get-tuple-element(%while.1), index=1",
        )
    )
    item = only(counters)
    assert item["computation"] == "loop_body" and item["kind"] == "collective-permute"
    assert item["hidden"] and not item["matmul_between"]


def test_a_start_without_its_done_is_reported_unmatched_and_exposed() -> None:
    counters = collective_counters(
        module(AG_START, DOT_FUSION, "ROOT %n = bf16[8,128]{1,0} negate(%fusion.1)")
    )
    item = only(counters)
    assert not item["matched"] and item["async"] and not item["hidden"]
    assert (counters["hidden"], counters["hidden_by_matmul"], counters["exposed"]) == (0, 0, 1)


def test_no_entry_is_an_error() -> None:
    with pytest.raises(ValueError, match="no ENTRY"):
        collective_counters("HloModule m\n")


def test_no_collectives_at_all() -> None:
    counters = collective_counters(
        module(DOT_FUSION, "ROOT %n = bf16[8,128]{1,0} negate(%fusion.1)")
    )
    assert counters["total"] == 0 and counters["by_kind"] == {} and counters["items"] == []


class _FakeCompiled:
    """Enough of jax.stages.Compiled for compiled_counters."""

    class _Stats:
        argument_size_in_bytes = 100
        output_size_in_bytes = 50
        temp_size_in_bytes = 30
        alias_size_in_bytes = 20
        generated_code_size_in_bytes = 7

    def __init__(self, cost):
        self._cost = cost

    def cost_analysis(self):
        return self._cost

    def memory_analysis(self):
        return self._Stats()

    def as_text(self) -> str:
        return module(AG_START, DOT_FUSION, AG_DONE, "ROOT %n = bf16[8,128]{1,0} negate(%fusion.1)")


def test_compiled_counters_is_plain_json_and_ignores_optimal_seconds() -> None:
    cost = {"flops": 12.0, "bytes accessed": 34.0, "optimal_seconds": -0.5}
    for wrapped in (cost, [cost]):  # a dict, or the older list of one dict
        counters = compiled_counters(_FakeCompiled(wrapped))
        assert counters["flops"] == 12.0 and counters["bytes_accessed"] == 34.0
        assert "optimal_seconds" not in json.dumps(counters)
        assert counters["memory"] == {
            "argument": 100,
            "output": 50,
            "temp": 30,
            "alias": 20,
            "generated_code": 7,
            "peak": 160,
        }
        assert counters["collectives"]["hidden"] == 1
        assert json.loads(json.dumps(counters)) == counters
    assert "items" not in compiled_counters(_FakeCompiled(None), items=False)["collectives"]
    assert compiled_counters(_FakeCompiled(None))["flops"] == 0.0


# --------------------------------------------------------------------------------------
# One real compile: a tiny shard_map program on 8 compile-only TPU v5e 2x4 devices.
# --------------------------------------------------------------------------------------

TINY = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec as P
    from moegen.verify.counters import compiled_counters

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
