"""Stage 2, `moegen.validate`: every cross-field rule, passing and failing, located."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moegen.diagnostics import SpecError
from moegen.load import LoadedSpec, load_spec, load_spec_bytes
from moegen.sizes import divisors, listed
from moegen.validate import MAX_CPU_DEVICES, RULES, check_rules, validate
from moegen.validate.bounds import MAX_EXPERTS

REPO_ROOT = Path(__file__).resolve().parent.parent
RULES_BY_NAME = {rule.__name__: rule for rule in RULES}


def spec_yaml(
    *,
    experts: int = 8,
    embed: int = 64,
    ffn: int = 128,
    top_k: int = 2,
    renormalize: bool = False,
    batch: int = 16,
    seq: int = 32,
    axes: str = "{data: 2, fsdp: 2}",
    batch_axes: str | None = None,
    overlap: int = 1,
    strategy: str | None = None,
    hardware: str = "cpu",
    topology: str | None = None,
    kernel: str = "xla",
    gate_up: str | None = None,
    down: str | None = None,
    compute: str = "bfloat16",
    router: tuple[str, ...] = (),
    dcn_axes: str | None = None,
    expert_over_dcn: bool | None = None,
    slices: int | None = None,
    ffn_chunks: int | None = None,
    quantization: str | None = None,
) -> str:
    """A schema-valid spec with every value on a fixed line (see the column comments).

    `gate_up` / `down` are YAML flow lists such as "[512, 1024, 1024]"; target.tiles is
    written (line 21) when either is given. `strategy` sets parallelism.experts without
    moving a line: the parallelism section becomes a flow mapping over lines 15-16, with
    the strategy at line 15, column 24, and overlap_chunks still at line 16, column 19.

    `router` adds lines to the router section, each indented by 2 (so a key is at column 3)
    and written from line 9 on: a spec that uses them has every line from 9 on moved down
    by their number; lines 1-8 stay where they are.

    `dcn_axes` (a YAML flow mapping such as "{data: 2}") and `expert_over_dcn` set the mesh
    fields of multi-slice targets without moving a line: the mesh section becomes a flow
    mapping over lines 12-13 (or 12-14 with batch_axes), written `mesh: {dcn_axes: ...,
    expert_over_dcn: ...,` at line 12, so the dcn_axes key is at column 8 and its value at
    column 18 (in "{data: 2}", the key data at column 19 and 2 at column 25); axes stays at
    line 13, column 9, and batch_axes at line 14, column 15. `slices` writes target.slices at
    line 21, column 11, in place of the tiles comment (so it cannot go with tiles).
    `ffn_chunks` writes memory.ffn_chunks at line 27, column 15. `quantization` writes
    target.quantization at line 21, column 17, in place of the tiles comment too."""
    tiles = gate_up is not None or down is not None
    assert not (tiles and slices is not None), "slices takes the line of target.tiles"
    mesh_fields = ([f"dcn_axes: {dcn_axes}"] if dcn_axes is not None else []) + (
        [f"expert_over_dcn: {'true' if expert_over_dcn else 'false'}"]
        if expert_over_dcn is not None
        else []
    )
    mesh_flow = bool(mesh_fields)
    mesh_end = "" if not mesh_flow else "}" if batch_axes is None else ","
    lines = [
        "version: 1",  # 1
        "layer:",  # 2
        f"  num_experts: {experts}",  # 3, value at column 16
        f"  embed_dim: {embed}",  # 4, column 14
        f"  ffn_dim: {ffn}",  # 5, column 12
        "router:",  # 6
        f"  top_k: {top_k}",  # 7, column 10
        f"  renormalize: {'true' if renormalize else 'false'}",  # 8, column 16
        *(f"  {line}" for line in router),  # 9 on
        "shapes:",  # 9
        f"  batch: {batch}",  # 10, column 10
        f"  seq_len: {seq}",  # 11, column 12
        "mesh:" if not mesh_flow else "mesh: {" + ", ".join(mesh_fields) + ",",  # 12
        f"  axes: {axes}" + mesh_end,  # 13, column 9
        f"  batch_axes: {batch_axes}" + ("}" if mesh_flow else "")
        if batch_axes is not None
        else "  # batch_axes: default",
        "parallelism:" if strategy is None else f"parallelism: {{experts: {strategy},",  # 15
        f"  overlap_chunks: {overlap}" + ("" if strategy is None else "}"),  # 16, column 19
        "target:",  # 17
        f"  hardware: {hardware}",  # 18, column 13
        f"  topology: {topology}" if topology is not None else "  # topology: none",  # 19, col 13
        f"  kernel: {kernel}",  # 20, column 11
        "  tiles:"
        if tiles
        else f"  slices: {slices}"
        if slices is not None
        else f"  quantization: {quantization}"
        if quantization is not None
        else "  # tiles: none",  # 21, key at column 3 (slices: value at column 11)
        f"    gate_up: {gate_up}" if gate_up is not None else "    # gate_up: auto",  # 22, col 14
        f"    down: {down}" if down is not None else "    # down: auto",  # 23, column 11
        "dtypes:",  # 24
        f"  compute: {compute}",  # 25, column 12
    ]
    if ffn_chunks is not None:
        lines += ["memory:", f"  ffn_chunks: {ffn_chunks}"]  # 26; 27, column 15
    return "\n".join(lines) + "\n"


def loaded_spec(**kwargs) -> LoadedSpec:
    return load_spec_bytes(spec_yaml(**kwargs).encode(), "rule.yaml", "rule")


def found(rule_name: str, **kwargs) -> list[tuple[int, int, str, str]]:
    diagnostics = RULES_BY_NAME[rule_name](loaded_spec(**kwargs))
    assert all(d.file == "rule.yaml" for d in diagnostics)
    return [(d.line, d.column, d.field, d.message) for d in diagnostics]


# Valid slice shapes as the messages list them.
V5E_SLICES = "1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"  # v6e offers the same
V5P_SLICES = (
    "2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, 4x8x8, 8x8x8, 8x8x16, 8x16x16, 16x16x16, 16x16x24"
)
TPU7X_SLICES = "2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, 4x8x8, 8x8x8, 8x8x16"
# Pallas targets matching the default 4-device mesh.
PALLAS_V5E = {"hardware": "tpu-v5e", "topology": "2x2", "kernel": "pallas"}
PALLAS_V6E = {"hardware": "tpu-v6e", "topology": "2x2", "kernel": "pallas"}
# One NVLink node of 8 H100s, fsdp over all of them.
H100_8 = {"hardware": "gpu-h100", "topology": 8, "axes": "{fsdp: 8}"}
TE_OFF_GPU = (
    "kernel te (Transformer Engine) runs on NVIDIA GPU targets only (gpu-a100, gpu-h100, "
    "gpu-h200, gpu-b200), not {target}; use kernel: {other}"
)
# Experts sharded over a 4-device expert axis, chunked overlap possible.
RING = {"axes": "{expert: 4}", "strategy": "ring_of_experts"}
# Two TPU v5e 2x4 slices (8 chips each) joined by the data-center network: 16 devices.
TWO_V5E_SLICES = {"hardware": "tpu-v5e", "topology": "2x4", "slices": 2}
# specs/mixtral_8x7b_2slices_v5e.yaml's mesh: data parallel across the 2 slices, fsdp 2 x
# expert 4 (ragged all-to-all) inside each; 16 devices, batch 16 one sequence each.
MIXTRAL_2SLICES = {
    **TWO_V5E_SLICES,
    "axes": "{data: 2, fsdp: 2, expert: 4}",
    "strategy": "ragged_all_to_all",
    "dcn_axes": "{data: 2}",
}
EXPERT_OVER_DCN = (
    "splitting the expert axis over 2 slices sends every token exchange over the data-center "
    "network, about 10x slower than the links inside a slice; cross slices with data (or "
    "fsdp) instead, or set mesh.expert_over_dcn: true to accept it"
)


def group_limit(groups: int, keep: int) -> tuple[str, ...]:
    """Router lines for group-limited routing, written first: group_limit at line 9, the
    value of groups at line 10, column 13, and of keep at line 11, column 11."""
    return ("group_limit:", f"  groups: {groups}", f"  keep: {keep}")


# DeepSeek-V3's router: 256 experts in 8 groups, the best 4 kept, top-8 sigmoid scores with
# the aux-loss-free bias, renormalised and scaled by 2.5.
DEEPSEEK_V3 = {
    "experts": 256,
    "top_k": 8,
    "renormalize": True,
    "router": (*group_limit(8, 4), "score: sigmoid", "routing_bias: true", "routed_scaling: 2.5"),
}
ROUTING_BIAS_ON_SOFTMAX = (
    "a routing bias balances sigmoid-type scores; with score: softmax the experts compete "
    "inside one softmax and the bias has no defined effect; set score: sigmoid (or "
    "sqrtsoftplus), or routing_bias: false"
)
NOTHING_BALANCES = (
    "a capacity drops what unbalanced routing sends past it, and nothing here balances the "
    "routing; set router.load_balance_loss (e.g. 0.01) or router.routing_bias: true "
    "(sigmoid-type scores), or remove capacity (dropless)"
)

# rule name -> [(spec overrides, expected diagnostics: (line, column, field, message))].
# Each rule has at least one passing case (expected []) and one failing case.
CASES: dict[str, list[tuple[dict, list[tuple[int, int, str, str]]]]] = {
    "top_k_within_experts": [
        ({}, []),
        ({"experts": 8, "top_k": 8}, []),  # boundary: every expert
        (
            {"experts": 8, "top_k": 9},
            [(7, 10, "router.top_k", "must be <= layer.num_experts (8), got 9")],
        ),
        (
            {"experts": 1, "top_k": 2},
            [(7, 10, "router.top_k", "must be <= layer.num_experts (1), got 2")],
        ),
    ],
    "batch_axes_are_mesh_axes": [
        ({}, []),  # default batch axes
        ({"batch_axes": "[fsdp, data]"}, []),  # any order
        ({"batch_axes": "[]"}, []),  # empty is another rule's business
        (
            {"axes": "{data: 2}", "batch_axes": "[data, fsdp]"},
            [(14, 22, "mesh.batch_axes[1]", "'fsdp' is not a mesh axis (mesh.axes: data)")],
        ),
        (
            {"batch_axes": "[data, fsdp, data]"},
            [(14, 28, "mesh.batch_axes[2]", "'data' is listed twice")],
        ),
        (
            {"axes": "{fsdp: 4}", "batch_axes": "[data, data]"},
            [
                (14, 16, "mesh.batch_axes[0]", "'data' is not a mesh axis (mesh.axes: fsdp)"),
                (14, 22, "mesh.batch_axes[1]", "'data' is not a mesh axis (mesh.axes: fsdp)"),
            ],
        ),
    ],
    "data_parallel_axes_shard_batch": [
        ({}, []),
        ({"batch_axes": "[data, fsdp]"}, []),
        ({"axes": "{fsdp: 4}", "batch_axes": "[fsdp]"}, []),
        ({"axes": "{data: 2, expert: 2}", "strategy": "ragged_all_to_all"}, []),
        (
            {"batch_axes": "[data]"},
            [
                (
                    14,
                    15,
                    "mesh.batch_axes",
                    "mesh axes ['fsdp'] must shard the batch too; write ['data', 'fsdp']",
                )
            ],
        ),
        (
            {"batch_axes": "[]"},
            [
                (
                    14,
                    15,
                    "mesh.batch_axes",
                    "mesh axes ['data', 'fsdp'] must shard the batch too; write ['data', 'fsdp']",
                )
            ],
        ),
        # the expert axis shards tokens as well as experts: it is a batch axis too
        (
            {
                "axes": "{data: 2, expert: 2}",
                "strategy": "ragged_all_to_all",
                "batch_axes": "[data]",
            },
            [
                (
                    14,
                    15,
                    "mesh.batch_axes",
                    "mesh axes ['expert'] must shard the batch too; write ['data', 'expert']",
                )
            ],
        ),
    ],
    "batch_divisible_by_batch_axes": [
        ({"batch": 4}, []),  # 4 % (2*2) == 0
        ({"batch": 2, "batch_axes": "[data]"}, []),  # only the listed axes count
        ({"batch": 6, "batch_axes": "[data, data]"}, []),  # a repeated axis counts once
        (
            {"batch": 12, "axes": "{data: 2, fsdp: 4}"},
            [
                (
                    10,
                    10,
                    "shapes.batch",
                    "12 is not divisible by data*fsdp = 8; nearest valid: 8 or 16",
                )
            ],
        ),
        (
            {"batch": 3, "axes": "{data: 2, fsdp: 4}"},
            [(10, 10, "shapes.batch", "3 is not divisible by data*fsdp = 8; nearest valid: 8")],
        ),
        (
            {"batch": 3, "axes": "{data: 2, fsdp: 4}", "batch_axes": "[fsdp]"},
            [(10, 10, "shapes.batch", "3 is not divisible by fsdp = 4; nearest valid: 4")],
        ),
        # the expert axis shards the batch like any other axis
        (
            {"batch": 6, "axes": "{data: 2, expert: 2}", "strategy": "ragged_all_to_all"},
            [
                (
                    10,
                    10,
                    "shapes.batch",
                    "6 is not divisible by data*expert = 4; nearest valid: 4 or 8",
                )
            ],
        ),
    ],
    "embed_divisible_by_fsdp": [
        ({"embed": 63, "axes": "{data: 2}"}, []),  # no fsdp axis: nothing is sharded
        ({"embed": 64, "axes": "{fsdp: 8}"}, []),
        (
            {"embed": 500, "axes": "{fsdp: 8}"},
            [
                (
                    4,
                    14,
                    "layer.embed_dim",
                    (
                        "500 is not divisible by fsdp = 8 (parameters are sharded along "
                        "embed_dim); nearest valid: 496 or 504"
                    ),
                )
            ],
        ),
        (
            {"embed": 3, "axes": "{data: 2, fsdp: 4}"},
            [
                (
                    4,
                    14,
                    "layer.embed_dim",
                    (
                        "3 is not divisible by fsdp = 4 (parameters are sharded along "
                        "embed_dim); nearest valid: 4"
                    ),
                )
            ],
        ),
    ],
    "single_expert_not_renormalized": [
        ({"top_k": 1, "renormalize": False}, []),
        ({"top_k": 2, "renormalize": True}, []),
        (
            {"top_k": 1, "renormalize": True},
            [
                (
                    8,
                    16,
                    "router.renormalize",
                    (
                        "with top_k = 1 the renormalised weight is always 1.0 and the router gets "
                        "zero gradient; set renormalize: false"
                    ),
                )
            ],
        ),
    ],
    "expert_axis_matches_strategy": [
        ({}, []),  # replicated experts, no expert axis
        ({"axes": "{data: 2, expert: 2}", "strategy": "ragged_all_to_all"}, []),
        ({"axes": "{expert: 4}", "strategy": "ring_of_experts"}, []),
        ({"strategy": "replicated"}, []),  # written out, as by default
        # an expert axis with replicated experts (the default): at the axis's key
        (
            {"axes": "{data: 2, expert: 2}"},
            [
                (
                    13,
                    19,
                    "mesh.axes.expert",
                    "an expert axis shards experts, but parallelism.experts is replicated; "
                    "set it to ragged_all_to_all or ring_of_experts",
                )
            ],
        ),
        (
            {"axes": "{expert: 4}", "strategy": "replicated"},
            [
                (
                    13,
                    10,
                    "mesh.axes.expert",
                    "an expert axis shards experts, but parallelism.experts is replicated; "
                    "set it to ragged_all_to_all or ring_of_experts",
                )
            ],
        ),
        # a strategy that moves tokens to experts, with no expert axis to shard them over
        (
            {"strategy": "ragged_all_to_all"},
            [
                (
                    15,
                    24,
                    "parallelism.experts",
                    "ragged_all_to_all shards experts over a mesh axis named expert; "
                    "add one to mesh.axes",
                )
            ],
        ),
        (
            {"axes": "{data: 4}", "strategy": "ring_of_experts"},
            [
                (
                    15,
                    24,
                    "parallelism.experts",
                    "ring_of_experts shards experts over a mesh axis named expert; "
                    "add one to mesh.axes",
                )
            ],
        ),
    ],
    "experts_divisible_by_expert_axis": [
        ({}, []),  # no expert axis
        ({"experts": 6, "axes": "{data: 4}"}, []),  # replicated: any number of experts
        ({"experts": 8, "axes": "{expert: 4}", "strategy": "ragged_all_to_all"}, []),
        ({"experts": 4, "top_k": 1, "axes": "{expert: 4}", "strategy": "ring_of_experts"}, []),
        (
            {"experts": 6, "axes": "{expert: 4}", "strategy": "ragged_all_to_all"},
            [
                (
                    3,
                    16,
                    "layer.num_experts",
                    "6 experts do not split over expert = 4 devices; nearest valid: 4 or 8",
                )
            ],
        ),
        (
            {"experts": 10, "axes": "{data: 1, expert: 4}", "strategy": "ring_of_experts"},
            [
                (
                    3,
                    16,
                    "layer.num_experts",
                    "10 experts do not split over expert = 4 devices; nearest valid: 8 or 12",
                )
            ],
        ),
        # fewer experts than devices: the only valid value is above
        (
            {"experts": 3, "axes": "{expert: 4}", "strategy": "ring_of_experts"},
            [
                (
                    3,
                    16,
                    "layer.num_experts",
                    "3 experts do not split over expert = 4 devices; nearest valid: 4",
                )
            ],
        ),
    ],
    "te_runs_on_nvidia_gpus": [
        ({"kernel": "te", **H100_8}, []),
        ({"kernel": "te", "hardware": "gpu-a100", "topology": 4, "axes": "{fsdp: 4}"}, []),
        ({"hardware": "gpu-h100", "topology": 4, "axes": "{fsdp: 4}"}, []),  # xla on a GPU
        (
            {"kernel": "te"},
            [(20, 11, "target.kernel", TE_OFF_GPU.format(target="cpu", other="xla"))],
        ),
        (
            {"kernel": "te", "hardware": "tpu-v5e", "topology": "2x2", "axes": "{fsdp: 4}"},
            [(20, 11, "target.kernel", TE_OFF_GPU.format(target="tpu-v5e", other="pallas or xla"))],
        ),
    ],
    "quantization_needs_te": [
        ({"quantization": "none"}, []),
        ({"kernel": "te", "quantization": "fp8", **H100_8}, []),
        (
            {"quantization": "fp8", "hardware": "gpu-h100", "topology": 4, "axes": "{fsdp: 4}"},
            [
                (
                    21,
                    17,
                    "target.quantization",
                    "quantization fp8 needs kernel: te (an NVIDIA GPU target); kernel xla "
                    "computes in dtypes.compute: set quantization: none",
                )
            ],
        ),
    ],
    "quantization_fits_the_gpu": [
        ({"kernel": "te", "quantization": "fp8", **H100_8}, []),
        ({"kernel": "te", "quantization": "mxfp8", **H100_8, "hardware": "gpu-b200"}, []),
        ({"kernel": "te", "quantization": "none", **H100_8, "hardware": "gpu-a100"}, []),
        # MXFP8 on Hopper
        (
            {"kernel": "te", "quantization": "mxfp8", **H100_8},
            [
                (
                    21,
                    17,
                    "target.quantization",
                    "mxfp8 needs Blackwell (SM 10.0) or newer; gpu-h100 is SM 9.0: use "
                    "quantization fp8 or none, or target gpu-b200",
                )
            ],
        ),
        # FP8 before Hopper
        (
            {"kernel": "te", "quantization": "fp8", **H100_8, "hardware": "gpu-a100"},
            [
                (
                    21,
                    17,
                    "target.quantization",
                    "fp8 needs Hopper (SM 9.0) or newer; gpu-a100 is SM 8.0: use quantization "
                    "none, or target gpu-h100 or gpu-h200 or gpu-b200",
                )
            ],
        ),
    ],
    "quantized_widths_fit": [
        ({"kernel": "te", "quantization": "fp8", **H100_8}, []),  # 64 and 128
        ({"kernel": "te", "quantization": "fp8", "embed": 48, **H100_8}, []),  # 16 x 3
        (
            {
                "kernel": "te",
                "quantization": "mxfp8",
                "embed": 48,
                **H100_8,
                "hardware": "gpu-b200",
            },
            [
                (
                    4,
                    14,
                    "layer.embed_dim",
                    "embed_dim = 48 is not a multiple of 32, as mxfp8 GEMMs need; "
                    "nearest: 32 or 64",
                )
            ],
        ),
        (
            {"kernel": "te", "quantization": "fp8", "ffn": 136, "embed": 72, **H100_8},
            [
                (
                    4,
                    14,
                    "layer.embed_dim",
                    "embed_dim = 72 is not a multiple of 16, as fp8 GEMMs need; nearest: 64 or 80",
                ),
                (
                    5,
                    12,
                    "layer.ffn_dim",
                    "ffn_dim = 136 is not a multiple of 16, as fp8 GEMMs need; nearest: 128 or 144",
                ),
            ],
        ),
    ],
    "ffn_chunks_fit": [
        ({}, []),  # omitted: the plan decides
        ({"ffn_chunks": 1}, []),
        ({"ffn_chunks": 4}, []),  # 32 columns a slice (xla takes any width)
        ({"ffn_chunks": 2, "ffn": 256, **PALLAS_V5E}, []),  # 128 columns: whole lanes
        (
            {"ffn_chunks": 3},
            [
                (
                    27,
                    15,
                    "memory.ffn_chunks",
                    "ffn_dim 128 does not split into 3 equal slices; "
                    "valid slice counts: 2, 4, 8, 16, 32, 64, or 1",
                )
            ],
        ),
        # a slice is a megablox output (gate, up) and contraction (down) width
        (
            {"ffn_chunks": 2, "ffn": 384, **PALLAS_V5E},
            [
                (
                    27,
                    15,
                    "memory.ffn_chunks",
                    "slices of 192 columns are not whole 128-lane tiles for pallas; "
                    "valid slice counts: 3, or 1",
                )
            ],
        ),
    ],
    "ffn_chunks_without_overlap": [
        ({"ffn_chunks": 2, **RING}, []),
        ({"overlap": 2, "ffn_chunks": 1, **RING}, []),
        (
            {"overlap": 2, "ffn_chunks": 2, **RING},
            [
                (
                    27,
                    15,
                    "memory.ffn_chunks",
                    "ffn_chunks 2 with overlap_chunks 2: the overlapped ring slices the "
                    "embedding, not the FFN width; set ffn_chunks 1 or overlap_chunks 1",
                )
            ],
        ),
    ],
    "overlap_chunks_fit": [
        ({}, []),  # 1 chunk: no overlap
        ({"overlap": 2, **RING}, []),
        ({"overlap": 64, **RING}, []),  # one column a chunk is wasteful, not wrong, for xla
        ({"overlap": 4, "embed": 512, **RING, **PALLAS_V5E}, []),  # 128 columns a chunk
        ({"overlap": 3, "embed": 768, **RING, **PALLAS_V5E}, []),  # 256 columns a chunk
        # only ring_of_experts gathers tokens to overlap
        (
            {"overlap": 2},
            [
                (
                    16,
                    19,
                    "parallelism.overlap_chunks",
                    "2 chunks overlap the token all-gather of ring_of_experts; "
                    "experts: replicated has none to overlap; set 1",
                )
            ],
        ),
        (
            {"overlap": 4, "axes": "{expert: 4}", "strategy": "ragged_all_to_all"},
            [
                (
                    16,
                    19,
                    "parallelism.overlap_chunks",
                    "4 chunks overlap the token all-gather of ring_of_experts; "
                    "experts: ragged_all_to_all has none to overlap; set 1",
                )
            ],
        ),
        # chunks hold equal numbers of columns (MaxText's 7 chunks over 512 drop one)
        (
            {"overlap": 7, "embed": 512, **RING},
            [
                (
                    16,
                    19,
                    "parallelism.overlap_chunks",
                    "embed_dim 512 does not split into 7 equal chunks; "
                    "valid chunk counts: 2, 4, 8, 16, 32, 64, or 1 (no overlap)",
                )
            ],
        ),
        (
            {"overlap": 5, "embed": 96, **RING},
            [
                (
                    16,
                    19,
                    "parallelism.overlap_chunks",
                    "embed_dim 96 does not split into 5 equal chunks; "
                    "valid chunk counts: 2, 3, 4, 6, 8, 12, 16, 24, or 1 (no overlap)",
                )
            ],
        ),
        # pallas: a chunk is a contraction block of whole 128-lane tiles
        (
            {"overlap": 4, "embed": 768, **RING, **PALLAS_V5E},
            [
                (
                    16,
                    19,
                    "parallelism.overlap_chunks",
                    "chunks of 192 columns are not whole 128-lane tiles for the pallas kernel; "
                    "valid chunk counts: 2, 3, 6, or 1 (no overlap)",
                )
            ],
        ),
        (
            {"overlap": 64, "embed": 4096, **RING, **PALLAS_V5E},
            [
                (
                    16,
                    19,
                    "parallelism.overlap_chunks",
                    "chunks of 64 columns are not whole 128-lane tiles for the pallas kernel; "
                    "valid chunk counts: 2, 4, 8, 16, 32, or 1 (no overlap)",
                )
            ],
        ),
    ],
    "indices_fit_int32": [
        ({}, []),
        # per device: (2**18 - 1) * 2 rows of width 4096 = 2**31 - 8192 elements: fits
        ({"embed": 4096, "ffn": 1024, "batch": 1, "seq": 2**18 - 1, "axes": "{data: 1}"}, []),
        (
            {"embed": 4096, "ffn": 1024, "batch": 1, "seq": 2**18, "axes": "{data: 1}"},
            [
                (
                    10,
                    10,
                    "shapes.batch",
                    (
                        "each device routes 524288 rows of width 4096: 2147483648 elements "
                        "overflow int32 indexing (< 2**31); shard the batch over more devices, "
                        "or reduce shapes.batch or shapes.seq_len"
                    ),
                )
            ],
        ),
        # the width is the larger of embed_dim and ffn_dim
        (
            {"embed": 1024, "ffn": 4096, "batch": 2, "seq": 2**18, "axes": "{data: 2}"},
            [
                (
                    10,
                    10,
                    "shapes.batch",
                    (
                        "each device routes 524288 rows of width 4096: 2147483648 elements "
                        "overflow int32 indexing (< 2**31); shard the batch over more devices, "
                        "or reduce shapes.batch or shapes.seq_len"
                    ),
                )
            ],
        ),
        # global token slots: 256 * (2**20 - 1) * 8 < 2**31 fits; 256 * 2**20 * 8 does not
        (
            {
                "embed": 8,
                "ffn": 8,
                "batch": 256,
                "seq": 2**20 - 1,
                "top_k": 8,
                "axes": "{data: 256}",
            },
            [],
        ),
        (
            {"embed": 8, "ffn": 8, "batch": 256, "seq": 2**20, "top_k": 8, "axes": "{data: 256}"},
            [
                (
                    11,
                    12,
                    "shapes.seq_len",
                    "batch*seq_len*top_k = 2147483648 token slots overflow int32 (< 2**31); "
                    "reduce shapes.batch, shapes.seq_len or router.top_k",
                )
            ],
        ),
        (
            {"embed": 4096, "batch": 256, "seq": 2**20, "top_k": 8, "axes": "{data: 2}"},
            [
                (
                    10,
                    10,
                    "shapes.batch",
                    (
                        "each device routes 1073741824 rows of width 4096: 4398046511104 elements "
                        "overflow int32 indexing (< 2**31); shard the batch over more devices, "
                        "or reduce shapes.batch or shapes.seq_len"
                    ),
                ),
                (
                    11,
                    12,
                    "shapes.seq_len",
                    "batch*seq_len*top_k = 2147483648 token slots overflow int32 (< 2**31); "
                    "reduce shapes.batch, shapes.seq_len or router.top_k",
                ),
            ],
        ),
    ],
    "parameters_reasonably_sized": [
        ({}, []),
        ({"experts": 1023, "embed": 2**15, "ffn": 2**15}, []),  # just under 2**40 elements
        (
            {"experts": 1024, "embed": 2**15, "ffn": 2**15},
            [
                (
                    2,
                    1,
                    "layer",
                    (
                        "expert weights of num_experts*embed_dim*ffn_dim = 1099511627776 elements "
                        "(>= 2**40) per projection; check the sizes"
                    ),
                )
            ],
        ),
    ],
    "experts_within_limit": [
        ({}, []),
        ({"experts": 4096}, []),  # boundary: MAX_EXPERTS
        (
            {"experts": 4097},
            [
                (
                    3,
                    16,
                    "layer.num_experts",
                    "4097 experts; at most 4096: the shrunken twin `moegen build` verifies "
                    "keeps every expert, and its dense reference runs every token through each "
                    "of them on CPU (the largest published MoE layers have 2048, Switch-C)",
                )
            ],
        ),
    ],
    "topology_matches_hardware": [
        ({}, []),  # cpu: no topology
        ({"hardware": "tpu-v5e", "topology": "2x2"}, []),  # 4 chips, the 4-device mesh
        ({"hardware": "tpu-v6e", "topology": "2x4", "axes": "{data: 2, fsdp: 4}"}, []),
        ({"hardware": "tpu-v5p", "topology": "2x2x1"}, []),
        ({"hardware": "tpu7x", "topology": "2x2x1", "axes": "{data: 2, fsdp: 4}"}, []),
        (
            {"hardware": "tpu-v5e"},
            [(17, 1, "target", f"tpu-v5e needs target.topology, one of: {V5E_SLICES}")],
        ),
        (
            {"hardware": "tpu7x", "kernel": "pallas"},
            [(17, 1, "target", f"tpu7x needs target.topology, one of: {TPU7X_SLICES}")],
        ),
        (
            {"topology": "2x2"},
            [(19, 13, "target.topology", "target cpu takes no topology; remove it")],
        ),
        (
            {"hardware": "tpu-v5e", "topology": "2x2x1"},  # a v5p shape on a v5e
            [
                (
                    19,
                    13,
                    "target.topology",
                    f"'2x2x1' is not a tpu-v5e slice; valid: {V5E_SLICES}; with 4 devices: 2x2",
                )
            ],
        ),
        (
            {"hardware": "tpu-v5p", "topology": "2x4", "axes": "{data: 2, fsdp: 4}"},
            [
                (
                    19,
                    13,
                    "target.topology",
                    f"'2x4' is not a tpu-v5p slice; valid: {V5P_SLICES}; with 8 devices: 2x2x2",
                )
            ],
        ),
        # tpu7x has two devices per chip: 8 devices are the 4 chips of 2x2x1
        (
            {"hardware": "tpu7x", "topology": "2x2x2", "axes": "{data: 2, fsdp: 4}"},
            [],
        ),
        (
            {"hardware": "tpu7x", "topology": "2x4", "axes": "{data: 2, fsdp: 4}"},
            [
                (
                    19,
                    13,
                    "target.topology",
                    f"'2x4' is not a tpu7x slice; valid: {TPU7X_SLICES}; with 8 devices: 2x2x1",
                )
            ],
        ),
        # libtpu's own spelling is not the spec's; the hint still names the right shape
        (
            {"hardware": "tpu-v6e", "topology": "v6e:2x2"},
            [
                (
                    19,
                    13,
                    "target.topology",
                    f"'v6e:2x2' is not a tpu-v6e slice; valid: {V5E_SLICES}; with 4 devices: 2x2",
                )
            ],
        ),
        # no slice of this generation has 12 devices: no hint
        (
            {"hardware": "tpu-v6e", "topology": "3x4", "batch": 12, "axes": "{data: 12}"},
            [(19, 13, "target.topology", f"'3x4' is not a tpu-v6e slice; valid: {V5E_SLICES}")],
        ),
    ],
    "mesh_matches_topology": [
        ({}, []),  # cpu
        ({"hardware": "tpu-v5e", "topology": "2x2"}, []),
        ({"hardware": "tpu-v5e", "topology": "1x1", "axes": "{data: 1}"}, []),
        ({"hardware": "tpu-v5p", "topology": "2x2x2", "axes": "{data: 2, fsdp: 4}"}, []),
        ({"hardware": "tpu7x", "topology": "2x2x1", "axes": "{data: 2, fsdp: 4}"}, []),
        ({"hardware": "tpu-v5e"}, []),  # no topology: topology_matches_hardware reports it
        ({"hardware": "tpu-v5e", "topology": "2x3"}, []),  # not a slice: likewise
        (
            {"hardware": "tpu-v5e", "topology": "2x4"},
            [
                (
                    13,
                    3,
                    "mesh.axes",
                    "the mesh has 4 devices but tpu-v5e 2x4 has 8; "
                    "make the product of the axis sizes 8",
                )
            ],
        ),
        (
            {"hardware": "tpu-v6e", "topology": "4x4", "axes": "{data: 2, fsdp: 4}"},
            [
                (
                    13,
                    3,
                    "mesh.axes",
                    "the mesh has 8 devices but tpu-v6e 4x4 has 16; "
                    "make the product of the axis sizes 16",
                )
            ],
        ),
        # one mesh position per chip is not enough on tpu7x: JAX sees 2 devices per chip
        (
            {"hardware": "tpu7x", "topology": "2x2x1"},
            [
                (
                    13,
                    3,
                    "mesh.axes",
                    "the mesh has 4 devices but tpu7x 2x2x1 has 8 (2 per chip); "
                    "make the product of the axis sizes 8",
                )
            ],
        ),
        # multi-slice: the mesh spans every slice, chips x slices devices
        (MIXTRAL_2SLICES, []),  # v5e 2x4 x 2 slices: 16 devices
        (
            {**TWO_V5E_SLICES, "slices": 4, "batch": 32, "axes": "{data: 4, fsdp: 8}"}
            | {"dcn_axes": "{data: 4}"},
            [],
        ),
        (
            {"hardware": "tpu7x", "topology": "2x2x1", "slices": 2, "axes": "{data: 2, fsdp: 8}"}
            | {"dcn_axes": "{data: 2}"},
            [],  # 4 chips x 2 devices x 2 slices
        ),
        # one slice's worth of devices for two slices
        (
            {**TWO_V5E_SLICES, "axes": "{data: 2, fsdp: 4}", "dcn_axes": "{data: 2}"},
            [
                (
                    13,
                    3,
                    "mesh.axes",
                    "the mesh has 8 devices but tpu-v5e 2x4 x 2 slices has 16; "
                    "make the product of the axis sizes 16",
                )
            ],
        ),
        (
            {**TWO_V5E_SLICES, "slices": 4, "axes": "{data: 4, fsdp: 4}", "dcn_axes": "{data: 4}"},
            [
                (
                    13,
                    3,
                    "mesh.axes",
                    "the mesh has 16 devices but tpu-v5e 2x4 x 4 slices has 32; "
                    "make the product of the axis sizes 32",
                )
            ],
        ),
        (
            {"hardware": "tpu7x", "topology": "2x2x1", "slices": 2, "axes": "{data: 2, fsdp: 4}"}
            | {"dcn_axes": "{data: 2}"},
            [
                (
                    13,
                    3,
                    "mesh.axes",
                    "the mesh has 8 devices but tpu7x 2x2x1 x 2 slices has 16 (2 per chip); "
                    "make the product of the axis sizes 16",
                )
            ],
        ),
    ],
    "kernel_runs_on_target": [
        ({}, []),  # cpu, xla
        ({"hardware": "tpu-v5e", "topology": "2x2"}, []),  # ragged_dot runs on TPU too
        ({"hardware": "tpu-v5e", "topology": "2x2", "kernel": "pallas"}, []),
        (
            {
                "hardware": "tpu-v5e",
                "topology": "2x2",
                "kernel": "pallas",
                "gate_up": "[512, 1024, 1024]",
            },
            [],
        ),
        (
            {"kernel": "pallas"},
            [
                (
                    20,
                    11,
                    "target.kernel",
                    "kernel pallas (megablox) runs on TPU targets only, not cpu; use kernel: xla",
                )
            ],
        ),
        (
            {"hardware": "tpu-v5e", "topology": "2x2", "down": "[512, 1024, 1024]"},
            [(21, 3, "target.tiles", "tiles apply to kernel pallas only")],
        ),
        (
            {"gate_up": "[512, 1024, 1024]"},  # cpu, xla
            [(21, 3, "target.tiles", "tiles apply to kernel pallas only")],
        ),
    ],
    "pinned_tiles_run": [
        ({}, []),
        # v5e tiles may use 0.75 * 16 = 12 MiB. [512, 1024, 1024] needs exactly that (tgmm
        # step 2*(0.5 + 0.5)Mi*2 + 2*1Mi*2 + 4*1Mi = 12 MiB; gmm 10 MiB). [256, 512, 2048]:
        # m*k = 128 Ki, k*n = 1 Mi, m*n = 512 Ki; gmm 2*1152Ki*2 + 2*512Ki*2 + 4*512Ki =
        # 4.5 + 2 + 2 = 8.5 MiB, tgmm 2*640Ki*2 + 2*1Mi*2 + 4*1Mi = 2.5 + 4 + 4 = 10.5 MiB
        (dict(PALLAS_V5E, gate_up="[512, 1024, 1024]", down="[256, 512, 2048]"), []),
        (dict(PALLAS_V5E, gate_up="[16, 128, 128]"), []),  # the smallest bfloat16 tile
        (dict(PALLAS_V5E, gate_up="[8, 128, 128]", compute="float32"), []),  # float32: 8 rows
        (dict(PALLAS_V5E, gate_up="[8, 128, 127]", kernel="xla"), []),  # kernel_runs_on_target
        # [512, 1024, 2048] bfloat16: m*k = 0.5 Mi, k*n = 2 Mi, m*n = 1 Mi; gmm 2*2.5*2 +
        # 2*1*2 + 4*1 = 18 MiB, tgmm 2*1.5*2 + 2*2*2 + 4*2 = 22 MiB: too much for v5e's usable
        # 12, fine in v6e's 0.75 * 32 = 24
        (dict(PALLAS_V6E, gate_up="[512, 1024, 2048]"), []),
        (
            dict(PALLAS_V5E, gate_up="[8, 128, 128]"),
            [
                (
                    22,
                    14,
                    "target.tiles.gate_up",
                    "row tile 8 must be a multiple of 16 for bfloat16; nearest valid: 16",
                )
            ],
        ),
        (
            dict(PALLAS_V5E, down="[500, 1024, 1024]"),
            [
                (
                    23,
                    11,
                    "target.tiles.down",
                    "row tile 500 must be a multiple of 16 for bfloat16; nearest valid: 496 or 512",
                )
            ],
        ),
        (
            dict(PALLAS_V5E, gate_up="[12, 128, 128]", compute="float32"),
            [
                (
                    22,
                    14,
                    "target.tiles.gate_up",
                    "row tile 12 must be a multiple of 8 for float32; nearest valid: 8 or 16",
                )
            ],
        ),
        (
            dict(PALLAS_V5E, gate_up="[512, 100, 1000]"),
            [
                (
                    22,
                    14,
                    "target.tiles.gate_up",
                    "contraction tile 100 must be a multiple of 128 lanes; nearest valid: 128",
                ),
                (
                    22,
                    14,
                    "target.tiles.gate_up",
                    "output tile 1000 must be a multiple of 128 lanes; nearest valid: 896 or 1024",
                ),
            ],
        ),
        (
            dict(PALLAS_V5E, gate_up="[512, 2048, 2048]"),
            [
                (
                    22,
                    14,
                    "target.tiles.gate_up",
                    "tiles [512, 2048, 2048] need 40.0 MiB of VMEM forward or backward, more "
                    "than the 12 MiB tiles may use; for example [512, 1024, 1024] fits",
                )
            ],
        ),
        # float32 doubles the blocks (the accumulator is float32 anyway): the default tile
        # (12 MiB in bfloat16) needs 20: tgmm 2*1Mi*4 + 2*1Mi*4 + 4*1Mi. Halving the
        # contraction, [512, 512, 1024] needs 12 MiB in both steps (2*0.75Mi*4 + 2*0.5Mi*4 +
        # 4*0.5Mi = 6 + 4 + 2)
        (
            dict(PALLAS_V5E, down="[512, 1024, 1024]", compute="float32"),
            [
                (
                    23,
                    11,
                    "target.tiles.down",
                    "tiles [512, 1024, 1024] need 20.0 MiB of VMEM forward or backward, more "
                    "than the 12 MiB tiles may use; for example [512, 512, 1024] fits",
                )
            ],
        ),
        # every problem of both projections, in order
        (
            dict(PALLAS_V5E, gate_up="[24, 4096, 2050]", down="[16, 128, 256]"),
            [
                (
                    22,
                    14,
                    "target.tiles.gate_up",
                    "row tile 24 must be a multiple of 16 for bfloat16; nearest valid: 16 or 32",
                ),
                (
                    22,
                    14,
                    "target.tiles.gate_up",
                    "output tile 2050 must be a multiple of 128 lanes; nearest valid: 2048 or 2176",
                ),
                (
                    22,
                    14,
                    "target.tiles.gate_up",
                    # m*k = 98304, k*n = 8396800, m*n = 49200; tgmm 2*(98304 + 49200)*2 +
                    # 2*8396800*2 + 4*8396800 = 590016 + 33587200 + 33587200 = 67764416 B
                    # = 64.6 MiB (gmm 34374016 B). Aligned down to [16, 4096, 2048] and
                    # halved k, k, n: [16, 1024, 1024], tgmm 2*32Ki*2 + 2*1Mi*2 + 4*1Mi
                    # = 8.125 MiB
                    "tiles [24, 4096, 2050] need 64.6 MiB of VMEM forward or backward, more "
                    "than the 12 MiB tiles may use; for example [16, 1024, 1024] fits",
                ),
            ],
        ),
    ],
    "routing_bias_needs_sigmoid_scores": [
        ({}, []),
        ({"router": ("score: sigmoid", "routing_bias: true")}, []),
        ({"router": ("score: sqrtsoftplus", "routing_bias: true")}, []),
        ({"router": ("score: softmax", "routing_bias: false")}, []),
        (DEEPSEEK_V3, []),
        # softmax by default: the bias is refused where it is written
        (
            {"router": ("routing_bias: true",)},
            [(9, 17, "router.routing_bias", ROUTING_BIAS_ON_SOFTMAX)],
        ),
        (
            {"router": ("score: softmax", "routing_bias: true")},
            [(10, 17, "router.routing_bias", ROUTING_BIAS_ON_SOFTMAX)],
        ),
    ],
    "score_after_top_k_is_meaningful": [
        ({}, []),
        ({"router": ("score_after_top_k: true",)}, []),  # Mixtral: top-2 softmax over 2 logits
        # gpt-oss: 128 experts, softmax over the top-4 logits
        ({"experts": 128, "top_k": 4, "router": ("score: softmax", "score_after_top_k: true")}, []),
        ({"router": ("score: sigmoid", "score_after_top_k: false")}, []),
        (
            {"router": ("score: sigmoid", "score_after_top_k: true")},
            [
                (
                    10,
                    22,
                    "router.score_after_top_k",
                    "sigmoid scores each expert on its own, so applying it after top-k gives the "
                    "same weights; remove score_after_top_k",
                )
            ],
        ),
        # the score is the whole story: renormalize (fine with sigmoid) is not looked at
        (
            {"renormalize": True, "router": ("score: sqrtsoftplus", "score_after_top_k: true")},
            [
                (
                    10,
                    22,
                    "router.score_after_top_k",
                    "sqrtsoftplus scores each expert on its own, so applying it after top-k "
                    "gives the same weights; remove score_after_top_k",
                )
            ],
        ),
        (
            {"top_k": 1, "router": ("score_after_top_k: true",)},
            [
                (
                    9,
                    22,
                    "router.score_after_top_k",
                    "a softmax over one chosen logit is always 1.0: the router would get zero "
                    "gradient; set score_after_top_k: false (softmax over all experts)",
                )
            ],
        ),
        (
            {"renormalize": True, "router": ("score_after_top_k: true",)},
            [
                (
                    8,
                    16,
                    "router.renormalize",
                    "the softmax over the chosen logits already sums to 1; set renormalize: false",
                )
            ],
        ),
        (
            {"router": (*group_limit(4, 2), "score_after_top_k: true")},
            [
                (
                    9,
                    3,
                    "router.group_limit",
                    "group-limited routing ranks groups by scores over all experts, which "
                    "score_after_top_k does not compute; use score_after_top_k: false with it",
                )
            ],
        ),
        # both problems of a softmax written with what score_after_top_k already does
        (
            {"renormalize": True, "router": (*group_limit(4, 2), "score_after_top_k: true")},
            [
                (
                    8,
                    16,
                    "router.renormalize",
                    "the softmax over the chosen logits already sums to 1; set renormalize: false",
                ),
                (
                    9,
                    3,
                    "router.group_limit",
                    "group-limited routing ranks groups by scores over all experts, which "
                    "score_after_top_k does not compute; use score_after_top_k: false with it",
                ),
            ],
        ),
    ],
    "group_limit_can_pick_top_k": [
        ({}, []),
        (DEEPSEEK_V3, []),
        # DeepSeek-V2: 160 experts in 8 groups of 20, the best 3 kept, top 6
        ({"experts": 160, "top_k": 6, "router": group_limit(8, 3)}, []),
        # boundary: each kept group supplies all its experts (16 in 8 groups of 2, 2 of 4 kept)
        ({"experts": 16, "top_k": 4, "router": group_limit(8, 2)}, []),
        ({"experts": 32, "top_k": 8, "router": group_limit(4, 1)}, []),  # 8 of one group of 8
        ({"experts": 8, "top_k": 2, "router": group_limit(8, 2)}, []),  # groups of one expert
        (
            dict(DEEPSEEK_V3, router=(*group_limit(7, 4), "score: sigmoid")),
            [
                (
                    10,
                    13,
                    "router.group_limit.groups",
                    "256 experts do not split into 7 equal groups; "
                    "valid: 2, 4, 8, 16, 32, 64, 128, 256",
                )
            ],
        ),
        # more groups than experts; and when groups are wrong, keep is not judged
        (
            {"experts": 8, "top_k": 2, "router": group_limit(16, 16)},
            [
                (
                    10,
                    13,
                    "router.group_limit.groups",
                    "8 experts do not split into 16 equal groups; valid: 2, 4, 8",
                )
            ],
        ),
        (
            {"experts": 1, "top_k": 1, "router": group_limit(2, 1)},
            [
                (
                    10,
                    13,
                    "router.group_limit.groups",
                    "1 experts do not split into 2 equal groups; valid: none (one expert)",
                )
            ],
        ),
        (
            dict(DEEPSEEK_V3, router=(*group_limit(8, 3), "score: sigmoid")),
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "top_k = 8 is not a multiple of keep = 3 (a group's score is the sum of its "
                    "top top_k / keep scores); valid keep: 1, 2, 4; or remove group_limit",
                )
            ],
        ),
        (
            dict(DEEPSEEK_V3, router=(*group_limit(8, 8), "score: sigmoid")),
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "keeping 8 of 8 groups limits nothing; valid keep: 1, 2, 4; "
                    "or remove group_limit",
                )
            ],
        ),
        (
            {"experts": 8, "top_k": 2, "router": group_limit(2, 3)},
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "keeping 3 of 2 groups limits nothing; valid keep: 1; or remove group_limit",
                )
            ],
        ),
        # 16 experts in 8 groups of 2: top 8 from 2 kept groups needs 4 from each
        (
            {"experts": 16, "top_k": 8, "router": group_limit(8, 2)},
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "each kept group must supply top_k / keep = 4 experts but holds 2; "
                    "valid keep: 4; or remove group_limit",
                )
            ],
        ),
        (
            {"experts": 32, "top_k": 8, "router": group_limit(8, 1)},
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "each kept group must supply top_k / keep = 8 experts but holds 4; "
                    "valid keep: 2, 4; or remove group_limit",
                )
            ],
        ),
        # 16 experts in 4 groups of 4, top 10: keep 1 or 2 would need 10 or 5 from a group of 4
        (
            {"experts": 16, "top_k": 10, "router": group_limit(4, 2)},
            [
                (
                    11,
                    11,
                    "router.group_limit.keep",
                    "each kept group must supply top_k / keep = 5 experts but holds 4; "
                    "no keep works for top_k = 10 with 4 groups of 4; groups that work: 8, 16; "
                    "or remove group_limit",
                )
            ],
        ),
    ],
    "capacity_has_a_balancer": [
        ({}, []),  # dropless
        ({"router": ("load_balance_loss: 0.01", "capacity: {factor: 1.25}")}, []),
        (
            {
                "router": (
                    "score: sigmoid",
                    "routing_bias: true",
                    "capacity: {factor: 1.0, drop: position}",
                )
            },
            [],
        ),
        ({"router": ("load_balance_loss: 0.0",)}, []),  # no capacity, no balancer: dropless
        (
            {"router": ("capacity: {factor: 1.25}",)},
            [(9, 3, "router.capacity", NOTHING_BALANCES)],
        ),
        # written out as off, and a z-loss (which only keeps logits small) does not balance
        (
            {
                "router": (
                    "capacity: {factor: 2.0, drop: position}",
                    "load_balance_loss: 0",
                    "routing_bias: false",
                    "z_loss: 0.001",
                )
            },
            [(9, 3, "router.capacity", NOTHING_BALANCES)],
        ),
    ],
    "mesh_fits_cpu_target": [
        ({"batch": 256, "axes": f"{{data: {MAX_CPU_DEVICES}}}"}, []),
        ({"batch": 256, "axes": "{data: 16, fsdp: 16}"}, []),
        (
            {"batch": 512, "axes": "{data: 32, fsdp: 16}"},
            [(13, 3, "mesh.axes", "512 devices; target cpu runs at most 256 host devices")],
        ),
        (
            {"batch": 514, "axes": "{data: 257}"},
            [(13, 3, "mesh.axes", "257 devices; target cpu runs at most 256 host devices")],
        ),
    ],
    "slices_need_a_tpu_target": [
        ({}, []),  # one slice, the default
        ({"slices": 1}, []),  # written out
        (MIXTRAL_2SLICES, []),
        (
            {"slices": 2, "dcn_axes": "{data: 2}"},
            [
                (
                    21,
                    11,
                    "target.slices",
                    "cpu has no slices; remove target.slices or pick a TPU target",
                )
            ],
        ),
    ],
    "dcn_axes_split_mesh_axes": [
        ({}, []),  # no dcn_axes
        (MIXTRAL_2SLICES, []),
        ({**MIXTRAL_2SLICES, "dcn_axes": "{data: 2, fsdp: 1}"}, []),  # a part of 1 is in-slice
        # fsdp crosses the slices: 2 of its 4 ways in each slice
        ({**TWO_V5E_SLICES, "axes": "{data: 4, fsdp: 4}", "dcn_axes": "{fsdp: 2}"}, []),
        # data crosses the slices, but the mesh has no data axis: at the key
        (
            {**TWO_V5E_SLICES, "axes": "{fsdp: 16}", "dcn_axes": "{data: 2}"},
            [(12, 19, "mesh.dcn_axes.data", "'data' is not a mesh axis (mesh.axes: fsdp)")],
        ),
        # 3 slices crossed by an fsdp axis of 8: at the value
        (
            {
                "hardware": "tpu-v5e",
                "topology": "2x4",
                "slices": 3,
                "batch": 24,
                "axes": "{data: 3, fsdp: 8}",
                "dcn_axes": "{fsdp: 3}",
            },
            [
                (
                    12,
                    25,
                    "mesh.dcn_axes.fsdp",
                    "fsdp = 8 does not split into 3 slices; valid: 1, 2, 4, 8",
                )
            ],
        ),
        # more slices than the axis has devices
        (
            {
                **TWO_V5E_SLICES,
                "slices": 4,
                "batch": 32,
                "axes": "{data: 2, fsdp: 16}",
                "dcn_axes": "{data: 4}",
            },
            [(12, 25, "mesh.dcn_axes.data", "data = 2 does not split into 4 slices; valid: 1, 2")],
        ),
        # both problems, each where it is written
        (
            {
                **TWO_V5E_SLICES,
                "slices": 6,
                "batch": 48,
                "axes": "{fsdp: 4, expert: 12}",
                "strategy": "ragged_all_to_all",
                "experts": 24,
                "dcn_axes": "{data: 2, fsdp: 3}",
            },
            [
                (
                    12,
                    19,
                    "mesh.dcn_axes.data",
                    "'data' is not a mesh axis (mesh.axes: fsdp, expert)",
                ),
                (
                    12,
                    34,
                    "mesh.dcn_axes.fsdp",
                    "fsdp = 4 does not split into 3 slices; valid: 1, 2, 4",
                ),
            ],
        ),
    ],
    "dcn_axes_span_the_slices": [
        ({}, []),  # one slice, no dcn_axes
        ({"dcn_axes": "{data: 1}"}, []),  # one slice, said explicitly
        (MIXTRAL_2SLICES, []),
        (
            {**TWO_V5E_SLICES, "slices": 4, "batch": 32, "axes": "{data: 4, fsdp: 8}"}
            | {"dcn_axes": "{data: 2, fsdp: 2}"},
            [],  # 2 x 2 = 4 slices
        ),
        # several slices, none of the axes said to cross them: at target.slices
        (
            {**MIXTRAL_2SLICES, "dcn_axes": None},
            [
                (
                    21,
                    11,
                    "target.slices",
                    "2 slices, but mesh.dcn_axes does not say which axes cross them; add e.g. "
                    "dcn_axes: {data: 2} under mesh",
                )
            ],
        ),
        # the product of the parts is not the number of slices: at the dcn_axes key
        (
            {**TWO_V5E_SLICES, "slices": 4, "batch": 32, "axes": "{data: 4, fsdp: 8}"}
            | {"dcn_axes": "{data: 2}"},
            [
                (
                    12,
                    8,
                    "mesh.dcn_axes",
                    "the cross-slice parts multiply to 2 but target.slices is 4; make them equal",
                )
            ],
        ),
        (
            {**TWO_V5E_SLICES, "axes": "{data: 4, fsdp: 4}", "dcn_axes": "{data: 2, fsdp: 2}"},
            [
                (
                    12,
                    8,
                    "mesh.dcn_axes",
                    "the cross-slice parts multiply to 4 but target.slices is 2; make them equal",
                )
            ],
        ),
        # dcn_axes on a one-slice target (slices left at its default 1)
        (
            {"hardware": "tpu-v5e", "topology": "2x4", "axes": "{data: 2, fsdp: 4}"}
            | {"dcn_axes": "{data: 2}"},
            [
                (
                    12,
                    8,
                    "mesh.dcn_axes",
                    "the cross-slice parts multiply to 2 but target.slices is 1; make them equal",
                )
            ],
        ),
    ],
    "expert_axis_stays_in_a_slice": [
        ({}, []),
        (MIXTRAL_2SLICES, []),  # data crosses the slices, experts stay in each
        ({**MIXTRAL_2SLICES, "dcn_axes": "{data: 2, expert: 1}"}, []),  # explicitly in-slice
        ({**MIXTRAL_2SLICES, "dcn_axes": "{expert: 2}", "expert_over_dcn": True}, []),  # accepted
        (
            {**MIXTRAL_2SLICES, "dcn_axes": "{expert: 2}", "strategy": "ring_of_experts"}
            | {"expert_over_dcn": True},
            [],
        ),
        # the expert axis crosses the slices: at the part
        (
            {**MIXTRAL_2SLICES, "dcn_axes": "{expert: 2}"},
            [(12, 27, "mesh.dcn_axes.expert", EXPERT_OVER_DCN)],
        ),
        (
            {**MIXTRAL_2SLICES, "dcn_axes": "{expert: 2}", "expert_over_dcn": False},
            [(12, 27, "mesh.dcn_axes.expert", EXPERT_OVER_DCN)],
        ),
        (
            {
                **TWO_V5E_SLICES,
                "slices": 4,
                "batch": 32,
                "axes": "{data: 2, fsdp: 2, expert: 8}",
                "strategy": "ragged_all_to_all",
                "dcn_axes": "{data: 2, expert: 2}",
            },
            [(12, 36, "mesh.dcn_axes.expert", EXPERT_OVER_DCN)],
        ),
    ],
}

RULE_CASES = [
    pytest.param(name, kwargs, expected, id=f"{name}-{i}-{'pass' if not expected else 'fail'}")
    for name, cases in CASES.items()
    for i, (kwargs, expected) in enumerate(cases)
]


def test_every_rule_has_cases() -> None:
    assert sorted(CASES) == sorted(RULES_BY_NAME), "add CASES for every rule in RULES"
    assert len(RULES_BY_NAME) == len(RULES), "two rules share a name"
    for name, cases in CASES.items():
        assert any(not expected for _, expected in cases), f"{name}: no passing case"
        assert any(expected for _, expected in cases), f"{name}: no failing case"


def test_every_rule_is_documented() -> None:
    for rule in RULES:
        assert rule.__doc__ and rule.__doc__.strip(), rule.__name__


@pytest.mark.parametrize(("name", "kwargs", "expected"), RULE_CASES)
def test_rule(name: str, kwargs: dict, expected: list) -> None:
    assert found(name, **kwargs) == expected


@pytest.mark.parametrize(("name", "kwargs", "expected"), RULE_CASES)
def test_only_the_rule_under_test_fires_in_check_rules(name: str, kwargs: dict, expected) -> None:
    """The failing cases are minimal: check_rules reports exactly this rule's diagnostics,
    except where a case needs a second, related rule to fire too."""
    loaded = loaded_spec(**kwargs)
    others = [d for rule in RULES if rule.__name__ != name for d in rule(loaded)]
    everything = check_rules(loaded)
    assert len(everything) == len(expected) + len(others)
    if not expected:
        return
    related = {
        ("batch_axes_are_mesh_axes", "data_parallel_axes_shard_batch"),
        ("data_parallel_axes_shard_batch", "batch_divisible_by_batch_axes"),
    }
    for d in others:
        fired = next(r.__name__ for r in RULES if d in r(loaded))
        assert (name, fired) in related or (fired, name) in related, (name, d)


def test_check_rules_reports_several_violations_at_once() -> None:
    loaded = loaded_spec(
        experts=4,
        top_k=1,
        renormalize=True,
        embed=66,
        batch=6,
        axes="{data: 2, fsdp: 4}",
        batch_axes="[data, fsdp, data]",
        overlap=3,
    )
    diagnostics = check_rules(loaded)
    assert sorted((d.line, d.column, d.field) for d in diagnostics) == [
        (4, 14, "layer.embed_dim"),
        (8, 16, "router.renormalize"),
        (10, 10, "shapes.batch"),
        (14, 28, "mesh.batch_axes[2]"),
        (16, 19, "parallelism.overlap_chunks"),
    ]
    with pytest.raises(SpecError) as info:
        validate(loaded)
    # SpecError keeps every diagnostic, in file order.
    assert info.value.diagnostics == sorted(
        diagnostics, key=lambda d: (d.file, d.line, d.column, d.field)
    )
    assert str(info.value).splitlines() == [d.text() for d in info.value.diagnostics]


def test_validate_returns_a_valid_spec_unchanged() -> None:
    loaded = loaded_spec()
    assert check_rules(loaded) == []
    assert validate(loaded) is loaded


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "specs").glob("*.yaml")), ids=lambda p: p.stem)
def test_example_specs_pass_every_rule(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    loaded = load_spec(path.relative_to(REPO_ROOT))
    assert check_rules(loaded) == []


def test_tpu_rules_report_together() -> None:
    """A TPU spec with every target field wrong: each problem once, where it is written."""
    loaded = loaded_spec(
        hardware="tpu-v5e",
        topology="2x2x1",
        kernel="pallas",
        gate_up="[8, 1024, 1024]",
        down="[512, 1000, 1024]",
    )
    assert [(d.line, d.column, d.field) for d in check_rules(loaded)] == [
        (19, 13, "target.topology"),
        (22, 14, "target.tiles.gate_up"),
        (23, 11, "target.tiles.down"),
    ]


def test_example_tpu_spec_needs_its_topology() -> None:
    """The v5e example without its topology line is refused at the target key."""
    text = (REPO_ROOT / "specs" / "mixtral_8x7b_v5e.yaml").read_text(encoding="utf-8")
    assert "  topology: 2x4\n" in text
    loaded = load_spec_bytes(text.replace("  topology: 2x4\n", "").encode(), "v5e.yaml", "v5e")
    [diagnostic] = check_rules(loaded)
    assert diagnostic.field == "target"
    assert diagnostic.message.startswith("tpu-v5e needs target.topology, one of: ")


def test_pallas_on_cpu_with_tiles_reports_only_the_kernel() -> None:
    loaded = loaded_spec(kernel="pallas", gate_up="[512, 1024, 1024]")
    assert [(d.field, d.message) for d in check_rules(loaded)] == [
        (
            "target.kernel",
            "kernel pallas (megablox) runs on TPU targets only, not cpu; use kernel: xla",
        )
    ]


@pytest.mark.parametrize(
    ("tile", "gmm_mib", "tgmm_mib"),
    [
        # tiles whose forward (gmm) step fits v5e's usable 12 MiB, and whose weight-gradient
        # (tgmm) step does not. [16, 1024, 2048]: m*k = 16 Ki, k*n = 2 Mi, m*n = 32 Ki;
        # gmm 2*(16Ki + 2Mi)*2 + 2*32Ki*2 + 4*32Ki = 8.0625 + 0.125 + 0.125 = 8.3125 MiB,
        # tgmm 2*(16 + 32)Ki*2 + 2*2Mi*2 + 4*2Mi = 0.1875 + 8 + 8 = 16.1875 MiB
        ("[16, 1024, 2048]", 8.3125, 16.1875),
        # [128, 1024, 1536]: m*k = 128 Ki, k*n = 1.5 Mi, m*n = 192 Ki; gmm 2*1.625*2 +
        # 2*0.1875*2 + 4*0.1875 = 6.5 + 0.75 + 0.75 = 8 MiB, tgmm 2*0.3125*2 + 2*1.5*2 +
        # 4*1.5 = 1.25 + 6 + 6 = 13.25 MiB
        ("[128, 1024, 1536]", 8, 13.25),
        # [64, 2048, 1024]: m*k = 128 Ki, k*n = 2 Mi, m*n = 64 Ki; gmm 2*2.125*2 + 2*(1/16)*2
        # + 4/16 = 8.5 + 0.25 + 0.25 = 9 MiB, tgmm 2*(3/16)*2 + 2*2*2 + 4*2 = 0.75 + 8 + 8
        # = 16.75 MiB
        ("[64, 2048, 1024]", 9, 16.75),
    ],
)
def test_pinned_tile_whose_weight_gradient_overflows_vmem_is_refused(
    tile: str, gmm_mib: float, tgmm_mib: float
) -> None:
    from moegen.tiling import Tile, vmem_bytes

    m, k, n = (int(v) for v in tile.strip("[]").split(", "))
    b = 2  # bfloat16
    assert 2 * (m * k + k * n) * b + 2 * m * n * b + 4 * m * n == gmm_mib * 2**20 <= 12 * 2**20
    assert 2 * (k * m + m * n) * b + 2 * k * n * b + 4 * k * n == tgmm_mib * 2**20 > 12 * 2**20
    assert vmem_bytes(Tile(m, k, n), "bfloat16") == tgmm_mib * 2**20
    loaded = loaded_spec(**PALLAS_V5E, gate_up=tile)
    [problem] = [d for d in check_rules(loaded) if d.field == "target.tiles.gate_up"]
    assert problem.message.startswith(
        f"tiles {tile} need {tgmm_mib:.1f} MiB of VMEM forward or backward, more than the "
        "12 MiB tiles may use; for example "
    )


@pytest.mark.parametrize(
    ("tile", "compute"),
    [
        ("[512, 2048, 2048]", "bfloat16"),
        ("[512, 1024, 1024]", "float32"),
        ("[24, 4096, 2050]", "bfloat16"),
        ("[512, 1024, 1152]", "bfloat16"),  # 13.25 MiB: refused only by the headroom
        ("[16, 1024, 2048]", "bfloat16"),
        ("[1024, 1024, 1024]", "bfloat16"),
        ("[8, 4096, 4096]", "float32"),
    ],
)
@pytest.mark.parametrize("target", [PALLAS_V5E, PALLAS_V6E], ids=["v5e", "v6e"])
def test_vmem_advice_followed_once_fits(tile: str, compute: str, target: dict) -> None:
    """The tile the VMEM message names passes every tile check when pinned instead."""
    loaded = loaded_spec(**target, gate_up=tile, compute=compute)
    messages = [d.message for d in check_rules(loaded) if "VMEM" in d.message]
    if target is PALLAS_V6E and not messages:
        return  # fits v6e's usable 24 MiB
    [message] = messages
    assert message.endswith(" fits")
    suggested = message.rsplit("; for example ", 1)[1].removesuffix(" fits")
    assert check_rules(loaded_spec(**target, gate_up=suggested, compute=compute)) == []


@pytest.mark.parametrize(
    ("chunks", "embed", "target"),
    [
        pytest.param(7, 512, {}, id="xla-uneven"),
        pytest.param(5, 96, {}, id="xla-uneven-small"),
        pytest.param(4, 768, PALLAS_V5E, id="pallas-unaligned"),
        pytest.param(64, 4096, PALLAS_V5E, id="pallas-unaligned-many"),
        pytest.param(3, 4096, PALLAS_V5E, id="pallas-uneven"),
        pytest.param(5, 768, PALLAS_V5E, id="pallas-uneven-768"),
    ],
)
def test_overlap_chunk_advice_followed_passes(chunks: int, embed: int, target: dict) -> None:
    """Every chunk count the overlap message lists passes every rule when written instead."""
    loaded = loaded_spec(overlap=chunks, embed=embed, **RING, **target)
    [message] = [d.message for d in check_rules(loaded)]
    listed = re.findall(r"\d+", message.rsplit("valid chunk counts: ", 1)[1])
    assert "1" in listed  # no overlap is always a way out
    for count in listed:
        again = loaded_spec(overlap=int(count), embed=embed, **RING, **target)
        assert check_rules(again) == [], (count, message)


@pytest.mark.parametrize(
    ("chunks", "embed", "target"),
    [
        pytest.param(2, 67, {}, id="xla-prime-embed"),
        pytest.param(4, 96, PALLAS_V5E, id="pallas-narrow-embed"),
    ],
)
def test_overlap_chunks_with_no_valid_count_offers_one(
    chunks: int, embed: int, target: dict
) -> None:
    loaded = loaded_spec(overlap=chunks, embed=embed, **RING, **target)
    [message] = [d.message for d in check_rules(loaded)]
    assert "none" not in message
    assert re.search(r"\b1\b", message), message


def _keep_message(experts: int, top_k: int, groups: int, keep: int) -> str:
    loaded = loaded_spec(experts=experts, top_k=top_k, router=group_limit(groups, keep))
    [diagnostic] = check_rules(loaded)
    assert diagnostic.field == "router.group_limit.keep", diagnostic
    return diagnostic.message


def _listed_keeps(message: str) -> list[int]:
    """The values of "...; valid keep: a, b; or remove group_limit"."""
    match = re.search(r"; valid keep: (\d+(?:, \d+)*); or remove group_limit$", message)
    assert match, message
    return [int(value) for value in match.group(1).split(", ")]


def _assert_listed_keeps_are_exactly_the_passing_ones(
    experts: int, top_k: int, groups: int, message: str
) -> None:
    listed = _listed_keeps(message)
    for value in range(1, groups + 2):
        again = loaded_spec(experts=experts, top_k=top_k, router=group_limit(groups, value))
        if value in listed:  # every keep the message calls valid passes every rule
            assert check_rules(again) == [], (value, message)
        else:  # and it leaves none out
            assert check_rules(again) != [], (value, message)


@pytest.mark.parametrize(
    ("experts", "top_k", "groups", "keep"),
    [
        pytest.param(256, 8, 8, 3, id="deepseek-v3-keep-3"),
        pytest.param(160, 6, 8, 4, id="deepseek-v2-keep-4"),
        # 16 experts in 8 groups of 2: keep 1 or 2 would need 6 or 3 experts from a group of 2
        pytest.param(16, 6, 8, 4, id="small-groups"),
        pytest.param(256, 8, 8, 8, id="keeps-every-group"),
    ],
)
def test_group_keep_advice_followed_passes(experts: int, top_k: int, groups: int, keep: int):
    message = _keep_message(experts, top_k, groups, keep)
    _assert_listed_keeps_are_exactly_the_passing_ones(experts, top_k, groups, message)


@pytest.mark.parametrize(
    ("experts", "top_k", "groups", "keep", "listed"),
    [
        pytest.param(16, 8, 8, 2, [4], id="16-experts-top-8"),
        pytest.param(32, 8, 8, 1, [2, 4], id="32-experts-top-8"),
    ],
)
def test_group_keep_too_few_groups_advice_followed_passes(
    experts: int, top_k: int, groups: int, keep: int, listed: list[int]
) -> None:
    message = _keep_message(experts, top_k, groups, keep)
    assert _listed_keeps(message) == listed, message
    _assert_listed_keeps_are_exactly_the_passing_ones(experts, top_k, groups, message)


def test_group_keep_says_when_no_keep_works() -> None:
    # 16 experts in 4 groups of 4, top 10: no keep below 4 divides 10 and supplies <= 4 a group
    message = _keep_message(16, 10, 4, 2)
    assert "valid keep:" not in message, message
    assert message.endswith(
        "; no keep works for top_k = 10 with 4 groups of 4; groups that work: 8, 16; "
        "or remove group_limit"
    ), message
    for keep in range(1, 6):  # and indeed none does
        again = loaded_spec(experts=16, top_k=10, router=group_limit(4, keep))
        assert check_rules(again) != [], keep


def test_group_counts_named_when_no_keep_works_do_work() -> None:
    message = _keep_message(16, 10, 4, 2)
    named = [int(g) for g in message.split("groups that work: ")[1].split(";")[0].split(", ")]
    assert named == [8, 16]
    for groups in named:
        keeps = [
            keep
            for keep in range(1, groups)
            if check_rules(loaded_spec(experts=16, top_k=10, router=group_limit(groups, keep)))
            == []
        ]
        assert keeps, groups


@pytest.mark.parametrize(
    "router",
    [
        ("capacity:", "  factor: 1.25"),
        ("capacity: {factor: 1.25}",),
        (*group_limit(4, 2), "score_after_top_k: true"),
    ],
    ids=["capacity-block", "capacity-flow", "group_limit-block"],
)
def test_mapping_valued_router_fields_are_reported_at_their_key(router: tuple[str, ...]) -> None:
    [diagnostic] = check_rules(loaded_spec(router=router))
    assert (diagnostic.line, diagnostic.column) == (9, 3), diagnostic


def _with_shared_expert(width: int, **kwargs) -> LoadedSpec:
    """spec_yaml with layer.shared_ffn_dim written after ffn_dim (line 6: later lines move)."""
    text = spec_yaml(**kwargs)
    ffn_line = f"  ffn_dim: {kwargs.get('ffn', 128)}\n"
    assert ffn_line in text
    text = text.replace(ffn_line, f"{ffn_line}  shared_ffn_dim: {width}\n")
    return load_spec_bytes(text.encode(), "rule.yaml", "rule")


def test_shared_expert_width_counts_for_int32_indexing() -> None:
    # 2**18 tokens a device, top-2: 2**19 routed rows of width 1024 fit (2**29 elements);
    # the shared expert runs once per token, not per routed copy: its 2**18 rows of width 8191
    # fit (2**31 - 2**18 elements), though 2**19 rows of that width would not
    shape = {"embed": 1024, "ffn": 1024, "batch": 2, "seq": 2**18, "axes": "{data: 2}"}
    assert check_rules(_with_shared_expert(8191, **shape)) == []
    # 2**18 rows of width 2**13 are 2**31 elements alone: reported at the shared width
    found = [
        (d.line, d.column, d.field, d.message)
        for d in check_rules(_with_shared_expert(8192, **shape))
    ]
    assert found == [
        (
            6,
            19,
            "layer.shared_ffn_dim",
            "the shared expert's hidden activations on each device hold 262144 x 8192 = "
            "2147483648 elements, overflowing int32 indexing (< 2**31); shard the batch over "
            "more devices, or reduce shapes.batch or shapes.seq_len",
        )
    ]
    # a narrow shared expert changes nothing
    assert check_rules(_with_shared_expert(512, **shape)) == []


def test_shared_expert_is_not_counted_per_routed_copy() -> None:
    loaded = _with_shared_expert(4096, embed=1024, ffn=1024, batch=2, seq=2**18, axes="{data: 2}")
    assert check_rules(loaded) == []


def test_example_multi_slice_spec_without_its_slices_is_refused() -> None:
    """specs/mixtral_8x7b_2slices_v5e.yaml spans 16 devices: one 2x4 slice has 8."""
    text = (REPO_ROOT / "specs" / "mixtral_8x7b_2slices_v5e.yaml").read_text(encoding="utf-8")
    assert "  slices: 2\n" in text
    loaded = load_spec_bytes(text.replace("  slices: 2\n", "").encode(), "2s.yaml", "two")
    assert [(d.field, d.message) for d in check_rules(loaded)] == [
        (
            "mesh.axes",
            "the mesh has 16 devices but tpu-v5e 2x4 has 8; make the product of the axis sizes 8",
        ),
        (
            "mesh.dcn_axes",
            "the cross-slice parts multiply to 2 but target.slices is 1; make them equal",
        ),
    ]


def test_dcn_axes_advice_followed_passes() -> None:
    """Several slices and no dcn_axes: the dcn_axes the message suggests pass every rule."""
    loaded = loaded_spec(**{**MIXTRAL_2SLICES, "dcn_axes": None})
    [diagnostic] = check_rules(loaded)
    suggested = re.search(r"dcn_axes: (\{.*\}) under mesh", diagnostic.message)
    assert suggested, diagnostic.message
    assert check_rules(loaded_spec(**{**MIXTRAL_2SLICES, "dcn_axes": suggested.group(1)})) == []


def test_topology_hint_counts_the_devices_of_one_slice() -> None:
    kwargs = {**TWO_V5E_SLICES, "axes": "{data: 2, fsdp: 8}", "dcn_axes": "{data: 2}"}
    [diagnostic] = check_rules(loaded_spec(**{**kwargs, "topology": "2x2x1"}))
    hint = diagnostic.message.rsplit(": ", 1)[1]
    assert check_rules(loaded_spec(**{**kwargs, "topology": hint})) == [], diagnostic.message


def test_dcn_axis_missing_from_the_mesh_is_reported_once() -> None:
    loaded = loaded_spec(**TWO_V5E_SLICES, axes="{data: 2, fsdp: 8}", dcn_axes="{expert: 2}")
    assert [(d.field, d.message) for d in check_rules(loaded)] == [
        ("mesh.dcn_axes.expert", "'expert' is not a mesh axis (mesh.axes: data, fsdp)")
    ]


def test_slices_on_cpu_get_one_fix() -> None:
    assert [(d.field, d.message) for d in check_rules(loaded_spec(slices=2))] == [
        ("target.slices", "cpu has no slices; remove target.slices or pick a TPU target")
    ]


# ---------------------------------------------------------------------------------------
# Sizes as large as the schema allows (< 2**31): every rule finishes at once (divisors are
# enumerated by pairs up to the square root, never by a scan up to the value) and says what
# is wrong where, listing at most MAX_LISTED valid values.

INT32_MAX = 2**31 - 1
HIGHLY_COMPOSITE = 735134400  # 1344 divisors


def _fired(loaded: LoadedSpec, field: str) -> list[tuple[int, int, str]]:
    return [(d.line, d.column, d.message) for d in check_rules(loaded) if d.field == field]


def _listed_values(message: str, after: str) -> tuple[list[int], int | None]:
    """The values listed after `after`, and how many there are when the list is cut short."""
    match = re.search(
        re.escape(after) + r"(\d+(?:, \d+)*)(?: \(the \d+ nearest \d+ of (\d+)\))?", message
    )
    assert match, message
    total = int(match.group(2)) if match.group(2) else None
    return [int(v) for v in match.group(1).split(", ")], total


def test_prime_expert_count_at_the_schema_limit_splits_into_no_groups() -> None:
    loaded = loaded_spec(experts=INT32_MAX, router=group_limit(2, 1))
    assert _fired(loaded, "router.group_limit.groups") == [
        (10, 13, "2147483647 experts do not split into 2 equal groups; valid: 2147483647")
    ]
    [(line, column, message)] = _fired(loaded, "layer.num_experts")
    assert (line, column) == (3, 16) and message.startswith("2147483647 experts; at most 4096")


def test_group_count_at_the_schema_limit_lists_its_keeps() -> None:
    loaded = loaded_spec(experts=2**30, router=group_limit(2**30, 3))
    assert _fired(loaded, "router.group_limit.keep") == [
        (
            11,
            11,
            "top_k = 2 is not a multiple of keep = 3 (a group's score is the sum of its top "
            "top_k / keep scores); valid keep: 2; or remove group_limit",
        )
    ]


def test_no_keep_works_lists_the_group_counts_that_do_nearest_the_one_written() -> None:
    top_k = 720720000  # more than the 367567200 experts of each of 2 groups: keep 1 fails
    loaded = loaded_spec(experts=HIGHLY_COMPOSITE, top_k=top_k, router=group_limit(2, 1))
    [(line, column, message)] = _fired(loaded, "router.group_limit.keep")
    assert (line, column) == (11, 11)
    assert "no keep works for top_k = 720720000 with 2 groups of 367567200" in message
    groups, total = _listed_values(message, "groups that work: ")
    assert len(groups) == 8 and total is not None and total > 8, message
    assert groups == sorted(groups) and all(HIGHLY_COMPOSITE % g == 0 for g in groups)
    keeps = divisors(top_k)
    for count in groups:  # each listed group count has a keep that passes the rule
        passing = [
            keep
            for keep in keeps
            if keep < count
            and not found(
                "group_limit_can_pick_top_k",
                experts=HIGHLY_COMPOSITE,
                top_k=top_k,
                router=group_limit(count, keep),
            )
        ]
        assert passing, count


def test_axis_at_the_schema_limit_over_slices() -> None:
    loaded = loaded_spec(**TWO_V5E_SLICES, axes=f"{{data: {INT32_MAX}}}", dcn_axes="{data: 2}")
    assert _fired(loaded, "mesh.dcn_axes.data") == [
        (12, 25, "data = 2147483647 does not split into 2 slices; valid: 1, 2147483647")
    ]
    assert _fired(loaded, "mesh.axes")  # and the mesh is far larger than the slices


def test_axis_with_many_divisors_lists_those_nearest_the_slices_written() -> None:
    axes = f"{{data: {HIGHLY_COMPOSITE}}}"
    loaded = loaded_spec(**TWO_V5E_SLICES, axes=axes, dcn_axes="{data: 19}")
    [(line, column, message)] = _fired(loaded, "mesh.dcn_axes.data")
    assert (line, column) == (12, 25)
    values, total = _listed_values(message, "valid: ")
    assert values == [14, 15, 16, 17, 18, 20, 21, 22] and total == 1344, message


def test_every_example_expert_count_is_within_the_limit() -> None:
    for path in sorted((REPO_ROOT / "specs").glob("*.yaml")):
        loaded = load_spec_bytes(path.read_bytes(), path.name, path.stem)
        assert loaded.spec.layer.num_experts <= MAX_EXPERTS, path.name


def test_expert_count_past_the_limit_is_exit_3_located(tmp_path: Path, run_moegen) -> None:
    spec = tmp_path / "many.yaml"
    spec.write_text(spec_yaml(experts=INT32_MAX, router=group_limit(2, 1)))
    result = run_moegen("build", "--no-verify", "--out", tmp_path / "out", spec, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    output = result.stdout + result.stderr
    assert "many.yaml:3:16: layer.num_experts: 2147483647 experts; at most 4096" in output
    assert "many.yaml:10:13: router.group_limit.groups:" in output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_divisors_and_listed() -> None:
    assert divisors(1) == [1] and divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert divisors(INT32_MAX) == [1, INT32_MAX]
    assert len(divisors(HIGHLY_COMPOSITE)) == 1344
    assert listed([2, 4, 8], 3) == "2, 4, 8"
    assert (
        listed(list(range(1, 101)), 50)
        == "46, 47, 48, 49, 50, 51, 52, 53 (the 8 nearest 50 of 100)"
    )
