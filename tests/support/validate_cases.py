"""Spec choices, targets and helpers shared by the tests of stage 2, `moegen.validate`.

Each case is a dict of spec_builder choices over BASE and the diagnostics one rule must
report, each as (field, KEY or VALUE, message): the line and column expected are where
spec_builder says it wrote that field's key or value, so the loader's positions are checked
against the builder's own record of its writing, not against numbers typed by hand."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from spec_builder import spec_positions, spec_yaml

from moegen.load import LoadedSpec, load_spec_bytes
from moegen.validate import RULES, check_rules

REPO_ROOT = Path(__file__).resolve().parents[2]
RULES_BY_NAME = {rule.__name__: rule for rule in RULES}


# The spec every case starts from, as spec_builder choices: 8 experts, top-2 over a data 2 x
# fsdp 2 cpu mesh, with the fields that rules read written out even where they hold the
# schema's default (renormalize, overlap_chunks, kernel, compute), so that a diagnostic about
# them has a place in the text. A case's choices update it; a choice of None leaves a field out.
BASE: dict[str, Any] = {
    "experts": 8,
    "embed": 64,
    "ffn": 128,
    "top_k": 2,
    "renormalize": False,
    "batch": 16,
    "seq_len": 32,
    "axes": {"data": 2, "fsdp": 2},
    "overlap_chunks": 1,
    "hardware": "cpu",
    "kernel": "xla",
    "compute_dtype": "bfloat16",
}
# Where a diagnostic points at its field: the key, or the value (see spec_builder.Position).
KEY, VALUE = "key", "value"
# An expected diagnostic: (field, KEY or VALUE or an explicit (line, column), message); a
# rule's cases: [(choices over BASE, [expected diagnostics])], by rule name.
Expected = tuple[str, str | tuple[int, int], str]
Cases = dict[str, list[tuple[dict[str, Any], list[Expected]]]]
NO_CHOICES: Mapping[str, Any] = MappingProxyType({})  # BASE as it is


def case_choices(choices: Mapping[str, Any]) -> dict[str, Any]:
    """BASE updated with `choices`, less the fields a case sets to None."""
    return {name: value for name, value in (BASE | dict(choices)).items() if value is not None}


def case_yaml(choices: Mapping[str, Any] = NO_CHOICES) -> str:
    """The text of the spec of a case: BASE updated with `choices`, written by spec_builder."""
    return spec_yaml(case_choices(choices))


def loaded_spec(choices: Mapping[str, Any] = NO_CHOICES) -> LoadedSpec:
    return load_spec_bytes(case_yaml(choices).encode(), "rule.yaml", "rule")


def position(choices: Mapping[str, Any], field: str, where: str = VALUE) -> tuple[int, int]:
    """(line, column) of the key or the value of `field` where spec_builder wrote it."""
    written = spec_positions(case_choices(choices))
    assert field in written, f"{field} is not written in this case's spec"
    at = getattr(written[field], where)
    assert at is not None, f"{field} has no {where}"
    return at


def located(choices: Mapping[str, Any], expected: list) -> list[tuple[int, int, str, str]]:
    """Expected diagnostics as (field, KEY or VALUE, message), or (field, (line, column),
    message) where the position itself is under test, as the loader reports them:
    (line, column, field, message), the position taken from where the builder wrote it."""
    out = []
    for field, where, message in expected:
        line, column = where if isinstance(where, tuple) else position(choices, field, where)
        out.append((line, column, field, message))
    return out


def found(
    rule_name: str, choices: Mapping[str, Any] = NO_CHOICES
) -> list[tuple[int, int, str, str]]:
    diagnostics = RULES_BY_NAME[rule_name](loaded_spec(choices))
    assert all(d.file == "rule.yaml" for d in diagnostics)
    return [(d.line, d.column, d.field, d.message) for d in diagnostics]


# Valid slice shapes as the messages list them.
V5E_SLICES = "1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"  # v6e offers the same
V5P_SLICES = (
    "2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, 4x8x8, 8x8x8, 8x8x16, 8x16x16, 16x16x16, 16x16x24"
)
TPU7X_SLICES = "2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, 4x8x8, 8x8x8, 8x8x16"
# Pallas targets matching the default 4-device mesh.
PALLAS_V5E = {"hardware": "tpu-v5e", "topology": "2x2", "kernel": "pallas"}
PALLAS_V6E = {"hardware": "tpu-v6e", "topology": "2x2", "kernel": "pallas"}
# One NVLink node of 8 H100s, fsdp over all of them.
H100_8 = {"hardware": "gpu-h100", "topology": 8, "axes": {"fsdp": 8}}
TE_OFF_GPU = (
    "kernel te (Transformer Engine) runs on NVIDIA GPU targets only (gpu-a100, gpu-h100, "
    "gpu-h200, gpu-b200), not {target}; use kernel: {other}"
)
# Experts sharded over a 4-device expert axis, chunked overlap possible.
RING = {"axes": {"expert": 4}, "strategy": "ring_of_experts"}
# Two TPU v5e 2x4 slices (8 chips each) joined by the data-center network: 16 devices.
TWO_V5E_SLICES = {"hardware": "tpu-v5e", "topology": "2x4", "slices": 2}
# specs/mixtral_8x7b_2slices_v5e.yaml's mesh: data parallel across the 2 slices, fsdp 2 x
# expert 4 (ragged all-to-all) inside each; 16 devices, batch 16 one sequence each.
MIXTRAL_2SLICES = {
    **TWO_V5E_SLICES,
    "axes": {"data": 2, "fsdp": 2, "expert": 4},
    "strategy": "ragged_all_to_all",
    "dcn_axes": {"data": 2},
}
EXPERT_OVER_DCN = (
    "splitting the expert axis over 2 slices sends every token exchange over the data-center "
    "network, about 10x slower than the links inside a slice; cross slices with data (or "
    "fsdp) instead, or set mesh.expert_over_dcn: true to accept it"
)


# DeepSeek-V3's router: 256 experts in 8 groups, the best 4 kept, top-8 sigmoid scores with
# the aux-loss-free bias, renormalised and scaled by 2.5.
DEEPSEEK_V3 = {
    "experts": 256,
    "top_k": 8,
    "renormalize": True,
    "score": "sigmoid",
    "routed_scaling": 2.5,
    "group_limit": (8, 4),
    "routing_bias": True,
}
ROUTING_BIAS_ON_LOGITS = (
    "score_after_top_k chooses experts by their raw logits, before any score exists to add "
    "the balancing bias to; set score_after_top_k: false (the bias is then added to the "
    "softmax probabilities, as ERNIE 4.5 does) or routing_bias: false"
)
CAPACITY_TWICE = (
    "capacity.factor and capacity.copies both give the copies each expert keeps; remove one"
)
CAPACITY_WITHOUT_SIZE = (
    "a capacity needs its size: factor (copies per expert = ceil(factor * tokens * top_k / "
    "num_experts), e.g. 1.25) or copies (a fixed count)"
)
CAPACITY_PER_SPLIT_SEQUENCE = (
    "capacity per sequence counts a sequence's copies in token order, and the sequence axis "
    "splits each sequence over 2 devices, which would have to count each other's; use per: "
    "device, or drop the sequence axis"
)
NOTHING_BALANCES = (
    "a capacity drops what unbalanced routing sends past it, and nothing here balances the "
    "routing; set router.load_balance_loss (e.g. 0.01) or router.routing_bias: true, "
    "or remove capacity (dropless)"
)
EPSILON_WITHOUT_RENORMALIZE = (
    "renormalize_epsilon is added to the sum the top-k weights are divided by, and renormalize "
    "is false, so nothing is divided; set renormalize: true or remove renormalize_epsilon"
)
BIAS_ON_WITHOUT_BIAS = (
    "routing_bias_on says where the selection bias is added, and routing_bias is false; set "
    "routing_bias: true or remove routing_bias_on"
)
FORM_WITHOUT_LOSS = (
    "load_balance_form: transformers defines a loss that is not computed "
    "(router.load_balance_loss is 0); set router.load_balance_loss to its weight (a model "
    "config's router_aux_loss_coef, e.g. 0.001), or remove load_balance_form"
)


def rule_params(cases: dict[str, list[tuple[dict, list]]]) -> list:
    """pytest params of (rule name, spec choices, expected diagnostics) for each case."""
    return [
        pytest.param(name, choices, expected, id=f"{name}-{i}-{'pass' if not expected else 'fail'}")
        for name, rule_cases in cases.items()
        for i, (choices, expected) in enumerate(rule_cases)
    ]


def assert_only_the_rule_fires(name: str, choices: dict, expected: list) -> None:
    """The failing cases are minimal: check_rules reports exactly this rule's diagnostics,
    except where a case needs a second, related rule to fire too."""
    loaded = loaded_spec(choices)
    others = [d for rule in RULES if rule.__name__ != name for d in rule(loaded)]
    everything = check_rules(loaded)
    assert len(everything) == len(expected) + len(others)
    if not expected:
        return
    related = {
        ("batch_axes_are_mesh_axes", "data_parallel_axes_shard_batch"),
        ("data_parallel_axes_shard_batch", "batch_divisible_by_batch_axes"),
    }
    for d in others:
        fired = next(r.__name__ for r in RULES if d in r(loaded))
        assert (name, fired) in related or (fired, name) in related, (name, d)


def rule_tests(cases: dict[str, list[tuple[dict, list]]]) -> tuple[object, object]:
    """The two tests every subject file runs over its CASES table, assigned at its top level
    as `test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)`."""
    params = rule_params(cases)

    @pytest.mark.parametrize(("name", "choices", "expected"), params)
    def test_rule(name: str, choices: dict, expected: list) -> None:
        assert found(name, choices) == located(choices, expected)

    @pytest.mark.parametrize(("name", "choices", "expected"), params)
    def test_only_the_rule_under_test_fires_in_check_rules(
        name: str, choices: dict, expected: list
    ) -> None:
        assert_only_the_rule_fires(name, choices, expected)

    return test_rule, test_only_the_rule_under_test_fires_in_check_rules
