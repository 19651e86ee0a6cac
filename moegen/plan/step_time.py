"""The time of one forward and one forward+backward pass per device, as run, per memory trade.

The roofline (moegen.plan.roofline) is a lower bound over the whole pass. What a trade costs
lies in what it adds between the matmuls, which a bound over the pass does not see: so here
the routed path is a sequence of steps, each at its own bound (its FLOPs at the chip's peak
or its bytes at HBM bandwidth, whichever is longer), summed, as the compiler runs them one
after another. Read from the programs compiled for a v5e chip (bench/trade_time/README.md):

- the weights in their use dtype: a cast (and gate and up side by side, a copy) before the
  experts run, and the weight gradients cast back after;
- the routed rows gathered into expert order and back, and combined, at about twice and
  three times the bytes an ideal copy moves (as XLA's gathers ran on the chip);
- a grouped matmul reads its rows once per output tile and each group's weights once, or
  once per row tile where the contraction is tiled (megablox re-reads a block whose index
  changes); its weight gradient reads rows and gradients once per tile of the other side;
- token chunks: every chunk is a call of its own (each group's weights read again), the
  backward pass recomputes each chunk's rows, gate/up product and activation (only the
  experts' outputs are kept), and the chunks' weight gradients are summed in the loop: the
  running sum read, the chunk's read, the sum written, for every chunk after the first;
- FFN slices: each slice's weights cut out and cast (forward and again when recomputed),
  each slice's down projection summed in float32 over the rows, the backward pass
  recomputing (gate and) up per slice, each slice's weight gradients written into the whole.

Communication adds as the roofline exposes it. Times are estimates, not bounds: the plan
ranks trades by them and prints them as the whole layer's multiple.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# The chip's gathers of rows moved about twice the bytes of an ideal copy, and the weighted
# combine about three times (bench/tpu_explore/run2_breakdown.json: gather 1.08 ms, combine
# 3.50 ms for 268 MB of rows on v5e).
GATHER_OVERHEAD = 2
COMBINE_OVERHEAD = 3
FLOAT32 = 4


@dataclass(frozen=True)
class StepShape:
    """What the time of one device's pass depends on."""

    tokens: int
    routed_rows: int  # token copies routed (tokens x top-k, or fewer under a capacity)
    kernel_rows: int  # rows of one grouped-matmul call, padded
    calls: int  # grouped-matmul calls per projection per pass: token chunks x ring steps
    experts: int  # expert weights a device holds
    embed: int  # the routed width (latent where the experts run in one)
    ffn: int  # one device's FFN columns
    matmuls: int  # 3 gated, 2 plain
    compute_bytes: int
    param_bytes: int
    token_chunks: int
    ffn_slices: int
    whole_forward: bool  # sliced FFN whose forward pass runs whole
    fused_gate_up: bool  # gate and up side by side (one grouped matmul, a copy to make)
    tiles: tuple[tuple[int, int, int], ...] = ()  # (rows, contraction, output): gate/up, down


@dataclass(frozen=True)
class StepTime:
    forward_s: float
    train_s: float  # forward+backward
    parts: tuple[tuple[str, float], ...] = field(default=(), compare=False)


@dataclass
class _Clock:
    peak: float
    hbm: float
    parts: dict[str, float] = field(default_factory=dict)

    def step(self, name: str, flops: float, nbytes: float) -> None:
        seconds = max(flops / self.peak, nbytes / self.hbm)
        self.parts[name] = self.parts.get(name, 0.0) + seconds

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def step_time(shape: StepShape, peak_flops: float, hbm_bytes_per_s: float) -> StepTime:
    """Forward and forward+backward seconds of the routed path (zero without chip figures)."""
    if not peak_flops or not hbm_bytes_per_s:
        return StepTime(0.0, 0.0)
    clock = _Clock(peak_flops, hbm_bytes_per_s)
    _forward(clock, shape)
    forward = clock.total
    _backward(clock, shape)
    parts = tuple((name, seconds) for name, seconds in clock.parts.items())
    return StepTime(forward, clock.total, parts)


def _weights(s: StepShape, nbytes: int) -> float:
    return s.experts * s.embed * s.ffn * s.matmuls * nbytes


def _copies(s: StepShape) -> float:
    """Bytes to make the weights as used from the weights as stored (0: used in place)."""
    if s.param_bytes == s.compute_bytes and not s.fused_gate_up:
        return 0.0
    return _weights(s, s.param_bytes) + _weights(s, s.compute_bytes)


def _forward(clock: _Clock, s: StepShape) -> None:
    slices = 1 if s.whole_forward else s.ffn_slices
    clock.step("weights cast", 0, _copies(s))
    _route_rows(clock, s, "forward")
    _ffn(clock, s, slices, "forward", recompute=False)
    clock.step(
        "combine", 0, COMBINE_OVERHEAD * (s.routed_rows + s.tokens) * s.embed * s.compute_bytes
    )


def _backward(clock: _Clock, s: StepShape) -> None:
    clock.step(
        "combine, backward",
        0,
        COMBINE_OVERHEAD * (s.routed_rows + s.tokens) * s.embed * s.compute_bytes,
    )
    if s.token_chunks > 1:  # each chunk's forward again, up to the experts' kept outputs
        _route_rows(clock, s, "recomputed")
    _ffn(clock, s, s.ffn_slices, "backward", recompute=s.token_chunks > 1 or s.ffn_slices > 1)
    _route_rows(clock, s, "backward")
    clock.step(
        "weight gradients cast", 0, _weights(s, s.compute_bytes) + _weights(s, s.param_bytes)
    )
    if s.token_chunks > 1:
        summed = 3 * (s.token_chunks - 1) * _weights(s, s.compute_bytes)
        clock.step("weight gradients summed over chunks", 0, summed)
    if s.ffn_slices > 1:  # each slice's gradient of the stored weights, summed into the whole
        summed = 3 * (s.ffn_slices - 1) * s.token_chunks * _weights(s, s.param_bytes)
        clock.step("weight gradients summed over slices", 0, summed)


def _route_rows(clock: _Clock, s: StepShape, when: str) -> None:
    rows = s.routed_rows * s.embed * s.compute_bytes
    clock.step(f"rows gathered, {when}", 0, GATHER_OVERHEAD * 2 * rows)


def _ffn(clock: _Clock, s: StepShape, slices: int, when: str, *, recompute: bool) -> None:
    """The grouped matmuls and activation of one pass, `slices` slices of the FFN width."""
    width = s.ffn // slices
    up_width = (s.matmuls - 1) * width
    rows = s.kernel_rows * s.calls
    up_tile, down_tile = _tiles(s)
    cb = s.compute_bytes
    sliced = slices > 1
    if when == "forward" or recompute:
        tag = "" if when == "forward" else ", recomputed"
        if sliced:
            # in every token chunk: the slice loop runs inside the chunk loop
            cut = s.token_chunks * (_copies(s) or 2 * _weights(s, cb))
            clock.step(f"FFN slices cut out{tag}", 0, cut)
        _gmm(clock, f"gate/up{tag}", s, rows, s.embed, up_width * slices, up_tile)
        clock.step(f"activation{tag}", 0, rows * (up_width + width) * slices * cb)
    if when == "forward":
        out_bytes = FLOAT32 if sliced else cb
        _gmm(clock, "down", s, rows, width * slices, s.embed, down_tile, out_bytes)
        if sliced:
            clock.step("FFN slices summed", 0, 3 * slices * rows * s.embed * FLOAT32)
        return
    _gmm(clock, "down, input gradient", s, rows, s.embed, width * slices, down_tile)
    _tgmm(clock, "down, weight gradient", s, rows, width * slices, s.embed, down_tile)
    clock.step("activation, backward", 0, 5 * rows * width * slices * cb)
    _gmm(clock, "gate/up, input gradient", s, rows, up_width * slices, s.embed, up_tile)
    _tgmm(clock, "gate/up, weight gradient", s, rows, s.embed, up_width * slices, up_tile)
    if sliced:
        clock.step("FFN slices summed, backward", 0, 3 * slices * rows * s.embed * FLOAT32)


def _tiles(s: StepShape) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    if len(s.tiles) == 2:
        return s.tiles[0], s.tiles[1]
    # a kernel without tiles (XLA's ragged_dot): rows in blocks of 512, nothing re-read
    return (512, s.embed, s.ffn), (512, s.ffn, s.embed)


def _gmm(
    clock: _Clock,
    name: str,
    s: StepShape,
    rows: int,
    contraction: int,
    output: int,
    tile: tuple[int, int, int],
    out_bytes: int = 0,
) -> None:
    tm, tk, tn = tile
    cb = s.compute_bytes
    groups = s.experts * s.calls
    visits = rows / tm + groups if tk < contraction else groups
    weights = visits * contraction * output * cb
    lhs = rows * contraction * cb * math.ceil(output / min(tn, output))
    out = rows * output * (out_bytes or cb)
    clock.step(name, 2 * rows * contraction * output, weights + lhs + out)


def _tgmm(
    clock: _Clock,
    name: str,
    s: StepShape,
    rows: int,
    contraction: int,
    output: int,
    tile: tuple[int, int, int],
) -> None:
    """The weight gradient [experts, contraction, output] over the rows."""
    _, tk, tn = tile
    cb = s.compute_bytes
    lhs = rows * contraction * cb * math.ceil(output / min(tn, output))
    grad = rows * output * cb * math.ceil(contraction / min(tk, contraction))
    out = s.experts * s.calls * contraction * output * cb
    clock.step(name, 2 * rows * contraction * output, lhs + grad + out)
