"""One tiny transformers model per family moegen.checkpoints covers, and the spec of the moegen
layer that computes the same MoE block (tests/test_checkpoints.py).

The families, their classes, routing and the checkpoint tests' sizes are the entries of the one
table of model families, tests/families.py (the transformers oracle uses it too). Each case:
the family (moegen.checkpoints' name), a function that builds a 2-layer float32 model of that
family with layer 1 an MoE layer, the path from the model to layer 1's MoE block, and the spec
of the matching moegen layer (tests/spec_builder.py choices). Sizes: 8 experts (16 where
groups need them), embed 32, FFN 16, so every test runs in seconds on a CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
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


def _config(entry: families.ModelFamily, transformers: Any) -> Any:
    assert entry.checkpoint is not None
    kwargs = entry.checkpoint.config_kwargs(entry.keys, EMBED, FFN)
    if entry.keys.hidden == "hidden_size":  # DbrxConfig names layers and heads its own way
        kwargs = COMMON | kwargs
    config = getattr(transformers, entry.config)(**kwargs)
    if entry.name == "dbrx":
        config.attn_config.rope_theta = 10000.0  # DbrxAttention reads it there (transformers 5.24)
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
    )


# moegen.checkpoints names both DeepSeek-V2 layouts "deepseek_v2": the greedy V2-Lite is the
# family's case, V2 proper (group-limited greedy, groups ranked by their best expert) a second
CHECKPOINT_FAMILY = {"deepseek_v2_lite": "deepseek_v2"}
CASES: dict[str, Case] = {
    CHECKPOINT_FAMILY.get(entry.name, entry.name): _case(
        entry, CHECKPOINT_FAMILY.get(entry.name, entry.name)
    )
    for entry in families.FAMILIES
    if entry.checkpoint is not None and entry.name != "deepseek_v2"
}
DEEPSEEK_V2_GROUPS = _case(families.BY_NAME["deepseek_v2"], "deepseek_v2")
