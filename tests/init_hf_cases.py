"""Hand-written config.json cases of tests/test_init_hf.py: mixed dense/MoE layer lists,
configs moegen refuses (and the words the refusal must hold), and hostile files."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# sizes every case shares, in each family's key names
LLAMA4_TEXT = {
    "model_type": "llama4_text",
    "num_local_experts": 8,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 6,
    "interleave_moe_layer_step": 2,
}
MIXTRAL = {
    "model_type": "mixtral",
    "num_local_experts": 8,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
}
DEEPSEEK = {
    "n_routed_experts": 16,
    "hidden_size": 32,
    "moe_intermediate_size": 16,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 5,
}
QWEN2 = {
    "model_type": "qwen2_moe",
    "num_experts": 8,
    "hidden_size": 32,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 8,
}


@dataclass(frozen=True)
class LayerList:
    name: str
    config: dict[str, Any]
    specs: dict[str, tuple[str, int]]  # file -> (its MoE layers, as written; its top-k)


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
        {
            "model_type": "ernie4_5_moe",
            "moe_num_experts": 8,
            "moe_k": 2,
            "hidden_size": 32,
            "moe_intermediate_size": 16,
            "num_hidden_layers": 6,
            "moe_layer_start_index": 1,
            "moe_layer_end_index": 4,
            "moe_num_shared_experts": 0,
        },
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
]


@dataclass(frozen=True)
class Refused:
    name: str
    config: Any  # a JSON value, or the file's text; None: no file at all
    message: tuple[str, ...] = field(default_factory=tuple)


REFUSALS = [
    Refused(
        "phimoe sparsemixer", {"model_type": "phimoe"}, ("'phimoe' is not supported", "sparsemixer")
    ),
    Refused(
        "unknown model_type",
        {"model_type": "llama"},
        ("'llama' is not a family moegen maps", "supported: ", "mixtral", "qwen3_moe"),
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
        "ernie shared expert biases",
        {**LAYER_LISTS[4].config, "use_bias": True},
        ("use_bias", "biases"),
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
