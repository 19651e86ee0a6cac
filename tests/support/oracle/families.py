"""The model families checked against transformers, as the oracle runs them.

The families' config and block classes are their entries' in moegen's family table
(moegen.families); their routing and the oracle's tiny sizes are the cases of
tests/support/families.py (the checkpoint tests use them too): each keeps the model's real routing settings (top-k, normalisation, scoring function,
groups, scaling, shared experts, biases) at small widths. Here each gains what needs torch:
how the block's weights map to moegen's parameters (hf_blocks), the initialisation where the
default would not test the routing, and the clamps of the SwiGLU. Sizes are small so that
every case runs in about a second.

Published settings the tiny configs keep (expert counts shrink to 8..32):
  Mixtral 8x7B       8 experts, top-2, softmax, renormalised
  Qwen3-30B-A3B      top-8, norm_topk_prob
  OLMoE              top-8, no renormalisation
  DeepSeek-V3        sigmoid + e_score_correction_bias, 8 groups keep 4, top-8, scaling 2.5,
                     renormalised, 1 shared expert
  GLM-4.5            sigmoid + bias, 1 group, top-8, scaling 2.5, renormalised, 1 shared
  dots.llm1          sigmoid + bias, 1 group, top-6, scaling 2.5, renormalised, 2 shared
  DeepSeek-V2-Lite   softmax, greedy top-6, scaling 1, not renormalised, 2 shared
  DBRX               16 experts, top-4, L1-normalised (= renormalised)
  Jamba              16 experts, top-2, not renormalised
  Granite-MoE        top-8, softmax over the chosen logits
  Hunyuan-A13B       top-8, renormalised, a shared MLP
  MiniMax-Text-01    32 experts, top-2, renormalised
  DeepSeek-V4        sqrtsoftplus + bias, top-6, scaling 1.5, renormalised, 1 shared,
                     SwiGLU clamped at swiglu_limit 10 (routed and shared)
and, with the spec features of issue 18:
  gpt-oss            router with a bias, top-4, softmax over the chosen logits, expert
                     biases, clamped SwiGLU with alpha 1.702 and (up + 1)
  Llama 4            top-1 sigmoid, the weight multiplies the expert's input, 1 shared
  Qwen1.5/2-MoE      top-4, not renormalised, shared expert gated by sigmoid(x @ g)
  ERNIE 4.5          softmax + a selection-only bias (moe_statics), top-6, renormalised,
                     2 shared
  DeepSeek-V2        softmax, 8 groups ranked by their best score, keep 3, top-6,
                     scaling 16, not renormalised, 2 shared
  (synthetic)        DeepSeek-V3's router with top-6 of 4 kept groups: still ranked by
                     the sum of each group's top 2
and the families the oracle alone checks, tests/support/families_deepseek.py and
tests/support/families_more.py, each with its published settings in a comment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import families
import torch
from torch import nn

from oracle.hf_blocks import (
    Init,
    Tensor,
    Weights,
    concatenated,
    concatenated_biased_experts,
    dbrx_experts,
    expert_mlps,
    fused_experts,
    fused_shared_mlp,
    gated_linear_mlp,
    gpt_oss_experts,
    interleaved,
    jetmoe_experts,
    latent_projections,
    linear_t,
    llama4_experts,
    shared_mlp,
    ungated_experts,
    ungated_mlp,
)

EMBED = families.EMBED  # D
FFN = families.ORACLE_FFN  # F, each routed expert
BATCH, SEQ_LEN = 4, 16  # 64 tokens

M = "transformers.models."


@dataclass(frozen=True)
class Family:
    name: str
    block: str  # transformers' MoE block class
    config: str  # its config class
    config_kwargs: dict[str, Any]
    spec: dict[str, Any]  # spec_builder choices: layer and router (sizes, routing, FFN)
    weights: Callable[[nn.Module], Weights]  # the block's tensors as moegen's parameters
    block_args: tuple[Any, ...] = ()  # after the config (a layer index)
    init: Init = field(default_factory=Init)
    # (limit, how gate_up splits) where the experts clamp their SwiGLU: the large input
    # scale must make the clamps bite
    clamp: tuple[float, Callable[[Tensor], tuple[Tensor, Tensor]]] | None = None
    # input scale of the second case (None: normal only). Llama 4 at 8x: the two best logits
    # of 2 tokens pass ~17, where float32 sigmoid is 1.0 for both: Llama4Router chooses by
    # logit, and so must moegen (a top-k of the saturated scores would take the lower index)
    large_scale: float | None = 8.0


def _fused(block: nn.Module) -> Weights:
    return {"router": linear_t(block.gate.weight), **fused_experts(block.experts)}


def _biased_shared(block: nn.Module) -> Weights:
    """A gate with the selection bias (e_score_correction_bias) and a shared MLP."""
    return {
        **_fused(block),
        "routing_bias": block.gate.e_score_correction_bias,
        **shared_mlp(block.shared_experts),
    }


def _shared(block: nn.Module) -> Weights:
    return {**_fused(block), **shared_mlp(block.shared_experts)}


def _biased(block: nn.Module) -> Weights:
    """The gate's selection bias, no shared expert (MiMo-V2-Flash, Beam)."""
    return {**_fused(block), "routing_bias": block.gate.e_score_correction_bias}


def _block_biased(block: nn.Module) -> Weights:
    """A selection bias the block holds and hands to its gate (MiniMax-M2, HY3), and the
    shared experts where there are some."""
    shared = getattr(block, "shared_experts", None)
    return {
        **_fused(block),
        "routing_bias": block.e_score_correction_bias,
        **(shared_mlp(shared) if shared is not None else {}),
    }


def _ungated_shared(block: nn.Module) -> Weights:
    """Qwen's names, the shared expert added in full (Lara-Mini, Flint)."""
    return {**_fused(block), **shared_mlp(block.shared_expert)}


def _gated_shared(block: nn.Module) -> Weights:
    """Qwen's shared expert scaled by sigmoid(x @ shared_expert_gate)."""
    return {
        **_ungated_shared(block),
        "shared_expert_gate": block.shared_expert_gate.weight[0],  # nn.Linear(D, 1): [1, D]
    }


def _router_fused(block: nn.Module) -> Weights:
    """A `router` (its weight [E, D]) beside the common experts (Jamba, Granite)."""
    return {"router": linear_t(block.router.weight), **fused_experts(block.experts)}


def _gemma_layer(block: nn.Module) -> Weights:
    """Gemma 4's router (proj, its input scale, per-expert scales), the experts' input norm
    and the common experts (tests/support/oracle/composed.py keeps the layer's modules)."""
    return {
        "router": linear_t(block.router.proj.weight),
        "router_input_scale": block.router.scale,
        "per_expert_scale": block.router.per_expert_scale,
        "expert_input_norm": block.norm.weight,
        **fused_experts(block.experts),
    }


def _output_normed(block: nn.Module) -> Weights:
    """DeepSeek-V3's block, then an RMSNorm of its output (A.X-K1's post_mlp_layernorm)."""
    return {**_biased_shared(block), "output_norm": block.post_mlp_layernorm.weight}


def _ernie(block: nn.Module) -> Weights:
    """ERNIE's gate: the softmax's selection bias is moe_statics' [1, E]."""
    return {**_fused(block), "routing_bias": block.gate.moe_statics.e_score_correction_bias[0]}


def _longcat_flash(block: nn.Module) -> Weights:
    """LongCat-Flash: the classifier scores the experts, then the identity experts; the
    experts module holds the computing experts alone (transformers 5.25: the block adds the
    identity experts' share itself)."""
    return {
        "router": linear_t(block.router.classifier.weight),
        "routing_bias": block.router.e_score_correction_bias,
        **fused_experts(block.experts),
    }


def _inkling(block: nn.Module) -> Weights:
    """Inkling: the gate's weight [E + S, D] scores the experts, then the S shared experts;
    its global_scale [1] multiplies every weight; the shared experts' per-expert tensors
    (gate_proj and up_proj [S, F, D], down_proj [S, D, F]) side by side are one shared FFN
    of width S * F."""
    shared = block.shared_experts
    return {
        "router": linear_t(block.gate.weight),
        "routing_bias": block.gate.e_score_correction_bias,
        "router_scale": block.gate.global_scale,
        **fused_experts(block.experts),
        "shared_gate": torch.cat([linear_t(w) for w in shared.gate_proj], dim=1),
        "shared_up": torch.cat([linear_t(w) for w in shared.up_proj], dim=1),
        "shared_down": torch.cat([linear_t(w) for w in shared.down_proj], dim=0),
    }


def _ergo(block: nn.Module) -> Weights:
    """ErgoMoE: its router a linear of its own (gate.linear), the experts' up_proj [E, D, F] and
    down_proj [E, F, D] applied as x @ W (no gate), each expert's output norm weight row
    (experts.post_expert_norm [E, D]), a relu^2 shared MLP with its own output norm."""
    experts, shared = block.experts, block.shared_experts
    return {
        "router": linear_t(block.gate.linear.weight),
        "routing_bias": block.gate.e_score_correction_bias,
        "w_up": experts.up_proj,
        "w_down": experts.down_proj,
        "expert_output_norm": experts.post_expert_norm.weight,
        **ungated_mlp(shared),
        "shared_output_norm": shared.norm.weight,
    }


# family -> the block's tensors as moegen's parameters
WEIGHTS: dict[str, Callable[[nn.Module], Weights]] = {
    "mixtral": _fused,
    "qwen3_moe": _fused,
    "olmoe": _fused,
    "deepseek_v3": _biased_shared,
    "glm4_moe": _biased_shared,
    **dict.fromkeys(("sarvam_moe", "param2moe", "sarvam_mla"), _biased_shared),
    "dots1": _biased_shared,
    "deepseek_v2_lite": _shared,
    "dbrx": lambda b: {"router": linear_t(b.router.layer.weight), **dbrx_experts(b.experts)},
    "jamba": _router_fused,
    "granitemoe": _router_fused,
    "hunyuan_v1_moe": lambda b: {
        "router": linear_t(b.gate.wg.weight),
        **fused_experts(b.experts),
        **shared_mlp(b.shared_mlp),
    },
    "minimax": _fused,
    "deepseek_v4": _biased_shared,
    "gpt_oss": lambda b: {
        "router": linear_t(b.router.weight),
        "router_bias": b.router.bias,
        **gpt_oss_experts(b.experts),
    },
    "llama4": lambda b: {
        "router": linear_t(b.router.weight),
        **llama4_experts(b.experts),
        **shared_mlp(b.shared_expert),
    },
    "qwen2_moe": _gated_shared,
    "ernie4_5_moe": lambda b: {**_ernie(b), **shared_mlp(b.shared_experts)},
    "deepseek_v2": _shared,
    "deepseek_v3_top6_keep4": _biased_shared,
    # ---- tests/support/families_deepseek.py ----
    **dict.fromkeys(
        (
            "deepseek_v32",
            "bailing_hybrid",
            "bailing_hybrid_clamped",
            "axk2",
            "glm4_moe_lite",
            "glm4v_moe",
            "glm_moe_dsa",
        ),
        _biased_shared,
    ),
    **dict.fromkeys(
        ("glm5_next", "kimi_linear", "solar_open", "dots3_note", "exaone_moe", "minicpm5_moe"),
        _biased_shared,
    ),
    "axk1": _output_normed,
    "dots3_note_vision": _block_biased,
    "mimo_v2_flash": _biased,
    "beam": _biased,
    "hy_v3": _block_biased,
    "minimax_m2": _block_biased,
    "afmoe": lambda b: {
        "router": linear_t(b.router.gate.weight),
        "routing_bias": b.expert_bias,
        **fused_experts(b.experts),
        **shared_mlp(b.shared_experts),
    },
    "minimax_m3_vl": lambda b: {
        **_fused(b),
        "routing_bias": b.gate.e_score_correction_bias,
        **fused_shared_mlp(b.shared_experts),
    },
    **dict.fromkeys(("mistral4", "mistral_large4", "deepseek_ocr2", "unlimited_ocr"), _shared),
    # ---- tests/support/families_more.py ----
    **dict.fromkeys(("flex_olmo", "mellum", "qwen3_vl_moe", "qwen3_omni_moe"), _fused),
    **dict.fromkeys(("qwen3_omni_moe_talker", "qwen3_5_moe", "qwen3_next"), _gated_shared),
    "qwen4_exp": _gated_shared,
    "lara_mini": _ungated_shared,
    "flint": _ungated_shared,
    **dict.fromkeys(("granitemoe_swa", "granitemoeshared"), _router_fused),
    "granitemoehybrid": lambda b: {**_router_fused(b.block), **gated_linear_mlp(b.shared_mlp)},
    "cohere2_moe": _fused,
    "aria": lambda b: {  # Aria's experts have Llama 4's layout (x @ W, gate then up)
        "router": linear_t(b.router.weight),
        **llama4_experts(b.experts),
        **shared_mlp(b.shared_experts),
    },
    "openai_privacy_filter": lambda b: {
        "router": linear_t(b.router.weight),
        "router_bias": b.router.bias,
        **concatenated_biased_experts(b.experts),
    },
    "jetmoe": lambda b: {"router": linear_t(b.router.layer.weight), **jetmoe_experts(b)},
    "ernie4_5_vl_moe": lambda b: {**_ernie(b.text_moe), **shared_mlp(b.shared_experts)},
    "ernie4_5_vl_moe_modality": _ernie,
    # ---- tests/support/families_options.py ----
    **dict.fromkeys(
        ("step3p7", "hy_v4", "hy_v4_vl", "kolibri1", "kolibri1_1", "laguna"), _biased_shared
    ),
    "inkling": _inkling,
    **dict.fromkeys(("inkling2", "inkling2_loop"), _biased),
    "lfm2_moe": lambda b: {**_fused(b), "routing_bias": b.expert_bias},
    "nemotron_h": lambda b: {
        "router": linear_t(b.gate.weight),
        "routing_bias": b.gate.e_score_correction_bias,
        **ungated_experts(b.experts),
        **ungated_mlp(b.shared_experts),
    },
    "nemotron_h_latent": lambda b: {
        "router": linear_t(b.gate.weight),
        "routing_bias": b.gate.e_score_correction_bias,
        **ungated_experts(b.experts),
        **ungated_mlp(b.shared_experts, biases=True),
        **latent_projections(b.fc1_latent_proj, b.fc2_latent_proj),
    },
    **dict.fromkeys(("gemma4", "diffusion_gemma_encoder", "diffusion_gemma_decoder"), _gemma_layer),
    "ernie4_5_moe_use_bias": lambda b: {**_ernie(b), **shared_mlp(b.shared_experts, biases=True)},
    "longcat_flash": _longcat_flash,
    "ergo": _ergo,
    "switch_transformers": lambda b: {
        "router": linear_t(b.router.classifier.weight),
        "router_bias": b.router.classifier.bias,
        **expert_mlps(b.experts),
    },
}
# softmax probabilities are about 1 / 16 each: a bias of that order steers ERNIE's selection;
# Kolibri1 adds its bias to logits of order 1
INITS = dict.fromkeys(
    ("ernie4_5_moe", "ernie4_5_vl_moe", "ernie4_5_vl_moe_modality", "ernie4_5_moe_use_bias"),
    Init(selection_bias=0.03),
) | {
    "kolibri1": Init(selection_bias=0.5),
    "kolibri1_1": Init(selection_bias=0.5),
    "longcat_flash": Init(selection_bias=0.03),
}
# the SwiGLU clamps: DeepSeek-V4's and GLM-5-Next's swiglu_limit on a concatenated gate_up,
# gpt-oss's preset on an interleaved one, and on a concatenated one (MiniMax-M3, OpenAI's
# privacy filter)
CLAMPS = {
    "deepseek_v4": (10.0, concatenated),
    "glm5_next": (10.0, concatenated),
    "gpt_oss": (7.0, interleaved),
    "minimax_m3_vl": (7.0, concatenated),
    "openai_privacy_filter": (7.0, concatenated),
    "step3p7": (0.5, concatenated),
    "hy_v4": (1.0, concatenated),
    "hy_v4_vl": (1.0, concatenated),
    "bailing_hybrid_clamped": (0.5, concatenated),
}


def _oracle_family(entry: families.ModelFamily) -> Family:
    tiny = entry.oracle
    folder, modeling = M + entry.folder, entry.transformers.block_folder
    return Family(
        name=entry.name,
        block=entry.oracle_block or f"{M}{modeling}.modeling_{modeling}.{entry.block}",
        config=f"{folder}.configuration_{entry.folder}.{entry.config}",
        config_kwargs=tiny.config_kwargs(entry.keys, EMBED, FFN),
        spec=tiny.spec_choices(entry.routing, EMBED, FFN),
        weights=WEIGHTS[entry.name],
        block_args=tiny.block_args,
        init=INITS.get(entry.name, Init()),
        clamp=CLAMPS.get(entry.name),
    )


FAMILIES: list[Family] = [_oracle_family(entry) for entry in families.FAMILIES]
BY_NAME = {family.name: family for family in FAMILIES}
assert set(WEIGHTS) == set(BY_NAME)
