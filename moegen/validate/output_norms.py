"""Rules of the experts' output norms (layer.expert_output_norm_eps, layer.shared_output_norm_eps):
an RMSNorm of one expert's output needs that output whole on the device that normalises it."""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec

OUTPUT_NORMS = ("expert_output_norm_eps", "shared_output_norm_eps")


def shared_output_norm_needs_a_shared_expert(loaded: LoadedSpec) -> list[Diagnostic]:
    """The shared expert's output norm normalises an output only a shared expert has."""
    layer = loaded.spec.layer
    if layer.shared_output_norm_eps is None or layer.shared_ffn_dim:
        return []
    return [
        loaded.diagnostic(
            ("layer", "shared_output_norm_eps"),
            "there is no shared expert whose output it would normalise; set "
            "layer.shared_ffn_dim (the shared expert's width) or remove shared_output_norm_eps",
        )
    ]


def output_norms_see_whole_outputs(loaded: LoadedSpec) -> list[Diagnostic]:
    """With a tensor axis each device computes its FFN columns' share of an expert's output,
    and the shares are summed only after the experts' outputs are combined: the RMS of one
    expert's output is known nowhere before that sum."""
    spec = loaded.spec
    tensor = spec.mesh.axes.get("tensor")
    if tensor is None:
        return []
    return [
        loaded.diagnostic(
            ("layer", name),
            f"an expert's output norm needs that expert's whole output, but mesh.axes.tensor "
            f"({tensor}) splits each expert's FFN columns over {tensor} devices, each holding "
            "a partial sum of the output until the combined outputs are summed; use an "
            "expert or fsdp axis instead of tensor (both keep each expert's output whole), "
            f"or remove layer.{name}",
        )
        for name in OUTPUT_NORMS
        if getattr(spec.layer, name) is not None
    ]


OUTPUT_NORM_RULES = (shared_output_norm_needs_a_shared_expert, output_norms_see_whole_outputs)
