"""The plan's memory ledger against the compiler on a fixed sample of the generated population
(bench.population, seed 0), none of them a committed example: spread over the three
strategies, the five mesh axes, both kernels and every trade (whole, FFN slices, token
chunks, both).

bench/stores/ledger_population.json holds each spec's compiled peaks under the SHA-256 of the
module it compiled and the versions that shaped the compile (`python -m bench.ledger
--population 60 --seed 0`). A record is only evidence for that module: when the plan renders
a spec differently, or a pin moves, its record is stale and this test fails until the spec is
compiled again.

The ledger is held within LEDGER_TOLERANCE on SAMPLE. NOT_YET_WITHIN names the sampled
programs the ledger still misses (issue 27) with the error it has today, as a bound: a
change that makes one worse fails, one that brings it within 10% must move it to SAMPLE.
"""

from __future__ import annotations

import functools
import json
import math
import re

import pytest
import yaml

import bench.ledger_population
from bench.extrapolate import shrunk
from bench.ledger_population import STORE, STORES, merge_stores, module_key, plan_of, planned
from bench.population import population
from moegen.plan import Plan

LEDGER_TOLERANCE = 0.10  # |planned - compiled| / compiled
PROGRAMS = ("forward", "train")
SAMPLE = (
    "s0_000_qwen3_30b_a3b",  # ragged all-to-all, data x expert x sequence, pallas, whole
    "s0_004_deepseek_v3",  # replicated, data x sequence, 90 GiB of 96: XLA under pressure
    "s0_006_llama4_scout",  # ragged all-to-all, data x fsdp x expert, xla, 8 token chunks
    "s0_013_qwen15_moe_a27b",  # ragged all-to-all, data x fsdp x expert, xla, 4 slices
    "s0_015_deepseek_v3",  # ragged all-to-all, expert x tensor on tpu7x, xla, 4 slices
    "s0_016_dbrx",  # replicated, data x sequence: weight gradients all-reduced
    "s0_017_qwen2_57b_a14b",  # ring of experts, expert x sequence, 2 token chunks
    "s0_018_jamba",  # replicated, sequence 4, 2 slices
    "s0_019_mixtral_8x7b",  # replicated, tensor 8 alone, bfloat16 parameters
    "s0_021_qwen15_moe_a27b",  # replicated, tensor x sequence, biases
    "s0_022_gpt_oss_120b",  # ragged all-to-all, expert x sequence, xla, 2 slices x 8 chunks
    "s0_025_olmoe",  # replicated, sequence 8
    "s0_030_qwen3_30b_a3b",  # ragged all-to-all, expert 4, xla, 4 token chunks
    # compiled after the ledger was frozen (bench/LEDGER.md): judged, never fitted on
    "s0_035_mixtral_8x7b",  # replicated, fsdp x sequence, xla, 4 slices
    "s0_043_mixtral_8x7b",  # ragged all-to-all, fsdp x expert, whole, v5p
    "s0_048_qwen3_30b_a3b",  # ring of experts, expert x sequence, biases, 2 token chunks
    "s0_051_qwen3_30b_a3b",  # ragged all-to-all, expert x sequence, 8 token chunks, v6e
    "s0_052_olmoe",  # ragged all-to-all, expert x tensor, xla, whole
    # bfloat16 parameters read in place by megablox, 4 slices x 4 token chunks (the
    # forward was +67% when the ledger counted a copy of the weights there)
    "s0_056_mixtral_8x7b",
    # tpu7x, whose compiler holds more float32 weight gradients (HELD_WEIGHT_GRADIENTS):
    "s0_002_gpt_oss_120b",  # ragged all-to-all, data x expert x tensor, all-reduced
    "s0_049_mixtral_8x7b",  # ragged all-to-all, fsdp x expert, 4 token chunks, bfloat16
)
# (spec, program) -> the |error| the ledger has today, outside LEDGER_TOLERANCE
NOT_YET_WITHIN = {
    ("s0_001_qwen3_30b_a3b", "forward"): 0.20,  # replicated, fsdp x tensor
    ("s0_007_gpt_oss_120b", "forward"): 0.52,  # fsdp x expert x tensor, biases, tpu7x
    ("s0_020_qwen2_57b_a14b", "forward"): 0.28,  # expert x tensor, xla, 4 token chunks
    ("s0_031_llama4_scout", "forward"): 0.27,  # data x fsdp x expert, shared expert
    # the combine weights on the hidden rows (moegen.plan.combine): the compiled forward fell
    # from 1.69 to 1.27 GiB, which the ledger does not model yet (it was within 10%)
    ("s0_019_mixtral_8x7b", "forward"): 0.21,
}
SPECS = dict(population(60, 0))
STORED = json.loads(STORE.read_text(encoding="utf-8"))["modules"]
HOLDOUT_STORE = STORES / "holdout_assigned.json"


# Planning both 60-spec populations takes ~12 s a pass and four tests read them: each spec is
# planned once a test process (plans are immutable values of their spec's text).
_plan_once = functools.cache(plan_of)


@functools.cache
def _record(name: str) -> tuple[dict[str, int], dict]:
    """The plan's peaks of `name` and the compiled record of the module it renders today."""
    peaks, source = planned(name, SPECS[name])
    record = STORED.get(module_key(source))
    if record is None:
        pytest.fail(
            f"{name}: no compiled record for the module the plan renders today (the module or "
            "a pinned version changed): run python -m bench.ledger --population 60 --seed 0"
        )
    assert record["spec"] == name
    return peaks, record


def _error(name: str, program: str) -> float:
    peaks, record = _record(name)
    return peaks[program] / record[program]["peak"] - 1


def test_the_sample_is_spread_and_not_an_example() -> None:
    trees = [yaml.safe_load(SPECS[name]) for name in SAMPLE]
    assert {t["parallelism"]["experts"] for t in trees} == {
        "ragged_all_to_all",
        "ring_of_experts",
        "replicated",
    }
    assert {a for t in trees for a in t["mesh"]["axes"]} == {
        "data",
        "fsdp",
        "expert",
        "tensor",
        "sequence",
    }
    assert {t["target"]["kernel"] for t in trees} == {"pallas", "xla"}
    trades = {tuple(sorted(k for k, v in t.get("memory", {}).items() if v > 1)) for t in trees}
    assert trades == {(), ("ffn_chunks",), ("token_chunks",), ("ffn_chunks", "token_chunks")}
    assert all(t["description"].startswith("population:") for t in trees)


@pytest.mark.parametrize(
    ("name", "program"),
    [(n, p) for n in SAMPLE for p in PROGRAMS if (n, p) not in NOT_YET_WITHIN],
)
def test_the_ledger_is_within_tolerance_on_the_sample(name: str, program: str) -> None:
    error = _error(name, program)
    assert abs(error) <= LEDGER_TOLERANCE, f"{name} {program}: planned {error:+.1%}"


@pytest.mark.parametrize(("name", "program"), sorted(NOT_YET_WITHIN))
def test_the_programs_not_yet_within_do_not_get_worse(name: str, program: str) -> None:
    error = _error(name, program)
    assert abs(error) > LEDGER_TOLERANCE, f"{name} {program} is within: move it to SAMPLE"
    assert abs(error) <= NOT_YET_WITHIN[(name, program)], f"{name} {program}: {error:+.1%}"


def test_stores_compiled_side_by_side_merge_and_the_first_record_of_a_module_stays(tmp_path):
    main, seed1 = tmp_path / "main.json", tmp_path / "s1.json"
    main.write_text(json.dumps({"modules": {"a": {"spec": "s0_000", "seconds": 1}}}))
    seed1.write_text(json.dumps({"modules": {"a": {"spec": "other"}, "b": {"spec": "s1_000"}}}))
    merge_stores(main, [seed1])
    merged = json.loads(main.read_text())["modules"]
    assert merged == {"a": {"spec": "s0_000", "seconds": 1}, "b": {"spec": "s1_000"}}


def test_a_spec_shrinks_to_a_shorter_sequence_only_where_it_splits_evenly() -> None:
    text = SPECS["s0_051_qwen3_30b_a3b"]  # expert 2 x sequence 2, 8 token chunks, seq 1024
    tree = yaml.safe_load(text)
    quarter = yaml.safe_load(shrunk(text, 4))
    assert quarter["shapes"] == {**tree["shapes"], "seq_len": tree["shapes"]["seq_len"] // 4}
    assert {k: v for k, v in quarter.items() if k not in ("shapes", "description")} == {
        k: v for k, v in tree.items() if k not in ("shapes", "description")
    }
    assert shrunk(text, 64) is None  # 16 tokens over 2 sequence shards in 8 chunks: refused


def test_the_share_moegen_plan_states_is_the_recorded_populations(monkeypatch):
    """`moegen plan` tells the user how often its estimate is over 10% off: that figure is the
    records' of both 60-spec populations (planned now, against the recorded compiles)."""
    from bench.ledger_population import ledger_errors
    from moegen.plan.report import LEDGER_MISSES_PERCENT

    monkeypatch.setattr(bench.ledger_population, "plan_of", _plan_once)  # the same plans
    programs = outside = 0
    for seed in (0, 1):
        errors, _ = ledger_errors(60, seed)
        for found in errors.values():
            programs += len(found)
            outside += sum(1 for error, _ in found if abs(error) > LEDGER_TOLERANCE)
    assert programs >= 200, programs  # both populations are compiled: a missing record shows
    assert abs(100 * outside / programs - LEDGER_MISSES_PERCENT) <= 5, (outside, programs)


@functools.cache
def _population_plans() -> tuple[tuple[str, Plan, dict | None], ...]:
    """(name, plan, record or None) of both 60-spec populations, planned now."""
    from moegen.render import render

    rows = []
    for seed in (0, 1):
        for name, text in population(60, seed):
            plan = _plan_once(name, text)
            rows.append((name, plan, STORED.get(module_key(render(plan)))))
    return tuple(rows)


def _compiled(record: dict, program: str) -> int | None:
    figures = record.get(program)
    return None if not figures or "oom" in figures else figures["peak"]


def test_the_refusal_margin_covers_every_recorded_overestimate():
    """memory.fit_check: compile refuses a plan more than REFUSAL_OVERESTIMATE over HBM as
    proved: never less than the most the plan is over the compiled peak on either population
    (the larger of the two programs, as moegen.plan.headroom compares), nor over XLA's assigned
    peak on the hold-outs of bench.holdout (seeds 2-4: the compiled peak to 0.0034%), or it
    is no proof. Seed 4 broke the bound set on seeds 0 and 1 (55%): +63.6%, s4_026."""
    from moegen.plan import MEASURED_OVERESTIMATE, REFUSAL_OVERESTIMATE, peak

    overs = []
    for name, plan, record in _population_plans():
        compiled = [_compiled(record or {}, program) for program in PROGRAMS]
        if None not in compiled:
            overs.append((peak(plan) / max(compiled) - 1, name))
    assert len(overs) >= 100, len(overs)
    for name, plan, assigned in [*_holdout_plans(), *_too_big_whole_plans()]:
        overs.append((peak(plan) / max(assigned) - 1, name))
    assert len(overs) >= 310, len(overs)
    # the worst was +123.5% (s2_023_olmoe_b224) until the combine weights moved to the hidden
    # rows (moegen.plan.combine), which made that layer's assigned peak larger: +101.4% now;
    # MEASURED_OVERESTIMATE keeps the worst ever recorded
    assert 1.0 < max(overs)[0] <= MEASURED_OVERESTIMATE <= REFUSAL_OVERESTIMATE / 1.5, max(overs)


def _too_big_whole_plans():
    """(name, plan, peaks) of each population layer made too big to run whole (the batch in
    its bench label) whose layer whole was measured: compiled as the build's choice
    (bench.defaults_fit, seeds 0 and 1), or read by XLA's buffer assignment (bench.holdout,
    seeds 2-4). The layers the ledger over-counts most: read whole, not traded."""
    from bench.defaults_fit import with_trade
    from moegen.load import load_spec_bytes
    from moegen.plan import make_plan
    from moegen.render import render
    from moegen.validate import validate
    from moegen.variants import derive

    read = json.loads(HOLDOUT_STORE.read_text(encoding="utf-8"))["modules"]
    for seed, index, batch in _too_big_labels(read):
        name, text = population(60, seed)[index]
        tree = yaml.safe_load(text)
        tree.pop("memory", None)
        tree["shapes"]["batch"] = batch
        label, big = f"{name}_b{batch}", yaml.safe_dump(tree, sort_keys=False)
        if seed < 2:
            plan = plan_of(f"{label}_chosen", with_trade(big, 1, 1))
            record = STORED.get(module_key(render(plan)), {})
            peaks = tuple(_compiled(record, program) for program in PROGRAMS)
        else:
            loaded = validate(load_spec_bytes(big.encode(), f"{label}.yaml", label))
            whole = {("memory", "ffn_chunks"): 1, ("memory", "token_chunks"): 1}
            plan = make_plan(derive(loaded, whole))
            entry = read.get(module_key(render(plan)), {})
            peaks = (entry.get("forward"), entry.get("forward+backward"))
        if None not in peaks:
            yield label, plan, peaks


def _too_big_labels(read: dict) -> list[tuple[int, int, int]]:
    """(seed, index, batch) of every too-big layer the two stores name."""
    found = set()
    for entry in [*STORED.values(), *read.values()]:
        hit = re.match(r"s(\d)_(\d{3})_\w+?_b(\d+)_(chosen|trade|whole)$", entry.get("spec", ""))
        if hit:
            found.add((int(hit.group(1)), int(hit.group(2)), int(hit.group(3))))
    return sorted(found)


def _holdout_plans():
    """(name, plan, XLA's assigned peaks) of the hold-out specs read by bench.holdout."""
    from moegen.render import render

    read = json.loads(HOLDOUT_STORE.read_text(encoding="utf-8"))["modules"]
    for seed in (2, 3, 4):
        for name, text in population(60, seed):
            plan = plan_of(name, text)
            entry = read.get(module_key(render(plan)), {})
            if "forward" in entry:
                yield name, plan, (entry["forward"], entry["forward+backward"])


def test_every_population_spec_the_plan_refuses_is_out_of_hbm_in_the_compiler():
    """The default refusal (LEDGER_OVERESTIMATE, set on the examples) has not refused a
    population spec that compiles to fit: each one it refuses is out of HBM in the compiler
    (or its stored parameters and gradients alone are over HBM)."""
    from moegen.plan import cannot_fit

    refused = []
    for name, plan, record in _population_plans():
        if cannot_fit(plan):
            refused.append(name)
            exact_over = plan.memory.exact_bytes > plan.memory.hbm_bytes_per_device
            assert exact_over or "oom" in json.dumps(record), name
    assert len(refused) >= 6, refused


@pytest.mark.parametrize(
    ("kernel", "params", "copied"),
    [("pallas", "bfloat16", False), ("xla", "bfloat16", True), ("pallas", "float32", True)],
)
def test_sliced_weights_are_copied_whole_unless_the_kernel_reads_them_in_place(
    kernel: str, params: str, copied: bool
) -> None:
    """FFN slices of weights stored in the compute dtype, read in place by megablox: the
    forward copies none of them (s0_056, s1_024, s1_029, s1_031), but keeps the slices whole
    for the backward pass; cast, or relaid out for ragged_dot (s0_034, xla: its forward
    holds a copy of every weight), the copy is counted in both programs."""
    tree = yaml.safe_load(SPECS["s0_056_mixtral_8x7b"])
    tree["target"]["kernel"], tree["dtypes"]["params"] = kernel, params
    plan = plan_of("s0_056_mixtral_8x7b", yaml.safe_dump(tree, sort_keys=False))
    items = dict(plan.memory.ledger)
    ffn = [p for p in plan.params if p.ffn_axis is not None]
    weights = sum(math.prod(p.local_shape) for p in ffn) * 2  # local shards, in bfloat16
    cast = items.get("stored expert weights cast to the compute dtype once", 0)
    kept = items.get("the slices' weights, kept whole for the backward pass", 0)
    assert (cast, kept) == ((weights, 0) if copied else (0, weights))


def test_the_tpu7x_share_of_held_gradients_is_fitted_on_seed_0_alone():
    """HELD_WEIGHT_GRADIENTS["tpu7x"] is the share, in hundredths, that leaves the fewest of
    seed 0's tpu7x forward+backward programs outside 10% (then the least median error):
    refitted here from the records, so the constant cannot drift from its fit. The hold-out
    (seed 1) plays no part in it."""
    import statistics

    from moegen.plan.memory import HELD_WEIGHT_GRADIENTS

    share = HELD_WEIGHT_GRADIENTS["tpu7x"]
    programs = []  # (the plan's peak without the held gradients, all of them, compiled)
    for name, plan, record in _population_plans():
        compiled = _compiled(record or {}, "train")
        held = [v for k, v in plan.memory.ledger if k.startswith("float32 weight gradients")]
        if name.startswith("s0_") and compiled and plan.hardware == "tpu7x":
            programs.append((plan.memory.train_peak - held[0], held[0] / share, compiled))
    assert len(programs) >= 12, len(programs)

    def misses(candidate: float) -> tuple[int, float]:
        errors = [abs((base + candidate * grads) / peak - 1) for base, grads, peak in programs]
        return sum(error > LEDGER_TOLERANCE for error in errors), statistics.median(errors)

    assert min(range(101), key=lambda hundredths: misses(hundredths / 100)) / 100 == share
