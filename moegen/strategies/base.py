"""What every expert-parallel strategy states about itself, in one typed record.

A strategy (spec field parallelism.experts) is one module of moegen/strategies/ holding a
`Strategy`: the rules that refuse specs it cannot run, the worst-case rows and calls of its
grouped matmuls, the bytes it moves, what the memory ledger and the network plan must know
of it, and what a CPU twin runs in its place. The stages ask the registry
(moegen.strategies.registry) instead of comparing strategy names; its code is one template,
templates/strategies/<name>.jinja.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec

StrategyRule = Callable[[LoadedSpec], list[Diagnostic]]


@dataclass(frozen=True)
class RowRequest:
    """What a strategy's worst-case grouped-matmul rows are counted from (one token chunk)."""

    call_tokens: int  # tokens of one device in one call of the experts (a token chunk)
    group_tokens: int  # tokens of the whole expert group in one call
    per_token: int  # most copies of one token a device receives: min(top_k, local experts)
    top_k: int
    num_experts: int
    local_experts: int
    shards: int  # devices of the expert axis
    overlap_chunks: int  # the ring's embedding chunks (1: not overlapped)
    capacity: int | None  # copies a device keeps per expert (None: dropless)

    def kept(self, rows: int, experts: int) -> int:
        """`rows` copies over `experts` experts, at most `capacity` of them each."""
        return min(rows, experts * self.capacity) if self.capacity else rows


@dataclass(frozen=True)
class TrafficRequest:
    """What the bytes a strategy moves per device (forward) are counted from."""

    local_tokens: int
    top_k: int
    embed_dim: int
    shards: int
    compute_bytes: int


def _no_traffic(request: TrafficRequest) -> int:
    return 0


@dataclass(frozen=True)
class Strategy:
    """One way of running the routed experts over devices, as every stage sees it."""

    name: str  # the value of parallelism.experts
    summary: str
    shards_experts: bool  # experts live on the devices of an `expert` mesh axis
    # (grouped-matmul rows per call, calls): the worst case a device can be asked to run
    rows: Callable[[RowRequest], tuple[int, int]]
    # located refusals of specs it cannot run; validation runs every strategy's rules on
    # every spec (a rule may refuse a field that only this strategy can use)
    rules: tuple[StrategyRule, ...] = ()
    # bytes one device sends over the expert axis in the forward pass (backward: the same)
    traffic: Callable[[TrafficRequest], int] = _no_traffic
    collective: str | None = None  # the network plan's kind of its transfer
    # its receive buffer is certified: every row a device can be sent fits, none dropped
    certifies_receive_buffer: bool = False
    emulated_on_cpu: bool = False  # XLA:CPU lacks its collective: CPU modules emulate it
    reports_received: bool = False  # aux.received_rows: the most rows a device received
    exchanges_rows: bool = False  # rows go to the experts' devices and come back
    # every device runs its experts on the whole group's tokens (gathered), and sums its
    # partial outputs over the group in float32
    gathers_group: bool = False
    overlaps: bool = False  # parallelism.overlap_chunks can hide its transfers
    # redundant expert slots (parallelism.redundant_experts): copies of a hot expert split
    # over its replicas' devices
    carries_replicas: bool = False
