"""moegen.plan.weight_reads: where the grouped matmuls read float32 weights as stored (the
pallas module's own gmm casting each block in VMEM) and where the plan keeps the one cast
before them; what the plan, the ledger and the rendered module make of it."""

from __future__ import annotations

import pytest
from spec_builder import spec_yaml, tiny, validated

from moegen.plan import format_plan, make_plan
from moegen.render import render

# One v5e chip, float32 params and bfloat16 compute, pallas: the weights are read as stored.
ONE_CHIP = {
    "experts": 8,
    "embed": 256,
    "ffn": 256,
    "batch": 4,
    "seq_len": 512,
    "axes": {"data": 1},
    "hardware": "tpu-v5e",
    "topology": "1x1",
    "kernel": "pallas",
    "params_dtype": "float32",
    "compute_dtype": "bfloat16",
}


def _plan(**changes):
    choices = tiny(**(ONE_CHIP | changes))
    return make_plan(validated(spec_yaml(choices), "spec.yaml", "spec"))


def _weight_dtypes(plan) -> dict[str, str]:
    return {p.name: p.use_dtype for p in plan.params if p.ffn_axis is not None}


def test_one_call_per_projection_reads_the_float32_weights_as_stored() -> None:
    plan = _plan(ffn_bias=True)
    assert plan.kernel.config.casts_weights
    assert plan.kernel.config.cast_vmem_limit == 2 * 16 * 2**20  # twice v5e's default
    # the routed weights as stored; their biases (gathered per row) in the compute dtype
    assert _weight_dtypes(plan) == {
        "w_gate": "float32",
        "w_up": "float32",
        "w_down": "float32",
        "b_gate": "bfloat16",
        "b_up": "bfloat16",
    }
    assert not plan.ffn.fuses_gate_up  # side by side would be a float32 copy of both
    source = render(plan)
    assert "def _gmm_cast(" in source and "megablox_gmm" not in source
    assert "CAST_VMEM_LIMIT = 32 * 2**20" in source
    assert "float32 read as stored" in format_plan(plan)  # `moegen plan` says so


# Each device runs its own experts' weights once, in one call per projection, whatever the
# strategy: the group's tokens gathered (the ring, no overlap) or exchanged.
READ_ONCE = {
    "ring, no overlap": {"axes": {"expert": 4}, "topology": "2x2", "strategy": "ring_of_experts"},
    "ragged all-to-all": {
        "axes": {"expert": 4},
        "topology": "2x2",
        "strategy": "ragged_all_to_all",
    },
}


@pytest.mark.parametrize("changes", READ_ONCE.values(), ids=READ_ONCE.keys())
def test_every_strategy_reads_its_own_experts_weights_as_stored(changes) -> None:
    plan = _plan(**changes)
    assert plan.kernel.config.casts_weights
    assert set(_weight_dtypes(plan).values()) == {"float32"}


CAST_ONCE = {
    "bfloat16 params": {"params_dtype": "bfloat16"},
    "float32 compute": {"compute_dtype": "float32"},
    "kernel xla": {"kernel": "xla"},
    "fsdp gathers them": {"axes": {"fsdp": 4}, "topology": "2x2"},
    "tensor shards the FFN width": {"axes": {"tensor": 4}, "topology": "2x2"},
    "gradients all-reduced over data": {"axes": {"data": 4}, "topology": "2x2"},
    "and over sequence": {
        "axes": {"expert": 2, "sequence": 2},
        "topology": "2x2",
        "strategy": "ragged_all_to_all",
    },
    "token chunks": {"token_chunks": 2},
    "FFN slices": {"ffn_chunks": 2},
    "overlap chunks": {
        "axes": {"expert": 4},
        "topology": "2x2",
        "strategy": "ring_of_experts",
        "overlap_chunks": 2,
    },
}


@pytest.mark.parametrize("changes", CAST_ONCE.values(), ids=CAST_ONCE.keys())
def test_weights_read_more_than_once_or_cut_first_are_cast_once(changes) -> None:
    plan = _plan(**changes)
    assert not plan.kernel.config or not getattr(plan.kernel.config, "casts_weights", False)
    compute = plan.compute_dtype
    assert set(_weight_dtypes(plan).values()) == {compute}
    assert "_gmm_cast" not in render(plan)
    assert "float32 read as stored" not in format_plan(plan)


def test_a_sliced_layers_whole_forward_reads_the_weights_as_its_slices_do() -> None:
    """FFN slices cast the weights; the whole forward pass they may run is planned (memory,
    tiles) with the same cast, not with the whole layer's float32 reads."""
    sliced = _plan(ffn_chunks=2, embed=2048, ffn=4096, batch=16)
    whole = _plan(embed=2048, ffn=4096, batch=16)
    assert whole.kernel.config.casts_weights and not sliced.kernel.config.casts_weights
    assert set(_weight_dtypes(sliced).values()) == {"bfloat16"}
    assert sliced.ffn.whole_forward  # the ledger runs this one's forward pass whole
    assert {p.use_dtype for p in sliced.ffn.forward_params if p.ffn_axis} == {"bfloat16"}
    # its tiles: the whole layer's as it would read bfloat16 weights (no float32 blocks)
    assert sliced.kernel.config.forward_gate_up_tile != whole.kernel.config.gate_up_tile


def test_the_ledger_holds_no_compute_dtype_copy_of_the_weights() -> None:
    stored, cast = _plan(), _plan(token_chunks=1, kernel="xla")
    kept = "expert weights in the compute dtype, kept for the backward pass"
    assert kept not in dict(stored.memory.ledger)
    assert kept in dict(cast.memory.ledger)
    assert stored.memory.forward_peak < cast.memory.forward_peak


def test_the_tiles_fit_each_kernels_own_limit_with_float32_weights() -> None:
    from moegen.kernels.tiling import Tile, kernel_vmem

    plan = _plan(embed=2048, ffn=768, experts=128, top_k=8, batch=16)
    config = plan.kernel.config
    limits = (config.cast_vmem_limit, config.cast_vmem_limit, 16 * 2**20)
    for projection, tiles in config.kernel_tiles.items():
        for kernel, (tile, limit) in enumerate(zip(tiles, limits, strict=True)):
            need = kernel_vmem(Tile(*tile), "bfloat16", None, "float32")[kernel]
            assert need <= limit, (projection, kernel, tile)
