"""The model-family table, continued (tests/support/families.py concatenates it): the families whose
MoE needs the spec options of issue 29 (clamps after the activation or on the routed experts
alone, a selection bias on the logits, a renormalisation epsilon, soft-capped router logits,
ungated relu^2 experts, Gemma 4's norms and per-expert scales, shared-expert biases), checked by
the oracle alone. The oracle's limits and epsilons are small enough to bite at these sizes.
"""

from __future__ import annotations

from dataclasses import replace

from families_keys import CF, LOCAL_MOE, NUM_MOE, RENORMALIZED, SIGMOID_BIAS, F
from family_model import Keys, ModelFamily, Tiny

from moegen.families import Transformers

# Step 3.7 clamps the activated gate (min(silu(g), L)), the shared expert at its own limit
_STEP3P7_GLU = {
    "glu": {"gate_limit": 0.5, "up_limit": 0.5, "gate_clamp": "after_activation"},
    "shared_glu": {"gate_limit": 0.8, "up_limit": 0.8, "gate_clamp": "after_activation"},
    "routed_scaling": 3.0,  # moe_router_scaling_factor: the experts' sum times it
}
# HY-V4 clamps its routed experts only (swiglu_limit), its shared MLP not
_HY_V4_GLU = {"glu": {"gate_limit": 1.0, "up_limit": 1.0}, "shared_glu": "plain"}
_HY_V4_CONFIG = dict(
    n_shared_experts=1, norm_topk_prob=True, swiglu_limit=1.0, n_group=1, topk_group=1
)
# Gemma 4 (and DiffusionGemma): the router's input RMS-normalised, per-expert scales, the
# experts on their own normalised input, tanh GELU
_GEMMA4 = RENORMALIZED | {
    "activation": "geglu",
    "gelu_approximation": "tanh",
    "input_norm_eps": 1e-06,
    "per_expert_scale": True,
    "expert_input_norm_eps": 1e-06,
}

# Kolibri1 and Kolibri 1.1: 16 experts, top-6, a shared expert twice F wide; the oracle
# renormalises (norm_topk_prob), as the spec does
KOLIBRI_ORACLE = Tiny(
    16, 6, shared=2 * F, config=dict(norm_topk_prob=True, shared_expert_intermediate_size=2 * F)
)
# the checkpoint tests' model: its Hub layout keeps the selection bias beside the block
# (moe.router.expert_bias), transformers' state_dict inside it
KOLIBRI_CHECKPOINT = Tiny(
    8, 2, shared=2 * CF, config=dict(norm_topk_prob=True, shared_expert_intermediate_size=2 * CF)
)
_GEMMA4_CONFIG = dict(
    enable_moe_block=True,
    intermediate_size=64,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    rms_norm_eps=1e-06,
)


def _gemma(name: str, model_type: str, layer: str, composed: str) -> ModelFamily:
    return ModelFamily(
        name,
        _GEMMA4,
        oracle=Tiny(16, 4, config=_GEMMA4_CONFIG, block_args=(0,)),
        model_type=model_type,
        other_block=layer,
        oracle_block=f"oracle.composed.{composed}",
    )


OPTION_FAMILIES: list[ModelFamily] = [
    ModelFamily(
        "step3p7",
        SIGMOID_BIAS,
        oracle=Tiny(
            16,
            4,
            shared=F,
            config=dict(
                n_routed_experts=16,
                share_expert_dim=F,
                moe_router_scaling_factor=3.0,
                swiglu_limits=[0.5],
                swiglu_limits_shared=[0.8],
                num_hidden_layers=1,
                mlp_layer_types=["sparse"],  # its default makes layers 0-2 dense
            ),
            spec=_STEP3P7_GLU,
            block_args=(0,),
        ),
        model_type="step3p5",
        config_keys=LOCAL_MOE,
    ),
    ModelFamily(
        "hy_v4",
        SIGMOID_BIAS,
        oracle=Tiny(16, 4, shared=F, scaling=2.827, config=_HY_V4_CONFIG, spec=_HY_V4_GLU),
    ),
    ModelFamily(
        "hy_v4_vl",
        SIGMOID_BIAS,
        oracle=Tiny(16, 4, shared=F, scaling=2.827, config=_HY_V4_CONFIG, spec=_HY_V4_GLU),
        model_type="hy_v4_vl_text",
    ),
    # Kolibri1: the selection bias on the logits, the weights the sigmoid of the chosen ones
    ModelFamily(
        "kolibri1",
        SIGMOID_BIAS | {"routing_bias_on": "logits"},
        oracle=KOLIBRI_ORACLE,
        checkpoint=KOLIBRI_CHECKPOINT,
        config_keys=NUM_MOE,
    ),
    # Kolibri 1.1 (transformers 5.25): Kolibri1's block (384 experts, top-6, not renormalised),
    # dense MLPs in the mlp_only_layers; the oracle renormalises, as Kolibri1's does
    ModelFamily(
        "kolibri1_1",
        SIGMOID_BIAS | {"routing_bias_on": "logits"},
        oracle=KOLIBRI_ORACLE,
        checkpoint=replace(
            KOLIBRI_CHECKPOINT,
            config=KOLIBRI_CHECKPOINT.config | dict(mlp_only_layers=[0], index_num_heads=1),
        ),
        config_keys=NUM_MOE,
    ),
    # LFM2-MoE: renormalised by the sum plus 1e-6
    ModelFamily(
        "lfm2_moe",
        SIGMOID_BIAS | {"renormalize_epsilon": 1e-06},
        oracle=Tiny(16, 4, scaling=1.5, config=dict(use_expert_bias=True, norm_topk_prob=True)),
    ),
    # Laguna: soft-capped router logits; the routed scaling multiplies the experts' sum
    ModelFamily(
        "laguna",
        SIGMOID_BIAS,
        oracle=Tiny(
            16,
            4,
            shared=2 * F,
            config=dict(
                shared_expert_intermediate_size=2 * F,
                moe_routed_scaling_factor=2.0,
                moe_router_logit_softcapping=1.5,
            ),
            spec={"routed_scaling": 2.0, "logit_softcap": 1.5},
        ),
    ),
    # Nemotron-H without its latent projections (moe_latent_size unset): relu^2 experts;
    # with_latent below adds them
    ModelFamily(
        "nemotron_h",
        SIGMOID_BIAS | {"activation": "relu2"},
        oracle=Tiny(
            16,
            4,
            shared=2 * F,
            scaling=2.5,
            config=dict(
                moe_shared_expert_intermediate_size=2 * F,
                norm_topk_prob=True,
                n_group=1,
                topk_group=1,
            ),
        ),
    ),
    _gemma("gemma4", "gemma4_text", "Gemma4TextDecoderLayer", "Gemma4Moe"),
    _gemma(
        "diffusion_gemma_encoder",
        "diffusion_gemma_text",
        "DiffusionGemmaEncoderTextLayer",
        "DiffusionGemmaEncoderMoe",
    ),
    _gemma(
        "diffusion_gemma_decoder",
        "diffusion_gemma_text",
        "DiffusionGemmaDecoderTextLayer",
        "DiffusionGemmaDecoderMoe",
    ),
]


def _inkling2(name: str) -> ModelFamily:
    """Inkling2 (and its looped variant): soft-capped SwiGLU experts (the linear gate factor
    and up), sigmoid + selection bias, renormalised (+1e-20: below float32's resolution)."""
    return ModelFamily(
        name,
        SIGMOID_BIAS,
        model_type=f"{name}_text",
        oracle=Tiny(
            16,
            4,
            config=dict(route_scale=2.0, mlp_gate_softcap=0.4, mlp_up_softcap=0.5),
            spec={"glu": {"gate_softcap": 0.4, "up_softcap": 0.5}, "routed_scaling": 2.0},
        ),
    )


OPTION_FAMILIES += [
    # Inkling: the router scores its 2 shared experts too (never chosen); sigmoid scores of
    # the chosen and the shared experts normalised together, times route_scale and a learned
    # global_scale; each shared expert's hidden units times its weight
    ModelFamily(
        "inkling",
        SIGMOID_BIAS | {"weighs_shared_experts": True, "learned_scale": True},
        oracle=Tiny(
            16,
            4,
            shared=2 * F,
            config=dict(route_scale=3.0, n_shared_experts=2),
            spec={"shared_experts": 2, "routed_scaling": 3.0},
        ),
        model_type="inkling_text",
    ),
    _inkling2("inkling2"),
    _inkling2("inkling2_loop"),
    # LongCat-Flash: softmax over the experts and the identity (zero-computation) experts,
    # chosen by score + a selection bias, not renormalised, times routed_scaling_factor
    ModelFamily(
        "longcat_flash",
        {"score": "softmax", "routing_bias": True},
        oracle=Tiny(
            16, 6, scaling=6.0, config=dict(zero_expert_num=8), spec={"identity_experts": 8}
        ),
    ),
    # Switch Transformers: top-1 softmax, the expert's output times its probability; each
    # sequence's tokens over expert_capacity (counted in token order) skip the experts. Its
    # config has no top-k key (the router is top-1); the harness's key is an unused attribute.
    ModelFamily(
        "switch_transformers",
        {"score": "softmax", "activation": "relu", "linear_bias": True},
        oracle=Tiny(
            8,
            1,
            # 16 tokens a sequence over 8 experts: a capacity of 2 drops in every sequence
            config=dict(expert_capacity=2, router_bias=True, router_jitter_noise=0.0),
            spec={
                "capacity": {"copies": 2, "per": "sequence", "drop": "position"},
                "load_balance_loss": 0.001,
                "load_balance_form": "sequence",
                "z_loss": 0.001,
            },
        ),
        classes=Transformers(
            "switch_transformers", "SwitchTransformersConfig", "SwitchTransformersSparseMLP", ""
        ),
        config_keys=Keys("num_experts", "num_selected_experts", "d_ff", "d_model"),
    ),
]


# Ergo: DeepSeek-V3's selection without groups, relu^2 experts and shared expert, each routed
# expert's output RMS-normalised with its own weight row before its weight, the shared expert's
# with its own. rms_norm_eps is 1e-12 in the config class; 0.01 here so that it counts.
ERGO_CONFIG = dict(
    shared_intermediate_size=2 * F,
    moe_routed_scaling_factor=2.828,
    rms_norm_eps=0.01,
)
ERGO_SPEC = {
    "shared_ffn": 2 * F,
    "routed_scaling": 2.828,
    "expert_output_norm_eps": 0.01,
    "shared_output_norm_eps": 0.01,
}
OPTION_FAMILIES.append(
    ModelFamily(
        "ergo",
        SIGMOID_BIAS | {"activation": "relu2"},
        oracle=Tiny(16, 4, config=ERGO_CONFIG, spec=ERGO_SPEC),
        checkpoint=Tiny(
            8,
            2,
            config=dict(
                shared_intermediate_size=2 * CF,
                moe_routed_scaling_factor=1.5,
                rms_norm_eps=0.01,
                first_dense_intermediate_size=64,
            ),
            spec=ERGO_SPEC | {"shared_ffn": 2 * CF, "routed_scaling": 1.5},
        ),
    )
)


def with_latent(nemotron: ModelFamily) -> ModelFamily:
    """Nemotron-H with moe_latent_size and mlp_bias: the experts in a latent width between
    fc1_latent_proj and fc2_latent_proj, those and the shared MLP with biases."""
    oracle = replace(
        nemotron.oracle,
        config=nemotron.oracle.config | {"moe_latent_size": 16, "mlp_bias": True},
        spec=nemotron.oracle.spec | {"latent": 16, "latent_bias": True, "shared_ffn_bias": True},
    )
    return replace(
        nemotron, name="nemotron_h_latent", model_type="nemotron_h", oracle=oracle, checkpoint=None
    )


def with_shared_biases(ernie: ModelFamily) -> ModelFamily:
    """ERNIE 4.5 with use_bias: its shared experts' projections have biases."""
    oracle = replace(
        ernie.oracle,
        config=ernie.oracle.config | {"use_bias": True},
        spec=ernie.oracle.spec | {"shared_ffn_bias": True},
    )
    return replace(
        ernie,
        name="ernie4_5_moe_use_bias",
        model_type="ernie4_5_moe",
        oracle=oracle,
        checkpoint=None,
    )
