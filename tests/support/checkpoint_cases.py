"""One tiny transformers model per family moegen.checkpoints covers, and the spec of the moegen
layer that computes the same MoE block (tests/model_families/test_checkpoints.py).

The families, their classes, routing and the checkpoint tests' sizes are the entries of the one
table of model families, tests/support/families.py (the transformers oracle uses it too). Each case:
the family (moegen.checkpoints' name), a function that builds a 2-layer float32 model of that
family with layer 1 an MoE layer, the path from the model to layer 1's MoE block, and the spec
of the matching moegen layer (tests/support/spec_builder.py choices). Sizes: 8 experts (16 where
groups need them), embed 32, FFN 16, so every test runs in seconds on a CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import families

EMBED, FFN = families.EMBED, families.CHECKPOINT_FFN
COMMON = {
    "vocab_size": 64,
    "hidden_size": EMBED,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
# the moegen side: one CPU device, float32 throughout, 2 x 8 tokens
SPEC_BASE = {
    "experts": 8,
    "embed": EMBED,
    "ffn": FFN,
    "top_k": 2,
    "batch": 2,
    "seq_len": 8,
    "params_dtype": "float32",
    "compute_dtype": "float32",
    "axes": {"data": 1},
}


@dataclass(frozen=True)
class Case:
    family: str
    model: str  # transformers class
    config: Callable[[Any], Any]  # transformers module -> config
    spec: dict[str, Any]  # spec_builder choices, merged into SPEC_BASE
    block: Callable[[Any], Any] = lambda model: model.model.layers[1].mlp
    fused_differs: bool = True  # the in-memory (state_dict) names differ from save_pretrained's
    block_path: str = "model.layers.1.mlp"  # the path from the model to layer 1's block

    def block_at(self, model: Any, layer: int) -> Any:
        """Layer `layer`'s MoE block (of a model with more layers than the case's two)."""
        parts = ["{L}" if part == "1" else part for part in self.block_path.split(".")]
        return _attribute_path(".".join(parts).format(L=layer), model)


def _config(entry: families.ModelFamily, transformers: Any, **more: Any) -> Any:
    """The family's tiny config; `more` replaces or adds arguments (e.g. more layers)."""
    assert entry.checkpoint is not None
    kwargs = entry.checkpoint.config_kwargs(entry.keys, EMBED, FFN)
    if entry.keys.hidden == "hidden_size":  # DbrxConfig names layers and heads its own way
        kwargs = COMMON | kwargs
    kwargs |= more
    config = getattr(transformers, entry.config)(**kwargs)
    if entry.name == "dbrx":
        config.attn_config.rope_theta = (
            10000.0  # DbrxAttention reads it there (transformers 5.24, 5.25)
        )
    return config


def _attribute_path(path: str, model: Any) -> Any:
    """`model.layers.1.mlp` of a model: attributes, and indices where a part is a number."""
    for part in path.split("."):
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


def _case(entry: families.ModelFamily, family: str) -> Case:
    assert entry.checkpoint is not None
    return Case(
        family,
        entry.model,
        functools.partial(_config, entry),
        entry.checkpoint.spec_choices(entry.routing, EMBED, FFN),
        block=functools.partial(_attribute_path, entry.checkpoint_block),
        fused_differs=entry.fused_differs,
        block_path=entry.checkpoint_block,
    )


def randomize_block(block: Any, torch: Any, generator: Any) -> None:
    """Every float weight and buffer of an MoE block random and non-zero (transformers starts
    biases at zero, which would hide a bias loaded wrong)."""
    with torch.no_grad():
        for name, tensor in [*block.named_parameters(), *block.named_buffers()]:
            if tensor.is_floating_point():
                scale = 0.5 if ("bias" in name or tensor.ndim == 1) else 0.3
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * scale)


# the loader's family of a case named otherwise: both DeepSeek-V2 layouts are "deepseek_v2" (the
# greedy V2-Lite is the family's case, V2 proper, group-limited greedy with groups ranked by
# their best expert, a second); Llama 4's is its text model's model_type (the multimodal
# "llama4" loads as it)
CHECKPOINT_FAMILY = {"deepseek_v2_lite": "deepseek_v2", "llama4": "llama4_text"}
CASES: dict[str, Case] = {
    CHECKPOINT_FAMILY.get(entry.name, entry.name): _case(
        entry, CHECKPOINT_FAMILY.get(entry.name, entry.name)
    )
    for entry in families.FAMILIES
    if entry.checkpoint is not None and entry.name != "deepseek_v2"
}
DEEPSEEK_V2_GROUPS = _case(families.BY_NAME["deepseek_v2"], "deepseek_v2")
# ERNIE 4.5 with use_bias: its shared experts' projections have biases
_ERNIE = families.BY_NAME["ernie4_5_moe"]
ERNIE_SHARED_BIASES = replace(
    _case(_ERNIE, "ernie4_5_moe"),
    config=functools.partial(_config, _ERNIE, use_bias=True),
    spec=_case(_ERNIE, "ernie4_5_moe").spec | {"shared_ffn_bias": True},
)


# family -> (config arguments of a model mixing dense and MoE layers, the MoE layers they make)
MULTI_LAYER: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "deepseek_v3": ({"num_hidden_layers": 3, "first_k_dense_replace": 1}, (1, 2)),
    "qwen2_moe": ({"num_hidden_layers": 4, "mlp_only_layers": [0, 2]}, (1, 3)),
    "qwen3_moe": ({"num_hidden_layers": 4, "decoder_sparse_step": 2}, (1, 3)),
    "jamba": ({"num_hidden_layers": 4, "expert_layer_period": 2, "expert_layer_offset": 1}, (1, 3)),
}


def multi_layer_model(family: str, torch: Any, transformers: Any) -> Any:
    """The family's tiny model with MULTI_LAYER's layers, every MoE block random, non-zero."""
    case = CASES[family]
    arguments, moe_layers = MULTI_LAYER[family]
    torch.manual_seed(0)
    model = getattr(transformers, case.model)(case.config(transformers, **arguments)).eval()
    try:
        model.set_experts_implementation("eager")
    except (ValueError, AttributeError, NotImplementedError):
        pass  # families without the experts interface run their own loop
    generator = torch.Generator().manual_seed(1)
    for layer in moe_layers:
        randomize_block(case.block_at(model, layer), torch, generator)
    return model


def block_and_input_gradient(block: Any, x: Any, cotangent: Any, torch: Any) -> tuple[Any, Any]:
    """A transformers block's output on x and the gradient of sum(output * cotangent) by x
    (numpy arrays in and out)."""
    inputs = torch.from_numpy(x).requires_grad_(True)
    out = block(inputs)
    out = (out[0] if isinstance(out, tuple) else out).reshape(x.shape)
    (out * torch.from_numpy(cotangent)).sum().backward()
    return out.detach().numpy(), inputs.grad.numpy()
