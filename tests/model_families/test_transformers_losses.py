"""transformers as the oracle of the training losses (issue 29): for every family of the
oracle table whose model trains its MoE layers with transformers' `load_balancing_loss_func`,
moegen's `aux.load_balance_loss` with `load_balance_form: transformers` (weight 1) equals that
function on the block's own router logits, value and gradient w.r.t. the input, at the normal
and the large input scale, replicated and over the ragged all-to-all. The families that define
no balance loss are listed, so a family gaining one is noticed; none of the table's families
defines a router z-loss but Switch Transformers, whose balance loss is per sequence (moegen's
`load_balance_form: sequence`): both its losses are compared (NLLB-MoE's are pending with it).
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle_gate import require_oracle

require_oracle()  # torch and transformers, or this module skipped (CI: failed)

import jax  # noqa: E402
from oracle import moegen_side  # noqa: E402
from oracle.families import BATCH, EMBED, FAMILIES, SEQ_LEN, Family  # noqa: E402
from oracle.hf_blocks import as_numpy, build_block, load  # noqa: E402
from oracle.hf_losses import (  # noqa: E402
    balance_loss_function,
    per_sequence_losses,
    router_recorder,
    run_balance_loss,
    run_per_sequence_loss,
)
from test_transformers_oracle import spec_choices  # noqa: E402

TOLERANCE = 1e-5
SEED = 1
STRATEGIES = {
    "replicated": ({"data": 2}, "replicated"),
    "a2a": ({"data": 2, "expert": 2}, "ragged_all_to_all"),
}
moegen_side.provide_cpu_devices(4)


def _block(family: Family):
    return build_block(
        family.config, family.config_kwargs, family.block, family.block_args, family.init, SEED
    )


def _trains_with_balance_loss(family: Family) -> bool:
    return balance_loss_function(load(family.block)) is not None


# families whose loss is recorded at another block of the table: why
RECORDED_ELSEWHERE = {
    "ernie4_5_vl_moe_modality": "one modality's sparse block: its router logits are recorded at "
    "the VL MoE block that holds it, which ernie4_5_vl_moe checks",
}
BALANCED = [
    family
    for family in FAMILIES
    if _trains_with_balance_loss(family)
    and family.name not in RECORDED_ELSEWHERE
    and not per_sequence_losses(load(family.block))
]
# Switch Transformers' losses: its balance loss per sequence, and a router z-loss
PER_SEQUENCE = [family for family in FAMILIES if per_sequence_losses(load(family.block))]


def test_which_families_train_with_the_balance_loss() -> None:
    """The split the cases below rest on, read from transformers: a family that gains or
    loses load_balancing_loss_func moves between the lists."""
    names = {family.name for family in BALANCED}
    assert {"mixtral", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v4", "ernie4_5_moe"} <= names
    assert not names & {"deepseek_v3", "llama4", "hunyuan_v1_moe", "axk1"}


@pytest.mark.parametrize("name", sorted(RECORDED_ELSEWHERE))
def test_families_recorded_elsewhere_have_no_recording_router(name: str) -> None:
    """The exclusions above still hold: the block has no router of its own that records."""
    family = next(family for family in FAMILIES if family.name == name)
    assert router_recorder(_block(family)) is None


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("family", BALANCED, ids=lambda family: family.name)
def test_balance_loss_matches_transformers(family: Family, strategy: str) -> None:
    # the oracle's spec of this family and strategy, with the loss in transformers' form
    choices = spec_choices(family, strategy) | {
        "load_balance_loss": 1.0,
        "load_balance_form": "transformers",
    }
    name = f"loss_{family.name}_{strategy}"
    module = moegen_side.import_source(moegen_side.rendered_source(choices, name), name)
    assert len(jax.devices()) >= module.NUM_DEVICES
    block = _block(family)
    run = moegen_side.loss_runner(module, as_numpy(family.weights(block)), "load_balance_loss")
    x = np.random.default_rng(SEED).standard_normal((BATCH, SEQ_LEN, EMBED)).astype(np.float32)
    errors = {}
    for label, scale in {"normal": 1.0, "large": family.large_scale or 1.0}.items():
        inputs = x * np.float32(scale)
        want, want_grad = run_balance_loss(block, inputs, choices["experts"], choices["top_k"])
        got, got_grad = run(inputs)
        errors[f"{label} loss"] = abs(float(got) - want) / abs(want)
        errors[f"{label} input grad"] = _relative(got_grad, want_grad)
    report = ", ".join(f"{key} {value:.2e}" for key, value in errors.items())
    print(f"{family.name} {strategy}: {report}")
    assert all(value < TOLERANCE for value in errors.values()), report


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("family", PER_SEQUENCE, ids=lambda family: family.name)
def test_per_sequence_balance_and_z_losses_match_transformers(family: Family, strategy: str):
    choices = spec_choices(family, strategy) | {
        "load_balance_loss": 1.0,
        "load_balance_form": "sequence",
        "z_loss": 1.0,
    }
    name = f"losses_{family.name}_{strategy}"
    module = moegen_side.import_source(moegen_side.rendered_source(choices, name), name)
    assert len(jax.devices()) >= module.NUM_DEVICES
    block = _block(family)
    weights = as_numpy(family.weights(block))
    x = np.random.default_rng(SEED).standard_normal((BATCH, SEQ_LEN, EMBED)).astype(np.float32)
    errors = {}
    for loss in ("load_balance_loss", "router_z_loss"):
        run = moegen_side.loss_runner(module, weights, loss)
        for label, scale in {"normal": 1.0, "large": family.large_scale or 1.0}.items():
            inputs = x * np.float32(scale)
            want, want_grad = run_per_sequence_loss(block, inputs, loss)
            got, got_grad = run(inputs)
            errors[f"{label} {loss}"] = abs(float(got) - want) / abs(want)
            errors[f"{label} {loss} input grad"] = _relative(got_grad, want_grad)
    report = ", ".join(f"{key} {value:.2e}" for key, value in errors.items())
    print(f"{family.name} {strategy}: {report}")
    assert all(value < TOLERANCE for value in errors.values()), report
