"""Rules of redundant expert slots (parallelism.redundant_experts and its placement): the
slots split evenly over the expert axis, a strategy that can carry them, and a placement
that names, for every device, experts it does not already hold, with shares that leave each
expert's home slot a share of its own."""

from __future__ import annotations

from collections import Counter

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec
from moegen.sizes import axes_product
from moegen.spec_parallelism import SHARE_UNITS
from moegen.strategies import strategy
from moegen.validate.bounds import known_batch_axes

INT32_LIMIT = 2**31


def redundant_experts_have_somewhere_to_go(loaded: LoadedSpec) -> list[Diagnostic]:
    """Redundant slots need an expert axis, a strategy that carries them, an equal number
    on every device, and whole FFNs (FFN slices gather their weights slice by slice)."""
    spec = loaded.spec
    extra = spec.parallelism.redundant_experts
    shards = spec.mesh.axes.get("expert", 1)
    at = ("parallelism", "redundant_experts")
    if extra == 0:
        return []
    name = spec.parallelism.experts
    if not strategy(name).carries_replicas:
        return [
            loaded.diagnostic(
                at,
                f"strategy {name} cannot carry redundant experts yet: set parallelism.experts: "
                "ragged_all_to_all, or remove redundant_experts",
            )
        ]
    if shards == 1:
        return []  # a strategy that carries replicas exchanges over an expert axis: its rule
    out = []
    if extra % shards:
        fewer, more = extra // shards * shards, (extra // shards + 1) * shards
        nearest = f"{fewer} or {more}" if fewer else f"{more}"
        out.append(
            loaded.diagnostic(
                at,
                f"{extra} redundant experts do not split evenly over expert {shards}: every "
                f"device gets the same number of extra slots; use {nearest}",
            )
        )
    if (spec.memory.ffn_chunks or 1) > 1:
        out.append(
            loaded.diagnostic(
                ("memory", "ffn_chunks"),
                "FFN slices cannot carry redundant experts yet (each slice gathers its "
                "weights again): remove ffn_chunks, or remove redundant_experts",
            )
        )
    # batch axes the mesh lacks are refused by their own rule; not counted here
    token_shards = axes_product(spec.mesh.axes, known_batch_axes(loaded)) * spec.sequence_shards
    rows = spec.shapes.batch * spec.shapes.seq_len // token_shards * spec.router.top_k
    if rows * SHARE_UNITS >= INT32_LIMIT:
        out.append(
            loaded.diagnostic(
                at,
                f"{rows} routed copies a device: the split of an expert's copies counts them in "
                f"{SHARE_UNITS}ths in int32; at most {INT32_LIMIT // SHARE_UNITS - 1} copies",
            )
        )
    return out


def placement_matches_the_slots(loaded: LoadedSpec) -> list[Diagnostic]:
    """A placement exactly when there are redundant slots: one list per device of the
    expert axis, each as long as its extra slots."""
    parallelism = loaded.spec.parallelism
    extra, placement = parallelism.redundant_experts, parallelism.replica_slots
    shards = loaded.spec.mesh.axes.get("expert", 1)
    at = ("parallelism", "placement")
    if extra and shards == 1:
        return []  # said by the strategy's rules
    if extra == 0:
        if parallelism.placement is None:
            return []
        message = "a placement without redundant experts places nothing: remove it, or set "
        return [loaded.diagnostic(at, message + "parallelism.redundant_experts")]
    if not placement:
        return [
            loaded.diagnostic(
                ("parallelism", "redundant_experts"),
                "redundant experts need a placement: which experts the extra slots hold and "
                "on which devices (`moegen rebalance SPEC --load FILE --out placement.json`, "
                "then placement: placement.json)",
            )
        ]
    if extra % shards:
        return []  # said by redundant_experts_have_somewhere_to_go
    per_device = extra // shards
    if len(placement) != shards:
        return [loaded.diagnostic(at, f"{len(placement)} devices for expert {shards}")]
    return [
        loaded.diagnostic(
            (*at, device),
            f"device {device} has {len(slots)} extra slots; redundant_experts {extra} over "
            f"expert {shards} gives each {per_device}",
        )
        for device, slots in enumerate(placement)
        if len(slots) != per_device
    ]


def replicas_are_new_experts(loaded: LoadedSpec) -> list[Diagnostic]:
    """Each extra slot holds an expert of the layer that its device does not hold already."""
    spec = loaded.spec
    experts, shards = spec.layer.num_experts, spec.mesh.axes.get("expert", 1)
    if spec.parallelism.redundant_experts == 0 or experts % shards:
        return []
    local = experts // shards
    out = []
    for device, slots in enumerate(spec.parallelism.replica_slots):
        seen: set[int] = set()
        for slot, replica in enumerate(slots):
            at = ("parallelism", "placement", device, slot, "expert")
            if replica.expert >= experts:
                problem = f"expert {replica.expert}: the layer has experts 0..{experts - 1}"
            elif replica.expert // local == device:
                problem = (
                    f"expert {replica.expert} is already on device {device} (it holds experts "
                    f"{device * local}..{device * local + local - 1}): a replica there splits "
                    "nothing; place it on another device"
                )
            elif replica.expert in seen:
                problem = f"expert {replica.expert} twice on device {device}: one slot suffices"
            else:
                seen.add(replica.expert)
                continue
            out.append(loaded.diagnostic(at, problem))
    return out


def shares_leave_a_home_share(loaded: LoadedSpec) -> list[Diagnostic]:
    """Each replica takes at least 1/1024 of its expert's copies, and an expert's replicas
    together at most all of them (its home slot keeps the rest)."""
    totals: Counter[int] = Counter()
    out = []
    for device, slots in enumerate(loaded.spec.parallelism.replica_slots):
        for slot, replica in enumerate(slots):
            units = round(replica.share * SHARE_UNITS)
            totals[replica.expert] += units
            if units == 0:
                at = ("parallelism", "placement", device, slot, "share")
                message = f"share {replica.share} rounds to 0 of {SHARE_UNITS}ths: at least "
                out.append(loaded.diagnostic(at, message + f"{1 / SHARE_UNITS:.6f}"))
    for expert, units in sorted(totals.items()):
        if units > SHARE_UNITS:
            out.append(
                loaded.diagnostic(
                    ("parallelism", "placement"),
                    f"expert {expert}'s replicas take {units / SHARE_UNITS:.4f} of its copies "
                    "together; at most 1 (its home slot keeps the rest)",
                )
            )
    return out


REPLICA_RULES = (
    redundant_experts_have_somewhere_to_go,
    placement_matches_the_slots,
    replicas_are_new_experts,
    shares_leave_a_home_share,
)
