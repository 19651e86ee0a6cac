"""Spec texts, targets and helpers shared by the tests of stage 2, `moegen.validate`."""

from __future__ import annotations

from pathlib import Path

import pytest

from moegen.load import LoadedSpec, load_spec_bytes
from moegen.validate import RULES, check_rules

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
    token_chunks: int | None = None,
    quantization: str | None = None,
    layer: tuple[str, ...] = (),
    variants: str | None = None,
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
    target.quantization at line 21, column 17, in place of the tiles comment too. `layer` adds
    lines to the layer section like `router` does, from line 6 on (every later line moves).
    `variants` (a YAML flow mapping such as "{eval: {batch: 32, seq_len: 8}}") writes
    shapes.variants without moving a line: the shapes section becomes a flow mapping over
    lines 9-11, `shapes: {variants: ...,` at line 9, so the first variant's key is at column
    21; batch and seq_len keep their lines and columns."""
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
        *(f"  {line}" for line in layer),  # 6 on
        "router:",  # 6
        f"  top_k: {top_k}",  # 7, column 10
        f"  renormalize: {'true' if renormalize else 'false'}",  # 8, column 16
        *(f"  {line}" for line in router),  # 9 on
        "shapes:" if variants is None else f"shapes: {{variants: {variants},",  # 9
        f"  batch: {batch}" + ("" if variants is None else ","),  # 10, column 10
        f"  seq_len: {seq}" + ("" if variants is None else "}"),  # 11, column 12
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
    if ffn_chunks is not None or token_chunks is not None:
        lines.append("memory:")  # 26
    if ffn_chunks is not None:
        lines.append(f"  ffn_chunks: {ffn_chunks}")  # 27, column 15
    if token_chunks is not None:
        lines.append(f"  token_chunks: {token_chunks}")  # 27 (28 after ffn_chunks), column 17
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
ROUTING_BIAS_ON_LOGITS = (
    "score_after_top_k chooses experts by their raw logits, before any score exists to add "
    "the balancing bias to; set score_after_top_k: false (the bias is then added to the "
    "softmax probabilities, as ERNIE 4.5 does) or routing_bias: false"
)
NOTHING_BALANCES = (
    "a capacity drops what unbalanced routing sends past it, and nothing here balances the "
    "routing; set router.load_balance_loss (e.g. 0.01) or router.routing_bias: true, "
    "or remove capacity (dropless)"
)


def rule_params(cases: dict[str, list[tuple[dict, list]]]) -> list:
    """pytest params of (rule name, spec overrides, expected diagnostics) for each case."""
    return [
        pytest.param(name, kwargs, expected, id=f"{name}-{i}-{'pass' if not expected else 'fail'}")
        for name, rule_cases in cases.items()
        for i, (kwargs, expected) in enumerate(rule_cases)
    ]


def assert_only_the_rule_fires(name: str, kwargs: dict, expected: list) -> None:
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


def rule_tests(cases: dict[str, list[tuple[dict, list]]]) -> tuple[object, object]:
    """The two tests every subject file runs over its CASES table, assigned at its top level
    as `test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)`."""
    params = rule_params(cases)

    @pytest.mark.parametrize(("name", "kwargs", "expected"), params)
    def test_rule(name: str, kwargs: dict, expected: list) -> None:
        assert found(name, **kwargs) == expected

    @pytest.mark.parametrize(("name", "kwargs", "expected"), params)
    def test_only_the_rule_under_test_fires_in_check_rules(
        name: str, kwargs: dict, expected: list
    ) -> None:
        assert_only_the_rule_fires(name, kwargs, expected)

    return test_rule, test_only_the_rule_under_test_fires_in_check_rules
