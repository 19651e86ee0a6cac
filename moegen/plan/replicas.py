"""Redundant expert slots (parallelism.redundant_experts): where each replica sits, how an
expert's copies split over its replicas, and how the replicas' weights reach their slots.

Device d of the expert axis holds its LOCAL_EXPERTS home experts (d * LOCAL_EXPERTS ...)
in its first slots, then EXTRA_SLOTS replicas. A device splits its own copies of an expert
by their rank among them: the home slot takes the first (1024 - sum of the replicas'
shares) 1024ths, each replica the next share, in the placement's order. The split is
static and deterministic, so every buffer keeps its certified size: a token still sends at
most one copy to each of its top_k experts, and a device holds distinct experts, so a
device receives at most min(top_k, LOCAL_SLOTS) copies of a token.

The replicas' weights move once per step: each goes from its expert's home device to its
slot's device by jax.lax.ppermute, in rounds where a device sends at most one expert and
receives at most one (a proper colouring of the owner -> holder pairs, greedy: at most
2 * most pairs of one device - 1 rounds). Their gradients go back the same way and add
into the expert's own: parameters, checkpoints and optimizers see num_experts experts.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

from moegen.load import LoadedSpec
from moegen.plan.costs import DTYPE_BYTES
from moegen.plan.params import ParamPlan, routed_expert_param
from moegen.spec_parallelism import SHARE_UNITS

Round = tuple[tuple[int, ...], tuple[tuple[int, int], ...]]


@dataclass(frozen=True)
class ReplicaPlan:
    """The replicas of one layer (none: `extra_per_device` 0 and every table empty)."""

    extra_per_device: int = 0
    local_slots: int = 0  # home experts + extra slots of one device
    slots: int = 0  # over the expert axis
    # per device: the experts of its extra slots, and their shares in 1024ths
    experts: tuple[tuple[int, ...], ...] = ()
    shares: tuple[tuple[int, ...], ...] = ()
    # expert -> ((slot, first 1024th of the expert's copies it takes), ...), after the home
    # slot (which takes those below the first), for each expert with replicas
    split: tuple[tuple[int, tuple[tuple[int, int], ...]], ...] = ()
    # per round: the local expert each device sends (0 where it sends none) and the
    # (home device, holder) pairs of the ppermute
    rounds: tuple[Round, ...] = ()
    arrivals: tuple[tuple[int, ...], ...] = ()  # per device, per extra slot: its round
    weight_bytes: int = 0  # one expert's FFN weights as used, on one device
    moved_bytes: int = 0  # forward, per device: the replicas' weights it receives
    share_units: int = SHARE_UNITS
    weights: tuple[str, ...] = ()  # the layer's expert weights (by use name) the slots take

    @property
    def active(self) -> bool:
        return self.extra_per_device > 0


def expert_weights(params: tuple[ParamPlan, ...]) -> list[ParamPlan]:
    """The routed experts' FFN weights, biases and output norm weights, one block per expert
    (not the router's per-expert vectors: the router reads them by expert id before any copy
    leaves)."""
    return [p for p in params if routed_expert_param(p.shape_names)]


def expert_bytes(params: tuple[ParamPlan, ...], fsdp: int) -> int:
    """One expert's FFN weights on one device as the layer uses them (cast, fsdp gathered)."""
    return sum(
        math.prod(p.local_shape[1:])
        * (fsdp if p.gather_axis is not None else 1)
        * DTYPE_BYTES[p.use_dtype]
        for p in expert_weights(params)
    )


def replica_plan(loaded: LoadedSpec, params: tuple[ParamPlan, ...]) -> ReplicaPlan:
    """The replicas the spec places (a validated spec) of the experts' `params`."""
    spec = loaded.spec
    placement = spec.parallelism.replica_slots
    extra = spec.parallelism.redundant_experts
    if not extra:
        return ReplicaPlan()
    shards = spec.mesh.axes["expert"]
    local = spec.layer.num_experts // shards
    per_device = extra // shards
    local_slots = local + per_device
    experts = tuple(tuple(r.expert for r in device) for device in placement)
    shares = tuple(tuple(round(r.share * SHARE_UNITS) for r in device) for device in placement)
    rounds, arrivals = _rounds(experts, local, shards)
    return ReplicaPlan(
        extra_per_device=per_device,
        local_slots=local_slots,
        slots=shards * local_slots,
        experts=experts,
        shares=shares,
        split=_split(experts, shares, local, local_slots),
        rounds=rounds,
        arrivals=arrivals,
        weight_bytes=(weight := expert_bytes(params, spec.mesh.axes.get("fsdp", 1))),
        moved_bytes=per_device * weight,
        weights=tuple(p.use_name for p in expert_weights(params) if p.use_name),
    )


def _split(
    experts: tuple[tuple[int, ...], ...],
    shares: tuple[tuple[int, ...], ...],
    local: int,
    local_slots: int,
) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
    """For each expert with replicas: its replicas' slots and where their shares start, the
    home slot first (it keeps what the replicas leave)."""
    replicas: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for device, (held, units) in enumerate(zip(experts, shares, strict=True)):
        for slot, (expert, share) in enumerate(zip(held, units, strict=True)):
            replicas[expert].append((device * local_slots + local + slot, share))
    out = []
    for expert in sorted(replicas):
        start = SHARE_UNITS - sum(share for _, share in replicas[expert])
        starts = []
        for slot, share in replicas[expert]:
            starts.append((slot, start))
            start += share
        out.append((expert, tuple(starts)))
    return tuple(out)


def _rounds(
    experts: tuple[tuple[int, ...], ...], local: int, shards: int
) -> tuple[tuple[Round, ...], tuple[tuple[int, ...], ...]]:
    """ppermute rounds moving each replica's weights from its home device to its holder:
    in a round each device sends at most one expert and receives at most one."""
    transfers = [
        (expert // local, holder, expert, slot)
        for holder, held in enumerate(experts)
        for slot, expert in enumerate(held)
    ]
    colour = _edge_colouring([(home, holder) for home, holder, _, _ in transfers])
    count = max(colour, default=-1) + 1
    sends: list[dict[int, tuple[int, int]]] = [{} for _ in range(count)]
    arrivals = [[0] * len(held) for held in experts]
    for (home, holder, expert, slot), round_ in zip(transfers, colour, strict=True):
        sends[round_][home] = (holder, expert)
        arrivals[holder][slot] = round_
    rounds = tuple(
        (
            tuple(by_home[d][1] % local if d in by_home else 0 for d in range(shards)),
            tuple(sorted((home, holder) for home, (holder, _) in by_home.items())),
        )
        for by_home in sends
    )
    return rounds, tuple(tuple(a) for a in arrivals)


def _edge_colouring(pairs: list[tuple[int, int]]) -> list[int]:
    """A colour (round) for each (sender, receiver) pair such that no sender and no receiver
    has two pairs of one colour, with as many colours as the most pairs at one device (Konig:
    a bipartite multigraph needs no more). Each pair takes a colour free at its sender; where
    that colour is taken at its receiver, the path of pairs alternating it with a colour free
    there swaps the two first (it cannot reach the sender)."""
    degree = max(
        (n for side in (0, 1) for n in Counter(p[side] for p in pairs).values()), default=0
    )
    at: dict[tuple[int, int], list[int | None]] = {}  # (side, device) -> pair of each colour
    colour: list[int] = [0] * len(pairs)

    def slots(side: int, device: int) -> list[int | None]:
        return at.setdefault((side, device), [None] * degree)

    for index, (sender, receiver) in enumerate(pairs):
        a = slots(0, sender).index(None)
        b = slots(1, receiver).index(None)
        if slots(1, receiver)[a] is not None:
            _swap_path(at, pairs, colour, (1, receiver), a, b)
        colour[index] = a
        slots(0, sender)[a] = slots(1, receiver)[a] = index
    return colour


def _swap_path(
    at: dict[tuple[int, int], list[int | None]],
    pairs: list[tuple[int, int]],
    colour: list[int],
    start: tuple[int, int],
    a: int,
    b: int,
) -> None:
    """Swap colours a and b along the path from `start` that alternates a, b, a, ..."""
    path, node, wanted = [], start, a
    while (index := at[node][wanted]) is not None:
        path.append(index)
        side, _ = node
        node = (1 - side, pairs[index][1 - side])
        wanted = b if wanted == a else a
    for index in path:
        for side in (0, 1):
            at[(side, pairs[index][side])][colour[index]] = None
    for index in path:
        colour[index] = b if colour[index] == a else a
        for side in (0, 1):
            at[(side, pairs[index][side])][colour[index]] = index
