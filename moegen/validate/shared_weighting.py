"""Rules of shared experts the router weighs (Inkling): the router scores them in columns
after the experts, their scores are normalised with the chosen experts', and each scales its
own shared expert. What that weighting does not define is refused, and so is an option of it
that would change nothing."""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec


def shared_experts_are_weighed(loaded: LoadedSpec) -> list[Diagnostic]:
    """layer.shared_experts splits the shared FFN only where the router weighs each part: n
    shared experts of width F, added unweighed, are one of width n*F."""
    layer = loaded.spec.layer
    weighs = loaded.spec.router.weighs_shared_experts
    out = []
    if layer.shared_experts > 1 and not weighs:
        out.append(
            loaded.diagnostic(
                ("layer", "shared_experts"),
                f"{layer.shared_experts} shared experts added unweighed are one of width "
                "shared_ffn_dim; remove shared_experts, or set router.weighs_shared_experts: "
                "true (the router weighs each, as Inkling's does)",
            )
        )
    if weighs and layer.shared_ffn_dim is None:
        out.append(
            loaded.diagnostic(
                ("router", "weighs_shared_experts"),
                "weighs_shared_experts needs shared experts to weigh: set layer.shared_ffn_dim "
                "(their total width) and layer.shared_experts (how many)",
            )
        )
    elif weighs and layer.shared_ffn_dim % layer.shared_experts:
        out.append(
            loaded.diagnostic(
                ("layer", "shared_experts"),
                f"shared_ffn_dim {layer.shared_ffn_dim} does not split into "
                f"{layer.shared_experts} shared experts of equal width",
            )
        )
    return out


def weighed_shared_experts_stand_alone(loaded: LoadedSpec) -> list[Diagnostic]:
    """The shared experts' weights come from scores normalised with the chosen experts':
    a score of each logit alone, and none of the features that would weigh, count or scale
    them another way."""
    spec = loaded.spec
    router, layer = spec.router, spec.layer
    if not router.weighs_shared_experts:
        return []
    clashes = [
        (("router", "score"), router.score == "softmax", "softmax scores",
         "the shared scores are normalised with the chosen ones, which needs a score of each "
         "logit alone: set score: sigmoid (Inkling) or sqrtsoftplus"),
        (("router", "identity_experts"), router.identity_experts > 0, "identity experts",
         "remove identity_experts"),
        (("router", "zero_experts"), router.zero_experts > 0, "zero experts",
         "remove zero_experts"),
        (("router", "weighting"), router.weighting == "input", "input weighting",
         "set weighting: output"),
        (("router", "per_expert_scale"), router.per_expert_scale, "per-expert scales",
         "set per_expert_scale: false"),
        (("router", "renormalize_epsilon"), router.renormalize_epsilon > 0,
         "a renormalisation epsilon", "remove renormalize_epsilon"),
        (("router", "load_balance_loss"), router.load_balance_loss > 0, "a balance loss",
         "balance with routing_bias and set load_balance_loss: 0"),
        (("router", "z_loss"), router.z_loss > 0, "a z-loss", "set z_loss: 0"),
        (("layer", "shared_expert_gate"), layer.shared_expert_gate, "a shared expert gate",
         "set shared_expert_gate: false (the router's weights gate the shared experts)"),
        (("layer", "shared_ffn_bias"), layer.shared_ffn_bias, "shared expert biases",
         "set shared_ffn_bias: false"),
        (("mesh", "axes", "tensor"), spec.tensor_shards > 1, "a tensor axis",
         "drop the tensor axis (it would split the shared experts' widths)"),
    ]  # fmt: skip
    return [
        loaded.diagnostic(
            path,
            f"router.weighs_shared_experts is not supported with {what}; {fix}",
        )
        for path, clashes_here, what, fix in clashes
        if clashes_here
    ]


SHARED_WEIGHTING_RULES = (shared_experts_are_weighed, weighed_shared_experts_stand_alone)
