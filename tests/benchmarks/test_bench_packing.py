"""bench.packing reads XLA's buffer assignment: the block of temporaries and the most bytes of
it live at once, on a written-out dump in the compiler's format."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.ledger_population import module_key, planned
from bench.packing import (
    Measured,
    block_values,
    current,
    live_peak,
    live_ranges,
    load_records,
    program_prefixes,
    record,
    temporaries,
    within,
)
from bench.population import population

# Two preallocated-temp allocations (the small one is a scoped scratch colour), a parameter,
# and in the block: `a` and `b` side by side, `c` over `a`'s offsets once `a` is dead, and
# `loop` and `loop.body` one loop-carried buffer (the same offsets, the same moments).
ASSIGNMENT = """\
allocation 0: size 1024, parameter 0, shape |f32[256]| at ShapeIndex {}:
 value: <1 param.0 @0> (size=1024,offset=0): f32[256]{0}
allocation 1: size 64, color 8, page 0, preallocated-temp:
 value: <2 scratch @0> (size=64,offset=0): u32[16]{0}
allocation 2: size 3000, page 0, preallocated-temp:
 value: <3 a @0> (size=1000,offset=0): bf16[500]{0}
 value: <4 b @0> (size=1000,offset=1000): bf16[500]{0}
 value: <5 c @0> (size=600,offset=200): bf16[300]{0}
 value: <6 loop{1} @0> (size=1000,offset=2000): bf16[500]{0}
 value: <7 loop.body{1} @0> (size=1000,offset=2000): bf16[500]{0}
"""
RANGES = """\
HloLiveRange (max 9):
  BufferLiveRange:
    param.0{}:0-9
    scratch{}:0-1
    a{}:1-3
    b{}:2-6
    c{}:4-8
    loop{1}:5-7
    loop.body{1}:5-7
  Live ranges at 5 (peak):
"""


def test_the_block_is_the_largest_temporary_allocation() -> None:
    block, values = block_values(ASSIGNMENT)
    assert block == 3000
    assert [name for name, _, _ in values] == ["a{}", "b{}", "c{}", "loop{1}", "loop.body{1}"]


def test_the_live_peak_counts_shared_offsets_once() -> None:
    _, values = block_values(ASSIGNMENT)
    ranges = live_ranges(RANGES)
    assert ranges["c{}"] == (4, 8)
    # at 5: b, c and the loop buffer (once): 1000 + 600 + 1000; a is dead by then
    assert live_peak(values, ranges) == 2600


def test_a_dump_folder_is_read_per_program(tmp_path: Path) -> None:
    prefix = tmp_path / "module_0007.jit_loss.cl_1."
    Path(f"{prefix}after_optimizations-buffer-assignment.txt").write_text(ASSIGNMENT)
    Path(f"{prefix}after_optimizations-live-range.txt").write_text(RANGES)
    (tmp_path / "module_0009.extracted.cl_1.after_optimizations-live-range.txt").write_text("")
    found = program_prefixes(tmp_path)
    assert list(found) == ["train"]
    measured = temporaries(found["train"])
    assert (measured.block, measured.live_peak) == (3000, 2600)


def test_an_assignment_without_temporaries_is_refused() -> None:
    with pytest.raises(ValueError, match="no preallocated-temp"):
        block_values(ASSIGNMENT.split("allocation 1:")[0])


def _row(block: int, live: int, exact: int = 1000, planned: int = 0, module: str = "") -> Measured:
    return Measured("s0_000_x", "train", block, live, exact, planned or exact + block, module)


def test_the_floor_counts_what_one_fraction_would_leave_outside() -> None:
    # peaks 2000 and 3000: x 1.2 of the live peaks gives 1840 (-8%) and 2440 (-19%)
    rows = [_row(block=1000, live=700), _row(block=2000, live=1200)]
    assert within(rows, 1.2) == 1
    assert within(rows, 1.6) == 2  # 2120 (+6%), 2920 (-3%)


def test_records_round_trip_and_a_stale_one_is_left_out(tmp_path: Path) -> None:
    name, text = population(1, 0)[0]
    peaks, source = planned(name, text)
    fresh = replace(_row(10, 5, module=module_key(source)), spec=name, planned=1)
    stale = replace(fresh, program="forward", module="0" * 64)
    path = tmp_path / "packing.json"
    record(path, [fresh, stale])
    assert load_records(path) == [fresh, stale]
    assert current(load_records(path)) == [replace(fresh, planned=peaks["train"])]


@pytest.mark.parametrize(
    "text",
    ["not json", "{}", '[{"spec": 1}]', '[{"spec": "x", "program": "train", "block": 1, '
     '"live": 1, "exact": 0, "planned": 1, "module": ""}]'],
)  # fmt: skip
def test_a_file_that_is_not_records_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "packing.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="packing.json"):
        load_records(path)
