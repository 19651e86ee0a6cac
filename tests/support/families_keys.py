"""The sizes and names the model-family table (tests/support/families.py and its continuations,
tests/families_*.py) shares: the harnesses' widths, the config key sets a few cases set, and
the routing choices many repeat. Kept apart so that every part of the table can import them
without importing the table itself."""

from __future__ import annotations

from family_model import Keys

EMBED = 32  # D, both harnesses
ORACLE_FFN = 48  # F of each routed expert in the oracle's blocks
CHECKPOINT_FFN = 16  # F in the checkpoint tests' models
F, CF = ORACLE_FFN, CHECKPOINT_FFN

# where a case's config sets other size keys than its family table entry's first ones
NUM_MOE = Keys("num_experts", "num_experts_per_tok", "moe_intermediate_size")
LOCAL_MOE = Keys("num_local_experts", "num_experts_per_tok", "moe_intermediate_size")

SOFTMAX = {"score": "softmax"}
RENORMALIZED = SOFTMAX | {"renormalize": True}
SIGMOID_BIAS = {"score": "sigmoid", "renormalize": True, "routing_bias": True}
# softmax over the top-k logits alone (Mixtral's form, Granite's, gpt-oss's)
AFTER_TOP_K = SOFTMAX | {"score_after_top_k": True}
# DeepSeek's multi-head latent attention, as small as the checkpoint models go
MLA = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
# the dense layer 0 of the DeepSeek-style checkpoint models
DENSE_FIRST = dict(intermediate_size=64, first_k_dense_replace=1)
