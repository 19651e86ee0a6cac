"""The plan of expert parallelism: partitions and local shapes, row counts and calls per strategy, communication estimates, and what `moegen plan` shows of them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from expert_parallel_cases import Case

from moegen.plan import Plan, make_plan
from moegen.render import render

BYTES = {"float32": 4, "bfloat16": 2}

MESHES = {
    "fsdp2xexpert4": {"fsdp": 2, "expert": 4},
    "expert4": {"expert": 4},
    "data2xexpert4": {"data": 2, "expert": 4},
    "expert8": {"expert": 8},
}


@pytest.mark.parametrize("strategy", ["ragged_all_to_all", "ring_of_experts"])
@pytest.mark.parametrize("mesh", list(MESHES))
def test_param_partitions_and_local_shapes(mesh: str, strategy: str) -> None:
    axes = MESHES[mesh]
    e, d, f = 16, 64, 48
    plan = make_plan(Case(strategy, axes, experts=e, embed=d, ffn=f).load())
    fsdp = "fsdp" if "fsdp" in axes else None
    n, shards = axes.get("fsdp", 1), axes["expert"]
    params = {p.name: p for p in plan.params}
    assert params["router"].partition == (fsdp, None)
    assert params["w_gate"].partition == ("expert", fsdp, None)
    assert params["w_up"].partition == ("expert", fsdp, None)
    assert params["w_down"].partition == ("expert", None, fsdp)
    assert params["router"].local_shape == (d // n, e)
    assert params["w_gate"].local_shape == (e // shards, d // n, f)
    assert params["w_up"].local_shape == (e // shards, d // n, f)
    assert params["w_down"].local_shape == (e // shards, f, d // n)
    assert [p.shape for p in plan.params] == [(d, e), (e, d, f), (e, d, f), (e, f, d)]
    gather = {"router": 0, "w_gate": 1, "w_up": 1, "w_down": 2}
    for name, p in params.items():
        assert p.gather_axis == (gather[name] if fsdp else None)
    assert plan.local_experts == e // shards
    assert plan.mesh.expert_axis == "expert" and plan.experts.shards == shards
    # Stored bytes: only this device's experts, fsdp-sharded.
    stored = sum(math.prod(p.local_shape) for p in plan.params) * 4
    assert plan.cost.param_bytes == stored
    source = render(plan)
    assert '"w_gate": P("expert", ' in source
    assert f"LOCAL_EXPERTS = {e // shards}" in source


def test_replicated_strategy_shards_no_experts() -> None:
    plan = make_plan(Case("replicated", {"fsdp": 2, "data": 2}).load())
    params = {p.name: p for p in plan.params}
    assert params["w_gate"].partition == (None, "fsdp", None)
    assert params["w_gate"].local_shape[0] == plan.num_experts
    assert plan.mesh.expert_axis is None and plan.experts.axis is None
    assert plan.experts.ffn_rows == plan.local_tokens * plan.router.top_k
    assert (plan.experts.ffn_calls, plan.experts.receive_rows) == (1, 0)
    assert plan.experts.communication_bytes == ()
    assert not plan.experts.emulates_collective


# (experts, top_k, mesh, batch, seq_len)
ROW_SHAPES = [
    (8, 2, "expert4", 8, 16),
    (8, 3, "data2xexpert4", 8, 5),  # top_k > local experts
    (16, 1, "fsdp2xexpert4", 16, 8),
    (64, 8, "expert8", 8, 32),
    (8, 8, "expert8", 8, 4),  # one expert per device: min(8, 1)
]


@pytest.mark.parametrize("shape", ROW_SHAPES, ids=lambda s: f"E{s[0]}-K{s[1]}-{s[2]}")
def test_rows_and_calls_per_strategy(shape) -> None:
    experts, top_k, mesh, batch, seq_len = shape
    axes = MESHES[mesh]
    shards = axes["expert"]
    local = experts // shards
    renorm = top_k > 1
    common = dict(experts=experts, top_k=top_k, renormalize=renorm, batch=batch, seq_len=seq_len)
    a2a = make_plan(Case("ragged_all_to_all", axes, **common).load())
    ring = make_plan(Case("ring_of_experts", axes, **common).load())
    overlap = make_plan(Case("ring_of_experts", axes, chunks=4, **common).load())
    devices = math.prod(axes.values())
    local_tokens = batch // devices * seq_len
    group = local_tokens * shards
    per_token = min(top_k, local)
    for plan in (a2a, ring, overlap):
        assert plan.local_tokens == local_tokens
        assert plan.routed_rows == local_tokens * top_k
        assert plan.experts.group_tokens == group
        assert plan.experts.local_experts == local and plan.experts.shards == shards
    assert (a2a.experts.ffn_rows, a2a.experts.ffn_calls, a2a.experts.receive_rows) == (
        group * per_token,
        1,
        group * per_token,
    )
    assert (ring.experts.ffn_rows, ring.experts.ffn_calls, ring.experts.receive_rows) == (
        group * per_token,
        1,
        0,
    )
    assert (overlap.experts.ffn_rows, overlap.experts.ffn_calls) == (
        local_tokens * per_token,
        shards,
    )
    assert overlap.experts.receive_rows == 0
    assert (overlap.experts.overlap_chunks, overlap.experts.chunk_width) == (4, 32 // 4)
    # kernel xla: nothing padded
    assert a2a.kernel.config is None and ring.kernel.config is None  # no row padding
    src = render(a2a)
    assert f"RECEIVE_ROWS = {group * per_token}" in src
    assert f"FFN_ROWS = {group * per_token}" in src
    assert "RECEIVE_ROWS" not in render(ring)


def ragged_bytes(b: int, t: int, k: int, d: int, p: int) -> int:
    return 2 * b * t * k * d * (p - 1) // p


def ring_bytes(b: int, t: int, d: int, p: int) -> int:
    return (b + 4) * t * d * (p - 1)


@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
@pytest.mark.parametrize("mesh", ["fsdp2xexpert4", "expert8", "data2xexpert4"])
@pytest.mark.parametrize("strategy", ["ragged_all_to_all", "ring_of_experts"])
def test_communication_bytes(strategy: str, mesh: str, compute: str) -> None:
    axes = MESHES[mesh]
    case = Case(
        strategy, axes, experts=16, top_k=4, embed=256, ffn=64, batch=16, seq_len=64,
        params="float32", compute=compute,
    )  # fmt: skip
    plan = make_plan(case.load())
    b, p = BYTES[compute], axes["expert"]
    t, k, d = plan.local_tokens, 4, 256
    assert 2 * b * t * k * d * (p - 1) % p == 0  # the formula is exact for these shapes
    want = {
        "ragged_all_to_all": ragged_bytes(b, t, k, d, p),
        "ring_of_experts": ring_bytes(b, t, d, p),
    }
    comm = plan.experts.communication_bytes
    assert dict(comm) == want
    assert comm[0][0] == strategy  # the chosen strategy first
    assert [name for name, _ in comm] == [strategy] + [n for n in want if n != strategy]


def test_emulation_only_where_the_collective_is_missing() -> None:
    tpu = Case(
        "ragged_all_to_all", {"fsdp": 2, "expert": 4}, embed=512, ffn=256, batch=8,
        seq_len=128, compute="bfloat16", hardware="tpu-v5e", topology="2x4", kernel="pallas",
    )  # fmt: skip
    loaded = tpu.load()
    assert not make_plan(loaded).experts.emulates_collective
    assert make_plan(loaded, interpret=True).experts.emulates_collective
    assert make_plan(Case("ragged_all_to_all", {"expert": 4}).load()).experts.emulates_collective
    ring = make_plan(Case("ring_of_experts", {"expert": 4}).load(), interpret=True)
    assert not ring.experts.emulates_collective


def _size_text(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


@pytest.mark.parametrize("strategy", ["ragged_all_to_all", "ring_of_experts"])
def test_moegen_plan_shows_the_comm_forward_lines(
    strategy: str, tmp_path: Path, invoke_main
) -> None:
    case = Case(
        strategy, {"fsdp": 2, "expert": 4}, experts=8, top_k=2, embed=4096, ffn=14336,
        batch=8, seq_len=4096, params="float32", compute="bfloat16", hardware="tpu-v5e",
        topology="2x4", kernel="pallas", chunks=4 if strategy == "ring_of_experts" else 1,
    )  # fmt: skip
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "ep_plan.yaml").write_text(case.text(), encoding="utf-8")
    result = invoke_main("plan", "specs/ep_plan.yaml", cwd=tmp_path)
    assert result.code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip().startswith("comm forward")]
    assert len(lines) == 2, result.stdout
    b, t, d, p = 2, 4096, 4096, 4
    ragged, ring = ragged_bytes(b, t, 2, d, p), ring_bytes(b, t, d, p)
    assert (ragged, ring) == (100_663_296, 301_989_888)  # 0.094 GiB and 0.281 GiB
    texts = {
        "ragged_all_to_all": f"ragged_all_to_all  {_size_text(ragged)} per device",
        "ring_of_experts": f"ring_of_experts    {_size_text(ring)} per device",
    }
    other = next(name for name in texts if name != strategy)
    assert lines[0].split() == ["comm", "forward", *texts[strategy].split(), "(chosen)"]
    assert lines[1].split() == ["comm", "forward", *texts[other].split()]
    assert texts[strategy] in lines[0] and texts[other] in lines[1]
    out = result.stdout
    plan = make_plan(case.load())
    if strategy == "ragged_all_to_all":
        assert f"receive buffer  {plan.experts.receive_rows} rows" in out
        assert "overlap" not in out
    else:
        assert f"expert FFN rows {plan.experts.ffn_rows} x 4 ring steps per device" in out
        assert "overlap         4 chunks of 1024 columns" in out
        assert "receive buffer" not in out


def test_plan_of_a_ring_overlap_spec_uses_chunk_wide_gate_up_tiles() -> None:
    plan: Plan = make_plan(
        Case(
            "ring_of_experts", {"fsdp": 2, "expert": 4}, experts=16, embed=1024, ffn=1024,
            batch=8, seq_len=512, compute="bfloat16", hardware="tpu-v5e", topology="2x4",
            kernel="pallas", chunks=4,
        ).load()
    )  # fmt: skip
    assert plan.experts.chunk_width == 256
    assert plan.kernel.config.gate_up_tile is not None and plan.kernel.config.down_tile is not None
    # gate/up contract over one chunk of the embedding; down over the whole ffn dimension.
    assert plan.kernel.config.gate_up_tile[1] <= 256
    assert plan.kernel.config.padded_rows % plan.kernel.config.row_alignment == 0
    assert plan.kernel.config.padded_rows >= plan.experts.ffn_rows
