"""transformers' own MoE blocks: built tiny, run as the reference, their weights mapped to
moegen's parameters.

Everything here reads transformers' modules as they are in memory (transformers 5 keeps the
experts as fused 3D tensors; `conversion_mapping.py` converts published checkpoints into that
on load), and writes moegen's layouts as the generated modules document them (PARAM_SHAPES):

    router [D, E]        w_gate, w_up [E, D, F]   w_down [E, F, D]
    router_bias [E]      b_gate, b_up [E, F]      b_down [E, D]
    routing_bias [E]     shared_gate, shared_up [D, S]   shared_down [S, D]
    shared_expert_gate [D]  latent_in [D, L]  latent_out [L, D] (the experts then [E, L, F])

The mapping is written from transformers' side only (which tensor is which, transposes,
`chunk(2)` of a concatenated gate_up, gpt-oss's interleaving), never from moegen's code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

Tensor = torch.Tensor
Weights = dict[str, Tensor]

# The blocks are tiny; one thread keeps them from competing with the JAX side for the cores.
torch.set_num_threads(1)


def load(path: str) -> Any:
    """`package.module.Name` -> the object."""
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


# ----------------------------------------------------------------------------------------
# Building a block


@dataclass(frozen=True)
class Init:
    """Standard deviations of the seeded normal weights, by kind of tensor."""

    weight: float = 0.18  # every matrix (about 1 / sqrt(32): pre-activations of order 1)
    bias: float = 0.1  # every bias: router bias, expert biases (2D gpt-oss ones included)
    selection_bias: float = 0.1  # e_score_correction_bias: sigmoid scores are in (0, 1)


def build_block(
    config_path: str,
    config_kwargs: dict[str, Any],
    block_path: str,
    block_args: tuple[Any, ...],
    init: Init,
    seed: int,
) -> nn.Module:
    """transformers' block from a tiny config: float32, eval(), the eager experts path,
    every floating parameter and buffer seeded normal (biases non-zero)."""
    config = load(config_path)(**config_kwargs)
    config._experts_implementation = "eager"  # the loop over experts, the reference form
    block = load(block_path)(config, *block_args).to(torch.float32).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*block.named_parameters(), *block.named_buffers()]:
            if not tensor.is_floating_point():
                continue
            if "e_score_correction_bias" in name:
                std = init.selection_bias
            elif name.endswith("bias"):
                std = init.bias
            else:
                std = init.weight
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * std)
    for name, tensor in biases(block).items():
        assert bool((tensor != 0).all()), f"bias {name} has zeros"
    return block


def biases(block: nn.Module) -> dict[str, Tensor]:
    """Every bias of the block (parameters and buffers), by name."""
    return {
        name: tensor
        for name, tensor in [*block.named_parameters(), *block.named_buffers()]
        if "bias" in name.rsplit(".", 1)[-1] and tensor.is_floating_point()
    }


def run_block(block: nn.Module, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The block's output and the gradient of sum(output) w.r.t. x, float32."""
    inputs = torch.tensor(x, dtype=torch.float32, requires_grad=True)
    out = block(inputs)
    if isinstance(out, tuple):  # gpt-oss and Llama 4 also return router scores or logits
        out = out[0]
    out = out.reshape(inputs.shape)
    out.sum().backward()
    assert inputs.grad is not None
    return out.detach().numpy(), inputs.grad.numpy()


def weight_gradients(block: nn.Module, weights: Callable[[nn.Module], Weights]) -> Weights:
    """The gradients run_block left in the block's parameters, as moegen's parameters: each
    tensor's gradient put in its place and read through the same map as the weights (a buffer,
    such as a selection bias, has none: zeros)."""
    tensors = [t for _, t in [*block.named_parameters(), *block.named_buffers()]]
    kept = [t.detach().clone() for t in tensors]
    with torch.no_grad():
        for tensor in tensors:
            grad = getattr(tensor, "grad", None)
            tensor.copy_(grad if grad is not None else torch.zeros_like(tensor))
        grads = {name: t.detach().clone() for name, t in weights(block).items()}
        for tensor, value in zip(tensors, kept, strict=True):
            tensor.copy_(value)
    return grads


# ----------------------------------------------------------------------------------------
# Clamps that bite


@dataclass
class Bites:
    """Pre-activations beyond the clamp limit, counted inside transformers' experts."""

    gate: int = 0  # routed gate pre-activations above the limit
    up: int = 0  # routed up pre-activations outside [-limit, limit]
    shared_gate: int = 0
    shared_up: int = 0
    seen: int = 0  # routed gate pre-activations looked at


def concatenated(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """[..., 2F] as [gate | up] (DeepSeek-V4)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return gate, up


def interleaved(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """[..., 2F] as gate0, up0, gate1, up1, ... (gpt-oss)."""
    return gate_up[..., ::2], gate_up[..., 1::2]


@contextmanager
def counting_bites(
    block: nn.Module, limit: float, split: Callable[[Tensor], tuple[Tensor, Tensor]]
) -> Iterator[Bites]:
    """Count, while the block runs, the routed experts' pre-activations their clamps change
    (through the experts' own `_apply_gate`, which receives gate_up after its biases), and
    the shared expert's (its gate_proj and up_proj outputs) when it has a clamped one."""
    bites = Bites()
    experts = block.experts
    apply_gate = experts._apply_gate

    def recording(gate_up: Tensor) -> Tensor:
        gate, up = split(gate_up.detach())
        bites.gate += int((gate > limit).sum())
        bites.up += int((up.abs() > limit).sum())
        bites.seen += gate.numel()
        return apply_gate(gate_up)

    hooks = []
    shared = getattr(block, "shared_experts", None)
    if shared is not None and getattr(shared, "limit", None) is not None:

        def gate_hook(_module: nn.Module, _inputs: Any, output: Tensor) -> None:
            bites.shared_gate += int((output.detach() > limit).sum())

        def up_hook(_module: nn.Module, _inputs: Any, output: Tensor) -> None:
            bites.shared_up += int((output.detach().abs() > limit).sum())

        hooks = [
            shared.gate_proj.register_forward_hook(gate_hook),
            shared.up_proj.register_forward_hook(up_hook),
        ]
    experts._apply_gate = recording  # the instance attribute shadows the class's method
    try:
        yield bites
    finally:
        del experts._apply_gate
        for hook in hooks:
            hook.remove()


# ----------------------------------------------------------------------------------------
# Weight layouts of transformers' modules -> moegen's parameters


def linear_t(weight: Tensor) -> Tensor:
    """nn.Linear / F.linear weight [out, in] -> [in, out] (x @ W)."""
    return weight.T


def fused_experts(experts: nn.Module) -> Weights:
    """The common experts module (Mixtral, Qwen3-MoE, DeepSeek, ...): gate_up_proj
    [E, 2F, D] with gate first then up (`chunk(2)` of dim 1), down_proj [E, D, F]; each
    applied as F.linear (x @ W.T)."""
    gate, up = experts.gate_up_proj.chunk(2, dim=1)  # [E, F, D] each
    return {
        "w_gate": gate.transpose(1, 2),
        "w_up": up.transpose(1, 2),
        "w_down": experts.down_proj.transpose(1, 2),  # [E, D, F] -> [E, F, D]
    }


def expert_mlps(experts: nn.Module) -> Weights:
    """One ungated MLP per expert, a ModuleDict (Switch Transformers): expert_{i}.wi [F, D]
    and expert_{i}.wo [D, F], nn.Linear without biases."""
    mlps = [experts[f"expert_{i}"] for i in range(len(experts))]
    assert all(m.wi.bias is None and m.wo.bias is None for m in mlps), "biased expert MLPs"
    return {
        "w_up": torch.stack([linear_t(m.wi.weight) for m in mlps]),
        "w_down": torch.stack([linear_t(m.wo.weight) for m in mlps]),
    }


def gpt_oss_experts(experts: nn.Module) -> Weights:
    """GptOssExperts: gate_up_proj [E, D, 2F] applied as x @ W, gate and up interleaved
    along 2F (gate `[..., ::2]`, up `[..., 1::2]`), gate_up_proj_bias [E, 2F] the same way;
    down_proj [E, F, D] applied as h @ W, down_proj_bias [E, D]."""
    gate_up, gate_up_bias = experts.gate_up_proj, experts.gate_up_proj_bias
    return {
        "w_gate": gate_up[..., ::2],
        "w_up": gate_up[..., 1::2],
        "w_down": experts.down_proj,
        "b_gate": gate_up_bias[..., ::2],
        "b_up": gate_up_bias[..., 1::2],
        "b_down": experts.down_proj_bias,
    }


def llama4_experts(experts: nn.Module) -> Weights:
    """Llama4TextExperts: gate_up_proj [E, D, 2F] applied with bmm (x @ W), gate then up
    (`chunk(2, dim=-1)`); down_proj [E, F, D] applied as h @ W."""
    gate, up = experts.gate_up_proj.chunk(2, dim=-1)
    return {"w_gate": gate, "w_up": up, "w_down": experts.down_proj}


def concatenated_biased_experts(experts: nn.Module) -> Weights:
    """gpt-oss's experts with gate and up concatenated (OpenAI's privacy filter):
    gate_up_proj [E, D, 2F] applied as x @ W, gate then up (`chunk(2, dim=-1)`),
    gate_up_proj_bias [E, 2F] the same way; down_proj [E, F, D] applied as h @ W,
    down_proj_bias [E, D]."""
    gate, up = experts.gate_up_proj.chunk(2, dim=-1)
    gate_bias, up_bias = experts.gate_up_proj_bias.chunk(2, dim=-1)
    return {
        "w_gate": gate,
        "w_up": up,
        "w_down": experts.down_proj,
        "b_gate": gate_bias,
        "b_up": up_bias,
        "b_down": experts.down_proj_bias,
    }


def jetmoe_experts(block: nn.Module) -> Weights:
    """JetMoeMoE: input_linear [E, 2F, D] and output_linear [E, D, F] (JetMoeParallelExperts,
    each applied as F.linear: x @ W.T), gate then up (`chunk(2, dim=-1)` of the output);
    one output bias [D] added after the combine, as each expert's down bias (the combine
    weights sum to 1), the gate and up biases zero."""
    gate, up = block.input_linear.weight.chunk(2, dim=1)  # [E, F, D] each
    num_experts, ffn = gate.shape[:2]
    return {
        "w_gate": gate.transpose(1, 2),
        "w_up": up.transpose(1, 2),
        "w_down": block.output_linear.weight.transpose(1, 2),  # [E, D, F] -> [E, F, D]
        "b_gate": torch.zeros(num_experts, ffn),
        "b_up": torch.zeros(num_experts, ffn),
        "b_down": block.bias.expand(num_experts, -1),
    }


def dbrx_experts(experts: nn.Module) -> Weights:
    """DbrxExperts: mlp.w1 (gate), v1 (up), w2 (down) each [E * F, D]; w1 and v1 applied as
    x @ W.T, w2 as h @ W (not transposed)."""
    mlp = experts.mlp
    num_experts, ffn = experts.num_experts, experts.ffn_hidden_size
    per_expert = (num_experts, ffn, experts.hidden_size)
    return {
        "w_gate": mlp.w1.view(per_expert).transpose(1, 2),
        "w_up": mlp.v1.view(per_expert).transpose(1, 2),
        "w_down": mlp.w2.view(per_expert),
    }


def _linear_mlp(projections: dict[str, nn.Module], biases: bool) -> Weights:
    """A shared MLP of nn.Linear projections by moegen name (gate, up, down); their biases
    where `biases` (moegen's shared_ffn_bias), else none."""
    for projection in projections.values():
        assert (projection.bias is not None) == biases, "the shared expert's biases"
    out = {f"shared_{name}": linear_t(p.weight) for name, p in projections.items()}
    if biases:
        out |= {f"shared_b_{name}": p.bias for name, p in projections.items()}
    return out


def shared_mlp(mlp: nn.Module, biases: bool = False) -> Weights:
    """A gated MLP of three nn.Linear (gate_proj, up_proj, down_proj)."""
    return _linear_mlp({"gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj}, biases)


def gated_linear_mlp(mlp: nn.Module) -> Weights:
    """Granite's shared MLP: input_linear [2S, D], gate then up (`chunk(2, dim=-1)` of its
    output), output_linear [D, S]; no biases."""
    gate, up = mlp.input_linear.weight.chunk(2, dim=0)  # [S, D] each
    return {
        "shared_gate": linear_t(gate),
        "shared_up": linear_t(up),
        "shared_down": linear_t(mlp.output_linear.weight),
    }


def ungated_experts(experts: nn.Module) -> Weights:
    """Experts with up and down only (Nemotron-H): up_proj [E, F, D], down_proj [E, D, F],
    each applied as F.linear."""
    return {
        "w_up": experts.up_proj.transpose(1, 2),
        "w_down": experts.down_proj.transpose(1, 2),
    }


def ungated_mlp(mlp: nn.Module, biases: bool = False) -> Weights:
    """A plain MLP of two nn.Linear (up_proj, down_proj): Nemotron-H's shared expert, with
    biases where mlp_bias."""
    return _linear_mlp({"up": mlp.up_proj, "down": mlp.down_proj}, biases)


def latent_projections(down: nn.Module, up: nn.Module) -> Weights:
    """Nemotron-H's fc1_latent_proj (D -> L) and fc2_latent_proj (L -> D), two nn.Linear, and
    their biases where they have them (mlp_bias)."""
    out = {"latent_in": linear_t(down.weight), "latent_out": linear_t(up.weight)}
    if down.bias is not None:
        out |= {"latent_in_bias": down.bias, "latent_out_bias": up.bias}
    return out


def fused_shared_mlp(mlp: nn.Module) -> Weights:
    """A gated MLP of two nn.Linear (MiniMax-M3's dense MLP): gate_up_proj [2S, D], gate
    then up (`chunk(2, dim=-1)` of its output), down_proj [D, S]; no biases."""
    for projection in (mlp.gate_up_proj, mlp.down_proj):
        assert projection.bias is None, "moegen's shared expert has no biases"
    gate, up = mlp.gate_up_proj.weight.chunk(2, dim=0)  # [S, D] each
    return {
        "shared_gate": linear_t(gate),
        "shared_up": linear_t(up),
        "shared_down": linear_t(mlp.down_proj.weight),
    }


def as_numpy(weights: Weights) -> dict[str, np.ndarray]:
    """float32, C-contiguous copies."""
    return {
        name: np.ascontiguousarray(tensor.detach().to(torch.float32).numpy())
        for name, tensor in weights.items()
    }
