"""transformers as the oracle: moegen's generated layers against the MoE blocks of the
model families themselves (issue 18).

For each family of tests/support/oracle/families.py: a tiny cpu spec (float32 params and compute,
kernel xla) with that model's routing and FFN, rendered in-process and imported; the
family's own transformers block (float32, eval, eager experts, seeded weights, every bias
non-zero) with its weights mapped into the module's parameters; then the output and the
gradient of sum(output) w.r.t. the input must agree (relative error, the norm of the
difference over the norm of transformers' value, below 1e-5) for a seeded random input at a
normal scale and at a large one (where a family clamps its SwiGLU, large enough that the
clamps bite, counted inside transformers' experts). Each family runs with replicated
experts (data 2) and over one sharded strategy, the ragged all-to-all (data 2 x expert 2) or
the ring of experts (expert 2), in turns down the table.

torch and transformers come from the `oracle` extra (test-only: pinned to transformers 5.25
and torch 2.14): without them the test skips, unless MOEGEN_REQUIRE_ORACLE is set (CI and
`make test`), where their absence fails.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from oracle_gate import require_oracle

require_oracle()  # torch and transformers, or this module skipped (CI: failed)

import jax  # noqa: E402
from oracle import moegen_side  # noqa: E402
from oracle.families import BATCH, EMBED, FAMILIES, SEQ_LEN, Family  # noqa: E402
from oracle.hf_blocks import as_numpy, build_block, counting_bites, run_block  # noqa: E402

TOLERANCE = 1e-5
SEED = 0

# strategy -> (mesh axes, parallelism.experts)
STRATEGIES = {
    "replicated": ({"data": 2}, "replicated"),
    "a2a": ({"data": 2, "expert": 2}, "ragged_all_to_all"),
    "ring": ({"expert": 2}, "ring_of_experts"),
}
moegen_side.provide_cpu_devices(max(int(np.prod(list(a.values()))) for a, _ in STRATEGIES.values()))


def spec_choices(family: Family, strategy: str) -> dict:
    axes, experts = STRATEGIES[strategy]
    return family.spec | {
        "batch": BATCH,
        "seq_len": SEQ_LEN,
        "params_dtype": "float32",
        "compute_dtype": "float32",
        "axes": axes,
        "strategy": experts,
        "hardware": "cpu",
        "kernel": "xla",
    }


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def strategies_of(index: int) -> tuple[str, str]:
    """Every family replicated and over one sharded strategy, the ragged all-to-all and the
    ring taking turns down the table (both the sharded ones cover half the families each:
    a family's routing and FFN run the same code whichever strategy moves its tokens;
    MOEGEN_ORACLE_EVERY_STRATEGY=1 runs all three for every family)."""
    return ("replicated", "a2a" if index % 2 == 0 else "ring")


EVERY_STRATEGY = bool(os.environ.get("MOEGEN_ORACLE_EVERY_STRATEGY"))
CASES = [
    pytest.param(family, strategy, id=f"{family.name}-{strategy}")
    for index, family in enumerate(FAMILIES)
    for strategy in STRATEGIES
    if EVERY_STRATEGY or strategy in strategies_of(index)
]


@pytest.mark.parametrize(("family", "strategy"), CASES)
def test_generated_layer_matches_transformers_block(family: Family, strategy: str) -> None:
    scales = {"normal": 1.0}
    if family.large_scale is not None:
        scales["large"] = family.large_scale
    compare(family, strategy, scales)


def compare(family: Family, strategy: str, scales: dict[str, float]) -> None:
    """The family's spec rendered for `strategy` against its transformers block, at each
    input scale: output and input gradient within TOLERANCE; clamps bite at the large one."""
    name = f"oracle_{family.name}_{strategy}"
    module = moegen_side.import_source(
        moegen_side.rendered_source(spec_choices(family, strategy), name), name
    )
    if len(jax.devices()) < module.NUM_DEVICES:
        message = (
            f"{module.NUM_DEVICES} CPU devices needed, {len(jax.devices())} here (a JAX "
            "computation ran in this process before this module was collected)"
        )
        if os.environ.get("MOEGEN_REQUIRE_ORACLE"):
            pytest.fail(message)
        pytest.skip(message)

    block = build_block(
        family.config, family.config_kwargs, family.block, family.block_args, family.init, SEED
    )
    run = moegen_side.runner(module, as_numpy(family.weights(block)))

    x = np.random.default_rng(SEED).standard_normal((BATCH, SEQ_LEN, EMBED)).astype(np.float32)
    errors, bites = {}, {}
    for label, scale in scales.items():
        inputs = x * np.float32(scale)
        if family.clamp is not None:
            limit, split = family.clamp
            with counting_bites(block, limit, split) as counted:
                want_y, want_grad = run_block(block, inputs)
            bites[label] = counted
        else:
            want_y, want_grad = run_block(block, inputs)
        got_y, got_grad = run(inputs)
        if "capacity" in family.spec:  # a capacity that drops nothing would prove nothing
            weights = as_numpy(family.weights(block))
            assert moegen_side.dropped_copies(module, weights, inputs) > 0, label
        if family.spec.get("identity_experts"):  # so must identity experts nobody chose
            weights = as_numpy(family.weights(block))
            assert moegen_side.identity_copies(module, weights, inputs) > 0, label
        errors[f"{label} output"] = relative_error(got_y, want_y)
        errors[f"{label} input grad"] = relative_error(got_grad, want_grad)

    report = ", ".join(f"{key} {value:.2e}" for key, value in errors.items())
    print(f"{family.name} {strategy}: {report}")
    if bites:
        print(f"  clamp bites: {bites}")
    if "large" in bites:
        large = bites["large"]
        assert large.gate > 0 and large.up > 0, (
            f"no clamp bites at input scale {scales['large']}: {large}"
        )
    bad = {key: value for key, value in errors.items() if not value < TOLERANCE}
    assert not bad, f"{family.name} ({strategy}) differs from transformers: {report}"
