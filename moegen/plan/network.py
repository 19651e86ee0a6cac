"""Communication per device, split into the links inside a slice (ICI) and between slices (DCN).

Every collective of forward+backward is listed with the bytes one device receives. A
collective over an axis of size n = i (in a slice) x d (across slices) runs hierarchically:
  gather-type (all-gather, reduce-scatter, all-reduce): a device receives T in all, of which
    the cross-slice step is T * (d - 1) / (n - 1) (each device exchanges its 1/n share with
    the d - 1 slices) and the rest moves inside the slice;
  all-to-all: T is spread evenly over the n - 1 peers, n - i of them in other slices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from moegen.plan.costs import DTYPE_BYTES
from moegen.plan.experts import ExpertPlan
from moegen.plan.params import ParamPlan
from moegen.strategies import strategy


@dataclass(frozen=True)
class Transfer:
    """One collective of forward+backward, per device."""

    name: str
    axis: str
    kind: str  # "gather" (all-gather / reduce-scatter / all-reduce) or "all-to-all"
    ici_bytes: int
    dcn_bytes: int


@dataclass(frozen=True)
class NetworkPlan:
    slices: int
    ici_mesh_shape: tuple[int, ...]  # per mesh axis, the part inside a slice
    dcn_mesh_shape: tuple[int, ...]  # per mesh axis, the part across slices
    transfers: tuple[Transfer, ...]
    ici_bytes: int
    dcn_bytes: int


def split(total: int, kind: str, ici: int, dcn: int) -> tuple[int, int]:
    """(ICI, DCN) bytes of a collective whose device receives `total` bytes over an axis of
    `ici` in-slice x `dcn` cross-slice devices."""
    n = ici * dcn
    if n == 1 or total == 0:
        return 0, 0
    crossing = (dcn - 1) if kind == "gather" else (n - ici)
    dcn_bytes = total * crossing // (n - 1)
    return total - dcn_bytes, dcn_bytes


def network_plan(
    params: tuple[ParamPlan, ...],
    experts: ExpertPlan,
    mesh_axes: dict[str, int],
    dcn_axes: dict[str, int],
    slices: int,
    param_dtype: str,
    *,
    regather_sliced: bool = False,
    token_chunks: int = 1,
    tensor_sum_bytes: int = 0,
) -> NetworkPlan:
    """`tensor_sum_bytes`: one device's layer output [local tokens, D] in the compute dtype,
    which the tensor shards sum (forward) as they sum the input's gradient (backward);
    `token_chunks`: how many times sliced weights are gathered (`regather_sliced`)."""
    ici_shape = {a: n // dcn_axes.get(a, 1) for a, n in mesh_axes.items()}
    flows: list[tuple[str, str, str, int]] = []  # name, axis, kind, bytes received
    fsdp = mesh_axes.get("fsdp", 1)
    if fsdp > 1:
        flows.extend(_fsdp_flows(params, fsdp, token_chunks if regather_sliced else 0))
    for axis, size in mesh_axes.items():
        if size == 1:
            continue
        # Gradients of parameters replicated over this axis are summed over it (all-reduce);
        # those sharded over it (fsdp's gathered weights) are reduce-scattered above.
        replicated = sum(
            math.prod(p.local_shape) * DTYPE_BYTES[param_dtype]
            for p in params
            if axis not in _axes_of(p)
        )
        if replicated:
            reduce = 2 * replicated * (size - 1) // size
            flows.append((f"gradient all-reduce over {axis}", axis, "gather", reduce))
    tensor = mesh_axes.get("tensor", 1)
    if tensor > 1:
        summed = 2 * tensor_sum_bytes * (tensor - 1) // tensor
        flows.append(("tensor all-reduce of the output, forward", "tensor", "gather", summed))
        flows.append(("tensor all-reduce of the input gradient", "tensor", "gather", summed))
    kind = strategy(experts.strategy).collective
    if kind is not None:
        forward = dict(experts.communication_bytes)[experts.strategy]
        flows.append((f"{experts.strategy} tokens, forward", "expert", kind, forward))
        flows.append((f"{experts.strategy} tokens, backward", "expert", kind, forward))
    transfers = []
    for name, axis, kind, total in flows:
        ici, dcn = split(total, kind, ici_shape[axis], dcn_axes.get(axis, 1))
        transfers.append(Transfer(name, axis, kind, ici, dcn))
    return NetworkPlan(
        slices=slices,
        ici_mesh_shape=tuple(ici_shape.values()),
        dcn_mesh_shape=tuple(dcn_axes.get(a, 1) for a in mesh_axes),
        transfers=tuple(transfers),
        ici_bytes=sum(t.ici_bytes for t in transfers),
        dcn_bytes=sum(t.dcn_bytes for t in transfers),
    )


def _fsdp_flows(
    params: tuple[ParamPlan, ...], fsdp: int, regathers: int
) -> list[tuple[str, str, str, int]]:
    """The fsdp gathers of the weights (forward) and reduce-scatters of their gradients
    (backward); `regathers`: how many times each sliced weight is gathered in the forward
    pass, and again in the backward pass, which recomputes its slice (the token chunks when
    the FFN is sliced under fsdp: each chunk gathers every slice; 0: gathered once, whole)."""

    def gathered(sliced: bool) -> int:
        return sum(
            math.prod(p.local_shape) * DTYPE_BYTES[p.use_dtype]
            for p in params
            if p.gather_axis is not None and (p.ffn_axis is not None) == sliced
        )

    once = (gathered(False) + gathered(True) * max(regathers, 1)) * (fsdp - 1)
    flows = [
        ("fsdp weight all-gather", "fsdp", "gather", once),
        ("fsdp gradient reduce-scatter", "fsdp", "gather", once),
    ]
    if regathers:
        again = gathered(True) * regathers * (fsdp - 1)
        flows.append(("fsdp weight all-gather again, backward", "fsdp", "gather", again))
    return flows


def _axes_of(param: ParamPlan) -> set[str]:
    axes: set[str] = set()
    for entry in param.partition:
        if isinstance(entry, tuple):
            axes.update(entry)
        elif entry is not None:
            axes.add(entry)
    return axes
