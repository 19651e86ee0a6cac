"""Stage 3, `moegen plan SPEC [--json]`, and what the plan text says (tiles, memory, padding)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from plan_cases import (
    EXAMPLE,
    REPO_ROOT,
    SHAPES,
    TPU_EXAMPLE,
    TPU_TARGETS,
    run_cli,
    spec_text,
    tokens_line,
    tpu_spec,
)

from moegen.load import load_spec_bytes
from moegen.pipeline import load_valid
from moegen.plan import format_plan, make_plan
from moegen.validate import validate


def test_cli_plan_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = run_cli("plan", EXAMPLE)
    assert result.returncode == 0, result.stderr
    assert result.stdout == format_plan(make_plan(load_valid(Path(EXAMPLE)))) + "\n"
    lines = result.stdout.splitlines()
    assert lines[0] == f"{EXAMPLE} -> mixtral_small_cpu.py"
    assert "  mesh            data=2 x fsdp=4 (8 devices); batch over ('data', 'fsdp')" in lines
    assert "  input           [16, 256, 512] bfloat16 -> per device [2, 256, 512]" in lines
    assert any(line.startswith("  tokens/device   512; routed rows 1024 ") for line in lines)
    assert (
        "    w_down   [8, 1792, 512] float32 spec P(None, None, 'fsdp') -> per device [8, 1792, 128]"
        in lines
    )


def test_cli_plan_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = run_cli("plan", EXAMPLE, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    expected = json.loads(json.dumps(make_plan(load_valid(Path(EXAMPLE))).to_dict()))
    # without --compile, nothing was compiled
    assert data == expected | {"compiled": []}
    assert data["module_name"] == "mixtral_small_cpu"
    assert data["spec_display"] == EXAMPLE
    assert data["local_tokens"] == 512
    assert data["routed_rows"] == 1024
    assert data["cost"]["router_flops"] == 2 * 512 * 512 * 8
    assert data["cost"]["expert_flops"] == 6 * 512 * 2 * 512 * 1792


def test_cli_plan_invalid_spec_exits_3() -> None:
    path = "tests/invalid_specs/top_k_above_num_experts.yaml"
    result = run_cli("plan", path)
    assert result.returncode == 3
    assert f"{path}:8:10: router.top_k: must be <= layer.num_experts (8), got 9" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout == ""


def test_cli_plan_tpu_example(monkeypatch: pytest.MonkeyPatch) -> None:
    from moegen.hardware import hardware

    monkeypatch.chdir(REPO_ROOT)
    result = run_cli("plan", TPU_EXAMPLE)
    assert result.returncode == 0, result.stderr
    assert result.stdout == format_plan(make_plan(load_valid(Path(TPU_EXAMPLE)))) + "\n"
    lines = result.stdout.splitlines()
    assert lines[0] == f"{TPU_EXAMPLE} -> mixtral_8x7b_v5e.py"
    assert (
        "  megablox tiles  gate/up [512, 1024, 1024], down [512, 1024, 1024] "
        "(rows, contraction, output); gradients: gate/up [512, 1024, 1024] and [512, 1024, 1024], "
        "down [512, 1024, 1024] and [512, 1024, 1024] (input gmm, weight tgmm)"
    ) in lines
    hbm = hardware("tpu-v5e").hbm_bytes_per_device / 2**30
    assert (
        f"  memory estimate forward 3.031 GiB, forward+backward 5.401 GiB of {hbm:.3f} GiB HBM "
        "per device"
    ) in lines
    # the ledger follows, largest first, then what FFN slices would cost
    start = lines.index(next(line for line in lines if line.startswith("  memory estimate")))
    assert (
        lines[start + 1 :]
        == [
            "    (an estimate of XLA's buffer assignment: on two generated populations of TPU "
            "layers it was over 10% off the compiled peak",
            "     on about 31% of the programs; `moegen plan --assigned` reads the compiler's "
            "figure in seconds)",
            "       2.625 GiB  gathered expert weights and one weight's gradient, at the weight "
            "gradients",
            "       0.656 GiB  parameters (stored shards)",
            "       0.656 GiB  parameter gradients (stored shards)",
            "       0.656 GiB  FFN activations and gradients at the backward peak (3 x [rows, 14336])",
            "       0.525 GiB  XLA's packing of the temporaries (+15%)",
            "       0.219 GiB  one weight's float32 gradient shard, before it is copied out",
            "       0.062 GiB  layer input and its gradient",
            "       384.0 KiB  router logits, scores and their gradients",
            "  FFN slices      1 (14336 columns each); memory.ffn_chunks options, forward+backward:",
            "      1 slices  peak  5.401 GiB  recomputed FLOPs 0.000e+00  <- this spec",
            "      2 slices  peak  3.766 GiB  recomputed FLOPs 1.924e+12",
        ]
        + lines[start + 14 :]
    )
    assert "  experts         8 (8 per device, replicated); kernel pallas; target tpu-v5e 2x4" in (
        lines
    )


def test_cli_plan_json_tpu_example(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = run_cli("plan", TPU_EXAMPLE, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    kernel, mesh = data["kernel"], data["mesh"]
    assert kernel["config"]["gate_up_tile"] == kernel["config"]["down_tile"] == [512, 1024, 1024]
    assert mesh["tpu_topology_name"] == "v5e:2x4"
    assert mesh["chips_per_host_bounds"] == [2, 4, 1]
    assert (kernel["name"], kernel["config"]["interpret"], kernel["check_vma"]) == (
        "pallas",
        False,
        False,
    )
    assert sum(size for _, size in data["memory"]["ledger"]) == data["memory"]["train_peak"]


@pytest.mark.parametrize(
    ("spec", "where"),
    [("mixtral_8x7b_v5e", "`moegen plan --assigned` reads"), ("mixtral_8x7b_h100", "--compile")],
)
def test_the_ledger_names_where_the_compilers_figure_is(spec: str, where: str, repo_root) -> None:
    """On a TPU slice the compiler's figure is seconds away (--assigned); elsewhere a compile."""
    text = format_plan(make_plan(load_valid(repo_root / "specs" / f"{spec}.yaml")))
    assert where in text


def test_cli_plan_cpu_has_no_tile_line() -> None:
    result = run_cli("plan", EXAMPLE)
    assert result.returncode == 0, result.stderr
    assert "megablox tiles" not in result.stdout
    assert any(line.startswith("  memory estimate forward ") for line in result.stdout.splitlines())
    assert " HBM per device" not in result.stdout  # cpu has no fixed memory to compare with


def test_plan_text_says_what_is_padded() -> None:
    tiles = {"gate_up": [256, 512, 512], "down": [384, 256, 512]}
    shape = dataclasses.replace(SHAPES["qwen3-30b-a3b"], batch=8, seq=1000)
    text = format_plan(make_plan(tpu_spec("tpu-v5e", "2x4", {"data": 8}, shape=shape, tiles=tiles)))
    # Only the total row count is rounded up (1000 tokens x top-8 = 8000 rows, to a multiple
    # of lcm(256, 384) = 768: 11 * 768 = 8448); expert groups start anywhere, megablox masks
    # partial row tiles. The text says so, not that groups are aligned.
    assert "groups aligned" not in text
    assert (
        "  tokens/device   1000; routed rows 8000 (x top_8, dropless); grouped-matmul calls "
        "of 8000 rows padded to 8448 (a multiple of 768: whole row tiles)"
    ) in text.splitlines()


def test_xla_plan_text_does_not_speak_of_row_tiles() -> None:
    name, topology, axes, *_ = TPU_TARGETS["v5e-2x4"]
    plan = make_plan(tpu_spec(name, topology, axes, kernel="xla"))
    assert (plan.kernel.config, plan.experts.ffn_rows) == (None, plan.routed_rows)
    text = format_plan(plan)
    assert "row tiles" not in text
    assert "padded to" not in text
    assert "no padding (groups of any size)" in tokens_line(plan)


@pytest.mark.parametrize("experts", ["replicated", "ragged_all_to_all"])
def test_plan_text_says_padded_only_when_rows_are_padded(experts: str) -> None:
    axes = {"fsdp": 8} if experts == "replicated" else {"fsdp": 2, "expert": 4}
    target = {"hardware": "tpu-v5e", "topology": "2x4", "kernel": "pallas"}
    raw = spec_text(SHAPES["mixtral-8x7b"], axes, None, strategy=experts, **target)
    plan = make_plan(validate(load_spec_bytes(raw.encode(), "specs/plan_case.yaml", "plan_case")))
    assert plan.kernel.config.row_alignment > 1 and not plan.kernel.config.pads_rows
    assert plan.kernel.config.padded_rows == plan.experts.ffn_rows
    assert "padded to" not in tokens_line(plan)
