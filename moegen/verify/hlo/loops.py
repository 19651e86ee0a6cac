"""Loop trips for the compiled counters: what `cost_analysis()` leaves out.

XLA's cost analysis counts the body of a while loop once, whatever its trip count (measured
on TPU, libtpu 0.0.51: four matmuls in a `lax.scan` report the FLOPs of one). A layer that
runs its FFN in slices (`memory.ffn_chunks`) is such a loop, so its compiled FLOPs and bytes
must be completed from the scheduled HLO:

- the trip count of a loop: its condition compares the induction variable (a tuple element
  the loop starts from a constant) with a constant, `LT` (n - start trips) or `LE`;
- the cost of one trip of a body: a kernel's own CostEstimate (a Pallas/Mosaic custom call
  carries it in its backend_config: what cost_analysis counted for it); 2 x output x
  contraction FLOPs for a dot (in a fusion or not); and for any instruction that moves data,
  the bytes of its operands (only the slices of an operand a fusion only slices; only the
  update of an in-place dynamic-update-slice) and of its result. Elementwise FLOPs are not
  counted: they are noise beside the matmuls;
- nested loops multiply.

`loop_corrections(hlo_text)` returns the FLOPs and bytes to add to cost_analysis()'s figures,
and how many loops were completed (or could not be: their trip count stays 1).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from moegen.verify.hlo.parse import HloModuleText, Instruction, is_kernel, parse_hlo, shape_bytes

_CONSTANT = re.compile(r"constant\((-?\d+)\)")
_DIRECTION = re.compile(r"direction=(LT|LE|GT|GE)")
_TUPLE_INDEX = re.compile(r"index=(\d+)")
_COST = re.compile(r'"cost_estimate":(\{[^}]*\})')
_LOOP_FIELDS = re.compile(r"\b(condition|body)=%?([\w.\-]+)")
_PARAMETER = re.compile(r"parameter\((\d+)\)")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_CONV_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_ARRAY_DIMS = re.compile(r"\[([\d,]*)\]")
_SLICES = frozenset({"slice", "dynamic-slice"})
# What names, regroups or starts values without reading or writing memory of its own.
_FREE = frozenset(
    {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all", "partition-id"}
)


@dataclass(frozen=True)
class Cost:
    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def times(self, n: int) -> Cost:
        return Cost(self.flops * n, self.bytes * n)


@dataclass(frozen=True)
class LoopCorrection:
    flops: float  # to add to cost_analysis()'s flops
    bytes: float  # to add to its bytes accessed
    loops: int  # while loops completed with their trip count
    unknown_trips: int  # while loops whose trip count could not be read (counted once)


def loop_corrections(hlo_text: str) -> LoopCorrection:
    module = parse_hlo(hlo_text)
    if module.entry is None:
        return LoopCorrection(0.0, 0.0, 0, 0)
    walker = _Walker(module)
    full = walker.cost(module.entry, full=True)
    once = walker.cost(module.entry, full=False)
    return LoopCorrection(
        full.flops - once.flops, full.bytes - once.bytes, walker.loops, walker.unknown
    )


def kernel_tile_bytes(hlo_text: str) -> float:
    """Bytes the kernels' own CostEstimates count beyond one read of each operand and one write
    of the result, every loop trip included.

    megablox's estimate counts its tiles as it moves them: the rows once per output tile, one
    expert's weights once per row tile, over the whole (worst-case) row buffer. XLA counts a
    dot or a ragged dot as its operands and result once, whatever its tiling. Taking this
    from the compiled bytes counts a Pallas layer the way XLA counts the others.
    """
    module = parse_hlo(hlo_text)
    if module.entry is None:
        return 0.0
    walker = _Walker(module, own_cost=_tile_rereads)
    return walker.cost(module.entry, full=True).bytes


def _tile_rereads(
    instruction: Instruction, shapes: dict[str, str], module: HloModuleText | None = None
) -> Cost:
    if not is_kernel(instruction):
        return Cost()
    estimate = _own_cost(instruction, shapes, module)
    once = sum(shape_bytes(shapes.get(name, "")) for name in instruction.operands)
    return Cost(0.0, max(0.0, estimate.bytes - once - shape_bytes(instruction.shape)))


class _Walker:
    def __init__(self, module: HloModuleText, own_cost: Callable[..., Cost] | None = None) -> None:
        self.module = module
        self.own_cost = own_cost or _own_cost
        self.loops = 0
        self.unknown = 0
        self._trips: dict[str, int] = {}

    def cost(self, computation: str, *, full: bool) -> Cost:
        """One run of `computation`: loops run all their trips (full) or one (as counted)."""
        instructions = self.module.computations.get(computation, [])
        shapes = {i.name: i.shape for i in instructions}
        total = Cost()
        for instruction in instructions:
            if instruction.opcode == "while":
                body = dict(_LOOP_FIELDS.findall(instruction.text)).get("body", "")
                trips = self.trips(computation, instruction) if full else 1
                total += self.cost(body, full=full).times(trips)
            else:
                total += self.own_cost(instruction, shapes, self.module)
        return total

    def trips(self, computation: str, loop: Instruction) -> int:
        key = f"{computation}/{loop.name}"
        if key not in self._trips:
            found = _trip_count(self.module, computation, loop)
            self.loops += 1
            self.unknown += found is None
            self._trips[key] = found or 1
        return self._trips[key]


def _own_cost(
    instruction: Instruction, shapes: dict[str, str], module: HloModuleText | None = None
) -> Cost:
    if instruction.opcode in _FREE:
        return Cost()
    if is_kernel(instruction):
        estimate = _COST.search(instruction.text)
        if estimate:
            values = json.loads(estimate.group(1))
            return Cost(float(values.get("flops", 0)), float(values.get("bytes_accessed", 0)))
    if instruction.opcode == "dynamic-update-slice" and len(instruction.operands) > 1:
        # in place: the update is read and written, the rest of the buffer is untouched
        return Cost(0.0, 2.0 * shape_bytes(shapes.get(instruction.operands[1], "")))
    read = _sliced_reads(instruction, module) if module else {}
    operands = sum(
        read.get(i, shape_bytes(shapes.get(name, "")))
        for i, name in enumerate(instruction.operands)
    )
    return Cost(
        _matmul_flops(instruction, shapes, module), float(operands + shape_bytes(instruction.shape))
    )


def _matmul_flops(
    instruction: Instruction, shapes: dict[str, str], module: HloModuleText | None
) -> float:
    """2 x output elements x contraction size of a dot, or of the dots inside a fusion."""
    if instruction.opcode == "dot":
        contracting = _CONTRACTING.search(instruction.text)
        lhs = _dims(shapes.get(instruction.operands[0], "")) if instruction.operands else []
        if contracting is None or not lhs:
            return 0.0
        size = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d)
        return 2.0 * math.prod(_dims(instruction.shape)) * size
    if instruction.opcode == "convolution":
        return _convolution_flops(instruction, shapes)
    if module is None or instruction.opcode != "fusion":
        return 0.0
    total = 0.0
    for called in instruction.called():
        inner = module.computations.get(called, [])
        inner_shapes = {i.name: i.shape for i in inner}
        total += sum(_matmul_flops(i, inner_shapes, module) for i in inner)
    return total


def _convolution_flops(instruction: Instruction, shapes: dict[str, str]) -> float:
    """2 x multiply-adds of a convolution, counting only window positions inside the input.

    XLA:TPU writes dots as convolutions, and batched dots as convolutions over a padded
    "spatial" dimension whose window meets the input at one position: counting the whole
    window would count those products several times over.
    """
    labels = _CONV_LABELS.search(instruction.text)
    if labels is None or len(instruction.operands) < 2:
        return 0.0
    lhs_labels, rhs_labels, out_labels = labels.groups()
    lhs = _dims(shapes.get(instruction.operands[0], ""))
    rhs = _dims(shapes.get(instruction.operands[1], ""))
    out = _dims(instruction.shape)
    if (len(lhs), len(rhs), len(out)) != (len(lhs_labels), len(rhs_labels), len(out_labels)):
        return 0.0
    window = _window(instruction.text, sum(c.isdigit() for c in rhs_labels))
    batch = out[out_labels.index("b")]
    features_out = rhs[rhs_labels.index("o")]
    features_in = rhs[rhs_labels.index("i")]
    pairs = 1
    for d, (size, low, stride) in enumerate(window):
        length_in = lhs[lhs_labels.index(str(d))]
        length_out = out[out_labels.index(str(d))]
        pairs *= sum(
            1
            for o in range(length_out)
            for k in range(size)
            if 0 <= o * stride + k - low < length_in
        )
    return 2.0 * batch * features_out * features_in * pairs


def _window(text: str, spatial: int) -> list[tuple[int, int, int]]:
    """(size, low padding, stride) of each spatial dimension of a convolution's window."""
    found = _WINDOW.search(text)
    fields = dict(re.findall(r"(\w+)=([\w_x\-]+)", found.group(1))) if found else {}
    sizes = [int(v) for v in fields.get("size", "").split("x") if v] or [1] * spatial
    pads = [int(p.split("_")[0]) for p in fields.get("pad", "").split("x") if p] or [0] * spatial
    strides = [int(v) for v in fields.get("stride", "").split("x") if v] or [1] * spatial
    return list(zip(sizes, pads, strides, strict=True))


def _dims(shape: str) -> list[int]:
    found = _ARRAY_DIMS.search(shape)
    return [int(d) for d in found.group(1).split(",") if d] if found else []


def _sliced_reads(fusion: Instruction, module: HloModuleText) -> dict[int, int]:
    """Operands of a fusion that it only slices: operand index -> bytes of the slices."""
    called = fusion.called()
    if fusion.opcode != "fusion" or not called:
        return {}
    inner = module.computations.get(called[0], [])
    users: dict[str, list[Instruction]] = {}
    for instruction in inner:
        for operand in instruction.operands:
            users.setdefault(operand, []).append(instruction)
    reads = {}
    for instruction in inner:
        number = _PARAMETER.search(instruction.text) if instruction.opcode == "parameter" else None
        slicing = users.get(instruction.name, [])
        if number and slicing and all(u.opcode in _SLICES for u in slicing):
            reads[int(number.group(1))] = sum(shape_bytes(u.shape) for u in slicing)
    return reads


def _trip_count(module: HloModuleText, computation: str, loop: Instruction) -> int | None:
    """n - start for `i < n` (n - start + 1 for `i <= n`), i starting from a constant."""
    fields = dict(_LOOP_FIELDS.findall(loop.text))
    condition = module.computations.get(fields.get("condition", ""), [])
    by_name = {i.name: i for i in condition}
    root = next((i for i in condition if i.text.lstrip().startswith("ROOT")), None)
    if root is None or root.opcode != "compare" or len(root.operands) != 2:
        return None
    direction = _DIRECTION.search(root.text)
    counter, bound = (by_name.get(name) for name in root.operands)
    if direction is None or counter is None or bound is None:
        return None
    if direction.group(1) in ("GT", "GE"):  # n > i
        counter, bound = bound, counter
    limit = _constant(bound, by_name)
    index = _TUPLE_INDEX.search(counter.text) if counter.opcode == "get-tuple-element" else None
    if limit is None or index is None or not loop.operands:
        return None
    start = _start_value(module.computations.get(computation, []), loop, int(index.group(1)))
    if start is None:
        return None
    trips = limit - start + (1 if direction.group(1) in ("LE", "GE") else 0)
    return trips if trips > 0 else None


def _constant(instruction: Instruction, by_name: dict[str, Instruction]) -> int | None:
    while instruction.opcode in ("copy", "convert", "bitcast") and instruction.operands:
        instruction = by_name.get(instruction.operands[0], instruction)
        if instruction.opcode not in ("copy", "convert", "bitcast", "constant"):
            return None
    found = _CONSTANT.search(instruction.text) if instruction.opcode == "constant" else None
    return int(found.group(1)) if found else None


def _start_value(instructions: list[Instruction], loop: Instruction, index: int) -> int | None:
    """The constant the loop's tuple element `index` starts from."""
    by_name = {i.name: i for i in instructions}
    init = by_name.get(loop.operands[0])
    if init is None or init.opcode != "tuple" or index >= len(init.operands):
        return None
    element = by_name.get(init.operands[index])
    return None if element is None else _constant(element, by_name)
