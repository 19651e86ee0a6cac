"""A memory trade a TPU spec leaves to the plan is chosen by XLA's buffer assignment
(moegen.fit.own_trade): the trades ranked by the plan's roofline, read in that order, the first
that fits taken, the module that of the spec with that trade written, the spec unchanged.
Stand-in reads here, one real read (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_no_traceback
from over_hbm_specs import DEEPSEEK, LLAMA4

from moegen import pipeline
from moegen.check import check
from moegen.diagnostics import SpecError
from moegen.fit import ANNOUNCED, READ_TIME, Candidate, count_by_plan
from moegen.plan import Plan
from moegen.verify import LIBTPU_FIX, VerifyError, preflight
from moegen.verify.memory import assigned

GiB = 2**30
WHOLE = (1, 1)


def _trade(plan: Plan) -> tuple[int, int]:
    return plan.ffn.chunks, plan.experts.token_chunks


def _xla(monkeypatch, out_of_hbm=(), peak_gib: float = 25.94, error: str = "") -> list:
    """XLA's read stood in: out of HBM for the (FFN slices, token chunks) given, `error` for
    every read when set, else `peak_gib`; each read's trade recorded."""
    reads: list = []

    def assigned_peak(plan: Plan) -> int:
        reads.append(_trade(plan))
        if error:
            raise VerifyError(error)
        if _trade(plan) in out_of_hbm:
            raise VerifyError("compile forward+backward: out of HBM: (34.53G)")
        return int(peak_gib * GiB)

    monkeypatch.setattr(assigned, "assigned_peak", assigned_peak)
    monkeypatch.setattr(preflight, "module_installed", lambda name: True)
    return reads


def _spec(tmp_path: Path, memory: str = "", text: str = DEEPSEEK) -> Path:
    """DeepSeek-V3's block in a ring over fsdp 2 x expert 4 x sequence 2 on v6e 4x4, batch
    128: its ledger would run it in 16 FFN slices (31.81 of 32 GiB planned), which XLA finds
    out of HBM (34.53 GiB of temporaries); the layer whole takes 25.94 GiB."""
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "layer.yaml"
    path.write_text(text + memory, encoding="utf-8")
    return path


def _body(source: str) -> str:
    """A module without its header lines naming the spec (its path and its hash)."""
    return "\n".join(line for line in source.splitlines() if not line.startswith("# spec"))


def _steps(notes: list) -> list[tuple[str, str]]:
    return [(name, details.verdict) for _, name, _, details in notes if details is not None]


def test_the_fastest_trade_xla_fits_is_the_modules(tmp_path, monkeypatch):
    reads = _xla(monkeypatch)
    spec = _spec(tmp_path)
    ledger = pipeline.make_plan(pipeline.load_valid(spec))
    assert _trade(ledger) == (16, 1)  # the ledger's own trade
    notes: list = []
    generated = pipeline.generate(spec, lambda *note: notes.append(note))
    # the layer whole recomputes nothing: ranked first, read first, and it fits
    assert reads == [WHOLE] and _trade(generated.plan) == WHOLE
    assert generated.loaded.source.text == DEEPSEEK  # the spec leaves it to the build
    written = _spec(tmp_path / "written", "memory: {ffn_chunks: 1, token_chunks: 1}\n")
    assert _body(generated.source) == _body(pipeline.generate(written).source)
    assert _steps(notes) == [
        (ANNOUNCED, f"up to 25 trades, fastest first, until one fits: {READ_TIME}"),
        ("memory: read token_chunks 1, ffn_chunks 1", "25.94 GiB per device: fits"),
        (
            "memory: trade chosen",
            "memory.token_chunks: 1, memory.ffn_chunks: 1: XLA's buffer assignment 25.94 GiB "
            "per device, of the 31.24 GiB the compiler grants a program (the plan's ledger "
            "would have run 16 FFN slices x 1 token chunk)",
        ),
    ]


def test_reads_go_on_in_the_plans_order_until_one_fits(tmp_path, monkeypatch):
    first = _xla(monkeypatch, error="")
    pipeline.generate(_spec(tmp_path))
    assert first == [WHOLE]
    reads = _xla(monkeypatch, out_of_hbm={WHOLE, (1, 2)})
    generated = pipeline.generate(_spec(tmp_path))
    assert len(reads) == 3 and _trade(generated.plan) == reads[-1]
    scores = [_score(tmp_path / f"{f}x{t}", f, t) for f, t in reads]
    assert scores == sorted(scores)  # the plan's roofline, fastest first


def _score(folder: Path, ffn_chunks: int, token_chunks: int) -> float:
    """The plan's roofline score of the spec with the trade written, as tune ranks it."""
    written = f"memory: {{ffn_chunks: {ffn_chunks}, token_chunks: {token_chunks}}}\n"
    loaded = pipeline.load_valid(_spec(folder, written))
    candidate = Candidate({}, loaded, pipeline.make_plan(loaded))
    count_by_plan(candidate)
    return candidate.score


@pytest.mark.parametrize(
    "memory",
    [
        "memory: {ffn_chunks: 16}\n",  # written: the spec's own
        "memory: {fit_check: plan}\n",  # the ledger's word alone
        "memory: {fit_check: compile}\n",  # the ledger's choice, the compile's verdict
    ],
)
def test_a_written_trade_or_another_fit_check_reads_nothing(tmp_path, monkeypatch, memory):
    reads = _xla(monkeypatch, error="never asked")
    generated = pipeline.generate(_spec(tmp_path, memory))
    assert reads == [] and _trade(generated.plan) == (16, 1)


def test_a_cpu_target_reads_nothing(tmp_path, monkeypatch, repo_root):
    reads = _xla(monkeypatch, error="never asked")
    pipeline.generate(repo_root / "specs" / "mixtral_small_cpu.yaml")
    assert reads == []


def test_without_libtpu_the_build_says_what_to_install_and_writes_nothing(
    tmp_path, monkeypatch, invoke_main
):
    reads = _xla(monkeypatch)
    monkeypatch.setattr(preflight, "module_installed", lambda name: False)
    spec = _spec(tmp_path)
    said = invoke_main("build", "--no-verify", spec.name, cwd=tmp_path)
    assert said.code == 3 and reads == []
    assert "16 FFN slices" in said.stderr and LIBTPU_FIX in said.stderr
    assert "memory.fit_check: plan" in said.stderr
    assert_no_traceback(said.stderr)
    assert not (tmp_path / "generated").exists() and spec.read_text(encoding="utf-8") == DEEPSEEK


def test_a_failed_read_stops_the_build_rather_than_take_another_trade(tmp_path, monkeypatch):
    """A read that fails for another reason than HBM (a killed worker, a timeout) is not an
    answer: taking the next trade would make the module depend on the failure."""
    reads = _xla(monkeypatch, error="compile forward ended before XLA's buffer assignment")
    with pytest.raises(SpecError) as info:
        pipeline.generate(_spec(tmp_path))
    (problem,) = info.value.diagnostics
    assert reads == [WHOLE] and problem.field == "memory"
    assert "XLA's read of a trade failed: compile forward ended before" in problem.message


def test_where_no_trade_fits_the_build_refuses_and_validate_reads_nothing(tmp_path, monkeypatch):
    reads = _xla(monkeypatch, peak_gib=40.0)  # every trade over the 31.24 GiB granted
    spec = _spec(tmp_path)
    _, notes = pipeline.load_planned(spec)
    assert reads == [] and "the trade is chosen by XLA's figure, fastest first" in notes[0]
    with pytest.raises(SpecError, match="no trade fits by XLA's buffer assignment"):
        pipeline.generate(spec)
    assert reads


def test_check_regenerates_the_same_module(tmp_path, monkeypatch):
    _xla(monkeypatch)
    spec = _spec(tmp_path)
    out = tmp_path / "generated"
    pipeline.build([spec], out, run_verify=False)
    report = check([spec], out, find_orphans=True)
    assert report.ok and report.fresh == [out / "layer.py"]


@pytest.mark.slow
def test_a_real_read_takes_the_layer_whole(tmp_path):
    """Llama 4 Scout over fsdp 4 on v5e, batch 180: the ledger would run 2 token chunks,
    XLA's buffer assignment fits the layer whole in 14.30 GiB (bench.holdout, seed 3)."""
    notes: list = []
    generated = pipeline.generate(_spec(tmp_path, text=LLAMA4), lambda *n: notes.append(n))
    assert _trade(generated.plan) == WHOLE
    (chosen,) = [verdict for name, verdict in _steps(notes) if name == "memory: trade chosen"]
    assert chosen.startswith("memory.token_chunks: 1, memory.ffn_chunks: 1: XLA's buffer ")
    assert "14.30 GiB per device" in chosen and "would have run 1 FFN slice x 2 token" in chosen


def test_the_reads_are_announced_before_the_first_with_what_they_cost(tmp_path, monkeypatch):
    _xla(monkeypatch)
    steps: list[tuple[str, object]] = []
    pipeline.generate(_spec(tmp_path), lambda spec, step, s, details: steps.append((step, details)))
    names = [name for name, _ in steps]
    first_read = next(i for i, name in enumerate(names) if name.startswith("memory: read "))
    announced = names.index(ANNOUNCED)
    assert announced < first_read
    words = steps[announced][1].verdict
    assert words.startswith("up to ") and "trades, fastest first, until one fits: " in words
    assert words.endswith(READ_TIME)
