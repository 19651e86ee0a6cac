"""Where the plan would refuse a TPU layer on its ledger's word alone (planned over HBM by
more than LEDGER_OVERESTIMATE, by less than REFUSAL_OVERESTIMATE), XLA's buffer assignment
decides (moegen.fit.refusal_read): a layer it fits goes on, and the build says which figure
let it; a refusal it agrees with says XLA's figure. Stand-in reads here, and two real ones
(slow): a layer the ledger over-counts by a third, and one XLA finds out of HBM too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_no_traceback, run_moegen
from over_hbm_specs import DEEPSEEK, LLAMA4

from moegen.diagnostics import SpecError
from moegen.fit import COMPILE_DECIDES, TAKE_OFFER, read_before_refusing
from moegen.pipeline import generate, load_planned, load_valid
from moegen.plan import cannot_fit, make_plan
from moegen.verify import XLA_READS, VerifyError, preflight
from moegen.verify.memory import assigned

GiB = 2**30
EXIT_INVALID = 3

# Jamba's MoE block replicated over data 4 x tensor 2 on v5e (bench.holdout, seed 2, spec 18
# made too big to run whole): the ledger plans 19.22 GiB forward+backward, 20% over HBM,
# where XLA assigns 15.04 GiB; at batch 112 the ledger plans 22.71 GiB and XLA agrees it is
# out of HBM.
JAMBA = """\
version: 1
layer: {{num_experts: 16, embed_dim: 4096, ffn_dim: 14336}}
router: {{top_k: 2, score: softmax}}
shapes: {{batch: {batch}, seq_len: 2048}}
dtypes: {{params: float32, compute: bfloat16}}
mesh:
  axes: {{data: 4, tensor: 2}}
parallelism: {{experts: replicated}}
target: {{hardware: {hardware}, topology: 2x4, kernel: xla}}
"""


def _spec(tmp_path: Path, batch: int = 80, hardware: str = "tpu-v5e") -> Path:
    path = tmp_path / "jamba.yaml"
    path.write_text(JAMBA.format(batch=batch, hardware=hardware), encoding="utf-8")
    return path


def _stand_in(monkeypatch, peak_gib: float | None = None, error: str | None = None) -> list:
    reads: list = []

    def assigned_peak(plan):
        reads.append(plan)
        if error:
            raise VerifyError(error)
        return int(peak_gib * GiB)

    monkeypatch.setattr(assigned, "assigned_peak", assigned_peak)
    monkeypatch.setattr(preflight, "module_installed", lambda name: True)
    return reads


def test_the_ledger_refuses_the_layer_on_its_word_alone(tmp_path):
    plan = make_plan(load_valid(_spec(tmp_path)))
    assert cannot_fit(plan) and not cannot_fit(plan, compile_decides=True)


def test_a_layer_xla_fits_goes_on_and_the_build_says_which_figure(tmp_path, monkeypatch):
    reads = _stand_in(monkeypatch, peak_gib=15.0)
    notes = []
    generated = generate(_spec(tmp_path), lambda *note: notes.append(note))
    assert len(reads) == 1 and generated.source
    (step,) = [details for _, name, _, details in notes if name.startswith("plan: memory")]
    assert step.verdict == (
        "XLA's buffer assignment of the full-size programs: 15.00 GiB per device, of the "
        "15.75 GiB the compiler grants a program: it fits"
    )


def test_moegen_plan_prints_the_read_that_let_it_through(tmp_path, monkeypatch, invoke_main):
    _stand_in(monkeypatch, peak_gib=15.0)
    _spec(tmp_path)
    said = invoke_main("plan", "jamba.yaml", cwd=tmp_path)
    assert said.code == 0, said.stderr
    assert "  plan: memory by XLA's assignment: XLA's buffer assignment of the full-size" in (
        said.stdout
    )
    as_json = invoke_main("plan", "--json", "jamba.yaml", cwd=tmp_path)
    assert json.loads(as_json.stdout)["fit_read"].endswith(
        "15.00 GiB per device, of the 15.75 GiB the compiler grants a program: it fits"
    )


@pytest.mark.parametrize(
    ("peak_gib", "error", "says", "offers_the_compile"),
    [
        (
            15.7,
            None,
            "15.70 GiB per device, of the 15.75 GiB the compiler grants a program: "
            "it does not fit either.",
            False,
        ),
        (
            None,
            "compile forward+backward: out of HBM: the compiler's line\nmore",
            "XLA's buffer assignment: compile forward+backward: out of HBM: the compiler's line.",
            False,
        ),
        (
            None,
            "compile forward ended before XLA's buffer assignment (killed)",
            "XLA's buffer assignment could not be read (compile forward ended before XLA's "
            "buffer assignment (killed)).",
            True,
        ),
    ],
)
def test_a_refusal_says_what_xla_read(
    tmp_path, monkeypatch, peak_gib, error, says, offers_the_compile
):
    _stand_in(monkeypatch, peak_gib=peak_gib, error=error)
    with pytest.raises(SpecError) as info:
        generate(_spec(tmp_path))
    (problem,) = info.value.diagnostics
    # XLA measured it: the build flag that reads other trades is offered instead
    offer = "" if offers_the_compile else f" {TAKE_OFFER}"
    assert problem.field == "shapes.batch" and problem.message.endswith(says + offer)
    assert (COMPILE_DECIDES in problem.message) == offers_the_compile


def test_without_libtpu_the_refusal_names_it(tmp_path, monkeypatch):
    reads = _stand_in(monkeypatch, peak_gib=1.0)
    monkeypatch.setattr(preflight, "module_installed", lambda name: name != "libtpu")
    with pytest.raises(SpecError, match=r"needs libtpu: pip install 'moegen\[tpu\]'"):
        generate(_spec(tmp_path))
    assert reads == []


def test_no_read_where_the_plan_proves_the_refusal(tmp_path, monkeypatch):
    reads = _stand_in(monkeypatch, peak_gib=1.0)
    path = tmp_path / "deepseek_v5e.yaml"  # planned 4.1x the v5e's HBM: refused unread
    text = DEEPSEEK.replace("tpu-v6e", "tpu-v5e").replace("batch: 128", "batch: 256")
    path.write_text(text, encoding="utf-8")
    proved = make_plan(load_valid(path))
    assert read_before_refusing(proved, XLA_READS) is None
    with pytest.raises(SpecError, match="more than the plan's error bound"):
        generate(path)
    assert reads == []


def test_fit_check_plan_keeps_the_ledgers_word_and_reads_nothing(tmp_path, monkeypatch):
    reads = _stand_in(monkeypatch, peak_gib=1.0)
    path = _spec(tmp_path)
    path.write_text(path.read_text(encoding="utf-8") + "memory: {fit_check: plan}\n")
    with pytest.raises(SpecError, match=COMPILE_DECIDES.lstrip("; ")):
        generate(path)
    assert reads == []


def _llama4(tmp_path: Path, memory: str = "") -> Path:
    path = tmp_path / "llama4.yaml"
    path.write_text(LLAMA4 + memory, encoding="utf-8")
    return path


TWO_CHUNKS = "memory: {token_chunks: 2}\n"  # the plan's own trade, written (else XLA's to choose)


def test_a_layer_planned_over_hbm_within_the_error_is_read_too(tmp_path, monkeypatch):
    plan = make_plan(load_valid(_llama4(tmp_path, TWO_CHUNKS)))
    assert not cannot_fit(plan) and plan.memory.train_peak > plan.memory.hbm_bytes_per_device
    reads = _stand_in(monkeypatch, error="compile forward+backward: out of HBM: (18.08G)")
    with pytest.raises(SpecError) as info:
        generate(_llama4(tmp_path, TWO_CHUNKS))
    (problem,) = info.value.diagnostics
    assert problem.field == "shapes.batch" and len(reads) == 1
    assert problem.message.startswith("the plan needs 16.60 GiB per device by its ledger, 4% over")
    assert "XLA's buffer assignment: compile forward+backward: out of HBM: (18.08G)." in (
        problem.message
    )
    assert problem.message.endswith(
        "Leave memory.ffn_chunks and memory.token_chunks out (the build then takes the fastest "
        "trade XLA's buffer assignment fits, seconds a trade), or shorten shapes.batch. "
        f"{TAKE_OFFER}"
    )
    _stand_in(monkeypatch, peak_gib=15.0)  # XLA fits it: it goes on, the read said
    notes = []
    generate(_llama4(tmp_path, TWO_CHUNKS), lambda *note: notes.append(note))
    assert any(name == "plan: memory by XLA's assignment" for _, name, _, _ in notes)


def test_a_written_trade_under_hbm_is_not_read(tmp_path, monkeypatch):
    """The plan's 16 FFN slices written into the spec, planned just under HBM: the spec's own
    trade, not read before the build (XLA reads a trade the spec leaves open instead:
    tests/fit/test_own_trade.py)."""
    reads = _stand_in(monkeypatch, error="never asked")
    path = tmp_path / "deepseek.yaml"
    path.write_text(DEEPSEEK + "memory: {ffn_chunks: 16}\n", encoding="utf-8")
    plan = make_plan(load_valid(path))
    assert plan.memory.train_peak < plan.memory.hbm_bytes_per_device
    generate(path)
    assert reads == []


def test_a_layer_planned_under_hbm_or_with_fit_check_plan_is_not_read(tmp_path, monkeypatch):
    reads = _stand_in(monkeypatch, error="never asked")
    generate(_llama4(tmp_path, "memory: {fit_check: plan}\n"))
    generate(_spec(tmp_path, batch=48))  # planned under HBM
    assert reads == []


@pytest.mark.slow
def test_xla_decides_for_real(tmp_path):
    """The real reads, by `moegen plan` (validate reads nothing): the layer the ledger
    over-counts is planned, and a second plan reads XLA's figure back, saying so; the larger
    one is refused with the compiler's figure, without the offer of the full-size compile."""
    fits = run_moegen("plan", _spec(tmp_path))
    assert fits.returncode == 0, fits.stderr
    assert "kept from an earlier read" not in fits.stdout
    again = run_moegen("plan", _spec(tmp_path))
    assert "(kept from an earlier read of the same programs): " in again.stdout, again.stdout
    too_big = tmp_path / "big"
    too_big.mkdir()
    refused = run_moegen("plan", _spec(too_big, batch=112))
    assert refused.returncode == EXIT_INVALID, refused
    assert "XLA's buffer assignment: compile forward+backward: out of HBM" in refused.stderr
    assert COMPILE_DECIDES not in refused.stderr
    assert_no_traceback(refused.stderr)
    chunks = run_moegen("plan", _llama4(tmp_path, TWO_CHUNKS))
    assert chunks.returncode == EXIT_INVALID, chunks
    assert "(18.08G) exceeds available HBM (15.75G)" in chunks.stderr
    # left open, XLA's read chooses the trade: the layer whole, 14.30 GiB, fits
    assert run_moegen("plan", _llama4(tmp_path)).returncode == 0


@pytest.mark.parametrize("peak_gib", [15.0, 40.0])
def test_validate_reads_nothing_and_says_who_decides(tmp_path, monkeypatch, peak_gib):
    """validate runs in editors, pre-commit and CI: it never compiles. The ledger alone would
    refuse this layer; XLA's read decides, at plan and build, and validate says so whether
    the read would fit it or not."""
    reads = _stand_in(monkeypatch, peak_gib=peak_gib)
    path = _spec(tmp_path)
    loaded, notes = load_planned(path)
    assert reads == [] and loaded.source.display == path.as_posix()
    (note,) = notes
    assert "over HBM, by less than it proves; whether it fits is XLA's to say" in note
    assert "`moegen plan` and `moegen build` read XLA's buffer assignment" in note


def test_validate_keeps_the_plans_refusal_where_no_read_has_a_say(tmp_path, monkeypatch):
    reads = _stand_in(monkeypatch, peak_gib=1.0)
    path = _spec(tmp_path)
    path.write_text(path.read_text(encoding="utf-8") + "memory: {fit_check: plan}\n")
    with pytest.raises(SpecError, match=COMPILE_DECIDES.lstrip("; ")):
        load_planned(path)
    assert reads == []
