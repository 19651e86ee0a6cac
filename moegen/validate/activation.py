"""Rules of the experts' activation and the shared expert's gate.

Each refusal is a parameter that would silently do nothing: a clamp on a gate that does not
exist, a sigmoid scale on an activation with no sigmoid, a gate on a shared expert that is
not there, or a `glu` section that changes nothing.
"""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec
from moegen.spec import GATED_ACTIVATIONS


def glu_needs_a_gated_activation(loaded: LoadedSpec) -> list[Diagnostic]:
    """Clamps, sigmoid scale and offset are parameters of act(gate) * up."""
    layer = loaded.spec.layer
    glu = layer.glu_params
    if glu is None:
        return []
    if layer.activation not in GATED_ACTIVATIONS:
        return [
            loaded.diagnostic(
                ("layer", "glu"),
                at_key=True,
                message=f"activation {layer.activation} has no gate: glu's clamps, scale and "
                "offset shape act(gate) * (up + offset) of swiglu or geglu; remove glu or "
                "use activation: swiglu",
            )
        ]
    if layer.activation == "geglu" and glu.sigmoid_scale != 1.0:
        return [
            loaded.diagnostic(
                ("layer", "glu", "sigmoid_scale"),
                "geglu's gelu has no sigmoid to scale (it is swiglu's silu(g) = g * "
                "sigmoid(g)); remove sigmoid_scale or use activation: swiglu",
            )
        ]
    if glu == type(glu)():
        return [
            loaded.diagnostic(
                ("layer", "glu"),
                at_key=True,
                message="this glu changes nothing (no clamp, sigmoid_scale 1, up_offset 0); "
                "remove it, or set gate_limit, up_limit, sigmoid_scale or up_offset",
            )
        ]
    return []


def shared_expert_gate_needs_a_shared_expert(loaded: LoadedSpec) -> list[Diagnostic]:
    """The gate scales the shared expert's output: without one it gates nothing."""
    layer = loaded.spec.layer
    if not layer.shared_expert_gate or layer.shared_ffn_dim:
        return []
    return [
        loaded.diagnostic(
            ("layer", "shared_expert_gate"),
            "there is no shared expert to gate; set layer.shared_ffn_dim (its hidden width) "
            "or remove shared_expert_gate",
        )
    ]


ACTIVATION_RULES = (glu_needs_a_gated_activation, shared_expert_gate_needs_a_shared_expert)
