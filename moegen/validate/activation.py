"""Rules of the experts' activation and the shared expert's gate.

Each refusal is a parameter that would silently do nothing: a clamp on a gate that does not
exist, a sigmoid scale on an activation with no sigmoid, a gate on a shared expert that is
not there, or a `glu` section that changes nothing.
"""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec
from moegen.spec import GATED_ACTIVATIONS, Glu


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
    return _glu_problems(loaded, ("layer", "glu"), glu)


def _glu_problems(loaded: LoadedSpec, path: tuple[str, ...], glu: Glu) -> list[Diagnostic]:
    """A glu (the routed experts' or the shared expert's) whose parameters do something."""
    name = path[-1]
    if loaded.spec.layer.activation == "geglu" and glu.sigmoid_scale != 1.0:
        return [
            loaded.diagnostic(
                (*path, "sigmoid_scale"),
                "geglu's gelu has no sigmoid to scale (it is swiglu's silu(g) = g * "
                "sigmoid(g)); remove sigmoid_scale or use activation: swiglu",
            )
        ]
    if glu.gate_softcap is not None and (
        loaded.spec.layer.activation != "swiglu" or glu.sigmoid_scale != 1.0
    ):
        return [
            loaded.diagnostic(
                (*path, "gate_softcap"),
                "gate_softcap caps the linear factor g of swiglu's g * sigmoid(g), with the "
                "sigmoid unscaled; "
                + (
                    "remove sigmoid_scale"
                    if loaded.spec.layer.activation == "swiglu"
                    else "use activation: swiglu without sigmoid_scale"
                )
                + ", or remove gate_softcap",
            )
        ]
    if glu.gate_clamp != "before_activation" and glu.gate_limit is None:
        return [
            loaded.diagnostic(
                (*path, "gate_clamp"),
                f"gate_clamp says where gate_limit clamps, and this {name} has no gate_limit; "
                "set gate_limit or remove gate_clamp",
            )
        ]
    if glu.model_copy(update={"gate_clamp": "before_activation"}) == Glu():
        return [
            loaded.diagnostic(
                path,
                at_key=True,
                message=f"this {name} changes nothing (no clamp, sigmoid_scale 1, up_offset "
                "0); remove it, or set gate_limit, up_limit, sigmoid_scale or up_offset",
            )
        ]
    return []


def gelu_approximation_needs_a_gelu(loaded: LoadedSpec) -> list[Diagnostic]:
    """The tanh approximation is of GELU: other activations have nothing to approximate."""
    layer = loaded.spec.layer
    if layer.gelu_approximation == "none" or layer.activation in ("gelu", "geglu"):
        return []
    return [
        loaded.diagnostic(
            ("layer", "gelu_approximation"),
            f"activation {layer.activation} has no GELU to approximate; use activation: geglu "
            "(or gelu) with it, or remove gelu_approximation",
        )
    ]


def shared_glu_has_a_shared_expert_to_change(loaded: LoadedSpec) -> list[Diagnostic]:
    """shared_glu gives the shared expert other activation parameters than the routed ones:
    there must be a gated shared expert, and the parameters must differ."""
    layer = loaded.spec.layer
    if layer.shared_glu is None:
        return []
    path = ("layer", "shared_glu")
    if not layer.shared_ffn_dim:
        why = "there is no shared expert; set layer.shared_ffn_dim (its hidden width) or"
    elif layer.activation not in GATED_ACTIVATIONS:
        why = f"activation {layer.activation} has no gate to clamp or scale"
    elif layer.shared_glu_params == layer.glu_params:
        why = "the shared expert already uses these parameters (those of layer.glu)"
    elif isinstance(layer.shared_glu, Glu):
        return _glu_problems(loaded, path, layer.shared_glu)
    else:
        return []
    fix = " remove shared_glu" if why.endswith(" or") else "; remove shared_glu"
    return [loaded.diagnostic(path, at_key=True, message=why + fix)]


def shared_expert_gate_needs_a_shared_expert(loaded: LoadedSpec) -> list[Diagnostic]:
    """The gate scales the shared expert's output, the biases follow its projections: without
    a shared expert they do nothing."""
    layer = loaded.spec.layer
    if layer.shared_ffn_dim:
        return []
    wanted = [("shared_expert_gate", "gate"), ("shared_ffn_bias", "give biases to")]
    return [
        loaded.diagnostic(
            ("layer", field),
            f"there is no shared expert to {verb}; set layer.shared_ffn_dim (its hidden width) "
            f"or remove {field}",
        )
        for field, verb in wanted
        if getattr(layer, field)
    ]


ACTIVATION_RULES = (
    glu_needs_a_gated_activation,
    gelu_approximation_needs_a_gelu,
    shared_glu_has_a_shared_expert_to_change,
    shared_expert_gate_needs_a_shared_expert,
)
