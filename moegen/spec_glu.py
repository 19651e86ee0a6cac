"""The gated activation's parameters (layer.glu, layer.shared_glu) and their presets."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from moegen.spec_placement import _Section

Limit = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]


class Glu(_Section):
    """The gated activation's parameters: hidden = act(gate) * (up + up_offset)."""

    gate_limit: Limit | None = Field(
        None, description="Clamp the gate pre-activation to at most this (none: no clamp)."
    )
    up_limit: Limit | None = Field(
        None, description="Clamp the up pre-activation to [-up_limit, up_limit] (none: no clamp)."
    )
    sigmoid_scale: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = Field(
        1.0,
        description="swiglu only: silu(g) = g * sigmoid(g) becomes g * sigmoid(sigmoid_scale * g) "
        "(gpt-oss: 1.702).",
    )
    up_offset: Annotated[float, Field(ge=-1e6, le=1e6, allow_inf_nan=False)] = Field(
        0.0, description="Added to the (clamped) up projection before the product (gpt-oss: 1)."
    )
    gate_softcap: Limit | None = Field(
        None,
        description="swiglu only: soft-cap the linear gate factor, silu(g) = g * sigmoid(g) "
        "becomes cap * tanh(g / cap) * sigmoid(g) (the sigmoid sees the raw gate; Inkling2's "
        "mlp_gate_softcap). Omit: none.",
    )
    up_softcap: Limit | None = Field(
        None,
        description="Soft-cap up: cap * tanh(up / cap), after its clamp and before the "
        "offset (Inkling2's mlp_up_softcap). Omit: none.",
    )
    gate_clamp: Literal["before_activation", "after_activation"] = Field(
        "before_activation",
        description="Where gate_limit clamps: the gate pre-activation, act(min(gate, limit)) "
        "(gpt-oss, DeepSeek-V4, HY-V4), or the activated gate, min(act(gate), limit) "
        "(Step 3.7).",
    )


# gpt-oss's experts (transformers models/gpt_oss: swiglu_limit 7.0, alpha 1.702, (up + 1)).
GLU_PRESETS = {"gpt_oss": Glu(gate_limit=7.0, up_limit=7.0, sigmoid_scale=1.702, up_offset=1.0)}
