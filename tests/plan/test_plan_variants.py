"""`moegen plan SPEC [--json]` on a spec with shape variants: a block per variant with its
shape, local tokens, routed rows, receive buffer and planned memory, each from the variant's
own plan; --json holds every variant's whole plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plan_cases import REPO_ROOT, run_cli
from spec_builder import spec_yaml, tiny

from moegen.load import load_spec_bytes
from moegen.pipeline import load_valid
from moegen.plan import format_plan, make_plan
from moegen.validate import validate

EXAMPLE = "specs/mixtral_small_variants_cpu.yaml"
A2A = tiny(
    axes={"data": 2, "expert": 2},
    strategy="ragged_all_to_all",
    ffn_chunks=2,
    variants={"prefill": {"batch": 4, "seq_len": 64}},
)


def _block(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("  shape variants")))
    return lines[start:]


def test_cli_plan_text_has_a_block_per_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = run_cli("plan", EXAMPLE)
    assert result.returncode == 0, result.stderr
    assert result.stdout == format_plan(make_plan(load_valid(Path(EXAMPLE)))) + "\n"
    assert _block(result.stdout) == [
        "  shape variants  2, the same parameters, each planned whole:",
        "    eval         x [32, 128, 512] -> per device [4, 128, 512], moe_layer_eval",
        "                 tokens/device 512; routed rows 1024 (at most 160 per expert kept, "
        "drop by probability); no receive buffer",
        "                 memory estimate forward 0.058 GiB, forward+backward 0.109 GiB per device",
        "    prefill      x [8, 1024, 512] -> per device [1, 1024, 512], moe_layer_prefill",
        "                 tokens/device 1024; routed rows 2048 (at most 320 per expert kept, "
        "drop by probability); no receive buffer",
        "                 memory estimate forward 0.067 GiB, forward+backward 0.122 GiB per device",
    ]


def test_each_variant_line_comes_from_its_own_plan() -> None:
    plan = make_plan(validate(load_spec_bytes(spec_yaml(A2A).encode(), "a2a.yaml", "a2a")))
    (variant,) = plan.variants
    v = variant.plan
    assert (v.local_tokens, v.routed_rows) == (64, 128)
    assert v.experts.receive_rows > plan.experts.receive_rows > 0
    block = _block(format_plan(plan))
    assert block[1].startswith("    prefill      x [4, 64, 64] -> per device [1, 64, 64]")
    assert f"routed rows 128 (dropless); receive buffer {v.experts.receive_rows} rows" in block[2]
    assert block[3].endswith(" per device, FFN slices 2")


def test_a_spec_without_variants_has_no_block() -> None:
    plan = make_plan(validate(load_spec_bytes(spec_yaml(tiny()).encode(), "t.yaml", "t")))
    assert "shape variants" not in format_plan(plan)


def test_cli_plan_json_holds_each_variant_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = run_cli("plan", EXAMPLE, "--json")
    assert result.returncode == 0, result.stderr
    variants = json.loads(result.stdout)["variants"]
    assert [(v["name"], v["function"], v["input_shape"]) for v in variants] == [
        ("eval", "moe_layer_eval", [32, 128, 512]),
        ("prefill", "moe_layer_prefill", [8, 1024, 512]),
    ]
    assert [v["plan"]["local_tokens"] for v in variants] == [512, 1024]
    assert [v["plan"]["routed_rows"] for v in variants] == [1024, 2048]
    assert all(v["plan"]["memory"]["train_peak"] > 0 for v in variants)


def test_per_device_shapes_split_seq_len_over_the_sequence_axis() -> None:
    choices = tiny(
        axes={"data": 2, "tensor": 2, "sequence": 2},
        variants={"prefill": {"batch": 4, "seq_len": 64}},
    )
    text = format_plan(
        make_plan(validate(load_spec_bytes(spec_yaml(choices).encode(), "s.yaml", "s")))
    )
    assert "  input           [8, 16, 64] bfloat16 -> per device [4, 8, 64]" in text.splitlines()
    assert "    prefill      x [4, 64, 64] -> per device [2, 32, 64], moe_layer_prefill" in text
