"""The sizes and names the model-family table (tests/families.py and its continuations,
tests/families_*.py) shares: the harnesses' widths, the config key sets most families use, and
the routing choices many repeat. Kept apart so that every part of the table can import them
without importing the table itself."""

from __future__ import annotations

from family_model import Keys

EMBED = 32  # D, both harnesses
ORACLE_FFN = 48  # F of each routed expert in the oracle's blocks
CHECKPOINT_FFN = 16  # F in the checkpoint tests' models
F, CF = ORACLE_FFN, CHECKPOINT_FFN

LOCAL = Keys("num_local_experts", "num_experts_per_tok", "intermediate_size")
NUM = Keys("num_experts", "num_experts_per_tok", "intermediate_size")
NUM_MOE = Keys("num_experts", "num_experts_per_tok", "moe_intermediate_size")
ROUTED = Keys("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")
LOCAL_MOE = Keys("num_local_experts", "num_experts_per_tok", "moe_intermediate_size")

SOFTMAX = {"score": "softmax"}
RENORMALIZED = SOFTMAX | {"renormalize": True}
SIGMOID_BIAS = {"score": "sigmoid", "renormalize": True, "routing_bias": True}
# softmax over the top-k logits alone (Mixtral's form, Granite's, gpt-oss's)
AFTER_TOP_K = SOFTMAX | {"score_after_top_k": True}
