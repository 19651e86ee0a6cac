"""How the routed experts' outputs come back to their tokens: where each copy's combine
weight is applied, and how the sorted copies are permuted in the backward pass.

Measured on one TPU v5e chip (bench/TPU_CHECK.md, run 7; Qwen3-30B-A3B's layer, 8,192
tokens): with the weights on the hidden rows and gathers for gradients, forward+backward
32.3 ms against 38.5 (the module otherwise the same).
"""

from __future__ import annotations

from dataclasses import dataclass

from moegen.load import LoadedSpec
from moegen.plan.experts import ExpertPlan
from moegen.plan.ffn import FfnPlan
from moegen.plan.router import RouterPlan


@dataclass(frozen=True)
class CombinePlan:
    """The combine of the replicated strategy's kept-every-copy path (other paths: both False)."""

    # Each copy's combine weight scales its hidden row ([rows, FFN]) before the down
    # projection, which is linear, instead of its output row ([rows, width]) after it: the
    # same sum, and the combine is a plain sum of each token's copies. Where FFN <= width,
    # its backward moves fewer bytes (no weighted output gradient written, no output rows
    # read back for the weights' gradient, which comes from the hidden rows instead).
    weights_on_hidden: bool
    # The sort's two row permutations (token copies in expert order, outputs back in token
    # order) get gathers by the inverse permutation as gradients: a gather's transpose is a
    # scatter-add, which XLA runs on TPU far slower (2.2 ms of the layer's 40.5 above).
    gather_gradients: bool
    why: str  # the reason weights_on_hidden is off ('' where it is on)


def combine_plan(
    loaded: LoadedSpec,
    experts: ExpertPlan,
    router: RouterPlan,
    ffn: FfnPlan,
    weights_on_hidden: bool | None = None,
) -> CombinePlan:
    """The combine of a validated spec's chosen path; `weights_on_hidden` pins where the
    weights apply where both places compute the same sum (a twin runs its full-size layer's
    path, whatever its own widths)."""
    plain = experts.strategy == "replicated" and not router.drops_copies
    if not plain:
        return CombinePlan(False, False, "only the replicated strategy's path keeping every copy")
    why = _output_not_linear(router, ffn)
    if not why and weights_on_hidden is not None:
        return CombinePlan(weights_on_hidden, True, "" if weights_on_hidden else "pinned off")
    why = why or _hidden_wider(loaded, ffn)
    return CombinePlan(weights_on_hidden=not why, gather_gradients=True, why=why)


def _output_not_linear(router: RouterPlan, ffn: FfnPlan) -> str:
    """Why a copy's weight cannot move before the down projection ('' where it can)."""
    if router.weights_on_input:
        return "the combine weights scale the experts' input"
    if ffn.bias:
        return "a down bias is added after the projection"
    if ffn.expert_output_norm_eps is not None:
        return "each expert's output is normalised after the projection"
    if ffn.layout != "whole":
        return "the FFN runs in slices"
    return ""


def _hidden_wider(loaded: LoadedSpec, ffn: FfnPlan) -> str:
    """Why the weights do not pay on the hidden rows: they are the wider ('' where not)."""
    width = ffn.latent or loaded.spec.layer.embed_dim
    if ffn.chunk_width > width:
        return f"the hidden rows ({ffn.chunk_width}) are wider than the output rows ({width})"
    return ""
