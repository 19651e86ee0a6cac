"""MoE blocks the oracle composes from a transformers decoder layer, where transformers keeps
the router and the experts in the layer itself and no module of its own holds them (Gemma 4,
DiffusionGemma).

Each runs the layer's own submodules, as the layer's forward does: the router on the residual
stream x, the experts on `pre_feedforward_layernorm_2(x)` with the router's choice. What the
layer does around them (its dense MLP, the post-norms) is not the MoE layer's.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from oracle.hf_blocks import load

_M = "transformers.models."


class _LayerMoe(nn.Module):
    """The MoE of one decoder layer of class `layer_class`."""

    layer_class = ""

    def __init__(self, config: Any, layer_idx: int = 0) -> None:
        super().__init__()
        layer = load(self.layer_class)(config, layer_idx)
        self.router, self.experts = layer.router, layer.experts
        self.norm = layer.pre_feedforward_layernorm_2

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        _, weights, index = self.router(flat)
        return self.experts(self.norm(flat), index, weights).reshape(x.shape)


class GraniteMoeHybridWithShared(nn.Module):
    """Granite-4.0-H's MoE layer: its decoder layer adds the always-on shared_mlp to the
    block_sparse_moe's output, on the same input (moegen's shared expert)."""

    def __init__(self, config: Any, layer_idx: int = 0) -> None:
        super().__init__()
        modeling = _M + "granitemoehybrid.modeling_granitemoehybrid."
        layer = load(modeling + "GraniteMoeHybridDecoderLayer")(config, layer_idx)
        self.block, self.shared_mlp = layer.block_sparse_moe, layer.shared_mlp

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x) + self.shared_mlp(x)


class Gemma4Moe(_LayerMoe):
    layer_class = _M + "gemma4.modeling_gemma4.Gemma4TextDecoderLayer"


class DiffusionGemmaEncoderMoe(_LayerMoe):
    layer_class = _M + "diffusion_gemma.modeling_diffusion_gemma.DiffusionGemmaEncoderTextLayer"


class DiffusionGemmaDecoderMoe(_LayerMoe):
    layer_class = _M + "diffusion_gemma.modeling_diffusion_gemma.DiffusionGemmaDecoderTextLayer"
