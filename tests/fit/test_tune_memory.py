"""`moegen tune` of memory trades alone on a TPU target: candidates ranked by the plan's
counts, their fit read from XLA's buffer assignment fastest first, none read after the first
that fits; the tuned spec says `memory.fit_check: compile` where the plan's ledger would
refuse what the compiler's figure found to fit."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import run_moegen

from moegen.fit import (
    FIT_CHECK,
    READ_BY,
    CompilerReads,
    ReadError,
    by_assignment,
    candidates,
    choose_by_assignment,
    count_by_plan,
    own_trade_note,
)
from moegen.hardware import hardware
from moegen.load import load_spec
from moegen.pipeline import load_valid
from moegen.plan import make_plan, over_hbm
from moegen.tune import tune, write_back

# Qwen3-30B-A3B over fsdp 8 x tensor 2 on v5e 4x4 (bench.population s1_046 made too big to
# run whole by the plan): the plan's ledger puts the layer whole 14% over HBM, XLA assigns
# it 8.6 of 15.75 GiB.
QWEN3_V5E = """\
version: 1
layer: {num_experts: 128, embed_dim: 2048, ffn_dim: 768}
router: {top_k: 8, score: softmax, renormalize: true}
shapes: {batch: 128, seq_len: 4096}
dtypes: {params: float32, compute: bfloat16}
mesh:
  axes: {fsdp: 8, tensor: 2}
parallelism: {experts: replicated}
target: {hardware: tpu-v5e, topology: 4x4, kernel: xla}
memory:
  # left to moegen tune
  ffn_chunks: auto
  token_chunks: auto
"""
SMALL_V5E = """\
version: 1
layer: {num_experts: 8, embed_dim: 256, ffn_dim: 512}
router: {top_k: 2}
shapes: {batch: 8, seq_len: 256}
mesh: {axes: {expert: 4}}
parallelism: {experts: ragged_all_to_all}
target: {hardware: tpu-v5e, topology: 2x2, kernel: xla}
memory: {token_chunks: auto, ffn_chunks: auto}
"""
GiB = 2**30


def _spec(tmp_path: Path, text: str, name: str = "layer") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _choice(candidate) -> tuple[int, int]:
    return candidate.plan.experts.token_chunks, candidate.plan.ffn.chunks


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("", "", True),
        ("parallelism: {experts: ragged_all_to_all}", "parallelism: {experts: auto}", False),
        ("hardware: tpu-v5e, topology: 2x2, kernel: xla", "hardware: cpu", False),
        ("shapes: {batch: 8, seq_len: 256}", "shapes: {batch: 8, seq_len: 256, "
         "variants: {short: {batch: 8, seq_len: 128}}}", True),
    ],
)  # fmt: skip
def test_only_memory_trades_on_tpu_are_read_by_assignment(tmp_path, old, new, expected):
    loaded = load_spec(_spec(tmp_path, SMALL_V5E.replace(old, new)))
    assert by_assignment(loaded) is expected


def _reads(read_peak) -> CompilerReads:
    """XLA's read stood in by `read_peak`, on a machine that can read."""
    return CompilerReads(peak=read_peak, missing=lambda: None)


def test_candidates_are_read_fastest_first_and_none_after_the_first_that_fits(tmp_path):
    found = candidates(load_spec(_spec(tmp_path, SMALL_V5E)))
    read: list[tuple[int, int]] = []
    hbm = 16 * GiB

    def read_peak(plan):  # one chunk does not fit, two chunks of it do
        read.append((plan.experts.token_chunks, plan.ffn.chunks))
        return 20 * GiB if plan.experts.token_chunks == 1 else 4 * GiB

    reported = []
    winner = choose_by_assignment(found, _reads(read_peak), 60, lambda *a: reported.append(a[2]))
    assert winner is not None and sorted(map(id, reported)) == sorted(map(id, found))
    assert read[-1] == _choice(winner) and winner.peak_bytes == 4 * GiB <= hbm
    assert all(c.problem.startswith(READ_BY) for c in found if c.plan and _choice(c) in read[:-1])
    ranked = sorted(
        (c for c in found if c.plan), key=lambda c: (c.score, _choice(c)[0] * _choice(c)[1])
    )
    assert ranked.index(winner) == len(read) - 1  # every faster candidate was read, none after
    unread = [c for c in found if c.plan and _choice(c) not in read]
    assert unread and all(c.problem == "not read: a faster candidate fits" for c in unread)


def test_a_refusal_and_a_peak_within_the_code_margin_do_not_fit(tmp_path):
    found = candidates(load_spec(_spec(tmp_path, SMALL_V5E)))

    def read_peak(plan):
        if plan.ffn.chunks == 1:
            raise ReadError("compile forward+backward: out of HBM: CompileTimeHbmOom")
        return int(
            0.995 * hardware(plan.hardware).compiler_hbm_bytes_per_device
        )  # the generated code needs 1%

    assert choose_by_assignment(found, _reads(read_peak), 60, lambda *a: None) is None
    problems = {c.problem for c in found if c.plan}
    assert any("CompileTimeHbmOom" in p for p in problems)
    assert any("99.5% of the 15.75 GiB" in p for p in problems)


def test_the_budget_stops_the_reads(tmp_path):
    found = candidates(load_spec(_spec(tmp_path, SMALL_V5E)))
    winner = choose_by_assignment(found, _reads(lambda p: 1), -1, lambda *a: None)
    assert winner is None
    assert all("budget" in c.problem for c in found if c.plan)


@pytest.mark.parametrize(
    ("memory", "tuned"),
    [
        ("memory: {token_chunks: auto, ffn_chunks: auto}",
         "memory: {fit_check: compile, token_chunks: 2, ffn_chunks: 1}"),
        ("memory:\n  # kept\n  ffn_chunks: 'auto'  # kept too\n  token_chunks: auto",
         "memory:\n  # kept\n  fit_check: compile\n  ffn_chunks: 1  # kept too\n"
         "  token_chunks: 2"),
        ("memory: {fit_check: 'plan', token_chunks: auto, ffn_chunks: auto}",
         "memory: {fit_check: compile, token_chunks: 2, ffn_chunks: 1}"),
    ],
)  # fmt: skip
def test_fit_check_is_written_beside_the_choices(tmp_path, memory, tuned):
    text = SMALL_V5E.replace("memory: {token_chunks: auto, ffn_chunks: auto}", memory)
    loaded = load_spec(_spec(tmp_path, text))
    choices = {
        ("memory", "token_chunks"): 2,
        ("memory", "ffn_chunks"): 1,
        ("memory", "fit_check"): "compile",
    }
    new = write_back(loaded, choices)
    assert new == text.replace(memory, tuned)
    memory_section = yaml.safe_load(new)["memory"]
    assert memory_section == {"fit_check": "compile", "token_chunks": 2, "ffn_chunks": 1}


def test_fit_check_on_the_first_line_after_a_byte_order_mark(tmp_path):
    text = "\ufeffmemory: {ffn_chunks: auto}\n" + SMALL_V5E.split("memory:")[0]
    loaded = load_spec(_spec(tmp_path, text))
    new = write_back(loaded, {("memory", "ffn_chunks"): 2, ("memory", "fit_check"): "compile"})
    assert new.startswith("\ufeffmemory: {fit_check: compile, ffn_chunks: 2}\n")


@pytest.mark.slow
def test_tune_keeps_a_layer_whole_that_xla_fits_and_the_plan_would_trade(tmp_path):
    """The plan's ledger puts this layer whole over HBM (its default trades memory); XLA's
    assignment fits it whole, so tune writes no trade and lets the compile judge the fit."""
    path = _spec(tmp_path, QWEN3_V5E)
    loaded = load_spec(path)
    result = run_moegen("tune", path.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"{READ_BY} read in" in result.stderr
    tuned = path.read_text(encoding="utf-8")
    assert "  # left to moegen tune\n  fit_check: compile\n  ffn_chunks: 1\n" in tuned
    assert "token_chunks: 1" in tuned
    whole = [c for c in candidates(loaded) if c.plan and _choice(c) == (1, 1)][0]
    assert over_hbm(whole.plan.memory)  # the ledger alone would have traded
    chosen = next(line for line in result.stdout.splitlines() if "<- chosen" in line)
    peak_gib = float(chosen.split()[-5])
    assert 0.3 < peak_gib / 15.75 < 0.9


@pytest.mark.parametrize(
    ("memory", "noted"),
    [
        ("", True),  # the plan trades on its own
        ("memory: {ffn_chunks: 1, token_chunks: 4}\n", False),
    ],
)
def test_the_build_says_when_a_trade_is_the_ledgers_own(tmp_path, memory, noted):
    """The memory verdict of a build whose FFN slices or token chunks the plan chose names
    the ledger as what chose them, and `moegen tune` as what reads XLA's figure instead."""
    text = QWEN3_V5E.split("memory:")[0] + memory
    loaded = load_valid(_spec(tmp_path, text))
    plan = make_plan(loaded)
    note = own_trade_note(loaded.spec.memory, plan)
    if noted:
        assert plan.ffn.chunks * plan.experts.token_chunks > 1  # the ledger traded
        assert "chosen by the plan's memory ledger" in note and "moegen tune" in note
    else:
        assert note == ""
    cpu = load_valid(
        _spec(tmp_path, text.replace("hardware: tpu-v5e, topology: 4x4", "hardware: cpu"), "cpu")
    )
    assert own_trade_note(cpu.spec.memory, make_plan(cpu)) == ""


def test_without_libtpu_tune_says_so_once_and_reads_nothing(tmp_path, monkeypatch):
    from moegen.verify import MissingVerifier, preflight

    real = preflight.module_installed
    monkeypatch.setattr(preflight, "module_installed", lambda name: name != "libtpu" and real(name))
    decided = []
    with pytest.raises(MissingVerifier, match="libtpu") as refused:
        tune(load_spec(_spec(tmp_path, SMALL_V5E)), on_candidate=lambda *a: decided.append(a))
    assert decided == []  # nothing read
    assert str(refused.value).count("needs libtpu") == 1


def test_a_missing_gpu_kernel_package_is_said_once_before_any_compile(tmp_path, monkeypatch):
    """The compile-each path (a GPU target) says a missing kernel package once, at the
    kernel's line, instead of once a candidate after trying to compile each."""
    from moegen.kernels import te
    from moegen.verify import MissingVerifier

    monkeypatch.setattr(te, "missing_te", lambda: ["transformer_engine_jax==2.20.2 (found none)"])
    tpu_target = "target: {hardware: tpu-v5e, topology: 2x2, kernel: xla}"
    assert tpu_target in SMALL_V5E
    text = SMALL_V5E.replace(tpu_target, "target: {hardware: gpu-h100, topology: 4, kernel: te}")
    decided = []
    with pytest.raises(MissingVerifier, match="kernel te") as refused:
        tune(load_spec(_spec(tmp_path, text, "gpu")), on_candidate=lambda *a: decided.append(a))
    assert decided == []
    assert str(refused.value).count("kernel te") == 1


def test_a_layout_the_edit_does_not_know_is_refused_located_and_unwritten(tmp_path):
    """An anchored memory mapping: inserting fit_check there would break the YAML; tune reads
    its text back, refuses at the memory line, and leaves the spec as it was."""
    from moegen.diagnostics import SpecError
    from moegen.tune import _written

    text = SMALL_V5E.replace("memory: {", "memory: &trades {")
    path = _spec(tmp_path, text)
    loaded = load_spec(path)
    choices = {("memory", "token_chunks"): 2, ("memory", "ffn_chunks"): 1, FIT_CHECK: "compile"}
    with pytest.raises(SpecError, match="write it by hand") as refused:
        _written(loaded, choices)
    assert "memory.fit_check: compile" in str(refused.value)
    assert refused.value.diagnostics[0].line == 8
    assert path.read_text(encoding="utf-8") == text


def test_a_spec_refused_whatever_tune_chooses_is_refused_at_its_own_line(tmp_path):
    """A mistake no `auto` choice mends (a GPU target without its topology) is the spec's
    own: refused once, located at the line that needs mending, not as 25 refused rows."""
    from moegen.diagnostics import SpecError

    tpu_target = "target: {hardware: tpu-v5e, topology: 2x2, kernel: xla}"
    text = SMALL_V5E.replace(tpu_target, "target: {hardware: gpu-h100, kernel: te}")
    path = _spec(tmp_path, text, "gpu")
    with pytest.raises(SpecError, match="needs target.topology") as refused:
        tune(load_spec(path))
    assert refused.value.diagnostics[0].text().startswith(f"{path}:7:")
    assert path.read_text(encoding="utf-8") == text


@pytest.fixture
def whole_fits(monkeypatch):
    """tune's reads stood in for: every candidate's peak 1 GiB (the whole layer wins)."""
    import moegen.tune

    real = moegen.tune.choose_by_assignment

    def choose(found, reads, budget_s, on_candidate):
        return real(found, _reads(lambda plan: GiB), budget_s, on_candidate)

    monkeypatch.setattr(moegen.tune, "choose_by_assignment", choose)


def test_tune_writes_through_a_symlink_and_keeps_the_files_mode(tmp_path, invoke_main, whole_fits):
    """The spec a user links to is the one tuned: the link stays a link, the mode stays."""
    real = _spec(tmp_path, SMALL_V5E, "shared")
    real.chmod(0o640)
    (tmp_path / "mine").mkdir()
    link = tmp_path / "mine" / "layer.yaml"
    link.symlink_to(real)
    result = invoke_main("tune", "layer.yaml", cwd=tmp_path / "mine")
    assert result.code == 0, result.stderr
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert "memory: {token_chunks: 1, ffn_chunks: 1}" in real.read_text(encoding="utf-8")
    assert real.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "shared.yaml"]


def test_a_failed_write_leaves_the_spec_as_it_was(tmp_path, invoke_main, whole_fits, monkeypatch):
    import errno

    import moegen.emit

    def full(path, blob, mode=0o644):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(moegen.emit, "_write_file", full)
    path = _spec(tmp_path, SMALL_V5E)
    result = invoke_main("tune", path.name, cwd=tmp_path)
    assert result.code == 4
    assert "cannot write layer.yaml, left as it is: [Errno 28]" in result.stderr
    assert "; write by hand: memory.token_chunks=1, memory.ffn_chunks=1" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert path.read_text(encoding="utf-8") == SMALL_V5E
    assert [p.name for p in tmp_path.iterdir()] == ["layer.yaml"]


def test_an_edit_made_while_tuning_is_kept(tmp_path, invoke_main, whole_fits, monkeypatch):
    import moegen.tune

    path = _spec(tmp_path, SMALL_V5E)
    edited = SMALL_V5E + "# edited in another window while tune ran\n"
    tune = moegen.tune.tune

    def tune_while_the_user_edits(*args, **kwargs):
        result = tune(*args, **kwargs)
        path.write_text(edited, encoding="utf-8")
        return result

    monkeypatch.setattr(moegen.tune, "tune", tune_while_the_user_edits)
    result = invoke_main("tune", path.name, cwd=tmp_path)
    assert result.code == 4
    assert (
        "cannot write layer.yaml, left as it is: it changed on disk since it was read; "
        "write by hand: memory.token_chunks=1"
    ) in result.stderr
    assert "Traceback" not in result.stderr
    assert path.read_text(encoding="utf-8") == edited
    assert [p.name for p in tmp_path.iterdir()] == ["layer.yaml"]


@pytest.mark.slow
def test_with_shape_variants_every_shape_is_read(tmp_path):
    """A memory trade is chosen for every shape of the module: each variant's programs are
    read (real, on the compile-only v5e: its forward is its own function), and the peak that
    decides is the largest."""
    from moegen.render import render
    from moegen.verify import assigned_memory, assigned_peak

    text = SMALL_V5E.replace(
        "shapes: {batch: 8, seq_len: 256}",
        "shapes: {batch: 8, seq_len: 256, variants: {long: {batch: 8, seq_len: 2048}}}",
    ).replace("memory: {token_chunks: auto, ffn_chunks: auto}", "memory: {token_chunks: 1}")
    plan = make_plan(load_valid(_spec(tmp_path, text)))
    source = render(plan)
    main = max(f.peak for f in assigned_memory(plan, source).values())
    long = max(f.peak for f in assigned_memory(plan, source, variant="long").values())
    assert long > main  # 8x the tokens
    assert assigned_peak(plan) == long


def test_candidates_are_ranked_by_the_plans_step_time_not_its_flops(tmp_path):
    """A memory trade's cost on the chip lies mostly between the matmuls (bench/trade_time):
    the score is the plan's step time plus its exposed communication, and on this layer it
    orders the trades otherwise than their FLOPs do."""
    found = [c for c in candidates(load_spec(_spec(tmp_path, QWEN3_V5E))) if c.plan]
    for candidate in found:
        count_by_plan(candidate)
        roof = candidate.plan.roofline
        assert candidate.counted_by == "plan" and roof.step.train_s > 0
        assert candidate.score == roof.step.train_s + roof.passes[-1].exposed_comm_s
    trade = {_choice(c): c for c in found}
    # the same FLOPs (the gate and up matmuls run twice either way), not the same time: on
    # the chip 2 token chunks cost 1.4-1.9x the layer whole, 2 FFN slices 1.8-3.0x
    assert trade[2, 1].flops == trade[1, 2].flops
    assert trade[1, 1].score < trade[2, 1].score < trade[1, 2].score
    for chunks, slices in trade:  # more of either trade costs more
        if (chunks * 2, slices) in trade:
            assert trade[chunks, slices].score < trade[chunks * 2, slices].score
        if (chunks, slices * 2) in trade:
            assert trade[chunks, slices].score < trade[chunks, slices * 2].score
