"""`moegen build --take-fitting-trade` (moegen.fit.refit): where a TPU layer runs out of HBM as
planned, by XLA's read before any twin or by the full-size compile, the plan's other memory
trades are read by XLA's buffer assignment, fastest first; the first that fits is taken,
written into the spec and built. Where none fits, the build fails as it would have, says
so, and changes nothing on disk. Stand-in reads here, one real read (slow)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import assert_no_traceback
from over_hbm_specs import LLAMA4

from moegen import pipeline
from moegen.diagnostics import SpecError
from moegen.fit import TAKE_OFFER
from moegen.load import load_spec
from moegen.pipeline import take_fitting_trade
from moegen.plan import Plan
from moegen.verify import CompilerCrashed, OutOfHbm, VerifyError, VerifyReport, preflight
from moegen.verify.memory import assigned

GiB = 2**30
CPU_SPEC = Path(__file__).resolve().parents[2] / "specs" / "mixtral_small_cpu.yaml"


# The trade written: a trade the spec leaves open is chosen by XLA's read before anything
# else (moegen.fit.own_trade, tests/fit/test_own_trade.py), so none of those runs out of HBM.
LLAMA4_TRADED = LLAMA4 + "memory:\n  token_chunks: 2\n"


def _llama4(tmp_path: Path) -> Path:
    """Llama 4 Scout replicated over fsdp 4 on v5e, batch 180, in 2 token chunks: planned
    within its ledger's error of HBM, so XLA's read is asked before anything is built."""
    path = tmp_path / "llama4.yaml"
    path.write_text(LLAMA4_TRADED, encoding="utf-8")
    return path


def _trade(plan: Plan) -> tuple[int, int]:
    return plan.ffn.chunks, plan.experts.token_chunks


def _xla(monkeypatch, out_of_hbm: set[tuple[int, int]], peak_gib: float = 14.0) -> list:
    """XLA's read, stood in: out of HBM for the (FFN slices, token chunks) given, else
    `peak_gib`; every read recorded, by refit and by the plan's refusal read alike."""
    reads: list = []

    def assigned_peak(plan: Plan) -> int:
        reads.append(_trade(plan))
        if _trade(plan) in out_of_hbm:
            raise VerifyError("compile forward+backward: out of HBM: (18.08G)")
        return int(peak_gib * GiB)

    monkeypatch.setattr(assigned, "assigned_peak", assigned_peak)
    monkeypatch.setattr(preflight, "module_installed", lambda name: True)
    monkeypatch.setattr(pipeline, "whole_layer_verdict", lambda *args, **kwargs: None)
    return reads


def test_the_fastest_trade_xla_fits_is_taken_and_written(tmp_path, monkeypatch):
    reads = _xla(monkeypatch, out_of_hbm={(1, 2), (1, 1)})
    notes: list = []
    generated = pipeline.generate(
        _llama4(tmp_path), lambda *note: notes.append(note), take_fitting_trade
    )
    assert generated.retraded and _trade(generated.plan) != (1, 2)
    # the failed trade is not read again; the whole layer (fastest) is, and is out of HBM
    assert reads[0] == (1, 2) and reads[1] == (1, 1) and (1, 2) not in reads[1:]
    taken = _trade(generated.plan)
    assert reads[2] == taken
    memory = generated.loaded.spec.memory
    assert (memory.ffn_chunks, memory.token_chunks) == taken
    assert generated.loaded.source.text.startswith(LLAMA4)
    steps = [(name, details.verdict) for _, name, _, details in notes if details is not None]
    assert steps[0] == (
        "memory: read token_chunks 1, ffn_chunks 1",
        "XLA's buffer assignment: compile forward+backward: out of HBM: (18.08G)",
    )
    assert steps[1][1] == "14.00 GiB per device: fits"
    assert steps[2][0] == "memory: trade taken"
    assert steps[2][1].startswith("the plan's 1 FFN slice x 2 token chunks ran out of HBM; took ")
    assert steps[2][1].endswith(
        "XLA's buffer assignment 14.00 GiB per device, of the 15.75 GiB the compiler grants a "
        "program; written into the spec"
    )


def test_where_no_trade_fits_the_build_fails_as_before_and_writes_nothing(tmp_path, monkeypatch):
    # the spec's own trade out of HBM, every other read over 99% of the grant
    _xla(monkeypatch, out_of_hbm={(1, 2)}, peak_gib=15.7)
    spec = _llama4(tmp_path)
    out = tmp_path / "generated"
    with pytest.raises(SpecError) as info:
        pipeline.build([spec], out, run_verify=False, refit=take_fitting_trade)
    (problem,) = info.value.diagnostics
    assert problem.message.startswith("the plan needs 16.60 GiB per device by its ledger")
    assert TAKE_OFFER not in problem.message
    assert re.search(
        r"--take-fitting-trade took no trade: none of the plan's (\d+) other trades fits: "
        r"(\d+) do not fit by XLA's buffer assignment(, \d+ proved out of HBM by the plan)? "
        r"\(lowest read: ",
        problem.message,
    )
    assert problem.message.endswith("15.70 GiB).")
    assert spec.read_text(encoding="utf-8") == LLAMA4_TRADED and not out.exists()


def test_an_out_of_hbm_full_compile_takes_a_trade_too(tmp_path, monkeypatch):
    """XLA's read let the plan's trade through, the full-size compile did not (the read is
    exact on every program measured; the path is there for the one it is not)."""
    reads = _xla(monkeypatch, out_of_hbm=set())
    compiled: list = []

    def verify(loaded, source, *, plan, on_step, cache):
        compiled.append(_trade(plan))
        if _trade(plan) == (1, 2):
            raise OutOfHbm("compile forward+backward: out of HBM: 18.08G of temporaries")
        return VerifyReport([])

    monkeypatch.setattr(pipeline, "verify", verify)
    monkeypatch.setattr(pipeline, "require_verifiers", lambda checks: None)
    spec = _llama4(tmp_path)
    out = tmp_path / "generated"
    ((module, generated),) = pipeline.build([spec], out, refit=take_fitting_trade)
    assert compiled == [(1, 2), (1, 1)] and reads == [(1, 2), (1, 1)]
    assert module.read_text(encoding="utf-8") == generated.source
    assert spec.read_text(encoding="utf-8") == generated.loaded.source.text != LLAMA4_TRADED
    assert load_spec(spec).spec.memory.token_chunks == 1


CRASH = (
    "the XLA compiler crashed (signal 6) after the step 'twin gradients': it stopped on a "
    "failed internal check: Check failed: SublaneStrideStepsWholeLarge2ndMinorTiles(window, "
    "large_factor) (fusion_util.cc:2636)."
)


def _crashing_in(trade: tuple[int, int], compiled: list):
    """The verification stood in: the full compile of `trade` crashes the compiler."""

    def verify(loaded, source, *, plan, on_step, cache):
        compiled.append(_trade(plan))
        if _trade(plan) == trade:
            raise CompilerCrashed(CRASH)
        return VerifyReport([])

    return verify


def test_a_compiler_crash_takes_a_trade_too(tmp_path, monkeypatch):
    """Another trade is another program: a crash of the compiler on the plan's trade (a defect
    of the pinned libtpu, as its token chunks' fusion was) takes the fastest other one."""
    reads = _xla(monkeypatch, out_of_hbm=set())
    compiled: list = []
    monkeypatch.setattr(pipeline, "verify", _crashing_in((1, 2), compiled))
    monkeypatch.setattr(pipeline, "require_verifiers", lambda checks: None)
    notes: list = []
    spec = _llama4(tmp_path)
    ((module, generated),) = pipeline.build(
        [spec],
        tmp_path / "generated",
        progress=lambda *n: notes.append(n),
        refit=take_fitting_trade,
    )
    assert compiled == [(1, 2), (1, 1)] and reads == [(1, 2), (1, 1)]
    assert module.read_text(encoding="utf-8") == generated.source
    assert load_spec(spec).spec.memory.token_chunks == 1
    taken = [details.verdict for _, name, _, details in notes if name == "memory: trade taken"]
    assert taken[0].startswith("the plan's 1 FFN slice x 2 token chunks crashed the compiler; ")


def test_without_the_flag_a_compiler_crash_offers_a_trade_and_writes_nothing(tmp_path, monkeypatch):
    _xla(monkeypatch, out_of_hbm=set())
    monkeypatch.setattr(pipeline, "verify", _crashing_in((1, 2), []))
    monkeypatch.setattr(pipeline, "require_verifiers", lambda checks: None)
    spec = _llama4(tmp_path)
    with pytest.raises(CompilerCrashed) as crashed:
        pipeline.build([spec], tmp_path / "generated")
    assert str(crashed.value) == f"{CRASH} {TAKE_OFFER}"
    assert (
        spec.read_text(encoding="utf-8") == LLAMA4_TRADED and not (tmp_path / "generated").exists()
    )


def test_a_crash_off_tpu_offers_no_trade(tmp_path, monkeypatch):
    """--take-fitting-trade reads trades on TPU targets only: a CPU crash is told as it is."""
    spec = tmp_path / "cpu.yaml"
    spec.write_text(CPU_SPEC.read_text(encoding="utf-8"), encoding="utf-8")
    trade = _trade(pipeline.generate(spec).plan)
    monkeypatch.setattr(pipeline, "verify", _crashing_in(trade, []))
    monkeypatch.setattr(pipeline, "require_verifiers", lambda checks: None)
    with pytest.raises(CompilerCrashed) as crashed:
        pipeline.build([spec], tmp_path / "generated")
    assert str(crashed.value) == CRASH


def test_without_the_flag_an_out_of_hbm_build_writes_nothing(tmp_path, monkeypatch):
    _xla(monkeypatch, out_of_hbm=set())
    monkeypatch.setattr(pipeline, "verify", _failing_compile)
    monkeypatch.setattr(pipeline, "require_verifiers", lambda checks: None)
    spec = _llama4(tmp_path)
    with pytest.raises(OutOfHbm):
        pipeline.build([spec], tmp_path / "generated")
    assert (
        spec.read_text(encoding="utf-8") == LLAMA4_TRADED and not (tmp_path / "generated").exists()
    )


def _failing_compile(loaded, source, *, plan, on_step, cache):
    raise OutOfHbm("compile forward+backward: out of HBM")


def test_a_target_that_is_not_a_tpu_takes_no_trade(tmp_path):
    loaded = pipeline.load_valid(CPU_SPEC)
    failure = OutOfHbm("compile forward+backward: out of HBM")
    plan = pipeline.make_plan(loaded)
    with pytest.raises(OutOfHbm, match="reads trades on TPU targets only"):
        take_fitting_trade(loaded, plan, failure, lambda candidate: None)


def test_a_layout_it_cannot_write_is_refused_located(tmp_path, monkeypatch):
    _xla(monkeypatch, out_of_hbm={(1, 2)})
    spec = tmp_path / "llama4.yaml"  # the trade as an anchored scalar: no edit reads back
    spec.write_text(LLAMA4 + "memory:\n  token_chunks: &two 2\n", encoding="utf-8")
    with pytest.raises(SpecError, match="layout; write it by hand: memory.token_chunks: "):
        pipeline.build([spec], tmp_path / "generated", run_verify=False, refit=take_fitting_trade)


def test_the_flag_on_the_command_line(tmp_path, monkeypatch, invoke_main):
    _xla(monkeypatch, out_of_hbm={(1, 2)})
    _llama4(tmp_path)
    without = invoke_main("build", "--no-verify", "llama4.yaml", cwd=tmp_path)
    assert without.code == 3 and "out of HBM" in without.stderr
    said = invoke_main("build", "--no-verify", "--take-fitting-trade", "llama4.yaml", cwd=tmp_path)
    assert said.code == 0, said.stderr
    assert "memory: trade taken" in said.stderr
    assert "wrote llama4.yaml: the memory trade taken" in said.stderr
    assert_no_traceback(said.stderr)
    # the spec alone now gives the module: moegen check finds it fresh
    written = (tmp_path / "generated" / "llama4.py").read_text(encoding="utf-8")
    assert pipeline.generate(tmp_path / "llama4.yaml").source == written


@pytest.mark.slow
def test_a_real_read_takes_the_layer_whole(tmp_path):
    """XLA finds the plan's 2 token chunks out of HBM (18.08G of temporaries) and the layer
    whole 14.30 GiB (bench.holdout, seed 3, spec 20): the whole layer is taken."""
    spec = _llama4(tmp_path)
    notes: list = []
    generated = pipeline.generate(spec, lambda *note: notes.append(note), take_fitting_trade)
    assert _trade(generated.plan) == (1, 1)
    memory = yaml.safe_load(generated.loaded.source.text)["memory"]
    assert memory == {"token_chunks": 1, "fit_check": "compile", "ffn_chunks": 1}
    (taken,) = [d.verdict for _, name, _, d in notes if name == "memory: trade taken"]
    assert "took memory.token_chunks: 1, memory.ffn_chunks: 1 (and memory.fit_check" in taken
    assert "XLA's buffer assignment 14.30 GiB per device" in taken


def test_a_symlinked_spec_stays_a_link_to_the_rewritten_file(tmp_path, monkeypatch):
    _xla(monkeypatch, out_of_hbm={(1, 2)})
    real = _llama4(tmp_path)
    link = tmp_path / "link.yaml"
    link.symlink_to(real.name)
    pipeline.build([link], tmp_path / "generated", run_verify=False, refit=take_fitting_trade)
    assert link.is_symlink() and real.read_text(encoding="utf-8") != LLAMA4_TRADED
    assert load_spec(link).spec.memory.token_chunks == 1


def test_two_specs_verified_at_once_each_take_their_trade(tmp_path, monkeypatch):
    _xla(monkeypatch, out_of_hbm=set())
    monkeypatch.setattr(pipeline, "verify", _out_of_hbm_in_two_chunks)
    monkeypatch.setattr(pipeline, "require_verifiers", lambda checks: None)
    specs = []
    for name in ("a", "b"):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(LLAMA4_TRADED, encoding="utf-8")
        specs.append(spec)
    out = tmp_path / "generated"
    written = pipeline.build(specs, out, jobs=2, refit=take_fitting_trade)
    assert [module.name for module, _ in written] == ["a.py", "b.py"]
    for spec in specs:
        assert load_spec(spec).spec.memory.token_chunks == 1


def _out_of_hbm_in_two_chunks(loaded, source, *, plan, on_step, cache):
    if _trade(plan) == (1, 2):
        raise OutOfHbm("compile forward+backward: out of HBM")
    return VerifyReport([])


def test_a_spec_edited_during_the_build_keeps_the_edit(tmp_path, monkeypatch, invoke_main):
    """The trade is written after the modules, minutes after the spec was read: where the
    user changed the spec meanwhile, their edit is kept and the trade is said, to write."""
    _xla(monkeypatch, out_of_hbm={(1, 2)})
    spec = _llama4(tmp_path)
    edited = LLAMA4_TRADED + "# edited while the build ran\n"
    write_all = pipeline.write_all

    def write_while_the_user_edits(*args, **kwargs):
        spec.write_text(edited, encoding="utf-8")
        return write_all(*args, **kwargs)

    monkeypatch.setattr(pipeline, "write_all", write_while_the_user_edits)
    said = invoke_main("build", "--no-verify", "--take-fitting-trade", spec.name, cwd=tmp_path)
    assert said.code == 4, said.stderr
    assert (
        "wrote the modules, but cannot write the trade taken into llama4.yaml (it changed on "
        "disk since it was read); write it by hand: memory: {ffn_chunks: 1, token_chunks: 1, "
        "fit_check: "
    ) in said.stderr
    assert_no_traceback(said.stderr)
    assert spec.read_text(encoding="utf-8") == edited
    assert (tmp_path / "generated" / "llama4.py").is_file()
