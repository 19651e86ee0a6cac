"""ERNIE 4.5's shared-expert biases (use_bias) through moegen.checkpoints: loaded into
shared_b_gate/up/down against a transformers checkpoint, and refused, naming the spec field,
by a module that would drop them."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkpoint_cases import CASES, ERNIE_SHARED_BIASES
from checkpoint_helpers import check_family, module_for, oracle, tiny_model

from moegen.checkpoints import CheckpointError, load_layer_params


def test_ernie_shared_expert_biases_match_transformers(tmp_path: Path) -> None:
    check_family(ERNIE_SHARED_BIASES, tmp_path)


def test_shared_expert_biases_need_shared_ffn_bias(tmp_path: Path) -> None:
    """A module without shared_ffn_bias would drop ERNIE's shared biases: refused, naming them
    and the spec field that keeps them."""
    torch, transformers = oracle()
    case = ERNIE_SHARED_BIASES
    module = module_for(CASES["ernie4_5_moe"].spec, tmp_path)
    tiny_model(case, torch, transformers).save_pretrained(tmp_path / "ck")
    with pytest.raises(CheckpointError) as refused:
        load_layer_params(module, tmp_path / "ck", layer=1, family="ernie4_5_moe")
    message = str(refused.value)
    assert "shared_experts.gate_proj.bias" in message, message
    assert "the spec must say layer.shared_ffn_bias: true" in message, message
