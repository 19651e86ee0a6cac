"""Collectives of a scheduled HLO module, and whether compute runs while each is in flight.

`collective_counters(hlo_text)` finds every collective of the scheduled HLO
(`compiled.as_text()`), and whether compute is scheduled while it is in flight. An async
collective is a `*-start` ... `*-done` pair (all-gather, all-reduce, reduce-scatter,
all-to-all, ragged-all-to-all, collective-permute, collective-broadcast), an `async-start` ...
`async-done` pair whose wrapped computation holds one, or an XLA:TPU async collective fusion
(a kCustom fusion ending in an `AsyncCollectiveStart` custom call, then the one ending in its
`AsyncCollectiveDone`; the in-flight state is handed on through get-tuple-elements and through
the fusions that step the collective beside their own compute). It is *hidden* when at least
one compute instruction (a fusion, dot, convolution, custom call such as a megablox
`tpu_custom_call`, a loop, ...) sits between its start and its done in the same scheduled
computation, and *hidden_by_matmul* when one of those does matrix work (a dot or convolution,
directly or in its fusion, or a compute custom call such as a Pallas kernel). A synchronous
collective (a plain `all-gather(...)`, or a fusion that wraps one) is always exposed. `bytes`
is the size of a collective's result (for a ragged all-to-all, its whole receive buffer: an
upper bound of what moves).

Scheduled computations are ENTRY and what it runs in sequence (while bodies and conditions,
conditional branches, called computations), transitively; collectives inside a loop body are
counted once (statically), not once per trip. Fused computations and reducers are not
scheduled on their own and are only searched for what they contain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moegen.verify.hlo.parse import HloModuleText, Instruction, is_kernel, parse_hlo, shape_bytes

COLLECTIVE_KINDS = (
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
    "collective-broadcast",
)
_STARTS = {f"{kind}-start": kind for kind in COLLECTIVE_KINDS}
_DONES = {f"{kind}-done": kind for kind in COLLECTIVE_KINDS}

# Instructions that do work on the device's cores (not data movement or bookkeeping).
COMPUTE_OPCODES = frozenset(
    {
        "fusion",
        "dot",
        "convolution",
        "custom-call",
        "while",
        "call",
        "conditional",
        "sort",
        "reduce",
        "reduce-window",
        "select-and-scatter",
        "scatter",
        "gather",
        "map",
        "fft",
        "triangular-solve",
        "cholesky",
        "rng-bit-generator",
    }
)
# TPU async collective fusions: a kCustom fusion whose computation starts a collective (and
# returns its in-flight state) and a later one that waits for it.
ASYNC_FUSION_START = "AsyncCollectiveStart"
ASYNC_FUSION_DONE = "AsyncCollectiveDone"
MATMUL_OPCODES = frozenset({"dot", "convolution"})
# Inside a fusion: what only names, moves or regroups values (no arithmetic).
PASS_THROUGH_OPCODES = frozenset(
    {"parameter", "tuple", "get-tuple-element", "bitcast", "constant", "custom-call"}
)


@dataclass(frozen=True)
class _Summary:
    kind: str | None = None  # the first collective inside
    matmul: bool = False  # matrix work inside (dot, convolution, a compute kernel)
    starts: bool = False  # holds an AsyncCollectiveStart: the start of an async fusion
    waits: bool = False  # holds an AsyncCollectiveDone: its done
    computes: bool = False  # holds anything beyond collectives and moving tuples around


class _Contents:
    """What a computation holds, searched through nested fusions and wrapped computations."""

    def __init__(self, module: HloModuleText) -> None:
        self.module = module
        self._cache: dict[str, _Summary] = {}

    def of(self, computation: str) -> _Summary:
        if computation in self._cache:
            return self._cache[computation]
        self._cache[computation] = _Summary()  # guards against cycles
        kind, matmul, starts, waits, computes = None, False, False, False, False
        for instruction in self.module.computations.get(computation, []):
            own_kind = _collective_kind(instruction.opcode)
            kind = kind or own_kind
            matmul = matmul or instruction.opcode in MATMUL_OPCODES or is_kernel(instruction)
            target = instruction.custom_call_target
            starts = starts or target == ASYNC_FUSION_START
            waits = waits or target == ASYNC_FUSION_DONE
            computes = computes or not (
                own_kind or instruction.opcode in PASS_THROUGH_OPCODES or instruction.called()
            )
            computes = computes or (instruction.opcode == "custom-call" and is_kernel(instruction))
            for called in instruction.called():
                inner = self.of(called)
                kind, matmul = kind or inner.kind, matmul or inner.matmul
                starts, waits = starts or inner.starts, waits or inner.waits
                computes = computes or inner.computes
        self._cache[computation] = _Summary(kind, matmul, starts, waits, computes)
        return self._cache[computation]

    def of_calls(self, instruction: Instruction) -> _Summary:
        """Everything `instruction` calls through `calls=`, merged."""
        parts = [self.of(c) for c in instruction.called()]
        return _Summary(
            next((p.kind for p in parts if p.kind), None),
            any(p.matmul for p in parts),
            any(p.starts for p in parts),
            any(p.waits for p in parts),
            any(p.computes for p in parts),
        )


def _collective_kind(opcode: str) -> str | None:
    if opcode in COLLECTIVE_KINDS:
        return opcode
    return _STARTS.get(opcode) or _DONES.get(opcode)


def _scheduled_computations(module: HloModuleText) -> list[str]:
    """ENTRY and every computation it runs in sequence, transitively, ENTRY first."""
    if module.entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    order, todo = [], [module.entry]
    while todo:
        name = todo.pop(0)
        if name in order or name not in module.computations:
            continue
        order.append(name)
        for instruction in module.computations[name]:
            todo.extend(instruction.scheduled_calls())
    return order


@dataclass
class _Window:
    kind: str
    name: str
    computation: str
    compute_between: int = 0
    matmul_between: bool = False


def _started(operands: tuple[str, ...], pending: dict, alias: dict[str, str]) -> str | None:
    """The in-flight start one of `operands` reads (directly or through an alias), if any."""
    for operand in operands:
        start = alias.get(operand, operand)
        if start in pending:
            return start
    return None


def collective_counters(hlo_text: str) -> dict[str, Any]:
    """Collectives of a scheduled HLO module and what is scheduled while each is in flight."""
    module = parse_hlo(hlo_text)
    contents = _Contents(module)
    items: list[dict[str, Any]] = []
    for computation in _scheduled_computations(module):
        scan = _Scan(computation, contents, items)
        for instruction in module.computations[computation]:
            scan.step(instruction)
        scan.finish()
    return summarize(items)


class _Scan:
    """One scheduled computation, in order: each collective's window and what runs inside it."""

    def __init__(self, computation: str, contents: _Contents, items: list[dict[str, Any]]) -> None:
        self.computation = computation
        self.contents = contents
        self.items = items
        self.pending: dict[str, _Window] = {}
        self.alias: dict[str, str] = {}  # async-update or get-tuple-element -> the start it reads

    def step(self, instruction: Instruction) -> None:
        opcode = instruction.opcode
        inner = self.contents.of_calls(instruction)
        if self._opens(instruction, inner) or self._closes(instruction, inner):
            return
        if opcode in COLLECTIVE_KINDS:
            self._record_synchronous(opcode, instruction)
            return
        # A TPU async collective fusion passes its in-flight state through the fusions
        # scheduled inside it (each may run a step of the collective beside its own
        # compute): whatever reads that state carries it on to the done.
        carried = _started(instruction.operands, self.pending, self.alias)
        if carried is not None:
            self.alias[instruction.name] = carried
            if opcode == "fusion" and not inner.computes:
                return
        elif opcode == "fusion" and inner.kind is not None:
            # A collective fusion runs the collective itself: synchronous here.
            self._record_synchronous(inner.kind, instruction)
            return
        self._count_compute(instruction, inner)

    def finish(self) -> None:
        for window in self.pending.values():  # started, never waited for here
            self._record(window, is_async=True, nbytes=0, matched=False)

    def _opens(self, instruction: Instruction, inner: _Summary) -> bool:
        """A collective's start: its window opens."""
        opcode = instruction.opcode
        if opcode in _STARTS:
            kind = _STARTS[opcode]
        elif (
            opcode in ("async-start", "fusion")
            and inner.kind
            and not inner.waits
            and (opcode == "async-start" or inner.starts)
        ):
            kind = inner.kind
        else:
            return False
        self.pending[instruction.name] = _Window(kind, instruction.name, self.computation)
        return True

    def _closes(self, instruction: Instruction, inner: _Summary) -> bool:
        """An update of an in-flight collective (an alias of its start), or its done."""
        opcode = instruction.opcode
        if opcode in ("async-update", "get-tuple-element", "bitcast"):
            start = _started(instruction.operands[:1], self.pending, self.alias)
            if start is not None:
                self.alias[instruction.name] = start
                return True
        if opcode in _DONES or opcode == "async-done" or (opcode == "fusion" and inner.waits):
            start = _started(instruction.operands, self.pending, self.alias)
            if start is not None:
                window = self.pending.pop(start)
                self._record(window, is_async=True, nbytes=shape_bytes(instruction.shape))
                return True
        return False

    def _count_compute(self, instruction: Instruction, inner: _Summary) -> None:
        """Compute scheduled while collectives are in flight hides them."""
        opcode = instruction.opcode
        if opcode not in COMPUTE_OPCODES:
            return
        if opcode == "custom-call" and not is_kernel(instruction):
            return
        matmul = opcode in MATMUL_OPCODES or is_kernel(instruction) or inner.matmul
        if opcode in ("while", "call", "conditional"):
            called = instruction.scheduled_calls()
            matmul = matmul or any(self.contents.of(c).matmul for c in called)
        for window in self.pending.values():
            window.compute_between += 1
            window.matmul_between = window.matmul_between or matmul

    def _record_synchronous(self, kind: str, instruction: Instruction) -> None:
        window = _Window(kind, instruction.name, self.computation)
        self._record(window, is_async=False, nbytes=shape_bytes(instruction.shape))

    def _record(
        self, window: _Window, *, is_async: bool, nbytes: int, matched: bool = True
    ) -> None:
        self.items.append(
            {
                "kind": window.kind,
                "name": window.name,
                "computation": window.computation,
                "async": is_async,
                "matched": matched,
                "compute_between": window.compute_between,
                "matmul_between": window.matmul_between,
                # An unmatched start cannot be shown to overlap anything.
                "hidden": matched and window.compute_between > 0,
                "bytes": nbytes,
            }
        )


def summarize(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals of the per-collective records (see collective_counters)."""
    by_kind: dict[str, dict[str, int]] = {}
    for item in items:
        entry = by_kind.setdefault(
            item["kind"],
            {
                "total": 0,
                "async": 0,
                "hidden": 0,
                "hidden_by_matmul": 0,
                "exposed": 0,
                "bytes": 0,
                "exposed_bytes": 0,
            },
        )
        entry["total"] += 1
        entry["async"] += int(item["async"])
        entry["hidden"] += int(item["hidden"])
        entry["hidden_by_matmul"] += int(item["hidden"] and item["matmul_between"])
        entry["exposed"] += int(not item["hidden"])
        entry["bytes"] += item["bytes"]
        entry["exposed_bytes"] += 0 if item["hidden"] else item["bytes"]
    return {
        "total": len(items),
        "async": sum(item["async"] for item in items),
        "sync": sum(not item["async"] for item in items),
        "hidden": sum(item["hidden"] for item in items),
        "hidden_by_matmul": sum(item["hidden"] and item["matmul_between"] for item in items),
        "exposed": sum(not item["hidden"] for item in items),
        "bytes": sum(item["bytes"] for item in items),
        "exposed_bytes": sum(item["bytes"] for item in items if not item["hidden"]),
        "by_kind": dict(sorted(by_kind.items())),
        "items": items,
    }
