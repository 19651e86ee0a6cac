"""Shape variants on every path beside CPU / xla / replicated: the pallas kernel with
ragged_all_to_all, the overlapped ring of experts, FFN slices, capacity, and a mesh with the
tensor and sequence axes. Each spec has the main shape and a variant of other local tokens;
the verify step's twin parity (forward, aux, gradients against the dense reference) must pass
for every shape, and each variant must have its own parity steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_twin_parity, generated_from
from spec_builder import tiny

from moegen.verify import verify

PALLAS = {"hardware": "tpu-v5e", "topology": "2x4", "kernel": "pallas"}

# name -> the spec's choices; every case has at least one variant of other local tokens.
CASES = {
    "pallas_ragged_all_to_all": tiny(
        embed=256, ffn=256, axes={"data": 2, "expert": 4}, strategy="ragged_all_to_all",
        variants={"eval": {"batch": 16, "seq_len": 16}, "prefill": {"batch": 8, "seq_len": 64}},
        **PALLAS,
    ),
    "ring_overlapped": tiny(
        axes={"data": 2, "expert": 2}, strategy="ring_of_experts", overlap_chunks=2,
        variants={"prefill": {"batch": 4, "seq_len": 64}},
    ),
    "ffn_slices": tiny(ffn_chunks=2, variants={"prefill": {"batch": 4, "seq_len": 64}}),
    "capacity": tiny(
        capacity=(1.0, "probability"), load_balance_loss=0.01,
        variants={"eval": {"batch": 16, "seq_len": 16}, "prefill": {"batch": 4, "seq_len": 64}},
    ),
    "tensor_sequence": tiny(
        axes={"data": 2, "tensor": 2, "sequence": 2},
        variants={"prefill": {"batch": 4, "seq_len": 64}},
    ),
}  # fmt: skip


def test_every_case_plans_its_variants_with_other_local_tokens(tmp_path, monkeypatch) -> None:
    for name, choices in CASES.items():
        plan = generated_from(choices, tmp_path, monkeypatch).plan
        assert [v.name for v in plan.variants] == list(choices["variants"]), name
        for variant in plan.variants:
            assert variant.plan.local_tokens != plan.local_tokens, (name, variant.name)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.slow
def test_each_shape_matches_the_dense_reference(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generated = generated_from(CASES[case], tmp_path, monkeypatch)
    report = verify(generated.loaded, generated.source, run_compiles=False)
    names = [step["step"] for step in assert_twin_parity(report)]
    variants = list(CASES[case]["variants"])
    main = [name for name in names if not name.endswith(tuple(f", {v})" for v in variants))]
    assert main, names
    for variant in variants:  # each variant twin-checked as the main shape is
        own = [name for name in names if name.endswith(f", {variant})")]
        assert [name.replace(f", {variant})", ")") for name in own] == main, (variant, names)
