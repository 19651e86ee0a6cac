"""The layers of issue 17 that validated and then could not be built (tests/emit/test_buildable.py
builds them; tests/kernels/test_tiling_libtpu.py compiles their tiles): each layer's spec
choices, the defect it had, and what a narrowed build of it keeps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spec_builder import spec_yaml, validated

from moegen.load import LoadedSpec
from moegen.plan import Plan, make_plan

# The shapes of MaxText's MoE comparisons: 8 sequences of 4096 tokens on a v5e 2x4 slice.
V5E_2X4 = {
    "batch": 8,
    "seq_len": 4096,
    "params_dtype": "float32",
    "compute_dtype": "bfloat16",
    "hardware": "tpu-v5e",
    "topology": "2x4",
    "strategy": "ragged_all_to_all",
}
V6E_4X4 = V5E_2X4 | {
    "batch": 16,
    "hardware": "tpu-v6e",
    "topology": "4x4",
    "axes": {"data": 2, "fsdp": 2, "expert": 4},
    "kernel": "pallas",
}
QWEN3 = {"experts": 128, "embed": 2048, "ffn": 768, "top_k": 8}
MIXTRAL = {"experts": 8, "embed": 4096, "ffn": 14336, "top_k": 2}
GROK1 = {"experts": 8, "embed": 6144, "ffn": 32768, "top_k": 2}
PHI35 = {"experts": 16, "embed": 4096, "ffn": 6400, "top_k": 2}
QWEN2_57B = {"experts": 64, "embed": 3584, "ffn": 2560, "top_k": 8, "shared_ffn": 20480}
# What a build of a layer whose defect is not in its widths changes: 128 tokens a sequence,
# narrow layers (each such layer built full-width took 25-50 s of TPU compile, 10 s here).
SMALL = {"seq_len": 128, "embed": 256, "ffn": 256}


def _structure(plan: Plan) -> tuple:
    """What a built defect depends on: FFN slices, the mesh, each kernel's tiles."""
    names = ("gate_up_tile", "down_tile", "gate_up_backward", "down_backward")
    tiles = (getattr(plan.kernel.config, name, None) for name in names)
    return (plan.ffn.chunks, plan.mesh, *tiles)


def _mesh_layout(plan: Plan) -> tuple:
    """What a defect of the mesh's layout on the slice depends on (not the widths)."""
    return (plan.mesh, plan.experts.strategy, plan.kernel.name)


@dataclass(frozen=True)
class Layer:
    """One layer of issue 17: its spec choices (tests/support/spec_builder.py) and what broke."""

    choices: dict[str, Any]
    defect: str
    splits_physical_axes: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    # Where the defect is in the program's structure (its types, tiles or mesh), not its size:
    # the build test builds the layer with these choices changed (fewer tokens, narrower
    # layers: a TPU compile's time grows with the sizes), keeping `structure` of its plan.
    built: dict[str, Any] = field(default_factory=dict)
    structure: Callable[[Plan], tuple] = _structure

    def text(self) -> str:
        return spec_yaml(self.choices)

    def loaded(self, name: str = "layer") -> LoadedSpec:
        loaded = validated(self.text(), f"{name}.yaml", name)
        assert isinstance(loaded, LoadedSpec), loaded
        return loaded

    def plan(self) -> Plan:
        return make_plan(self.loaded())


def _qwen3_xla(chunks: int) -> Layer:
    choices = V5E_2X4 | QWEN3 | {"axes": {"expert": 8}, "kernel": "xla", "ffn_chunks": chunks}
    defect = "scan body function carry input and carry output must have equal types"
    # the carry's types come from the strategy, the mesh and the slices, not the widths
    return Layer(choices, defect, built=SMALL)


LAYERS: dict[str, Layer] = {
    **{f"qwen3_xla_expert8_{c}_slices": _qwen3_xla(c) for c in (2, 4, 8)},
    "mixtral_2_slices": Layer(
        V5E_2X4 | MIXTRAL | {"axes": {"fsdp": 2, "expert": 4}, "kernel": "pallas", "ffn_chunks": 2},
        "CompileTimeScopedVmemOom in the tgmm of the down projection",
        # the down projection's tiles come from its slice (7168 wide) and a 1024-wide
        # embedding tile: the FFN stays, the embedding narrows to one tile (26 s -> 15 s)
        built={"seq_len": 128, "embed": 1024},
    ),
    "grok1_4_slices": Layer(
        V5E_2X4 | GROK1 | {"axes": {"fsdp": 2, "expert": 4}, "kernel": "pallas", "ffn_chunks": 4},
        "CompileTimeScopedVmemOom in the tgmm of the down projection",
    ),
    "phi35_split_mesh": Layer(
        V6E_4X4 | PHI35,
        "jax.make_mesh: Failed to find assignment for logical_axis_index 1 of size 2",
        splits_physical_axes=True,
        # the defect is the mesh's layout on the slice, whatever the widths; the full-width
        # tiles compile in tests/kernels/test_tiling_libtpu.py (49 s -> 10 s)
        built=SMALL,
        structure=_mesh_layout,
    ),
    "qwen2_57b_split_mesh": Layer(
        V6E_4X4 | QWEN2_57B,
        "jax.make_mesh: Failed to find assignment for logical_axis_index 1 of size 2",
        splits_physical_axes=True,
        built=SMALL,
        structure=_mesh_layout,
    ),
}


# The overlapped ring with FFN biases, which the plan-flag rewrite of its template touched: the
# biases are added on a line of their own, to names that are not the lists of every block's
# projections (the first rewrite rebound `gate` and `up` and broke on the second block). Gate
# and up apart (ffn 48), side by side (ffn 128: whole lanes), and no gate (relu).
RING_BIAS = {
    "experts": 8,
    "embed": 64,
    "top_k": 2,
    "ffn_bias": True,
    "batch": 8,
    "seq_len": 8,
    "params_dtype": "float32",
    "compute_dtype": "float32",
    "axes": {"expert": 4},
    "strategy": "ring_of_experts",
    "overlap_chunks": 2,
}
LAYERS |= {
    f"ring_overlap_bias_{name}": Layer(
        RING_BIAS | choices, "the second ring block indexed an array"
    )
    for name, choices in {
        "swiglu": {"ffn": 48},
        "swiglu_side_by_side": {"ffn": 128},
        "relu": {"ffn": 48, "activation": "relu"},
    }.items()
}
