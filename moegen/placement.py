"""Redundant-expert placement from a measured load (issue 30): read a load file, choose
which experts the extra slots of each device hold and what share of their copies they
take, and say what each device's rows become.

The layer's rules (parallelism.redundant_experts, moegen.plan.replicas): device d of the
expert axis keeps its home experts d*L .. d*L+L-1 (L = experts / devices), then X extra
slots. An extra slot holds a replica of an expert whose home is another device (never an
expert twice on one device) and takes `share` of that expert's copies, in 1024ths (at
least one); an expert's replicas take at most 1024 together and its home slot keeps the
rest. Every device splits its own copies of an expert by rank, so the rows a slot receives
are its share of the expert's load, up to a row per sending device.

`place` keeps the homes and chooses the extra slots by water-filling towards the mean
(total / devices, the best any placement can reach):

1. while the busiest device is more than one 1024th of its hottest expert over the mean,
   it gives a replica of one of its home experts to a device with a free slot that may hold
   it. The receiver: of the devices under the mean, the one with the least room that takes
   all the donor can ship of that expert (best fit), else the least-loaded one. The share:
   min(donor's excess, receiver's room, the expert's home share), rounded down to 1024ths
   of the expert's load, at least one. The expert: the one whose move ships the most rows
   (ties: the heavier). When every device with room is at or over the mean, the pair is
   levelled instead (half their difference), so no move makes the busiest device busier.
   Stop when the busiest device can give to nobody.
2. the slots still free (the layer needs exactly X per device), least-loaded device
   first, each take the smallest share, 1/1024, of the expert that leaves the busiest
   device lowest (relief, when its home is the busiest), else the lightest one it may hold:
   the fill that moves the fewest rows onto a device.

Why: a step lasts as long as its busiest device, and with the homes fixed the only freedom
is to ship part of an expert's copies from an over-mean device to an under-mean one, one
slot per shipment, so slots are what runs out (one per device is the common case). Busiest
first lowers the peak first. A move that ships the donor's whole excess into the tightest
room that holds it, or fills the emptiest device to the mean, finishes a device, so few
slots go to partial moves and the roomy devices stay for the other donors (the least-loaded
receiver alone, as a plain water-filling would pick, left 1.6x the mean on some Zipf loads
with one slot per device). Rounding down keeps receivers at or under the mean. A few
1024ths of each expert stay home while balancing, one for each device that may still fill a
slot with it, so that every slot can be filled. Deterministic: ties go to the lower index.

A placement depends only on the load's proportions: `place` scales the load by a power of two
(exact) so that no sum of huge counts overflows and no subnormal load underflows to 0.

The load is `aux.tokens_per_expert` summed over training steps (`accumulate_load` inside a
jitted step, `save_load` to write it). Everything read from disk is untrusted input: a bad
load file is a `LoadError` naming the file and what is wrong, never a traceback. This
module is a runtime library: it imports nothing else from moegen.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

LOAD_FORMAT = "moegen-load-1"
PLACEMENT_FORMAT = "moegen-placement-2"  # the file moegen.load.placement_file reads
MAX_LOAD_BYTES = 16 << 20  # a load file is a few numbers per expert
# The layer splits an expert's copies on a device in 1024ths (moegen.validate.replicas
# holds the same number; this runtime library imports nothing from moegen).
SHARE_UNITS = 1024
# The largest float64's digits: a longer JSON integer is no count, so it is never converted
# (Python refuses over 4300 digits, and converting is quadratic in the length).
MAX_COUNT_DIGITS = 309


class LoadError(ValueError):
    """A load file that cannot be used, with the reason."""


@dataclass(frozen=True)
class Placement:
    """The extra slots of each device: (expert, share in 1024ths) after its home experts."""

    experts: int
    devices: int
    extra: tuple[tuple[tuple[int, int], ...], ...]

    def home_units(self) -> list[int]:
        """Each expert's home share in 1024ths: what its replicas leave."""
        units = [SHARE_UNITS] * self.experts
        for slots in self.extra:
            for expert, share in slots:
                units[expert] -= share
        return units

    def rows(self, load: Sequence[float]) -> list[float]:
        """Each device's expected rows: its home experts' load times their home share and
        its replicas' load times theirs, in 1024ths as the layer splits them."""
        home = self.home_units()
        local = self.experts // self.devices
        out = []
        for device, slots in enumerate(self.extra):
            own = range(device * local, (device + 1) * local)
            # units / 1024 first (exact): load * 1024 could overflow where the rows do not
            rows = sum(load[e] * (home[e] / SHARE_UNITS) for e in own)
            out.append(rows + sum(load[e] * (s / SHARE_UNITS) for e, s in slots))
        return out

    def busiest_over_mean(self, load: Sequence[float]) -> float:
        """The busiest device's rows over the mean (1.0: perfectly even, or no load)."""
        scaled = _scaled([float(v) for v in load])  # the ratio does not depend on the scale
        mean = sum(scaled) / self.devices
        return max(self.rows(scaled)) / mean if mean > 0 else 1.0

    def as_json(self, source: str) -> dict[str, Any]:
        """The placement file the spec names (format moegen-placement-2); units / 1024 is
        exact in binary, so the layer's round(share * 1024) gives the units back."""
        return {
            "format": PLACEMENT_FORMAT,
            "placement": [
                [{"expert": e, "share": units / SHARE_UNITS} for e, units in slots]
                for slots in self.extra
            ],
            "source": source,
        }


def contiguous(experts: int, devices: int) -> Placement:
    """The layout without extra slots: device d holds experts d*E/D .. (d+1)*E/D - 1."""
    _check_request(experts, devices, 0)
    return Placement(experts, devices, ((),) * devices)


def place(load: Sequence[float], devices: int, extra_per_device: int) -> Placement:
    """`extra_per_device` extra slots on each of `devices` devices, chosen for `load` (one
    number per expert) by water-filling towards the mean (the module's docstring)."""
    _check_request(len(load), devices, extra_per_device)
    for expert, value in enumerate(load):
        if not 0 <= value <= sys.float_info.max:  # NaN, inf, or an integer past float64
            raise ValueError(f"load[{expert}] = {value!r:.40}: not a count of copies")
    layout = _Layout(_scaled([float(v) for v in load]), devices, extra_per_device)
    _balance(layout)
    _fill(layout)
    return Placement(len(load), devices, tuple(tuple(slots) for slots in layout.extra))


def _scaled(load: list[float]) -> list[float]:
    """`load` times the power of two that brings its largest count to [0.5, 1): exact."""
    _, exponent = math.frexp(max(load))
    return [math.ldexp(value, -exponent) for value in load]


def _check_request(experts: int, devices: int, extra_per_device: int) -> None:
    if devices < 1 or experts < 1 or experts % devices:
        raise ValueError(f"{experts} experts do not split over {devices} devices")
    if extra_per_device < 0:
        raise ValueError(f"extra slots per device must be >= 0, got {extra_per_device}")
    elsewhere = experts - experts // devices
    if extra_per_device and not elsewhere:
        raise ValueError("one device holds every expert: a replica has nowhere to go")
    if extra_per_device > elsewhere:
        raise ValueError(
            f"{extra_per_device} extra slots per device: a device holds each of the "
            f"{elsewhere} experts that live on other devices once at most"
        )
    if extra_per_device and devices > SHARE_UNITS + 1:
        raise ValueError(
            f"{devices} devices: an expert's replicas take at least 1/{SHARE_UNITS} each, "
            f"so at most {SHARE_UNITS + 1} devices can share one"
        )


class _Layout:
    """The placement being built: extra slots so far, home shares, and each device's rows."""

    def __init__(self, load: Sequence[float], devices: int, per_device: int) -> None:
        self.load, self.devices, self.per_device = load, devices, per_device
        self.local = len(load) // devices
        self.home_units = [SHARE_UNITS] * len(load)
        self.replicas = [0] * len(load)
        self.extra: list[list[tuple[int, int]]] = [[] for _ in range(devices)]
        self.held: list[set[int]] = [set() for _ in range(devices)]
        self.rows = [
            sum(load[device * self.local : (device + 1) * self.local]) for device in range(devices)
        ]

    def home(self, expert: int) -> int:
        return expert // self.local

    def homes(self, device: int) -> range:
        return range(device * self.local, (device + 1) * self.local)

    def may_hold(self, device: int, expert: int) -> bool:
        return (
            len(self.extra[device]) < self.per_device
            and self.home(expert) != device
            and expert not in self.held[device]
        )

    def spare_units(self, expert: int) -> int:
        """The home share a balancing move may take: it keeps back a 1024th for each other
        device that may still fill a slot with this expert after this replica."""
        kept = max(0, self.devices - 2 - self.replicas[expert])
        return self.home_units[expert] - kept

    def give(self, expert: int, device: int, units: int) -> None:
        """A replica of `expert` on `device` taking `units` 1024ths from its home slot."""
        self.home_units[expert] -= units
        self.replicas[expert] += 1
        self.extra[device].append((expert, units))
        self.held[device].add(expert)
        moved = self.load[expert] * units / SHARE_UNITS
        self.rows[self.home(expert)] -= moved
        self.rows[device] += moved


def _busiest(layout: _Layout) -> int:
    return max(range(layout.devices), key=lambda d: (layout.rows[d], -d))


def _balance(layout: _Layout) -> None:
    """Water-filling: the busiest device gives share to a device under the mean, until it is
    within a 1024th of its hottest expert of the mean or can give to nobody. Every move
    fills a slot, so this ends."""
    if not layout.per_device:
        return
    mean = sum(layout.load) / layout.devices
    while True:
        donor = _busiest(layout)
        hottest = max(layout.load[e] for e in layout.homes(donor))
        if layout.rows[donor] - mean <= hottest / SHARE_UNITS:
            return
        move = _donation(layout, donor, mean)
        if move is None:
            return
        layout.give(*move)


def _donation(layout: _Layout, donor: int, mean: float) -> tuple[int, int, int] | None:
    """(expert, receiver, units): of the donor's home experts that someone can take, the
    move that ships the most rows (ties: the heavier expert, then the lower index); None
    when no move helps."""
    moves = []
    for expert in layout.homes(donor):
        move = _move_of(layout, donor, expert, mean)
        if move is not None:
            receiver, units = move
            weight = layout.load[expert]
            moves.append((units * weight, weight, -expert, receiver, units))
    if not moves:
        return None
    _, _, negative_expert, receiver, units = max(moves)
    return -negative_expert, receiver, units


def _move_of(layout: _Layout, donor: int, expert: int, mean: float) -> tuple[int, int] | None:
    """(receiver, units) for a replica of the donor's `expert`, or None. Under the mean:
    the device with the least room that takes all the donor can ship of this expert (best
    fit: the roomier devices stay for other donors), else the least-loaded device, filled to
    the mean. Nobody under the mean: level the pair, never past each other."""
    rows, spare = layout.rows, layout.spare_units(expert)
    unit = layout.load[expert] / SHARE_UNITS
    takers = [d for d in range(layout.devices) if layout.may_hold(d, expert)]
    if spare < 1 or unit <= 0 or not takers:
        return None
    under = [d for d in takers if rows[d] < mean]
    if under:
        wanted = min(rows[donor] - mean, spare * unit)
        fitting = [d for d in under if mean - rows[d] >= wanted]
        if fitting:
            receiver = max(fitting, key=lambda d: (rows[d], -d))
        else:
            receiver = min(under, key=lambda d: (rows[d], d))
        amount = min(wanted, mean - rows[receiver])
        units = max(1, _whole_units(amount, unit, spare))  # down: nobody crosses the mean
    else:
        receiver = min(takers, key=lambda d: (rows[d], d))
        units = _whole_units((rows[donor] - rows[receiver]) / 2, unit, spare)
        if units < 1:
            return None
    return receiver, units


def _whole_units(rows: float, unit: float, spare: int) -> int:
    """`rows` in 1024ths of an expert (`unit` rows each), rounded down, at most `spare`
    (compared first: a tiny unit would overflow the division)."""
    return spare if rows >= spare * unit else math.floor(rows / unit)


def _fill(layout: _Layout) -> None:
    """Every slot still free takes 1/1024 of the expert that leaves the busiest device
    lowest, then the lightest (the fewest rows moved); the least-loaded device first."""
    while True:
        open_devices = [
            d for d in range(layout.devices) if len(layout.extra[d]) < layout.per_device
        ]
        if not open_devices:
            return
        device = min(open_devices, key=lambda d: (layout.rows[d], d))
        candidates = [e for e in range(len(layout.load)) if layout.may_hold(device, e)]
        # The reserve of `spare_units` leaves every candidate a 1024th at home.
        expert = min(candidates, key=lambda e: (_peak_after(layout, e, device), layout.load[e], e))
        layout.give(expert, device, 1)


def _peak_after(layout: _Layout, expert: int, device: int) -> float:
    """The busiest device's rows if `device` took 1/1024 of `expert`."""
    moved = layout.load[expert] / SHARE_UNITS
    home = layout.home(expert)
    changed = {device: layout.rows[device] + moved, home: layout.rows[home] - moved}
    return max(changed.get(d, rows) for d, rows in enumerate(layout.rows))


def read_load(path: Path, experts: int) -> list[float]:
    """The per-expert copies of a load file written by `save_load` (or by hand: a JSON object
    with "tokens_per_expert", one non-negative number per expert, their total a float64)."""
    data = strict_json(_read_regular(path), lambda why: LoadError(f"{path}: {why}"), _count_integer)
    counts = data.get("tokens_per_expert") if isinstance(data, dict) else None
    if not isinstance(counts, list):
        raise LoadError(f'{path}: expected a JSON object with a "tokens_per_expert" list')
    if len(counts) != experts:
        raise LoadError(f"{path}: {len(counts)} counts for a layer of {experts} experts")
    values = [_count(path, index, value) for index, value in enumerate(counts)]
    if not math.isfinite(sum(values)):  # refused, not scaled: the report gives rows in copies
        raise LoadError(f"{path}: tokens_per_expert sums to over {sys.float_info.max:.4g}")
    if not sum(values) > 0:
        raise LoadError(f"{path}: every count is 0: no load to place for")
    return values


def _read_regular(path: Path) -> bytes:
    """At most MAX_LOAD_BYTES + 1 bytes of the regular file `path`, checked before the open (a
    FIFO blocks it for ever) and through the descriptor (moegen.load.spec_file's way)."""
    raw = None
    try:
        if stat.S_ISREG(os.stat(path).st_mode):
            with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as stream:
                if stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                    raw = stream.read(MAX_LOAD_BYTES + 1)
    except (OSError, ValueError) as error:  # ValueError: a NUL in the path
        reason = getattr(error, "strerror", None) or error
        raise LoadError(f"{path}: cannot be read: {reason}") from None
    if raw is None:
        raise LoadError(f"{path}: not a regular file (a directory, a FIFO or a device?)")
    if len(raw) > MAX_LOAD_BYTES:
        raise LoadError(f"{path}: over {MAX_LOAD_BYTES} bytes; a load file is at most that")
    return raw


class _LongInteger(NamedTuple):
    """A JSON integer of over MAX_COUNT_DIGITS digits, left unconverted (no count is one)."""

    digits: int


def strict_json(raw: bytes, refuse: Callable[[str], Exception], parse_int: Any = int) -> Any:
    """JSON read back from disk, `refuse`d when it is none or holds a key twice in one object
    (which was meant? not last-wins). moegen.load's placement-file reader uses it too."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for key, value in pairs:
            if key in data:
                raise refuse(f"the key {key!r:.60} appears twice in one object")
            data[key] = value
        return data

    try:
        return json.loads(raw, object_pairs_hook=unique, parse_int=parse_int)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise refuse(f"not JSON: {str(error)[:200]}") from None


def _count_integer(text: str) -> int | _LongInteger:
    return int(text) if len(text) <= MAX_COUNT_DIGITS else _LongInteger(len(text.lstrip("-")))


def _count(path: Path, index: int, value: Any) -> float:
    """tokens_per_expert[index] as a float64, or a LoadError saying why it is no count."""
    where = f"{path}: tokens_per_expert[{index}]"
    largest = f"a count is at most {sys.float_info.max:.4g}, the largest float64"
    if isinstance(value, _LongInteger):
        raise LoadError(f"{where} is a {value.digits}-digit number: too long ({largest})")
    if type(value) not in (int, float) or not value >= 0:  # NaN is not >= 0
        raise LoadError(f"{where} = {value!r:.40}: not a count")
    if not value <= sys.float_info.max:  # inf, or an integer that float() would not take
        raise LoadError(f"{where} = {value!r:.40}: too large ({largest})")
    return float(value)


def save_load(path: Path, tokens_per_expert: Any, steps: int) -> None:
    """Write the summed `aux.tokens_per_expert` of `steps` steps as a load file."""
    counts = [float(v) for v in list(tokens_per_expert)]
    record = {"format": LOAD_FORMAT, "steps": int(steps), "tokens_per_expert": counts}
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")


def accumulate_load(total: Any, tokens_per_expert: Any) -> Any:
    """total + this step's counts, in float32 (jit-friendly: an int32 sum of a long run
    would overflow; float32 keeps the shares the placement uses to ~1e-7 per step)."""
    import jax.numpy as jnp

    return total + tokens_per_expert.astype(jnp.float32)
