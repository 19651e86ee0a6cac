"""How the routed experts' outputs come back to their tokens: where each copy's combine
weight is applied, and how the sorted copies are permuted in the backward pass.

Measured on one TPU v5e chip (bench/TPU_CHECK.md, run 7; Qwen3-30B-A3B's layer, 8,192
tokens): with the weights on the hidden rows and gathers for gradients, forward+backward
32.3 ms against 38.5 (the module otherwise the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from moegen.load import LoadedSpec


# What the combine reads of the router's and the FFN's plans (RouterPlan, FfnPlan: their
# modules import experts.py, which holds a CombinePlan, so they are not imported here).
class RouterPlan(Protocol):
    weights_on_input: bool
    drops_copies: bool


class FfnPlan(Protocol):
    bias: bool
    expert_output_norm_eps: float | None
    layout: str
    chunk_width: int
    latent: int


@dataclass(frozen=True)
class CombinePlan:
    """The combine of the replicated strategy's kept-every-copy path (other paths: both False)."""

    # Each copy's combine weight scales its hidden row ([rows, FFN]) before the down
    # projection, which is linear, instead of its output row ([rows, width]) after it: the
    # same sum, and the combine is a plain sum of each token's copies. Where FFN <= width,
    # its backward moves fewer bytes (no weighted output gradient written, no output rows
    # read back for the weights' gradient, which comes from the hidden rows instead).
    weights_on_hidden: bool = False
    why: str = "only the replicated strategy's path keeping every copy"  # '' where on

    @property
    def gather_gradients(self) -> bool:
        """The sort's two row permutations (token copies in expert order, outputs back in
        token order) get gathers by the inverse permutation as gradients: a gather's transpose
        is a scatter-add, which XLA runs on TPU far slower (2.2 ms of the layer's 40.5 above).
        Only with weights_on_hidden: alone they paid on Llama 4 Scout's one-chip layer (99.0 ->
        89.6 ms forward+backward) but not on Mixtral's or gpt-oss's, and cost
        mixtral_8x7b_v5e's compiled training step 1.1 GB more (6.07 -> 7.18 GB)."""
        return self.weights_on_hidden


def combine_plan(
    loaded: LoadedSpec,
    strategy: str,
    router: RouterPlan,
    ffn: FfnPlan,
    weights_on_hidden: bool | None = None,
) -> CombinePlan:
    """The combine of a validated spec's chosen path; `weights_on_hidden` pins where the
    weights apply where both places compute the same sum (a twin runs its full-size layer's
    path, whatever its own widths)."""
    if strategy != "replicated" or router.drops_copies:
        return CombinePlan()
    if loaded.spec.target.hardware.startswith("gpu"):
        # timed on TPU only; lowered for CUDA, TE's training program changes shape (8 grouped
        # GEMMs where there were 9, qwen3_30b_a3b_b200_mxfp8), not yet run on a GPU
        return CombinePlan(why="measured on TPU only, not yet on a GPU")
    why = _output_not_linear(router, ffn)
    if not why and weights_on_hidden is not None:
        why = "" if weights_on_hidden else "pinned off"
    else:
        why = why or _hidden_wider(loaded, ffn)
    return CombinePlan(weights_on_hidden=not why, why=why)


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
