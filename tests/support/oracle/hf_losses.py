"""The losses a transformers family trains its MoE layers with, computed by transformers itself.

A family whose modeling module defines `load_balancing_loss_func` adds it to the causal-LM
loss (times `router_aux_loss_coef`) over the router logits its model records: the recorder
in the family's `_can_record_outputs["router_logits"]` names the router class and which of its
outputs are the logits. Here a forward hook on that router inside the block catches them, so
the loss is transformers' own function on transformers' own logits, for one layer.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn


def _modeling(block: nn.Module | type[nn.Module]) -> Any:
    """The block's modeling module (a block or its class)."""
    cls = block if isinstance(block, type) else type(block)
    return importlib.import_module(cls.__module__)


def router_recorders(block: nn.Module | type[nn.Module]) -> list[Any]:
    """The OutputRecorders of router logits in the family's modeling module (a multimodal
    module has one per model: thinker, talker, ...)."""
    found = []
    for value in vars(_modeling(block)).values():
        outputs = getattr(value, "_can_record_outputs", None)
        if isinstance(outputs, dict) and "router_logits" in outputs:
            if outputs["router_logits"] not in found:
                found.append(outputs["router_logits"])
    return found


def router_recorder(block: nn.Module) -> Any | None:
    """The recorder whose router class is inside this block (None: the logits are recorded
    elsewhere, e.g. at a block that holds this one)."""
    for recorder in router_recorders(block):
        if any(isinstance(m, recorder.target_class) for m in block.modules()):
            return recorder
    return None


def balance_loss_function(block: nn.Module | type[nn.Module]) -> Callable[..., torch.Tensor] | None:
    """The family's load_balancing_loss_func, where its model trains with one."""
    return getattr(_modeling(block), "load_balancing_loss_func", None)


def per_sequence_losses(block: nn.Module | type[nn.Module]) -> bool:
    """The family's losses are Switch Transformers': load_balancing_loss_func(router_probs,
    expert_indices) over each sequence, beside router_z_loss_func(router_logits)."""
    function = balance_loss_function(block)
    if function is None:
        return False
    return next(iter(inspect.signature(function).parameters)) == "router_probs"


def _router_logits(block: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The logits the block's recording router gives on inputs (one run of the block)."""
    recorder = router_recorder(block)
    assert recorder is not None, "no router inside the block records its logits"
    routers = [m for m in block.modules() if isinstance(m, recorder.target_class)]
    assert len(routers) == 1, f"{len(routers)} {recorder.target_class.__name__} in the block"
    caught: list[torch.Tensor] = []

    def catch(_module: nn.Module, _inputs: Any, output: Any) -> None:
        caught.append(output[recorder.index] if isinstance(output, tuple | list) else output)

    hook = routers[0].register_forward_hook(catch)
    try:
        block(inputs)
    finally:
        hook.remove()
    assert len(caught) == 1, f"the router ran {len(caught)} times"
    return caught[0]


def run_balance_loss(
    block: nn.Module, x: np.ndarray, num_experts: int, top_k: int
) -> tuple[float, np.ndarray]:
    """transformers' balance loss of this block on x (coefficient 1) and its gradient w.r.t. x."""
    loss_function = balance_loss_function(block)
    assert loss_function is not None, "the family trains with no load_balancing_loss_func"
    inputs = torch.tensor(x, dtype=torch.float32, requires_grad=True)
    logits = _router_logits(block, inputs).reshape(-1, num_experts)
    return _value_and_grad(loss_function((logits,), num_experts, top_k), inputs)


def run_per_sequence_loss(block: nn.Module, x: np.ndarray, loss: str) -> tuple[float, np.ndarray]:
    """Switch Transformers' loss of this block on x ("load_balance_loss": its
    load_balancing_loss_func on softmax(logits) and their argmax, as its model calls it;
    "router_z_loss": router_z_loss_func) and its gradient w.r.t. x."""
    modeling = _modeling(block)
    inputs = torch.tensor(x, dtype=torch.float32, requires_grad=True)
    logits = _router_logits(block, inputs)  # [batch, seq, experts]: one group per sequence
    if loss == "router_z_loss":
        value = modeling.router_z_loss_func(logits)
    else:
        probs = nn.functional.softmax(logits, dim=-1)
        value = modeling.load_balancing_loss_func(probs, logits.argmax(dim=-1))
    return _value_and_grad(value, inputs)


def _value_and_grad(loss: torch.Tensor, inputs: torch.Tensor) -> tuple[float, np.ndarray]:
    loss.backward()
    assert inputs.grad is not None
    return float(loss.detach()), inputs.grad.numpy()
