"""`moegen tune`: candidates for each `auto`, compiled and scored; the winner written back in
place of `auto`, every other byte of the spec (comments included) kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_no_traceback, run_moegen

from moegen.load import load_spec
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.tune import candidates, tune, write_back

# Token exchange dominates: wide tokens, small experts, top-8 over an expert axis of 2. Ring
# of experts moves (b + 4) t D (P - 1) = 6tD bytes forward, ragged all-to-all
# 2 b t K D (P - 1) / P = 16tD: ring must win (the expert axis is smaller than top-k).
RING_WINS = """\
# wide tokens, small experts
version: 1
layer:
  num_experts: 8
  embed_dim: 1024
  ffn_dim: 128
router:
  top_k: 8
shapes:
  batch: 8
  seq_len: 256
mesh:
  axes: {fsdp: 2, expert: 2}
parallelism:
  experts: auto   # moegen tune picks
target:
  hardware: tpu-v5e
  topology: 2x2
  kernel: xla
"""

CPU_TWO_CHOICES = """\
version: 1
layer: {num_experts: 4, embed_dim: 64, ffn_dim: 32}
router: {top_k: 2}
shapes: {batch: 4, seq_len: 8}
mesh: {axes: {expert: 2}}
parallelism: {experts: auto, overlap_chunks: 'auto'}
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.slow
def test_ring_of_experts_wins_when_the_expert_axis_is_smaller_than_top_k(tmp_path):
    path = _write(tmp_path, "ring_wins", RING_WINS)
    result = run_moegen("tune", path.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    tuned = path.read_text(encoding="utf-8")
    assert tuned == RING_WINS.replace("experts: auto", "experts: ring_of_experts")
    assert "<- chosen" in result.stdout and "progress" not in result.stdout
    assert "[1/2]" in result.stderr and "[2/2]" in result.stderr  # progress while it works

    # The known answer, by the plan's own bytes: ring moves fewer.
    plans = {
        strategy: make_plan(load_valid(_write(tmp_path, strategy, tuned.replace(
            "ring_of_experts", strategy))))
        for strategy in ("ring_of_experts", "ragged_all_to_all")
    }  # fmt: skip
    traffic = {s: dict(p.experts.communication_bytes)[s] for s, p in plans.items()}
    assert traffic["ring_of_experts"] < traffic["ragged_all_to_all"]
    bounds = {s: p.roofline.passes[-1].exposed_comm_s for s, p in plans.items()}
    assert bounds["ring_of_experts"] < bounds["ragged_all_to_all"]


@pytest.mark.slow
def test_dry_run_within_a_budget_prints_the_patch_and_writes_nothing(tmp_path):
    path = _write(tmp_path, "two_choices", CPU_TWO_CHOICES)
    result = run_moegen("tune", "--dry-run", "--budget", "1", path.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert path.read_text(encoding="utf-8") == CPU_TWO_CHOICES
    assert result.stdout.count("<- chosen") == 1
    # the first candidate compiles; the budget is spent before the others start
    assert result.stderr.count("compiled in") == 1
    assert "not compiled: the 1 s budget ran out" in result.stderr
    assert "--- two_choices.yaml\n+++ two_choices.yaml (tuned)" in result.stdout
    assert "-parallelism: {experts: auto, overlap_chunks: 'auto'}" in result.stdout


@pytest.mark.slow
def test_the_winner_has_the_lowest_score_and_the_tuned_spec_builds(tmp_path):
    path = _write(tmp_path, "two_choices", CPU_TWO_CHOICES)
    loaded = load_spec(path)
    result = tune(loaded)
    scored = [c for c in result.candidates if not c.problem]
    # a2a with 1 chunk, ring with 1, 2 and 4 chunks (8 does not divide embed 64 into lanes? it
    # does on cpu: 8 columns each), all valid here
    assert len(scored) >= 3
    assert result.winner is min(scored, key=lambda c: c.score)
    path.write_text(result.new_text, encoding="utf-8")
    concrete = load_valid(path)  # no auto left: a normal, valid spec
    assert concrete.spec.auto_fields() == []


def test_candidates_skip_chunks_without_a_ring_and_say_why_others_are_invalid(tmp_path):
    text = CPU_TWO_CHOICES.replace("embed_dim: 64", "embed_dim: 36")
    found = candidates(load_spec(_write(tmp_path, "odd_embed", text)))
    pairs = {
        (c.choices[("parallelism", "experts")], c.choices[("parallelism", "overlap_chunks")]): c
        for c in found
    }
    assert ("ragged_all_to_all", 2) not in pairs  # chunks overlap the ring only
    assert pairs[("ring_of_experts", 8)].problem.startswith("embed_dim 36 does not split into 8")
    assert pairs[("ring_of_experts", 4)].problem == ""


def test_build_refuses_auto_at_its_line(tmp_path):
    path = _write(tmp_path, "ring_wins", RING_WINS)
    result = run_moegen("build", "--no-verify", path.name, cwd=tmp_path)
    assert result.returncode == 3
    assert result.stderr.startswith(
        "ring_wins.yaml:15:12: parallelism.experts: auto is chosen by `moegen tune ring_wins.yaml`"
    ), result.stderr
    assert_no_traceback(result.stderr)
    assert not (tmp_path / "generated").exists()


def test_nothing_to_tune_is_a_located_error(tmp_path):
    path = _write(tmp_path, "fixed", RING_WINS.replace("experts: auto", "experts: ring_of_experts"))
    result = run_moegen("tune", path.name, cwd=tmp_path)
    assert result.returncode == 3
    assert "nothing to tune" in result.stderr
    assert_no_traceback(result.stderr)


def test_write_back_keeps_quotes_comments_and_flow_mappings(tmp_path):
    loaded = load_spec(_write(tmp_path, "two_choices", CPU_TWO_CHOICES))
    new = write_back(
        loaded,
        {("parallelism", "experts"): "ring_of_experts", ("parallelism", "overlap_chunks"): 2},
    )
    assert new == CPU_TWO_CHOICES.replace(
        "{experts: auto, overlap_chunks: 'auto'}", "{experts: ring_of_experts, overlap_chunks: 2}"
    )


CPU_TOKEN_CHUNKS = """\
version: 1
layer: {num_experts: 4, embed_dim: 64, ffn_dim: 32}
router: {top_k: 2}
shapes: {batch: 4, seq_len: 16}
mesh: {axes: {expert: 2}}
parallelism: {experts: ragged_all_to_all}
memory: {token_chunks: auto}
"""


@pytest.mark.slow
def test_token_chunk_candidates_are_scored_by_every_iteration(tmp_path):
    """XLA's cost analysis counts a scan's body once: by compiled counts 16 chunks look 16
    times cheaper than one. Candidates that loop are scored by the plan's counts, every
    candidate alike, so more chunks never score fewer FLOPs than the layer run whole."""
    result = tune(load_spec(_write(tmp_path, "chunks", CPU_TOKEN_CHUNKS)))
    scored = {c.choices[("memory", "token_chunks")]: c for c in result.candidates if not c.problem}
    assert len(scored) >= 3 and 1 in scored
    assert all(c.counted_by == "plan" for c in scored.values())
    assert all(c.flops >= scored[1].flops for c in scored.values())  # chunks recompute
    assert result.winner is scored[1]  # it fits, and chunks only add work
