"""The MoE blocks of transformers the oracle does not check, and why
(tests/model_families/test_transformers_coverage.py holds every block of the installed transformers to this
table and to the families of tests/support/families.py).

Keys are `folder.Class`: transformers/models/<folder>/modeling_*.py defines the class.

REFUSED   what moegen does not express, concretely, as the block differs from the nearest
          spec (a refusal on purpose, or a difference no spec option is planned for);
PENDING   blocks waiting for spec options issue 29 plans: the row of its table they wait
          for, and the difference that row removes.
"""

from __future__ import annotations

from typing import NamedTuple


class Pending(NamedTuple):
    row: str  # the issue-29 table row (its model)
    differs: str


REFUSED: dict[str, str] = {
    "phimoe.PhimoeSparseMoeBlock": "sparsemixer routing, refused on purpose (moegen/spec.py "
    "UNSUPPORTED_CHOICES): the chosen expert's weight is a softmax over the logits within "
    "2 * jitter_eps of the best, trained with Gumbel sampling and a Heun-method gradient",
    "muse_spark.MuseSparkMoE": "experts in a latent width: pre_expert_proj and a centred "
    "RMSNorm before them, post_expert_proj after, each expert's output scaled by one (1 + w) "
    "for every expert before its RMSNorm (layer.expert_output_norm_eps scales after, by the "
    "expert's own weight) and its weight; router logits times output_multiplier",
    "doge.DogeCDMoE": "product-key retrieval experts: two top-k's over sqrt(E) keys summed "
    "pairwise choose the experts, each one embedding row in and one out (rank 1, the "
    "activation on a scalar), added to a dense gated MLP",
    "zaya.ZayaSparseMoeBlock": "the router is an MLP (a biased down_proj, RMSNorm, MLP) with "
    "an extra skip class, a fixed -1 balancing bias on it, and router states carried from the "
    "previous layer's router (EDA), which the block takes and returns",
    "jetmoe.JetMoeMoA": "a mixture of attention heads: the experts are the query and output "
    "projections around attention (map, reduce), not an FFN",
    "vitpose_backbone.VitPoseBackboneMoeMLP": "no router: each sample's expert is its dataset "
    "index, an input; the experts are one part of a split fc2 beside a shared part",
    # tests/model_families/test_transformers_coverage.py::test_nllb_moe_runs_two_experts_whatever_it_routes
    "nllb_moe.NllbMoeSparseMLP": "not a mixture as transformers runs it: NllbMoeExperts "
    "one-hot encodes the router's [tokens, experts] 0/1 mask, so every token's top-1 copy runs "
    "expert_1 and its other weights expert_0, whichever experts the router chose (the top-2 "
    "router with its top-1-first capacity over the batch is fairseq's NLLB-MoE)",
}


PENDING: dict[str, Pending] = {}
