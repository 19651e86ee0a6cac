"""moegen.verify.hlo.parse and moegen.verify.hlo.overlap on synthetic scheduled HLO: names, opcodes, operands, and transfers with or without a grouped matmul under them."""

from __future__ import annotations

import pytest

from moegen.verify.hlo.overlap import (
    hidden_transfers,
    is_grouped_matmul,
    overlapped,
    permute_windows,
)
from moegen.verify.hlo.parse import entry_instructions, parse_instruction

_GMM = (
    "{name} = f32[128,128]{{1,0:T(8,128)}} custom-call(%lhs, %rhs{extra}), "
    'custom_call_target="tpu_custom_call", metadata={{op_name="jit(f)/jit(gmm)/pallas_call"}}'
)


def synthetic(body: list[str]) -> str:
    lines = [
        "HloModule jit_f, is_scheduled=true, entry_computation_layout={(bf16[8,128])->bf16[8,128]}",
        "",
        "%fused_computation (p: bf16[8,128]) -> bf16[8,128] {",
        "  %p = bf16[8,128]{1,0} parameter(0)",
        '  %inner-gmm = f32[8,8]{1,0} custom-call(%p), custom_call_target="tpu_custom_call", '
        'metadata={op_name="gmm"}',
        "  ROOT %n = bf16[8,128]{1,0} negate(%p)",
        "}",
        "",
        "ENTRY %main (param: bf16[8,128]) -> bf16[8,128] {",
        "  %param = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(0)",
        *(f"  {line}" for line in body),
        "}",
        "",
    ]
    return "\n".join(lines)


def _start(name: str, operand: str = "param") -> str:
    return (
        f"%{name} = (bf16[8,128]{{1,0:T(8,128)(2,1)S(1)}}, bf16[8,128]{{1,0:T(8,128)(2,1)S(1)}}, "
        f"u32[]{{:S(2)}}, u32[]{{:S(2)}}) collective-permute-start(%{operand}), channel_id=1, "
        'source_target_pairs={{0,1},{1,0}}, backend_config={"flag_configs":[]}'
    )


def _done(name: str, start: str) -> str:
    return f"%{name} = bf16[8,128]{{1,0:T(8,128)(2,1)S(1)}} collective-permute-done(%{start})"


def test_parser_reads_names_opcodes_and_operands() -> None:
    line = (
        "  %gmm.3 = f32[1024,1024]{1,0:T(8,128)S(1)} custom-call(%get-tuple-element.742, "
        "%pad.group_metadata_0_, /*index=5*/%gather_fusion.26, %rhs.1), "
        'custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/jit(gmm)/pallas_call"}'
    )
    instruction = parse_instruction(line)
    assert instruction is not None
    assert instruction.name == "gmm.3" and instruction.opcode == "custom-call"
    assert instruction.operands == (
        "get-tuple-element.742",
        "pad.group_metadata_0_",
        "gather_fusion.26",
        "rhs.1",
    )
    assert is_grouped_matmul(instruction)
    start = parse_instruction(
        "  " + _start("collective-permute-start.4", "collective-permute-done")
    )
    assert start is not None and start.opcode == "collective-permute-start"
    assert start.operands == ("collective-permute-done",)
    root = parse_instruction("  ROOT %tuple.9 = (f32[2]{0}, s32[]) tuple(%a.1, %b)")
    assert root is not None and (root.name, root.opcode, root.operands) == (
        "tuple.9",
        "tuple",
        ("a.1", "b"),
    )
    allocate = parse_instruction(
        '  %custom-call.6 = u32[4]{0:T(128)S(1)} custom-call(), custom_call_target="AllocateBuffer"'
    )
    assert allocate is not None and not is_grouped_matmul(allocate)
    assert parse_instruction("HloModule jit_f, is_scheduled=true") is None
    assert parse_instruction("") is None


def test_parser_finds_a_grouped_matmul_under_a_transfer() -> None:
    text = synthetic(
        [
            _start("collective-permute-start"),
            _start("collective-permute-start.1"),
            _GMM.format(name="%gmm.1", extra=""),
            _done("collective-permute-done.1", "collective-permute-start.1"),
            _done("collective-permute-done", "collective-permute-start"),
            _GMM.format(name="%gmm.2", extra=", %collective-permute-done"),
            "ROOT %negate = bf16[8,128]{1,0} negate(%collective-permute-done)",
        ]
    )
    windows = permute_windows(text)
    # Matched by the done's operand, not by position: start.1 ends first.
    assert [(w.start, w.done) for w in windows] == [
        ("collective-permute-start.1", "collective-permute-done.1"),
        ("collective-permute-start", "collective-permute-done"),
    ]
    assert [w.grouped_matmuls for w in windows] == [("gmm.1",), ("gmm.1",)]
    assert len(overlapped(text)) == 2
    assert hidden_transfers(text) == (2, 2)  # what the verify worker reports


def test_parser_reports_no_overlap_when_every_transfer_finishes_first() -> None:
    text = synthetic(
        [
            _start("collective-permute-start"),
            "%negate.1 = bf16[8,128]{1,0} negate(%param)",  # other work may be overlapped
            '%custom-call = u32[4]{0} custom-call(), custom_call_target="AllocateBuffer"',
            _done("collective-permute-done", "collective-permute-start"),
            _GMM.format(name="%gmm", extra=", %collective-permute-done"),
            "%fusion = bf16[8,128]{1,0} fusion(%param), kind=kLoop, calls=%fused_computation",
            "ROOT %negate = bf16[8,128]{1,0} negate(%fusion)",
        ]
    )
    # The grouped matmul inside %fused_computation is not in ENTRY and does not count.
    assert [w.grouped_matmuls for w in permute_windows(text)] == [()]
    assert overlapped(text) == []
    assert hidden_transfers(text) == (0, 1)
    assert permute_windows(synthetic(["ROOT %negate = bf16[8,128]{1,0} negate(%param)"])) == []
    with pytest.raises(ValueError, match="no ENTRY"):
        entry_instructions("HloModule m\n")


def test_a_done_without_its_start_is_an_error_to_the_tests_and_skipped_by_the_worker() -> None:
    text = synthetic(
        [
            _start("collective-permute-start"),
            _GMM.format(name="%gmm", extra=""),
            _done("collective-permute-done", "collective-permute-start"),
            _done("collective-permute-done.1", "gmm"),
            "ROOT %negate = bf16[8,128]{1,0} negate(%collective-permute-done.1)",
        ]
    )
    with pytest.raises(ValueError, match="waits on gmm, not a permute start"):
        permute_windows(text)
    assert hidden_transfers(text) == (1, 1)
