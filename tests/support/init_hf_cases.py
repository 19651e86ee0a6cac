"""Hand-written config.json cases of tests/model_families/test_init_hf.py: mixed dense/MoE layer lists,
configs moegen refuses (and the words the refusal must hold), and hostile files."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from init_hf_configs import (
    CLAMP7,
    DEEPSEEK,
    ERGO_UNSHARED,
    ERGO_UNSHARED_FIELDS,
    ERNIE,
    GEMMA4_26B,
    INKLING,
    LLAMA4_TEXT,
    LONGCAT,
    MIXTRAL,
    NEMOTRON_H,
    QWEN2,
    STEP3P7,
)


@dataclass(frozen=True)
class LayerList:
    name: str
    config: dict[str, Any]
    specs: dict[str, tuple[str, int]]  # file -> (its MoE layers, as written; its top-k)
    # file -> {dotted spec field: its value}; a str value of "description" is a part of it
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)


LAYER_LISTS = [
    LayerList("llama4 interleave step", LLAMA4_TEXT, {"moe.yaml": ("1, 3, 5", 1)}),
    LayerList(
        "deepseek_v3 first_k_dense_replace",
        {"model_type": "deepseek_v3", **DEEPSEEK, "first_k_dense_replace": 2},
        {"moe.yaml": ("2-4", 4)},
    ),
    LayerList(
        "qwen2_moe sparse step and mlp_only_layers",
        {**QWEN2, "decoder_sparse_step": 2, "mlp_only_layers": [3]},
        {"moe.yaml": ("1, 5, 7", 2)},
    ),
    LayerList(
        "jamba expert period",
        {**MIXTRAL, "model_type": "jamba", "num_experts": 8},
        {"moe.yaml": ("1, 3", 2)},
    ),
    LayerList(
        "ernie start end interval",
        ERNIE,
        {"moe.yaml": ("1-4", 2)},
    ),
    LayerList(
        "deepseek_v4 hash layers left out",
        {
            "model_type": "deepseek_v4",
            **DEEPSEEK,
            "num_hidden_layers": 4,
            "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
        },
        {"moe.yaml": ("2-3", 4)},
    ),
    LayerList(
        "hunyuan per-layer top-k: a spec each",
        {
            "model_type": "hunyuan_v1_moe",
            "num_experts": 16,
            "hidden_size": 32,
            "intermediate_size": 32,
            "num_hidden_layers": 4,
            "moe_topk": [8, 8, 4, 4],
        },
        {"moe_top8.yaml": ("0-1", 8), "moe_top4.yaml": ("2-3", 4)},
    ),
    LayerList(
        "dots3 note moe_layer_freq without mlp_layer_types",
        {"model_type": "dots3_note_text", **DEEPSEEK, "num_hidden_layers": 6, "moe_layer_freq": 2}
        | {"shared_experts_intermediate_size": 16},
        {"moe.yaml": ("2, 4", 4)},
    ),
    LayerList(
        "dots3 note vision per_layer_config experts: a spec each",
        {
            "model_type": "dots3_note_vision_encoder",
            **{k: MIXTRAL[k] for k in ("hidden_size", "num_experts_per_tok")},
            "num_local_experts": 8,
            "moe_intermediate_size": 16,
            "num_hidden_layers": 3,
            "mlp_layer_types": ["dense", "sparse", "sparse"],
            "per_layer_config": {"1": {"num_local_experts": 4, "num_experts_per_tok": 3}},
        },
        {"moe_experts4_top3.yaml": ("1", 3), "moe_experts8_top2.yaml": ("2", 2)},
    ),
    LayerList(
        "deepseek-ocr2 explicit mlp_layer_types",
        {
            "model_type": "deepseek_ocr2_text",
            **DEEPSEEK,
            "mlp_layer_types": ["dense", "sparse", "sparse", "dense", "sparse"],
        },
        {"moe.yaml": ("1-2, 4", 4)},
    ),
    LayerList(
        "step3p7 two clamped layers: a spec each kind",
        STEP3P7,
        {"moe_kind1.yaml": ("2-3", 4), "moe_kind2.yaml": ("4-5", 4)},
        {
            "moe_kind1.yaml": {"layer.glu": None, "layer.shared_glu": None},
            "moe_kind2.yaml": {
                "layer.glu": CLAMP7,
                "layer.shared_glu": CLAMP7 | {"gate_limit": 16.0, "up_limit": 16.0},
                "router.routed_scaling": 3.0,
                "layer.num_experts": 16,
            },
        },
    ),
    LayerList(
        "step3p7 clamped routed experts only",
        {**STEP3P7, "moe_layers_enum": "4,5", "swiglu_limits_shared": None},
        {"moe.yaml": ("4-5", 4)},
        {"moe.yaml": {"layer.glu": CLAMP7, "layer.shared_glu": "plain"}},
    ),
    LayerList("ergo unshared", ERGO_UNSHARED, {"moe.yaml": ("1-3", 4)}, ERGO_UNSHARED_FIELDS),
    LayerList(
        "gemma-4-26B-A4B text model",
        GEMMA4_26B,
        {"moe.yaml": ("0-29", 8)},
        {
            "moe.yaml": {
                "layer.embed_dim": 2816,
                "layer.num_experts": 128,
                "layer.ffn_dim": 704,
                "layer.activation": "geglu",
                "layer.gelu_approximation": "tanh",
                "layer.expert_input_norm_eps": 1e-06,
                "router.input_norm_eps": 1e-06,
                "router.per_expert_scale": True,
                "router.renormalize": True,
                "description": "beside a dense MLP",
            }
        },
    ),
    LayerList(
        "nemotron_h hybrid_override_pattern",
        {**NEMOTRON_H, "hybrid_override_pattern": "MEM*EM-E", "num_hidden_layers": 52},
        {"moe.yaml": ("1, 4, 7", 4)},
        {"moe.yaml": {"layer.activation": "relu2", "description": "of 8"}},
    ),
    LayerList(
        "nemotron_h latent projections with biases",
        {
            **NEMOTRON_H,
            "layers_block_type": ["mlp", "moe"],
            "moe_latent_size": 16,
            "mlp_bias": True,
        },
        {"moe.yaml": ("1", 4)},
        {
            "moe.yaml": {
                "layer.latent_dim": 16,
                "layer.latent_bias": True,
                "layer.shared_ffn_bias": True,
            }
        },
    ),
    LayerList(
        "nemotron_h latent width null",
        {**NEMOTRON_H, "layers_block_type": ["moe"], "moe_latent_size": None, "mlp_bias": True},
        {"moe.yaml": ("0", 4)},
        {"moe.yaml": {"layer.latent_dim": None, "layer.latent_bias": False}},
    ),
    LayerList(
        "ernie shared expert biases",
        {**ERNIE, "moe_num_shared_experts": 2, "use_bias": True},
        {"moe.yaml": ("1-4", 2)},
        {"moe.yaml": {"layer.shared_ffn_bias": True, "layer.shared_ffn_dim": 32}},
    ),
    LayerList(
        "ernie use_bias without shared experts",
        {**ERNIE, "use_bias": True},
        {"moe.yaml": ("1-4", 2)},
        {"moe.yaml": {"layer.shared_ffn_bias": False, "layer.shared_ffn_dim": None}},
    ),
    # every num_layers decoder layer (num_hidden_layers counts its attention sublayers)
    LayerList(
        "longcat_flash identity experts",
        {**LONGCAT, "zero_expert_num": 4, "num_hidden_layers": 6},
        {"moe.yaml": ("0-2", 2)},
        {"moe.yaml": {"router.identity_experts": 4, "router.routed_scaling": 6.0}},
    ),
    # the config class makes the first dense_mlp_idx layers dense (mlp_layer_types absent)
    LayerList(
        "inkling weighed shared experts",
        {**INKLING, "dense_mlp_idx": 1, "n_shared_experts": 3, "route_scale": 2.0},
        {"moe.yaml": ("1-3", 2)},
        {
            "moe.yaml": {
                "layer.shared_experts": 3,
                "layer.shared_ffn_dim": 96,
                "router.weighs_shared_experts": True,
                "router.learned_scale": True,
                "router.routed_scaling": 2.0,
            }
        },
    ),
    LayerList(
        "longcat_flash zero_expert_num null",
        {**LONGCAT, "zero_expert_num": None, "routed_scaling_factor": 2.0},
        {"moe.yaml": ("0-2", 2)},
        {"moe.yaml": {"router.identity_experts": 0, "router.routed_scaling": 2.0}},
    ),
    # Kolibri 1.1: mlp_only_layers absent means the first two layers are dense
    LayerList(
        "kolibri1_1 default", {**QWEN2, "model_type": "kolibri1_1"}, {"moe.yaml": ("2-7", 2)}
    ),
    LayerList(
        "kolibri1_1 mlp_only_layers",
        {**QWEN2, "model_type": "kolibri1_1", "mlp_only_layers": [0, 4]},
        {"moe.yaml": ("1-3, 5-7", 2)},
    ),
]


@dataclass(frozen=True)
class Refused:
    name: str
    config: Any  # a JSON value, or the file's text; None: no file at all
    message: tuple[str, ...] = field(default_factory=tuple)


REFUSALS = [
    Refused(
        "inkling without shared experts",
        {**INKLING, "n_shared_experts": 0},
        ("n_shared_experts", "must be an integer from 1"),
    ),
    Refused(
        "inkling dense_intermediate_size",
        {**INKLING, "dense_intermediate_size": 128},
        ("dense_intermediate_size", "write layer.ffn_dim by hand"),
    ),
    Refused(
        "longcat_flash negative zero_expert_num",
        {**LONGCAT, "zero_expert_num": -1},
        ("zero_expert_num", "must be an integer from 0"),
    ),
    Refused(
        "a dense model",
        {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336},
        ("'llama' has no MoE layers", "Mixture-of-Experts layers only"),
    ),
    Refused(
        "a dense model's config nested",
        {"model_type": "llava", "text_config": {"model_type": "llama", "num_experts": 0}},
        ("'llava' has no MoE layers",),
    ),
    Refused(
        "an MoE model_type moegen does not map",
        {"model_type": "newmoe", "num_experts": 8, "num_experts_per_tok": 2},
        ("'newmoe' is not a family moegen maps", "supported: ", "mixtral", "qwen3_moe"),
    ),
    Refused(
        "an MoE model_type nested in text_config",
        {"model_type": "newvl", "text_config": {"model_type": "x", "moe_intermediate_size": 8}},
        ("'newvl' is not a family moegen maps",),
    ),
    Refused(
        "deepseek_v2 noaux_tc",
        {"model_type": "deepseek_v2", **DEEPSEEK, "topk_method": "noaux_tc"},
        ("config.json: topk_method", "'noaux_tc' is not mapped", "'group_limited_greedy'"),
    ),
    Refused(
        "dbrx 2-norm weights",
        {
            "model_type": "dbrx",
            "d_model": 32,
            "n_layers": 2,
            "ffn_config": {
                "moe_num_experts": 8,
                "moe_top_k": 2,
                "ffn_hidden_size": 16,
                "moe_normalize_expert_weights": 2.0,
            },
        },
        ("ffn_config.moe_normalize_expert_weights", "2.0 is not mapped", "p-norm"),
    ),
    Refused(
        "tanh gelu",
        {**MIXTRAL, "hidden_act": "gelu_pytorch_tanh"},
        ("hidden_act", "'gelu_pytorch_tanh' is not mapped"),
    ),
    Refused(
        "nemotron_h latent width 0",
        {**NEMOTRON_H, "layers_block_type": ["moe", "mlp"], "moe_latent_size": 0},
        ("moe_latent_size", "must be an integer from 1"),
    ),
    Refused(
        "gemma4 without enable_moe_block",
        {**GEMMA4_26B, "text_config": {**GEMMA4_26B["text_config"], "enable_moe_block": False}},
        ("text_config.enable_moe_block: is false", "no MoE layer"),
    ),
    Refused(
        "gemma4 enable_moe_block absent",
        {k: v for k, v in GEMMA4_26B["text_config"].items() if k != "enable_moe_block"},
        ("enable_moe_block", "absent: the config class's default", "no MoE layer"),
    ),
    Refused(
        "hy_v4 swiglu_limit 0",
        {**DEEPSEEK, "model_type": "hy_v4", "swiglu_limit": 0},
        ("swiglu_limit", "must be positive", "HYV4Experts clamps at it"),
    ),
    Refused(
        "step3p7 negative limit",
        {**STEP3P7, "swiglu_limits_shared": [0, 0, 0, 0, -1, 16]},
        ("swiglu_limits_shared", "must be positive"),
    ),
    Refused(
        "nemotron_h unknown block letter",
        {**NEMOTRON_H, "hybrid_override_pattern": "ME?"},
        ("hybrid_override_pattern[2]", "'?' is not a block letter"),
    ),
    Refused(
        "deepseek_v3 softmax scoring",
        {"model_type": "deepseek_v3", **DEEPSEEK, "scoring_func": "softmax"},
        ("scoring_func", "always scores with sigmoid"),
    ),
    Refused("router jitter", {**MIXTRAL, "router_jitter_noise": 0.1}, ("router_jitter_noise",)),
    Refused(
        "axk2 groups masked to 0",
        {"model_type": "axk2", **DEEPSEEK, "n_group": 4, "topk_group": 2},
        ("n_group", "masks dropped groups to 0"),
    ),
    Refused(
        "cohere2 averaged shared expert",
        {**QWEN2, "model_type": "cohere2_moe", "intermediate_size": 16, "num_shared_experts": 1},
        ("num_shared_experts", "'average' halves"),
    ),
    Refused(
        "deepseek-ocr2 null mlp_layer_types",
        {"model_type": "deepseek_ocr2_text", **DEEPSEEK, "mlp_layer_types": None},
        ("mlp_layer_types", "null"),
    ),
    Refused(
        "no MoE layer",
        {**QWEN2, "mlp_only_layers": list(range(8))},
        ("no MoE layer", "mlp_only_layers"),
    ),
    Refused(
        "missing size",
        {k: v for k, v in MIXTRAL.items() if k != "num_local_experts"},
        ("num_local_experts", "missing"),
    ),
    Refused("llama4 without text_config", {"model_type": "llama4"}, ("text_config",)),
]
# model_types init refuses whatever the config says: (model_type, case, words of the reason)
REFUSED_TYPES = [
    ("phimoe", "phimoe sparsemixer", ("sparsemixer",)),
    ("muse_spark", "muse_spark per-expert output norms", ("post_expert_norm", "moe_hidden_size")),
    ("muse_spark_text", "muse_spark_text per-expert output norms", ("post_expert_norm",)),
    ("doge", "doge product-key experts", ("product-key",)),
    ("nllb-moe", "nllb-moe encoder-decoder", ("encoder-decoder",)),
    ("zaya", "zaya router MLP", ("MLP", "previous decoder layer")),
]
REFUSALS += [
    Refused(name, {"model_type": model_type}, (f"'{model_type}' is not supported", *words))
    for model_type, name, words in REFUSED_TYPES
]

HOSTILE = [
    Refused("not JSON", "{oops", ("config.json:1:2", "not JSON")),
    Refused("a list", "[1, 2]", ("a JSON list, not an object",)),
    Refused("NaN", '{"model_type": "mixtral", "hidden_size": NaN}', ("NaN is not a JSON number",)),
    Refused("not UTF-8", b"\xff\xfe{", ("not UTF-8",)),
    Refused(
        "count as text", {**MIXTRAL, "num_local_experts": "8"}, ("num_local_experts", "integer")
    ),
    Refused(
        "count as bool", {**MIXTRAL, "num_experts_per_tok": True}, ("num_experts_per_tok", "True")
    ),
    Refused("huge width", {**MIXTRAL, "hidden_size": 2**40}, ("hidden_size", "2147483647")),
    Refused("nested deeply", "[" * 100_000 + "]" * 100_000, ("nested too deeply",)),
    Refused("huge file", " " * (5 * 1024 * 1024) + "{}", ("MiB, not a model config",)),
    Refused("model_type not text", {"model_type": 3}, ("model_type: missing or not a string",)),
    Refused("list not a list", {**QWEN2, "mlp_only_layers": "3"}, ("mlp_only_layers", "list")),
    Refused(
        "short per-layer list",
        {**LAYER_LISTS[6].config, "moe_topk": [8]},
        ("moe_topk", "no value for layer 1"),
    ),
    Refused("missing path", None, ("no such file or folder",)),
    Refused("folder without config.json", None, ("a folder without a config.json",)),
]
