"""`moegen.verify.hlo.parse`, `.collectives` and `.counters` on handwritten scheduled HLO: the parser, collectives with or without compute scheduled inside them, and compiled_counters' flops, bytes and memory."""

from __future__ import annotations

import json

import pytest
from counters_hlo import (
    ADD_FUSION,
    AG_DONE,
    AG_START,
    ALLOCATE,
    DOT_FUSION,
    GMM,
    HEADER,
    module,
    only,
)

from moegen.verify.hlo.collectives import collective_counters
from moegen.verify.hlo.counters import compiled_counters
from moegen.verify.hlo.parse import parse_hlo, parse_instruction, shape_bytes


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
