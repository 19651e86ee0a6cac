"""Which decoder layers of a model are MoE layers: the rule of each config.json model_type,
the one table of it. The checkpoint loader (moegen.checkpoints.schedule, by its family's
name) and `moegen init --from-hf` (moegen.hf.layers, by the model_type it maps) both read it;
neither family table carries a schedule of its own (tests/test_one_schedule.py).

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

from collections.abc import Mapping

from moegen.checkpoints.layer_rules import (
    AllBut,
    AllLayers,
    FirstDense,
    Listed,
    Period,
    SparseStep,
    Window,
)
from moegen.checkpoints.layer_types import (
    HASH_MOE,
    BlockPattern,
    FirstHashed,
    IndexList,
    LayerRule,
    Switched,
    Typed,
)


def mlp_types(fallback: LayerRule | None) -> Typed:
    """The decoder layer builds the MoE block where mlp_layer_types[i] is "sparse"; without
    the list, `fallback` derives it as the config class does."""
    return Typed("mlp_layer_types", "sparse", (("dense", "a dense MLP"),), fallback)


_HASH_LAYERS = "hash-routed (a fixed token-to-expert table, tid2eid), not a moegen router"
_FIRST_K = "first_k_dense_replace"
# the config classes that derive mlp_layer_types from first_k_dense_replace and moe_layer_freq
_BY_FREQ = mlp_types(FirstDense(_FIRST_K, 1, "moe_layer_freq", freq_list=True))
# Nemotron-H's block types; only "moe" layers have the MoE block
_NEMOTRON_LAYERS = BlockPattern(
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
_EVERY = (
    *("mixtral", "olmoe", "granitemoe", "granitemoeshared", "flex_olmo", "hunyuan_v1_moe"),
    *("minimax", "gpt_oss", "solar_open", "minimax_m2", "qwen3_omni_moe_talker_text"),
    *("qwen3_5_moe_text", "qwen4_exp_text", "lara_mini", "granitemoe_swa", "granitemoehybrid"),
    *("aria_text", "openai_privacy_filter", "jetmoe", "kolibri1"),
    *("inkling2_text", "inkling2", "inkling2_loop_text", "inkling2_loop"),
    # both its encoder and decoder layers build the block (enable_moe_block is not read)
    *("diffusion_gemma_text", "diffusion_gemma"),
)
# config classes that fix how many layers come first, dense, without a key for it
_FIXED_DENSE = {
    "glm4_moe_lite": 1,
    "glm5_next_text": 3,
    "mimo_v2_flash": 1,
    "beam": 3,
    "hy_v3": 1,
    "ernie4_5_vl_moe_text": 1,
    "hy_v4": 1,
    "hy_v4_vl_text": 1,
    "hy_v4_vl": 1,
    "laguna": 1,
}
# config classes that derive mlp_layer_types from first_k_dense_replace (its default here)
_FIRST_K_DENSE = {
    "deepseek_v32": 3,
    "glm_moe_dsa": 3,
    "bailing_hybrid": 2,
    "minicpm5_moe": 1,
    "kimi_linear": 1,
    "exaone_moe": 1,
    "mistral_large4_text": 1,
    "unlimited_ocr_text": 1,
    "cohere2_moe": 0,
}

SCHEDULES: Mapping[str, LayerRule] = {
    **dict.fromkeys(_EVERY, AllLayers()),
    "dbrx": AllLayers("n_layers"),
    # num_layers decoder layers (num_hidden_layers counts their attention sublayers)
    "longcat_flash": AllLayers("num_layers"),
    # DeepSeek's block: moe_layer_freq as DeepSeek's own modeling code reads it
    "deepseek_v3": FirstDense(_FIRST_K, 3, "moe_layer_freq"),
    "glm4_moe": FirstDense(_FIRST_K, 1, "moe_layer_freq"),
    "dots1": FirstDense(_FIRST_K, 0, "moe_layer_freq"),
    "deepseek_v2": FirstDense(_FIRST_K, 0, "moe_layer_freq"),
    # their decoder layers read first_k_dense_replace, not a list
    "glm4v_moe_text": FirstDense(_FIRST_K, 1),
    "mistral4": FirstDense(_FIRST_K, 0),
    "afmoe": FirstDense("num_dense_layers", 1),
    "lfm2_moe": FirstDense("num_dense_layers", 2),
    **{name: mlp_types(FirstDense(_FIRST_K, k)) for name, k in _FIRST_K_DENSE.items()},
    **{name: mlp_types(FirstDense(None, k)) for name, k in _FIXED_DENSE.items()},
    **dict.fromkeys(("axk1", "axk2", "dots3_note_text"), _BY_FREQ),
    "minimax_m3_vl_text": mlp_types(FirstDense(None, 0, "moe_layer_freq", freq_list=True)),
    "mellum": mlp_types(AllLayers()),
    "inkling_text": mlp_types(FirstDense("dense_mlp_idx", 0)),
    "inkling_mm_model": mlp_types(FirstDense("dense_mlp_idx", 0)),
    # their config classes derive no list for a null or absent mlp_layer_types (the vision
    # encoder's from pyramid_num_routed, which config.json does not keep)
    **dict.fromkeys(("deepseek_ocr2_text", "dots3_note_vision_encoder"), mlp_types(None)),
    "step3p5": mlp_types(IndexList()),  # Step3p7TextConfig's model_type
    "step3p7": mlp_types(IndexList()),
    "qwen2_moe": SparseStep(experts="num_experts"),
    "qwen3_moe": SparseStep(experts="num_experts"),
    **dict.fromkeys(
        ("qwen3_vl_moe_text", "qwen3_vl_moe", "qwen3_omni_moe_text", "qwen3_next", "flint"),
        SparseStep(),
    ),
    "kolibri1_1": AllBut("mlp_only_layers", 2),  # the first two dense, absent the list
    "jamba": Period(),
    "llama4_text": Listed(),
    "llama4": Listed(),
    "ernie4_5_moe": Window(),
    "deepseek_v4": Typed("mlp_layer_types", "moe", ((HASH_MOE, _HASH_LAYERS),), FirstHashed()),
    "nemotron_h": _NEMOTRON_LAYERS,
    "gemma4_text": Switched("enable_moe_block"),
    "gemma4": Switched("enable_moe_block"),
}
