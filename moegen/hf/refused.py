"""The model_types `moegen init --from-hf` refuses, each with the difference that makes it
(checked before the family table, moegen/families/table.py)."""

from __future__ import annotations

from collections.abc import Mapping

from moegen.spec import UNSUPPORTED_CHOICES

_MUSE_SPARK = (
    "Muse Spark's MoE block projects each token down to moe_hidden_size and "
    "centre-RMS-normalises it before the experts, RMS-normalises each expert's output after "
    "scaling it by (1 + post_expert_norm), one weight for every expert, before weighting it, "
    "and projects the sum back up: "
    "moegen has no centred input norm (layer.latent_dim projects without a norm), and its "
    "expert output norm (layer.expert_output_norm_eps) scales after normalising."
)
# model_type -> why moegen refuses it (checked before the table; the reason names the difference)
REFUSED: Mapping[str, str] = {
    "switch_transformers": "Switch Transformers is an encoder-decoder model, and --from-hf maps "
    "the MoE layers of decoder-only models. Its sparse layer can be written by hand: top_k: 1, "
    "score: softmax, activation: relu, router.linear_bias: <router_bias>, router.capacity: "
    "{copies: <expert_capacity>, per: sequence, drop: position}, router.load_balance_form: "
    "sequence (moegen's router adds no router_jitter_noise).",
    "muse_spark": _MUSE_SPARK,
    "muse_spark_text": _MUSE_SPARK,  # its text model's config
    "zaya": "ZAYA routes with an MLP (down_proj, two GELU layers, out_proj) whose hidden state "
    "carries over from the previous decoder layer's router, and a learned 'skip' expert: "
    "moegen's routers score with one linear layer on the layer's own input.",
    "phimoe": "Phi-3.5-MoE routes with sparsemixer (router_jitter_noise as its epsilon). "
    + UNSUPPORTED_CHOICES[(("router", "score"), "sparsemixer")],
    "doge": "Doge's experts are product-key retrieval: two top-k's over sqrt(E) keys, summed "
    "pairwise, choose the experts, each one embedding row in and one out beside a dense gated "
    "MLP; moegen's experts are FFNs chosen by one router.",
    "nllb-moe": "NLLB-MoE is an encoder-decoder model, and --from-hf maps the MoE layers of "
    "decoder-only models (transformers' NllbMoeSparseMLP also runs expert_0 and expert_1 "
    "whichever experts its router chose).",
}
