"""XLA's buffer assignment read before code generation (moegen.verify.memory.assigned, `moegen plan
--assigned`): the compiled peak, without the compile's minutes.

bench/stores/ledger_compiled.json records each TPU example's finished compile
(memory_analysis), and tests/fit/test_ledger.py holds those records to the module each example
renders now; the assigned figures must be the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.ledger import DEFAULT_JSON
from moegen.cli_plan import assigned_text
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.verify import VerifyError
from moegen.verify.memory import assigned
from moegen.verify.memory.assigned import (
    MODULE_NAMES,
    _failure,
    assigned_sizes,
    whole_layer,
    whole_layer_text,
    whole_layer_verdict,
)

RECORDS = DEFAULT_JSON
# XLA's text for a program's buffers: entry parameters, a parameter the output aliases, the
# output tuple's index table and an output, scoped scratch (another colour) and the block
ASSIGNMENT = """\
allocation 0: size 4, color 8, page 0, thread-local:
allocation 1: size 1000, page 0, parameter 0, shape |f32[250]| at ShapeIndex {}:
allocation 2: size 500, page 0, parameter 1, maybe-live-out, shape |f32[125]| at ShapeIndex {}:
allocation 3: size 32, page 0, output shape is |(f32[250], f32[125])|, maybe-live-out:
allocation 4: size 1000, page 0, maybe-live-out:
allocation 5: size 64, color 6, page 0, preallocated-temp:
allocation 6: size 7000, page 0, preallocated-temp:
allocation 7: size 512, page 0, constant:
"""


def test_the_sizes_are_counted_as_memory_analysis_counts_them() -> None:
    assert assigned_sizes(ASSIGNMENT) == (1500, 1032, 7000)


def test_a_worker_the_compiler_refused_reports_the_memory_it_ran_out_of(tmp_path: Path) -> None:
    log = tmp_path / f"{MODULE_NAMES['forward+backward']}.log"
    log.write_text(
        "W0000 some warning\njaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: E1000: "
        "CompileTimeHbmOom: Ran out of memory in memory space hbm. Used 17.2G of 15.75G hbm.\n"
    )
    message = _failure(tmp_path, "forward+backward")
    assert message.startswith("compile forward+backward: out of HBM: RESOURCE_EXHAUSTED")
    log.write_text("Traceback (most recent call last):\nValueError: bad module\n")
    assert "ValueError: bad module" in _failure(tmp_path, "forward+backward")


@pytest.mark.parametrize("name", ["mixtral_8x7b_ep_a2a_v5e"])
def test_the_assigned_peaks_are_the_compiled_ones(name: str, invoke_main, repo_root) -> None:
    result = invoke_main("plan", f"specs/{name}.yaml", "--assigned", "--json", cwd=repo_root)
    assert result.code == 0, result.stderr
    assigned = json.loads(result.stdout)["assigned"]
    compiled = json.loads(RECORDS.read_text())["specs"][name]
    for program, key in (("forward", "forward"), ("forward+backward", "train")):
        # memory_analysis counts a few KiB of scoped scratch the block does not hold
        assert assigned[program]["peak"] == pytest.approx(compiled[key]["peak"], rel=1e-4)
        assert assigned[program]["argument"] == compiled[key]["argument"]
        assert assigned[program]["seconds"] > 0
    # the example runs in 8 FFN slices; whole it compiles to 6.33 GB (the memory-ledger
    # design page), which a 16 GiB v5e holds
    whole = json.loads(result.stdout)["assigned_whole"]
    assert whole["fits"] and whole["peak"] == pytest.approx(6.33e9, rel=0.01)


def test_the_text_sets_the_figures_beside_the_ledger(repo_root) -> None:
    plan = make_plan(load_valid(repo_root / "specs" / "mixtral_8x7b_ep_a2a_v5e.yaml"))
    figures = {
        "forward": {"peak": plan.memory.forward_peak * 2, "seconds": 2.5},
        "forward+backward": {"peak": plan.memory.train_peak, "seconds": 3.25},
    }
    lines = assigned_text(plan, figures).splitlines()
    assert lines[0].startswith("XLA's buffer assignment (read before code generation, 3.2 s)")
    assert lines[1].split()[0] == "forward" and lines[1].endswith("-50.0%)")
    assert lines[2].split()[0] == "forward+backward" and lines[2].endswith("+0.0%)")


def test_each_shape_is_set_beside_its_own_ledger(tmp_path) -> None:
    """With shape variants, each variant's programs beside the variant's own plan; the
    seconds add up shape by shape (a shape's two programs are read side by side)."""
    path = tmp_path / "variants.yaml"
    path.write_text(
        QWEN3_V5E.replace(
            "shapes: {batch: 128, seq_len: 4096}",
            "shapes: {batch: 128, seq_len: 4096, variants: {short: {batch: 128, seq_len: 512}}}",
        ),
        encoding="utf-8",
    )
    plan = make_plan(load_valid(path))
    short = plan.variants[0].plan
    figures = {
        "forward": {"peak": plan.memory.forward_peak, "seconds": 2.0},
        "forward+backward": {"peak": plan.memory.train_peak, "seconds": 3.0},
        "forward (short)": {"peak": short.memory.forward_peak / 2, "seconds": 1.0},
        "forward+backward (short)": {"peak": short.memory.train_peak, "seconds": 1.5},
    }
    lines = assigned_text(plan, figures).splitlines()
    assert "4.5 s" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["forward", "forward+backward"] * 2
    assert lines[3].startswith("  forward (short)") and lines[3].endswith("+100.0%)")
    assert lines[4].endswith("+0.0%)")


def test_a_target_without_a_tpu_slice_is_refused(invoke_main, repo_root) -> None:
    result = invoke_main("plan", "specs/mixtral_small_cpu.yaml", "--assigned", cwd=repo_root)
    assert result.code == 4
    assert "TPU targets only" in result.stderr and "Traceback" not in result.stderr


def test_a_layer_that_runs_whole_is_not_read_again(repo_root) -> None:
    loaded = load_valid(repo_root / "specs" / "qwen3_30b_a3b_v6e.yaml")
    assert whole_layer(loaded, make_plan(loaded)) is None


@pytest.mark.parametrize(
    ("whole", "says"),
    [
        ({"peak": 13 * 2**30, "hbm": 16 * 2**30, "fits": True}, "13.00 GiB, 81% of HBM: it fits"),
        ({"peak": 16 * 2**30, "hbm": 16 * 2**30, "fits": False}, "100% of HBM: it does not fit"),
        (
            {"peak": None, "hbm": 1, "fits": False, "compiler": "E1000"},
            "out of HBM, as the compiler",
        ),
    ],
)
def test_the_whole_layer_is_said_in_hbm_words(whole: dict, says: str) -> None:
    assert says in whole_layer_text(whole)


# The layer of the memory how-to: the ledger puts it whole 14% over a v5e's HBM, so with its
# trades left to the plan the plan slices it; XLA assigns it whole 8.64 of 15.75 GiB.
QWEN3_V5E = """\
version: 1
layer: {num_experts: 128, embed_dim: 2048, ffn_dim: 768}
router: {top_k: 8, score: softmax, renormalize: true}
shapes: {batch: 128, seq_len: 4096}
mesh:
  axes: {fsdp: 8, tensor: 2}
parallelism: {experts: replicated}
target: {hardware: tpu-v5e, topology: 4x4, kernel: xla}
"""


# The ledger's own trade built, as with fit_check plan or compile (with assigned, the default,
# XLA's read chooses a trade the spec leaves open before anything is built: test_own_trade.py)
LEDGER_TRADES = "memory: {fit_check: compile}\n"


def _qwen3(tmp_path: Path, memory: str = ""):
    path = tmp_path / "qwen3_v5e.yaml"
    path.write_text(QWEN3_V5E + memory, encoding="utf-8")
    loaded = load_valid(path)
    return loaded, make_plan(loaded)


@pytest.mark.parametrize(
    ("whole", "says"),
    [
        (
            {"peak": 9 * 2**30, "hbm": 16 * 2**30, "fits": True},
            "9.00 GiB, 56% of HBM: it fits, and the trade recomputes for nothing: write "
            "memory.ffn_chunks: 1 and memory.token_chunks: 1",
        ),
        ({"peak": 16 * 2**30, "hbm": 16 * 2**30, "fits": False}, "it does not fit, a trade is"),
        (
            {"peak": None, "hbm": 1, "fits": False, "compiler": "out of HBM: E1000\nmore"},
            "the layer whole is out of HBM (out of HBM: E1000): a trade is needed",
        ),
    ],
)
def test_the_build_says_whether_the_plans_own_trade_was_needed(tmp_path, monkeypatch, whole, says):
    loaded, plan = _qwen3(tmp_path)
    assert plan.ffn.chunks * plan.experts.token_chunks > 1  # the ledger traded on its own
    monkeypatch.setattr(assigned, "whole_layer", lambda loaded, plan: whole)
    verdict = whole_layer_verdict(loaded, plan)
    assert verdict.startswith("the plan's ledger chose ") and says in verdict


def test_a_variant_the_plan_traded_is_read_too(tmp_path, monkeypatch):
    """The main shape runs whole, a larger variant in chunks the plan chose: the step names
    the variant's trade and reads the layer whole (every shape)."""
    path = tmp_path / "variants.yaml"
    path.write_text(
        QWEN3_V5E.replace(
            "shapes: {batch: 128, seq_len: 4096}",
            "shapes: {batch: 16, seq_len: 4096, variants: {big: {batch: 128, seq_len: 4096}}}",
        ),
        encoding="utf-8",
    )
    loaded = load_valid(path)
    plan = make_plan(loaded)
    assert plan.ffn.chunks * plan.experts.token_chunks == 1
    big = plan.variants[0].plan
    assert big.ffn.chunks * big.experts.token_chunks > 1
    read = []
    fits = {"peak": 9 * 2**30, "hbm": 16 * 2**30, "fits": True}
    monkeypatch.setattr(assigned, "whole_layer", lambda loaded, plan: read.append(plan) or fits)
    verdict = whole_layer_verdict(loaded, plan)
    assert verdict.startswith("the plan's ledger chose ") and " for big; " in verdict
    assert read == [plan]


def test_a_failed_read_is_said_and_a_written_trade_is_not_read(tmp_path, monkeypatch):
    loaded, plan = _qwen3(tmp_path)

    def killed(loaded, plan):
        raise VerifyError("compile forward ended before XLA's buffer assignment (killed by 9)")

    monkeypatch.setattr(assigned, "whole_layer", killed)
    assert "could not be read (compile forward ended" in whole_layer_verdict(loaded, plan)

    def never(loaded, plan):
        raise AssertionError("read a trade the spec chose")

    monkeypatch.setattr(assigned, "whole_layer", never)
    written = _qwen3(tmp_path, "memory: {ffn_chunks: 4}\n")
    assert whole_layer_verdict(*written) is None


@pytest.mark.slow
def test_the_build_reads_the_layer_whole_where_the_ledger_traded(tmp_path, monkeypatch):
    """After its verification, the build reads the layer whole by XLA's assignment (real,
    on the compile-only v5e, a few seconds) and says so as a step of its own. The full
    compile (minutes here) is stood in for: it does not change what is read."""
    import moegen.pipeline
    from moegen.verify import VerifyReport
    from moegen.verify.messages import Imported, MemoryVerdict

    def verify(loaded, source, *, plan, on_step=lambda step: None, timeout_s=None, cache=None):
        return VerifyReport(steps=[Imported("import", 0.0)])

    monkeypatch.setattr(moegen.pipeline, "verify", verify)
    monkeypatch.chdir(tmp_path)
    Path("qwen3_v5e.yaml").write_text(QWEN3_V5E + LEDGER_TRADES, encoding="utf-8")
    said = []
    moegen.pipeline.build(
        [Path("qwen3_v5e.yaml")], Path("out"), progress=lambda *args: said.append(args)
    )
    verdicts = [a for args in said for a in args if isinstance(a, MemoryVerdict)]
    assert len(verdicts) == 1 and verdicts[0].step == "memory: the layer whole"
    verdict = verdicts[0].verdict
    assert verdict.startswith("the plan's ledger chose ")
    # 8.64 GiB until the combine weights moved to the hidden rows (moegen.plan.combine)
    assert "XLA's buffer assignment of the layer whole: 7.12 GiB" in verdict
    assert "it fits, and the trade recomputes for nothing" in verdict


@pytest.mark.parametrize(
    ("whole", "says"),
    [
        (
            {"peak": 9 * 2**30, "hbm": 16 * 2**30, "fits": True},
            "9.00 GiB, 56% of HBM: it fits, where the plan's trade does not: write "
            "memory.ffn_chunks: 1 and memory.token_chunks: 1.",
        ),
        (
            {"peak": 17 * 2**30, "hbm": 16 * 2**30, "fits": False},
            "it does not fit, a trade is needed (memory.ffn_chunks: auto and "
            "memory.token_chunks: auto, then `moegen tune`,",
        ),
    ],
)
def test_a_plans_own_trade_out_of_hbm_is_said_with_the_layer_whole(
    tmp_path, monkeypatch, whole, says
):
    """The full-size compile of the ledger's own trade runs out of HBM (stood in for): the
    build's error adds XLA's read of the layer whole, and what to write."""
    import moegen.pipeline
    from moegen.verify.memory.verdict import OutOfHbm

    def verify(loaded, source, *, plan, on_step=lambda step: None, timeout_s=None, cache=None):
        raise OutOfHbm("forward+backward does not fit tpu-v5e 4x4; the TPU compiler says: ...")

    monkeypatch.setattr(moegen.pipeline, "verify", verify)
    monkeypatch.setattr(assigned, "whole_layer", lambda loaded, plan: whole)
    monkeypatch.chdir(tmp_path)
    Path("qwen3_v5e.yaml").write_text(QWEN3_V5E + LEDGER_TRADES, encoding="utf-8")
    with pytest.raises(OutOfHbm) as info:
        moegen.pipeline.build([Path("qwen3_v5e.yaml")], Path("out"))
    first, second = str(info.value).split("\n", 1)
    assert first.startswith("forward+backward does not fit tpu-v5e 4x4")
    assert second.startswith("The plan's ledger chose ") and says in second
    assert not Path("out").exists()
