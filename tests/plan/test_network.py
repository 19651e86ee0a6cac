"""`moegen.plan.network`: per-device communication split into the links inside a slice (ICI)
and the data-center network between slices (DCN), checked by hand on small collectives and
on the two-slice example, plus what `moegen plan` prints of it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from moegen.load import load_spec_bytes
from moegen.pipeline import load_valid
from moegen.plan import NetworkPlan, Plan, Transfer, format_plan, make_plan
from moegen.plan.network import split
from moegen.validate import validate

REPO_ROOT = Path(__file__).resolve().parents[2]
TWO_SLICES = "specs/mixtral_8x7b_2slices_v5e.yaml"
ONE_SLICE = "specs/mixtral_8x7b_v5e.yaml"

# ---------------------------------------------------------------------------------------
# split: one collective over an axis of `ici` in-slice x `dcn` cross-slice devices


@pytest.mark.parametrize(
    ("total", "kind", "ici", "dcn", "expected"),
    [
        # axis 8 = 4 in a slice x 2 across. A gather-type collective receives 7 shares of
        # 100: the one of the other slice over DCN, then 3 x 2 = 6 inside the slice.
        pytest.param(700, "gather", 4, 2, (600, 100), id="gather-4x2"),
        # all-to-all: 100 from each of 7 peers, 4 of them in the other slice
        pytest.param(700, "all-to-all", 4, 2, (300, 400), id="all-to-all-4x2"),
        # one device: nothing to exchange
        pytest.param(700, "gather", 1, 1, (0, 0), id="gather-single-device"),
        pytest.param(700, "all-to-all", 1, 1, (0, 0), id="all-to-all-single-device"),
        pytest.param(0, "gather", 4, 2, (0, 0), id="nothing-to-send"),
        # the whole axis inside a slice: all ICI
        pytest.param(700, "gather", 8, 1, (700, 0), id="gather-in-slice"),
        pytest.param(700, "all-to-all", 8, 1, (700, 0), id="all-to-all-in-slice"),
        # the whole axis across slices (data: 2 over 2 slices): all DCN
        pytest.param(700, "gather", 1, 8, (0, 700), id="gather-across"),
        pytest.param(700, "all-to-all", 1, 8, (0, 700), id="all-to-all-across"),
        # an all-reduce of S = 4096 B over 2 x 2: reduce-scatter and all-gather in the slice,
        # 2 * S * (2 - 1) / 2 = 4096 ICI; all-reduce of the S / 2 shard across, 2 * 2048 *
        # (2 - 1) / 2 = 2048 DCN; together 2 * S * 3 / 4 = 6144
        pytest.param(6144, "gather", 2, 2, (4096, 2048), id="all-reduce-2x2"),
        # all-to-all over 2 in a slice x 8 slices: 100 from each of 15 peers, 14 elsewhere
        pytest.param(1500, "all-to-all", 2, 8, (100, 1400), id="all-to-all-2x8"),
    ],
)
def test_split_by_hand(total: int, kind: str, ici: int, dcn: int, expected: tuple) -> None:
    assert split(total, kind, ici, dcn) == expected


SHAPES = [(i, d) for i, d in itertools.product([1, 2, 4, 8], [1, 2, 4]) if i * d > 1]


@pytest.mark.parametrize(("ici", "dcn"), SHAPES, ids=[f"{i}x{d}" for i, d in SHAPES])
def test_split_matches_hierarchical_collectives(ici: int, dcn: int) -> None:
    n = ici * dcn
    share = 96  # bytes each device holds (all-gather), or sends each peer (all-to-all)
    # all-gather in two steps: the d - 1 shares of the other slices over DCN, then the
    # d shares each of the i - 1 devices of the slice holds by then, over ICI
    gathered = (n - 1) * share
    assert split(gathered, "gather", ici, dcn) == ((ici - 1) * dcn * share, (dcn - 1) * share)
    # all-reduce of S bytes: reduce-scatter + all-gather inside the slice, and an all-reduce
    # of the S / i shard across the slices
    size = n * 48
    reduced = 2 * size * (n - 1) // n
    assert split(reduced, "gather", ici, dcn) == (
        2 * size * (ici - 1) // ici,
        2 * (size // ici) * (dcn - 1) // dcn,
    )
    # all-to-all: n - i of the n - 1 peers are in other slices
    exchanged = (n - 1) * share
    assert split(exchanged, "all-to-all", ici, dcn) == ((ici - 1) * share, (n - ici) * share)


@pytest.mark.parametrize("kind", ["gather", "all-to-all"])
def test_split_keeps_every_byte(kind: str) -> None:
    """Rounding never loses or invents a byte: ICI + DCN is the total."""
    for total, (ici, dcn) in itertools.product(range(0, 40), SHAPES):
        ici_bytes, dcn_bytes = split(total, kind, ici, dcn)
        assert ici_bytes >= 0 and dcn_bytes >= 0
        assert ici_bytes + dcn_bytes == total, (total, ici, dcn)


# ---------------------------------------------------------------------------------------
# network_plan of the two-slice example: Mixtral 8x7B, data 2 across 2 v5e 2x4 slices,
# fsdp 2 x expert 4 (ragged all-to-all) inside each; float32 params, bfloat16 compute.

ROUTER_SHARD = 2048 * 8 * 4  # router [4096, 8] float32, split along embed over fsdp 2
EXPERT_SHARD = 2 * 2048 * 14336  # elements of w_gate, w_up, w_down each: 2 experts, fsdp 2
# fsdp gathers the router in float32 and the expert weights in bfloat16; a device receives
# the other fsdp shard
FSDP_GATHER = ROUTER_SHARD + 3 * EXPERT_SHARD * 2
# every parameter is replicated over data: the float32 gradients of the stored shards are
# all-reduced over data 2, 2 * S * (2 - 1) / 2 = S bytes received
DATA_ALL_REDUCE = ROUTER_SHARD + 3 * EXPERT_SHARD * 4
# only the router is replicated over expert 4: 2 * S * 3 / 4
EXPERT_ALL_REDUCE = 2 * ROUTER_SHARD * 3 // 4
# ragged all-to-all, one way: 4096 tokens a device x top-2 copies x 4096 bfloat16 columns,
# 3 / 4 of them to other devices, dispatched and combined
TOKENS = 2 * 2 * 4096 * 2 * 4096 * 3 // 4


def _plan(path: str, monkeypatch: pytest.MonkeyPatch) -> Plan:
    monkeypatch.chdir(REPO_ROOT)
    return make_plan(load_valid(Path(path)))


def _variant(replacements: dict[str, str]) -> Plan:
    """The two-slice example with some lines replaced, validated and planned."""
    text = (REPO_ROOT / TWO_SLICES).read_text(encoding="utf-8")
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    return make_plan(validate(load_spec_bytes(text.encode(), "variant.yaml", "variant")))


def _by_name(net: NetworkPlan) -> dict[str, Transfer]:
    return {t.name: t for t in net.transfers}


def test_hand_numbers() -> None:
    assert FSDP_GATHER == 352_387_072  # 0.328 GiB
    assert DATA_ALL_REDUCE == 704_708_608  # 0.656 GiB
    assert EXPERT_ALL_REDUCE == 98_304  # 96 KiB
    assert TOKENS == 100_663_296  # 0.094 GiB


def test_two_slice_example_transfers(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(TWO_SLICES, monkeypatch)
    net = plan.network
    assert plan.mesh.slices == net.slices == 2
    assert plan.mesh.axes == (("data", 2), ("fsdp", 2), ("expert", 4))
    assert net.ici_mesh_shape == (1, 2, 4)
    assert net.dcn_mesh_shape == (2, 1, 1)
    assert net.transfers == (
        Transfer("fsdp weight all-gather", "fsdp", "gather", FSDP_GATHER, 0),
        Transfer("fsdp gradient reduce-scatter", "fsdp", "gather", FSDP_GATHER, 0),
        # data lies wholly across the slices: its gradient all-reduce is all DCN
        Transfer("gradient all-reduce over data", "data", "gather", 0, DATA_ALL_REDUCE),
        # expert lies wholly inside a slice: its traffic is all ICI
        Transfer("gradient all-reduce over expert", "expert", "gather", EXPERT_ALL_REDUCE, 0),
        Transfer("ragged_all_to_all tokens, forward", "expert", "all-to-all", TOKENS, 0),
        Transfer("ragged_all_to_all tokens, backward", "expert", "all-to-all", TOKENS, 0),
    )
    # the fsdp traffic agrees with the cost plan's gather
    assert plan.cost.gather_bytes_received == FSDP_GATHER
    # the token exchange is the expert plan's chosen communication, both ways
    assert dict(plan.experts.communication_bytes)["ragged_all_to_all"] == TOKENS


def test_two_slice_example_totals(monkeypatch: pytest.MonkeyPatch) -> None:
    net = _plan(TWO_SLICES, monkeypatch).network
    assert net.ici_bytes == sum(t.ici_bytes for t in net.transfers)
    assert net.dcn_bytes == sum(t.dcn_bytes for t in net.transfers)
    assert net.ici_bytes == 2 * FSDP_GATHER + EXPERT_ALL_REDUCE + 2 * TOKENS == 906_199_040
    assert net.dcn_bytes == DATA_ALL_REDUCE == 704_708_608
    assert all(t.axis == "data" for t in net.transfers if t.dcn_bytes)


def test_two_slice_plan_dict_carries_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    data = json.loads(json.dumps(_plan(TWO_SLICES, monkeypatch).to_dict()))
    assert data["mesh"]["slices"] == 2
    assert data["network"]["ici_mesh_shape"] == [1, 2, 4]
    assert data["network"]["dcn_mesh_shape"] == [2, 1, 1]
    assert data["network"]["dcn_bytes"] == DATA_ALL_REDUCE


def test_expert_axis_over_dcn_moves_token_exchanges_to_the_dcn() -> None:
    """The same mesh with expert = 2 in a slice x 2 across (accepted with expert_over_dcn)."""
    plan = _variant(
        {"  dcn_axes:\n    data: 2\n": "  dcn_axes:\n    expert: 2\n  expert_over_dcn: true\n"}
    )
    net = plan.network
    assert (net.ici_mesh_shape, net.dcn_mesh_shape) == ((2, 2, 2), (1, 1, 2))
    transfers = _by_name(net)
    # data now lies inside a slice
    assert transfers["gradient all-reduce over data"].ici_bytes == DATA_ALL_REDUCE
    assert transfers["gradient all-reduce over data"].dcn_bytes == 0
    # each device sends its copies evenly to 3 peers: 2 of them in the other slice
    for way in ("forward", "backward"):
        t = transfers[f"ragged_all_to_all tokens, {way}"]
        assert (t.ici_bytes, t.dcn_bytes) == (TOKENS // 3, 2 * TOKENS // 3)
        assert (t.ici_bytes, t.dcn_bytes) == (33_554_432, 67_108_864)
    # the router's all-reduce over expert 2 x 2: 2 * 64 Ki / 4 = 32 Ki across slices
    t = transfers["gradient all-reduce over expert"]
    assert (t.ici_bytes, t.dcn_bytes) == (2 * ROUTER_SHARD // 2, 2 * ROUTER_SHARD // 4)
    assert transfers["fsdp weight all-gather"].dcn_bytes == 0
    assert net.dcn_bytes == 2 * 2 * TOKENS // 3 + ROUTER_SHARD // 2


def test_fsdp_over_dcn_gathers_weights_across_slices() -> None:
    plan = _variant({"  dcn_axes:\n    data: 2\n": "  dcn_axes:\n    fsdp: 2\n"})
    net = plan.network
    assert (net.ici_mesh_shape, net.dcn_mesh_shape) == ((2, 1, 4), (1, 2, 1))
    transfers = _by_name(net)
    for name in ("fsdp weight all-gather", "fsdp gradient reduce-scatter"):
        assert (transfers[name].ici_bytes, transfers[name].dcn_bytes) == (0, FSDP_GATHER)
    assert transfers["gradient all-reduce over data"].dcn_bytes == 0
    assert net.dcn_bytes == 2 * FSDP_GATHER


def test_ring_of_experts_over_dcn_is_gather_type() -> None:
    """ring_of_experts all-gathers tokens (bfloat16) and reduce-scatters outputs (float32)."""
    plan = _variant(
        {
            "  dcn_axes:\n    data: 2\n": "  dcn_axes:\n    expert: 2\n  expert_over_dcn: true\n",
            "experts: ragged_all_to_all": "experts: ring_of_experts",
        }
    )
    ring = (2 + 4) * 4096 * 4096 * 3
    transfers = _by_name(plan.network)
    for way in ("forward", "backward"):
        t = transfers[f"ring_of_experts tokens, {way}"]
        assert (t.axis, t.kind) == ("expert", "gather")
        # expert 4 = 2 x 2: the other slice's share of 3 over DCN
        assert (t.ici_bytes, t.dcn_bytes) == (2 * ring // 3, ring // 3)


def test_one_slice_is_all_ici(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(ONE_SLICE, monkeypatch)
    net = plan.network
    assert plan.mesh.slices == net.slices == 1
    assert net.dcn_mesh_shape == tuple(1 for _ in plan.mesh.axes)
    assert net.ici_mesh_shape == tuple(size for _, size in plan.mesh.axes)
    assert net.transfers
    assert all(t.dcn_bytes == 0 for t in net.transfers)
    assert net.dcn_bytes == 0
    assert net.ici_bytes == sum(t.ici_bytes for t in net.transfers) > 0


def test_biases_replicated_over_fsdp_are_all_reduced_over_fsdp() -> None:
    data = {
        "version": 1,
        "layer": {"num_experts": 8, "embed_dim": 64, "ffn_dim": 32, "activation": "gelu"}
        | {"ffn_bias": True},
        "router": {"top_k": 2},
        "shapes": {"batch": 16, "seq_len": 64},
        "dtypes": {"params": "float32", "compute": "float32"},
        "mesh": {"axes": {"data": 2, "fsdp": 2}},
    }
    raw = json.dumps(data).encode()
    plan = make_plan(validate(load_spec_bytes(raw, "specs/bias.yaml", "bias")))
    [b_up] = [p for p in plan.params if p.name == "b_up"]
    assert b_up.partition == (None, None)  # on every fsdp device whole
    bias_bytes = 8 * 32 * 4
    fsdp = sum(t.ici_bytes + t.dcn_bytes for t in plan.network.transfers if t.axis == "fsdp")
    # the weight all-gather and gradient reduce-scatter, and 2 * S * (2 - 1) / 2 for b_up
    assert fsdp == 2 * plan.cost.gather_bytes_received + bias_bytes


# ---------------------------------------------------------------------------------------
# `moegen plan`


def test_cli_plan_shows_ici_dcn_and_the_dcn_share(invoke_main, repo_root: Path) -> None:
    result = invoke_main("plan", TWO_SLICES, cwd=repo_root)
    assert result.code == 0, result.output
    lines = result.stdout.splitlines()
    # 906199040 B = 0.844 GiB, 704708608 B = 0.656 GiB; 704708608 / 1610907648 = 43.7 %
    assert (
        "  communication per device, forward+backward: ICI 0.844 GiB, DCN 0.656 GiB "
        "(43.7% over DCN)"
    ) in lines
    assert "    2 slices: in-slice mesh [1, 2, 4], across slices [2, 1, 1]" in lines
    data_line = next(line for line in lines if "gradient all-reduce over data" in line)
    assert data_line.split()[-5:] == ["0.0", "KiB", "DCN", "0.656", "GiB"]
    assert data_line.split()[4:6] == ["data", "ICI"]
    tokens = [line for line in lines if "ragged_all_to_all tokens" in line]
    assert len(tokens) == 2
    for line in tokens:
        assert line.split()[-6:] == ["ICI", "0.094", "GiB", "DCN", "0.0", "KiB"]
    # the CLI prints the plan of the library (invoke_main left the working directory there)
    assert result.stdout == format_plan(make_plan(load_valid(Path(TWO_SLICES)))) + "\n"


def test_cli_plan_one_slice_has_no_dcn_share(invoke_main, repo_root: Path) -> None:
    result = invoke_main("plan", ONE_SLICE, cwd=repo_root)
    assert result.code == 0, result.output
    [line] = [line for line in result.stdout.splitlines() if "communication per device" in line]
    assert line.endswith(", DCN 0.0 KiB")
    assert "over DCN" not in result.stdout
    assert " slices: in-slice mesh" not in result.stdout
