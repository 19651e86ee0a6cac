"""Token chunks (`memory.token_chunks`, issue 20): the routed experts run on one chunk of each
device's tokens at a time, every buffer certified for one chunk, each chunk recomputed in the
backward pass up to its kept expert outputs.

The plan's figures are checked by hand; the twin cases run the verify step's parity
(forward, aux, every gradient) against the dense reference for every strategy and both
kernels, with the router and mesh features that touch the chunked path, and with FFN slices
in each chunk (memory.ffn_chunks), which a broken slice's gradient fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_twin_parity, generated_from
from spec_builder import spec_yaml, tiny, validated

import moegen.verify.verification
from moegen.load import LoadedSpec
from moegen.plan import make_plan
from moegen.verify import VerifyError, verify

A2A = {"axes": {"fsdp": 2, "expert": 4}, "strategy": "ragged_all_to_all"}

TWIN_CASES = {
    "a2a_xla_shared_bias": tiny(
        ffn=96, ffn_bias=True, shared_ffn=48, load_balance_loss=0.01, token_chunks=4, **A2A
    ),
    "a2a_pallas": tiny(
        embed=256, ffn=256, token_chunks=2, hardware="tpu-v5e", topology="2x4", kernel="pallas",
        **A2A,
    ),
    "replicated_capacity_input_weights": tiny(
        ffn=96, weighting="input", capacity=(1.25, "probability"), load_balance_loss=0.01,
        token_chunks=2,
    ),
    # each shape variant's twin splits into the chunks too
    "a2a_with_variants": tiny(
        ffn=96, token_chunks=8, variants={"prefill": {"batch": 8, "seq_len": 64}}, **A2A
    ),
    "ring_xla": tiny(
        ffn=96, axes={"data": 2, "expert": 2}, strategy="ring_of_experts", token_chunks=4
    ),
    "a2a_tensor_sequence": tiny(
        ffn=96, ffn_bias=True, axes={"tensor": 2, "expert": 2, "sequence": 2},
        strategy="ragged_all_to_all", token_chunks=2,
    ),
    # with FFN slices: each chunk runs the FFN slice by slice (fsdp: each slice gathered)
    "ring_fsdp_ffn_slices": tiny(
        ffn=96, axes={"fsdp": 2, "expert": 2}, strategy="ring_of_experts", token_chunks=4,
        ffn_chunks=2,
    ),
    # bench/MAXTEXT.md's ring row: megablox, fsdp gathering each slice, 2 chunks x 2 slices
    "ring_pallas_fsdp_ffn_slices": tiny(
        embed=256, ffn=256, axes={"fsdp": 2, "expert": 4}, strategy="ring_of_experts",
        token_chunks=2, ffn_chunks=2, hardware="tpu-v5e", topology="2x4", kernel="pallas",
    ),
    "a2a_pallas_ffn_slices": tiny(
        embed=256, ffn=256, token_chunks=2, ffn_chunks=2, hardware="tpu-v5e", topology="2x4",
        kernel="pallas", **A2A,
    ),
    "replicated_gelu_bias_shared_ffn_slices": tiny(
        ffn=96, activation="gelu", ffn_bias=True, shared_ffn=48, token_chunks=2, ffn_chunks=3,
    ),
}  # fmt: skip


def plan_of(choices: dict):
    loaded = validated(spec_yaml(choices), "layer.yaml", "layer")
    assert isinstance(loaded, LoadedSpec), loaded
    return make_plan(loaded)


@pytest.mark.parametrize("chunks", [2, 4, 8])
def test_every_buffer_is_one_chunks(chunks: int) -> None:
    whole = plan_of(tiny(ffn=256, **A2A))
    chunked = plan_of(tiny(ffn=256, token_chunks=chunks, **A2A))
    assert chunked.experts.call_tokens * chunks == whole.local_tokens
    assert chunked.experts.receive_rows * chunks == whole.experts.receive_rows
    assert chunked.experts.group_tokens * chunks == whole.experts.group_tokens
    # the same work in all: FLOPs, bytes exchanged
    assert chunked.cost.forward_flops == whole.cost.forward_flops
    assert chunked.experts.communication_bytes == whole.experts.communication_bytes
    assert chunked.roofline.passes[0].kernel_flops == whole.roofline.passes[0].kernel_flops


def test_gate_and_up_run_again_in_the_backward_pass() -> None:
    whole = plan_of(tiny(ffn=256, **A2A))
    chunked = plan_of(tiny(ffn=256, token_chunks=4, **A2A))
    assert whole.cost.recompute_flops == 0
    # gate and up of every kernel row: 2 of the 3 matmuls, once more
    rows = chunked.experts.receive_rows * 4
    assert chunked.cost.recompute_flops == 2 * 2 * rows * 64 * 256


def test_the_ledger_holds_one_chunk_and_every_chunks_outputs() -> None:
    whole = plan_of(tiny(ffn=256, batch=64, **A2A))
    chunked = plan_of(tiny(ffn=256, batch=64, token_chunks=8, **A2A))
    ledger = dict(chunked.memory.ledger)
    kept = ledger["expert outputs of the 8 token chunks, kept"]
    # every copy's output [D] in bfloat16, over all chunks
    assert kept == chunked.local_tokens * 2 * 64 * 2
    assert chunked.memory.train_peak < whole.memory.train_peak
    assert chunked.memory.forward_peak < whole.memory.forward_peak


def test_rendered_layer_scans_the_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = generated_from(tiny(ffn=96, token_chunks=4, **A2A), tmp_path, monkeypatch).source
    assert "def _routed_experts_in_chunks(" in source
    assert 'returned = checkpoint_name(returned, "expert_outputs")' in source
    assert "CHUNK_TOKENS = 4  # LOCAL_TOKENS / TOKEN_CHUNKS" in source
    assert "flat_ids = expert_ids.reshape(CHUNK_ROWS)" in source
    assert "y, received = _routed_experts_in_chunks(" in source


def test_without_chunks_none_of_it_is_emitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = generated_from(tiny(ffn=96, **A2A), tmp_path, monkeypatch).source
    for code in ("TOKEN_CHUNKS", "CHUNK_TOKENS", "checkpoint_name", "functools"):
        assert code not in source


@pytest.mark.parametrize("case", sorted(TWIN_CASES))
@pytest.mark.slow
def test_twin_matches_the_dense_reference(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generated = generated_from(TWIN_CASES[case], tmp_path, monkeypatch)
    report = verify(generated.loaded, generated.source, run_compiles=False)
    assert_twin_parity(report)


def test_token_chunks_with_ffn_slices_are_listed_and_costed() -> None:
    plan = plan_of(tiny(ffn=256, **A2A))
    options = {(o.chunks, o.ffn_chunks): o for o in plan.chunk_candidates.sliced_token_chunks}
    slices = [o.chunks for o in plan.ffn.chunk_options if o.chunks > 1]
    chunks = [o.chunks for o in plan.chunk_candidates.token_chunks if o.chunks > 1]
    assert slices and chunks
    assert sorted(options) == sorted((c, s) for c in chunks for s in slices)
    both = plan_of(tiny(ffn=256, token_chunks=4, ffn_chunks=2, **A2A))
    assert options[4, 2].train_peak == both.memory.train_peak
    assert options[4, 2].forward_peak == both.memory.forward_peak
    # the same recomputation as either alone: gate and up once more
    alone = {o.chunks: o for o in plan.chunk_candidates.token_chunks}
    assert options[4, 2].train_flops == alone[4].train_flops
    # under fsdp each chunk gathers every slice's weights: traffic grows with the chunks
    assert options[2, 2].ici_bytes < options[4, 2].ici_bytes < options[8, 2].ici_bytes


def test_the_ledger_of_sliced_chunks_holds_one_chunks_weight_gradients() -> None:
    both = plan_of(tiny(ffn=256, batch=64, token_chunks=4, ffn_chunks=2, **A2A))
    ledger = dict(both.memory.ledger)
    # the sliced weights' stored shards, [8, 64, 256] x 3 over fsdp 2 x expert 4, in bfloat16:
    # float32 parameters, bfloat16 compute, so the slices' backward is written out
    sliced = 3 * 8 * 64 * 256 * 2 // 8
    key = "one token chunk's gradients of the sliced weights, before the sum over chunks"
    assert ledger[key] == sliced
    assert "expert outputs of the 4 token chunks, kept" in ledger
    assert both.memory.train_peak < plan_of(tiny(ffn=256, batch=64, **A2A)).memory.train_peak


def test_rendered_chunks_run_the_ffn_in_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    choices = tiny(ffn=96, token_chunks=4, ffn_chunks=2, **A2A)
    source = generated_from(choices, tmp_path, monkeypatch).source
    assert "def _routed_experts_in_chunks(" in source
    assert "def _ffn_slice(" in source
    assert "jax.lax.all_gather(" in source.split("def _weight_slice(")[1]


@pytest.mark.slow
def test_a_broken_slice_gradient_fails_the_twin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each slice's weights cut off from the gradient: the forward is unchanged, the weight
    gradients are zero, and the twin's gradient parity says so."""
    generated = generated_from(TWIN_CASES["ring_fsdp_ffn_slices"], tmp_path, monkeypatch)
    original = "jax.lax.dynamic_slice_in_dim(stored[name], start, FFN_CHUNK, axis=axis)"
    mutant = f"jax.lax.stop_gradient({original})"
    real_render = moegen.verify.verification.render

    def mutated_render(plan):
        source = real_render(plan)
        if plan.ffn.slice_grads_by_hand:  # bfloat16 compute: the slices' backward written out
            assert source.count("columns_grad[") == len(plan.ffn.sliced_params)
            return source.replace("columns_grad[", "0 * columns_grad[")
        assert source.count(original) == 1
        return source.replace(original, mutant)

    monkeypatch.setattr(moegen.verify.verification, "render", mutated_render)
    with pytest.raises(VerifyError, match=r"grad_w_\w+ differs from the dense reference"):
        verify(generated.loaded, mutated_render(generated.plan), run_compiles=False)
