"""Rules of multi-slice meshes: which axes cross the data-center network, and how far.

A slice is a set of chips joined by fast inter-chip links (ICI); slices are joined by the
data-center network (DCN), an order of magnitude slower. Each mesh axis is split into an
in-slice part and a cross-slice part (`mesh.dcn_axes`).
"""

from __future__ import annotations

import math

from moegen.diagnostics import Diagnostic
from moegen.hardware import hardware
from moegen.load import LoadedSpec
from moegen.sizes import divisors, listed


def slices_need_a_tpu_target(loaded: LoadedSpec) -> list[Diagnostic]:
    """Only TPU targets come in slices; the cpu target is one host."""
    target = loaded.spec.target
    if target.slices == 1 or hardware(target.hardware).platform == "tpu":
        return []
    return [
        loaded.diagnostic(
            ("target", "slices"),
            f"{target.hardware} has no slices; remove target.slices or pick a TPU target",
        )
    ]


def dcn_axes_split_mesh_axes(loaded: LoadedSpec) -> list[Diagnostic]:
    """Each cross-slice part names a mesh axis and divides its size."""
    mesh = loaded.spec.mesh
    out = []
    for name, parts in (mesh.dcn_axes or {}).items():
        path = ("mesh", "dcn_axes", name)
        if name not in mesh.axes:
            known = ", ".join(mesh.axes)
            out.append(
                loaded.diagnostic(
                    path, at_key=True, message=f"'{name}' is not a mesh axis (mesh.axes: {known})"
                )
            )
        elif mesh.axes[name] % parts:
            # by pairs up to the square root: an axis can be any size up to 2**31 here
            valid = listed(divisors(mesh.axes[name]), parts)
            out.append(
                loaded.diagnostic(
                    path,
                    f"{name} = {mesh.axes[name]} does not split into {parts} slices; "
                    f"valid: {valid}",
                )
            )
    return out


def dcn_axes_span_the_slices(loaded: LoadedSpec) -> list[Diagnostic]:
    """The cross-slice parts multiply to the number of slices: one mesh position per slice."""
    spec = loaded.spec
    dcn = spec.mesh.dcn_axes
    slices = spec.target.slices
    if hardware(spec.target.hardware).platform != "tpu":
        return []  # slices_need_a_tpu_target says what to change
    if dcn is None:
        if slices == 1:
            return []
        return [
            loaded.diagnostic(
                ("target", "slices"),
                f"{slices} slices, but mesh.dcn_axes does not say which axes cross them; add "
                f"e.g. dcn_axes: {{data: {slices}}} under mesh",
            )
        ]
    product = math.prod(dcn.values())
    if product == slices:
        return []
    return [
        loaded.diagnostic(
            ("mesh", "dcn_axes"),
            at_key=True,
            message=f"the cross-slice parts multiply to {product} but target.slices is "
            f"{slices}; make them equal",
        )
    ]


def dcn_fields_need_a_tpu_target(loaded: LoadedSpec) -> list[Diagnostic]:
    """mesh.dcn_axes and expert_over_dcn describe TPU slices; elsewhere they would be ignored."""
    spec = loaded.spec
    target = spec.target.hardware
    if hardware(target).platform == "tpu" or spec.target.slices > 1:
        return []  # with slices, slices_need_a_tpu_target says what to change
    fields = [
        ("dcn_axes", spec.mesh.dcn_axes is not None),
        ("expert_over_dcn", spec.mesh.expert_over_dcn),
    ]
    return [
        loaded.diagnostic(
            ("mesh", name),
            at_key=True,
            message=f"{name} describes how mesh axes cross TPU slices; target {target} has "
            "none, so it would be ignored: remove it",
        )
        for name, written in fields
        if written
    ]


def expert_axis_stays_in_a_slice(loaded: LoadedSpec) -> list[Diagnostic]:
    """Token exchanges between experts are the layer's heaviest traffic: keep them on ICI."""
    mesh = loaded.spec.mesh
    parts = (mesh.dcn_axes or {}).get("expert", 1)
    if parts == 1 or mesh.expert_over_dcn or "expert" not in mesh.axes:
        return []
    return [
        loaded.diagnostic(
            ("mesh", "dcn_axes", "expert"),
            f"splitting the expert axis over {parts} slices sends every token exchange over the "
            "data-center network, about 10x slower than the links inside a slice; cross "
            "slices with data (or fsdp) instead, or set mesh.expert_over_dcn: true to accept it",
        )
    ]


SLICE_RULES = (
    dcn_fields_need_a_tpu_target,
    slices_need_a_tpu_target,
    dcn_axes_split_mesh_axes,
    dcn_axes_span_the_slices,
    expert_axis_stays_in_a_slice,
)
