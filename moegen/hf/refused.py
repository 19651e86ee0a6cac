"""The model_types `moegen init --from-hf` refuses, each with the difference that makes it
(checked before the family table, moegen/families/table.py)."""

from __future__ import annotations

from collections.abc import Mapping

from moegen.spec import UNSUPPORTED_CHOICES

# model_type -> why moegen refuses it (checked before the table; the reason names the difference)
REFUSED: Mapping[str, str] = {
    "switch_transformers": "Switch Transformers is an encoder-decoder model, and --from-hf maps "
    "the MoE layers of decoder-only models. Its sparse layer can be written by hand: top_k: 1, "
    "score: softmax, activation: relu, router.linear_bias: <router_bias>, router.capacity: "
    "{copies: <expert_capacity>, per: sequence, drop: position}, router.load_balance_form: "
    "sequence (moegen's router adds no router_jitter_noise).",
    "ergo": "Ergo RMS-normalises each routed expert's output with that expert's own learned "
    "weight (ErgoExpertNorm) before weighting it, and its shared expert's output with another: "
    "moegen has no per-expert output norm (layer.output_norm_eps normalises the layer's output, "
    "routed and shared summed).",
    "phimoe": "Phi-3.5-MoE routes with sparsemixer (router_jitter_noise as its epsilon). "
    + UNSUPPORTED_CHOICES[(("router", "score"), "sparsemixer")],
}
