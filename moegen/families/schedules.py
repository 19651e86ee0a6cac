"""The shorthands of the family table's `layers` rules (which decoder layers of a model are
MoE layers), and what the rules of the families say. The checkpoint loader
(moegen.checkpoints.schedule) and `moegen init --from-hf` (moegen.hf.layers) both run an
entry's rule (tests/model_families/test_family_table.py).

Each rule is what the family's transformers decoder layer builds (transformers 5.25,
models/<family>/modeling_<family>.py), or how its config class derives mlp_layer_types where
config.json does not give it; a key that is absent takes the config class's default:

- every layer: Mixtral, OLMoE, Granite-MoE, Hunyuan, MiniMax, gpt-oss, DBRX (n_layers), ...;
- DeepSeek-V2 / V3, GLM-4.5, dots.llm1: layers from `first_k_dense_replace` on (and, as
  DeepSeek's own code does, only every `moe_layer_freq`-th);
- Qwen2-MoE, Qwen3-MoE: layers not in `mlp_only_layers` whose index + 1 is a multiple of
  `decoder_sparse_step` (none when `num_experts` is 0);
- Jamba: `i % expert_layer_period == expert_layer_offset` (none with one expert);
- Llama 4: `moe_layers`, or else every `interleave_moe_layer_step`-th layer;
- ERNIE 4.5: `moe_layer_start_index` to `moe_layer_end_index`, every `moe_layer_interval`-th;
- DeepSeek-V4: `mlp_layer_types` (else the first `num_hash_layers` hash-routed), whose
  "hash_moe" layers hold experts moegen does not route;
- many later families: `mlp_layer_types` "sparse", derived as each config class does.
"""

from __future__ import annotations

from moegen.families.layer_rules import FirstDense
from moegen.families.layer_types import HASH_MOE, BlockPattern, FirstHashed, LayerRule, Typed

FIRST_K = "first_k_dense_replace"


def mlp_types(fallback: LayerRule | None) -> Typed:
    """The decoder layer builds the MoE block where mlp_layer_types[i] is "sparse"; without
    the list, `fallback` derives it as the config class does."""
    return Typed("mlp_layer_types", "sparse", (("dense", "a dense MLP"),), fallback)


def sparse_after_first_k(default: int) -> Typed:
    """mlp_layer_types, which the config class derives from first_k_dense_replace (absent:
    `default`) dense layers first."""
    return mlp_types(FirstDense(FIRST_K, default))


def sparse_after(dense: int) -> Typed:
    """mlp_layer_types, which the config class derives with a fixed count of dense layers
    first (no key for it)."""
    return mlp_types(FirstDense(None, dense))


# the config classes that derive mlp_layer_types from first_k_dense_replace and moe_layer_freq
BY_FREQ = mlp_types(FirstDense(FIRST_K, 1, "moe_layer_freq", freq_list=True))
# Nemotron-H's block types; only "moe" layers have the MoE block
NEMOTRON_LAYERS = BlockPattern(
    ("layers_block_type", "layer_types"),
    "hybrid_override_pattern",
    ("linear_attention", "moe", "full_attention", "mlp"),
    "moe",
    (
        ("mlp", "a dense MLP"),
        ("linear_attention", "a Mamba-2 mixer, no MLP"),
        ("full_attention", "attention, no MLP"),
    ),
)
# DeepSeek-V4: mlp_layer_types, else the first num_hash_layers hash-routed
DEEPSEEK_V4_LAYERS = Typed(
    "mlp_layer_types",
    "moe",
    ((HASH_MOE, "hash-routed (a fixed token-to-expert table, tid2eid), not a moegen router"),),
    FirstHashed(),
)
