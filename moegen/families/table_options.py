"""The family table, continued (moegen/families/table.py merges it): the families whose MoE needs
the spec options of clamps after the activation or on the routed experts alone, a selection
bias on the logits, a renormalisation epsilon, soft-capped router logits, ungated relu^2
experts, Gemma 4's norms and per-expert scales, and Ergo's norms of each expert's output
(transformers 5.25's modeling_<family>.py). The defaults are each config class's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from moegen.families.entry import (
    DEEPSEEK_SIZES,
    QWEN_SIZES,
    CheckpointKeys,
    Family,
    Rule,
    Transformers,
)
from moegen.families.layer_rules import (
    AllBut,
    AllLayers,
    FirstDense,
)
from moegen.families.layer_types import IndexList, LayerRule, Switched
from moegen.families.layouts import (
    ERGO_LAYOUTS,
    KOLIBRI_LAYOUTS,
)
from moegen.families.rules import (
    Choose,
    Clamp,
    Copy,
    Expect,
    Fixed,
    Latent,
    Positive,
    SharedCopy,
    SharedWidth,
    Softcaps,
    Switch,
    step_clamps,
)
from moegen.families.schedules import (
    NEMOTRON_LAYERS,
    mlp_types,
    sparse_after,
)
from moegen.families.shared_rules import (
    ACTIVATION,
    SELECTION_BIAS,
    balance,
    norm_topk,
    renormalized,
    scaling,
    sigmoid,
    silu_experts,
    softmax,
    v3_router,
)

# Step 3.7: min(silu(gate), L) and up in [-L, L], the routed experts at swiglu_limits[i], the
# shared expert at swiglu_limits_shared[i]; 0 or null: no clamp. Layers whose limits differ
# are different kinds, a spec each. The config class forces hidden_act to silu.
_STEP3P7 = Family(
    "Step 3.5/3.7",
    DEEPSEEK_SIZES.also(experts=("num_local_experts", "moe_num_experts"), top_k=("moe_top_k",)),
    (
        Fixed("layer.activation", "swiglu", "Step3p7Experts: silu (the config forces hidden_act)"),
        sigmoid("Step3p7TopKRouter"),
        renormalized("Step3p7TopKRouter"),
        SELECTION_BIAS,
        scaling(1.0, "moe_router_scaling_factor"),  # on the routed sum: the same product
        SharedWidth((), ("share_expert_dim", "share_expert_dims")),
        Copy("layer.shared_ffn_bias", ("mlp_bias",), False, "flag"),  # Step3p7MLP's biases
        *step_clamps("swiglu_limits", "swiglu_limits_shared"),
    ),
    layers=mlp_types(IndexList()),
    transformers=Transformers("step3p7", "Step3p7TextConfig", "Step3p7SparseMoeBlock", None),
)


def _hy_v4(block: str) -> tuple[Rule, ...]:
    """HY-V4's block: DeepSeek-V3's router, SiLU experts clamped before the activation at
    swiglu_limit (whatever its value: 0 or below is not off in its code), the shared MLP
    (n_shared_experts x moe_intermediate_size) unclamped."""
    return (
        *silu_experts(f"{block}Experts"),
        *v3_router(f"{block}TopkRouter", True, 2.827, (1, 1))[1:],
        SharedWidth(("n_shared_experts",), ("moe_intermediate_size",), 1),
        Clamp(
            "swiglu_limit",
            10.0,
            off=(),
            why=f"; {block}Experts clamps at it whatever it is (0 zeroes the experts)",
        ),
        Fixed("layer.shared_glu", "plain", f"{block}MLP: the shared experts are not clamped"),
    )


_HY_V4_VL = Family(
    "HY-V4-VL text",
    DEEPSEEK_SIZES,
    _hy_v4("HYV4VL"),
    layers=sparse_after(1),
    transformers=Transformers("hy_v4_vl", "HYV4VLTextConfig", "HYV4VLMoE", None),
)

# NemotronHExperts and the shared NemotronHMLP run act(x @ up) without a gate
_UNGATED = {"relu2": "relu2", "relu": "relu", "gelu": "gelu"}

# Gemma 4's experts run act(gate) * up with hidden_activation; gelu_pytorch_tanh is the tanh
# approximation of GELU
_GEMMA_ACTIVATION = Switch(
    "hidden_activation",
    {
        "gelu_pytorch_tanh": (
            Fixed("layer.activation", "geglu", "gelu(gate) * up"),
            Fixed("layer.gelu_approximation", "tanh", "GELU's tanh approximation"),
        ),
        "gelu": (Fixed("layer.activation", "geglu", "gelu(gate) * up"),),
        "silu": (Fixed("layer.activation", "swiglu", "silu(gate) * up"),),
    },
    "gelu_pytorch_tanh",
)
_GEMMA_NOTE = (
    "In every decoder layer this MoE block runs beside a dense MLP (intermediate_size wide) "
    "on the same residual; the layer adds their separately normalised outputs, and the "
    "dense MLP is not part of this spec"
)


def _gemma(title: str, block: str, layers: LayerRule, transformers: Transformers) -> Family:
    """Gemma 4's MoE block (DiffusionGemma's is the same): the router sees
    rms_norm(x) * scale / sqrt(D), softmax top-k renormalised, then times a per-expert
    scale; the experts run on their own RMS-normalised input (pre_feedforward_layernorm_2)."""
    return Family(
        title,
        QWEN_SIZES.but(top_k=("top_k_experts",)),
        (
            _GEMMA_ACTIVATION,
            softmax(f"{block}Router"),
            renormalized(f"{block}Router"),
            Copy("router.input_norm_eps", ("rms_norm_eps",), 1e-6, "number"),
            Fixed("router.per_expert_scale", True, f"{block}Router.per_expert_scale"),
            Copy("layer.expert_input_norm_eps", ("rms_norm_eps",), 1e-6, "number"),
        ),
        layers=layers,
        transformers=transformers,
        note=_GEMMA_NOTE,
    )


_GEMMA4 = _gemma(
    "Gemma 4",
    "Gemma4Text",
    Switched("enable_moe_block"),
    Transformers("gemma4", "Gemma4TextConfig", "Gemma4TextDecoderLayer", None),
)
# Inkling2: every decoder layer an MoE block; sigmoid scores (scoring_func) with a selection
# bias, renormalised (+1e-20, below float32's resolution), times route_scale; soft-capped
# SwiGLU experts, no shared expert
_INKLING2 = Family(
    "Inkling2",
    DEEPSEEK_SIZES,
    (
        Fixed("layer.activation", "swiglu", "Inkling2SoftcappedSwiGLU: silu's sigmoid"),
        sigmoid("Inkling2TopKRouter"),
        Expect("scoring_func", ("sigmoid",), "moegen maps its sigmoid scoring only"),
        renormalized("Inkling2TopKRouter"),
        SELECTION_BIAS,
        scaling(1.0, "route_scale"),
        Softcaps("mlp_gate_softcap", "mlp_up_softcap", (4.0, 25.0)),
    ),
    layers=AllLayers(),
    transformers=Transformers("inkling2", "Inkling2TextConfig", "Inkling2SparseMoeBlock", None),
)
# both its encoder and decoder layers build the block (enable_moe_block is not read)
_DIFFUSION_GEMMA = _gemma(
    "DiffusionGemma",
    "DiffusionGemmaText",
    AllLayers(),
    Transformers(
        "diffusion_gemma", "DiffusionGemmaTextConfig", "DiffusionGemmaEncoderTextLayer", None
    ),
)
# Inkling: the router's weight has n_shared_experts more rows, which score the shared experts;
# their sigmoid scores and the chosen experts' are normalised together, times route_scale and
# a learned global_scale, and each shared expert's hidden units are scaled by its weight.
# The first dense_mlp_idx layers are dense where mlp_layer_types is not given.
_INKLING = Family(
    "Inkling",
    DEEPSEEK_SIZES,
    (
        ACTIVATION,
        sigmoid("InklingTopkRouter"),
        renormalized("InklingTopkRouter"),
        SELECTION_BIAS,
        scaling(8.0, "route_scale"),
        SharedWidth(("n_shared_experts",), ("moe_intermediate_size",), 2),
        Copy("layer.shared_experts", ("n_shared_experts",), 2, "size"),
        Fixed("router.weighs_shared_experts", True, "InklingTopkRouter: its last columns"),
        Fixed("router.learned_scale", True, "InklingTopkRouter.global_scale"),
        Expect(
            "dense_intermediate_size",
            (None,),
            "with it the config class reads the experts' width from intermediate_size, "
            "which moegen does not map: write layer.ffn_dim by hand",
        ),
    ),
    layers=mlp_types(FirstDense("dense_mlp_idx", 0)),
    transformers=Transformers("inkling", "InklingTextConfig", "InklingMoE", None),
)
# LongCat-Flash: each of num_layers decoder layers (two attention and two dense MLP sublayers
# each; num_hidden_layers counts the attention ones) has one MoE; softmax over the experts and
# zero_expert_num identity experts, chosen by score + e_score_correction_bias, not
# renormalised, times routed_scaling_factor. Its classifier's bias (router_bias) is created
# but never applied by LongcatFlashTopkRouter.forward.
_LONGCAT_FLASH = Family(
    "LongCat-Flash",
    DEEPSEEK_SIZES.but(top_k=("moe_topk",), ffn=("expert_ffn_hidden_size",)),
    (
        ACTIVATION,
        softmax("LongcatFlashTopkRouter"),
        SELECTION_BIAS,
        Fixed("router.renormalize", False, "LongcatFlashTopkRouter: the chosen scores as they are"),
        scaling(6.0),
        Copy("router.identity_experts", ("zero_expert_num",), 256, "count"),
    ),
    layers=AllLayers("num_layers"),
    note="Each decoder layer also runs two dense MLPs (ffn_hidden_size wide) beside its "
    "attention sublayers; they are not part of this spec",
    transformers=Transformers("longcat_flash", "LongcatFlashConfig", "LongcatFlashMoE", None),
)

_KOLIBRI1 = Family(
    "Kolibri1",
    QWEN_SIZES.but(experts=("num_local_experts", "num_experts")),
    (
        ACTIVATION,
        sigmoid("Kolibri1TopKRouter"),
        SELECTION_BIAS,
        # top-k of logits + bias: sigmoid is monotone, but the bias is added before it
        Fixed("router.routing_bias_on", "logits", "Kolibri1TopKRouter: on the logits"),
        norm_topk(False),
        SharedWidth((), ("shared_expert_intermediate_size",)),
    ),
    layers=AllLayers(),
    checkpoint=CheckpointKeys(KOLIBRI_LAYOUTS),
    transformers=Transformers(
        "kolibri1", "Kolibri1Config", "Kolibri1SparseMoeBlock", "Kolibri1ForCausalLM"
    ),
)

# Ergo: sigmoid scores chosen with e_score_correction_bias, renormalised (+1e-20, below
# float32's resolution), times moe_routed_scaling_factor; relu^2 experts and shared expert, no
# gate; each routed expert's output RMS-normalised with its own weight row (ErgoExpertNorm)
# before its weight, the shared expert's with its own, both at rms_norm_eps. The first
# num_dense_blocks layers are dense where mlp_layer_types is not given.
_ERGO = Family(
    "Ergo",
    QWEN_SIZES,
    (
        Fixed("layer.activation", "relu2", "ErgoExpertProjections: always relu(x @ up)^2"),
        sigmoid("ErgoTopkRouter"),
        renormalized("ErgoTopkRouter"),
        SELECTION_BIAS,
        scaling(8**0.5, "moe_routed_scaling_factor"),
        SharedWidth((), ("shared_intermediate_size",)),
        Copy("layer.expert_output_norm_eps", ("rms_norm_eps",), 1e-12, "number"),
        SharedCopy(
            "layer.shared_output_norm_eps",
            ("rms_norm_eps",),
            1e-12,
            "number",
            width=("shared_intermediate_size",),
        ),
    ),
    layers=mlp_types(FirstDense("num_dense_blocks", 1)),
    checkpoint=CheckpointKeys(ERGO_LAYOUTS),
    transformers=Transformers("ergo", "ErgoConfig", "ErgoMoE", "ErgoForCausalLM"),
)

OPTION_FAMILIES: Mapping[str, Family] = {
    "step3p5": _STEP3P7,  # Step3p7TextConfig's model_type
    "step3p7": replace(_STEP3P7, text_config=True),
    "hy_v4": Family(
        "HY-V4",
        DEEPSEEK_SIZES,
        _hy_v4("HYV4"),
        layers=sparse_after(1),
        transformers=Transformers("hy_v4", "HYV4Config", "HYV4MoE", None),
    ),
    "hy_v4_vl_text": _HY_V4_VL,
    "hy_v4_vl": replace(_HY_V4_VL, text_config=True),
    "kolibri1": _KOLIBRI1,
    # Kolibri 1.1's MoE block is Kolibri1's; the layers in mlp_only_layers run a dense MLP
    "kolibri1_1": replace(
        _KOLIBRI1,
        title="Kolibri 1.1",
        layers=AllBut("mlp_only_layers", 2),  # the first two dense, absent the list
        transformers=Transformers(
            "kolibri1_1", "Kolibri1_1Config", "Kolibri1_1SparseMoeBlock", "Kolibri1_1ForCausalLM"
        ),
    ),
    "lfm2_moe": Family(
        "LFM2-MoE",
        QWEN_SIZES,
        (
            Fixed("layer.activation", "swiglu", "Lfm2MoeExperts: always silu(gate) * up"),
            sigmoid("Lfm2MoeTopKRouter"),
            Copy("router.routing_bias", ("use_expert_bias",), True, "flag"),
            Switch(
                "norm_topk_prob",
                {
                    True: (
                        Fixed("router.renormalize", True, "Lfm2MoeTopKRouter"),
                        Fixed("router.renormalize_epsilon", 1e-6, "it divides by sum + 1e-6"),
                    ),
                    False: (Fixed("router.renormalize", False, "Lfm2MoeTopKRouter"),),
                },
                True,
            ),
            scaling(1.0),
        ),
        layers=FirstDense("num_dense_layers", 2),
        transformers=Transformers("lfm2_moe", "Lfm2MoeConfig", "Lfm2MoeSparseMoeBlock", None),
    ),
    "laguna": Family(
        "Laguna",
        QWEN_SIZES,
        (
            ACTIVATION,
            sigmoid("LagunaTopKRouter"),
            renormalized("LagunaTopKRouter"),
            SELECTION_BIAS,
            Positive("router.logit_softcap", "moe_router_logit_softcapping", 0.0),
            scaling(1.0, "moe_routed_scaling_factor"),  # on the routed sum: the same product
            SharedWidth((), ("shared_expert_intermediate_size",)),
            Expect(
                "moe_apply_router_weight_on_input",
                (False,),
                "transformers' Laguna does not implement it (its config refuses it)",
            ),
            balance(0.001),
        ),
        layers=sparse_after(1),
        transformers=Transformers("laguna", "LagunaConfig", "LagunaSparseMoeBlock", None),
    ),
    "nemotron_h": Family(
        "Nemotron-H",
        DEEPSEEK_SIZES,
        (
            Choose("layer.activation", ("mlp_hidden_act",), _UNGATED, "relu2", "; ungated"),
            *v3_router("NemotronHTopkRouter", True, 1.0, (1, 1))[1:],
            SharedWidth((), ("moe_shared_expert_intermediate_size",)),
            Copy("layer.shared_ffn_bias", ("mlp_bias",), False, "flag"),  # NemotronHMLP's
            Latent(("moe_latent_size",), ("mlp_bias",)),  # fc1/fc2_latent_proj
        ),
        layers=NEMOTRON_LAYERS,
        transformers=Transformers("nemotron_h", "NemotronHConfig", "NemotronHMoE", None),
    ),
    "inkling2_text": _INKLING2,
    "inkling2": replace(_INKLING2, text_config=True),
    "inkling2_loop_text": replace(
        _INKLING2,
        title="Inkling2 (looped)",
        transformers=Transformers(
            "inkling2_loop", "Inkling2LoopTextConfig", "Inkling2LoopSparseMoeBlock", None
        ),
    ),
    "inkling2_loop": replace(_INKLING2, title="Inkling2 (looped)", text_config=True),
    "gemma4_text": _GEMMA4,
    "gemma4": replace(_GEMMA4, text_config=True),
    "diffusion_gemma_text": _DIFFUSION_GEMMA,
    "diffusion_gemma": replace(_DIFFUSION_GEMMA, text_config=True),
    "longcat_flash": _LONGCAT_FLASH,
    "inkling_text": _INKLING,
    "inkling_mm_model": replace(_INKLING, text_config=True),
    "ergo": _ERGO,
}
