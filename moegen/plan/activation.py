"""The gated activation's parameters as the module runs them (clamps, their place, sigmoid
scale, up offset), for the routed experts and, where it has its own, the shared expert."""

from __future__ import annotations

from dataclasses import dataclass

from moegen.spec import Glu


@dataclass(frozen=True)
class GluPlan:
    """The gated activation's parameters; None: that part is plain (no clamp, scale 1,
    offset 0), and the module has no constant for it."""

    gate_limit: float | None  # the gate clamped to at most this
    up_limit: float | None  # up clamped to [-up_limit, up_limit]
    sigmoid_scale: float | None  # swiglu: gate * sigmoid(sigmoid_scale * gate)
    up_offset: float | None  # added to up before the product
    clamp_after: bool  # gate_limit clamps the activated gate, not the pre-activation
    gate_softcap: float | None  # swiglu's linear gate factor soft-capped: cap * tanh(g / cap)
    up_softcap: float | None  # up soft-capped: cap * tanh(up / cap)
    preset: str | None  # the spec's preset name (gpt_oss), for the docstring


def glu_plan(glu: Glu | None, written: Glu | str | None) -> GluPlan | None:
    """The activation parameters `glu`, resolved from what the spec `written` (a preset's
    name, for the docstring)."""
    if glu is None:
        return None
    return GluPlan(
        gate_limit=glu.gate_limit,
        up_limit=glu.up_limit,
        sigmoid_scale=None if glu.sigmoid_scale == 1.0 else glu.sigmoid_scale,
        up_offset=None if glu.up_offset == 0.0 else glu.up_offset,
        clamp_after=glu.gate_limit is not None and glu.gate_clamp == "after_activation",
        gate_softcap=glu.gate_softcap,
        up_softcap=glu.up_softcap,
        preset=written if isinstance(written, str) else None,
    )
