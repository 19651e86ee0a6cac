"""`moegen.plan.roofline`: the per-device roofline of one layer (FLOPs, HBM bytes, ICI / DCN bytes, lower-bound seconds) against arithmetic written out by hand on small specs, and what `moegen plan` prints of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import EXAMPLE_NAMES, EXAMPLE_SPECS, REPO_ROOT
from roofline_cases import CPU, GELU_SHARED, REL, TPU7X, V5E, plan_of

from moegen.pipeline import load_valid
from moegen.plan import Plan, format_plan, make_plan


def transfer_bytes(plan: Plan, forward_only: bool) -> tuple[int, int]:
    """(ICI, DCN) of the network plan's transfers: forward ones, or all of them."""
    forward_names = ("fsdp weight all-gather", f"{plan.experts.strategy} tokens, forward")
    chosen = [t for t in plan.network.transfers if not forward_only or t.name in forward_names]
    return sum(t.ici_bytes for t in chosen), sum(t.dcn_bytes for t in chosen)


# ---------------------------------------------------------------------------------------
# by hand: tpu-v5e 2x2, fsdp 2 x expert 2, ragged_all_to_all, swiglu, kernel xla
#
# t tokens per device, d embed, f ffn, e experts, k top_k, m matmuls per expert (swiglu: 3)
V5E_DIMS = (128, 256, 512, 8, 2, 3)
# rows of the grouped matmul's worst-case buffer (derivation: _v5e_flops_by_hand)
V5E_KERNEL_ROWS = 512


def _v5e_flops_by_hand(plan: Plan) -> tuple[int, int, int]:
    """(router, routed, kernel) forward FLOPs per device, checked against the plan."""
    fwd = plan.roofline.passes[0]
    # batch 8 over fsdp x expert = 4 devices: 2 sequences of 64 -> t = 128 tokens per device
    assert plan.local_tokens == 128
    t, d, f, e, k, m = V5E_DIMS
    # worst-case rows of the grouped matmul: every token of the 2-device expert group sends
    # min(top_k 2, 4 local experts) = 2 copies here -> 256 x 2 = 512; xla: no tile padding
    assert (plan.experts.ffn_rows, plan.kernel.config, plan.experts.ffn_calls) == (512, None, 1)

    router = 2 * t * d * e  # 524,288
    routed = 2 * m * t * k * d * f  # 201,326,592
    kernel = router + 2 * m * V5E_KERNEL_ROWS * d * f  # 524,288 + 402,653,184
    assert (router, routed, kernel) == (524_288, 201_326_592, 403_177_472)
    assert fwd.router_flops == router
    assert fwd.routed_flops == routed
    assert fwd.shared_flops == 0
    assert fwd.useful_flops == router + routed == 201_850_880
    assert fwd.kernel_flops == kernel
    # the cost plan counts the same useful FLOPs
    assert fwd.useful_flops == plan.cost.forward_flops
    return router, routed, kernel


def _v5e_hbm_bytes_by_hand(plan: Plan) -> int:
    """Forward HBM bytes per device, checked against the plan."""
    t, d, f, *_ = V5E_DIMS
    # HBM, forward: stored params (float32): router [256/2, 8], three experts [8/2, 256/2, 512]
    stored = (128 * 8 + 3 * 4 * 128 * 512) * 4  # 3,149,824
    # gathered weights, written by the fsdp gather and read: router [256, 8] float32, three
    # [4, 256, 512] bfloat16
    gathered = 256 * 8 * 4 + 3 * 4 * 256 * 512 * 2  # 3,153,920
    # routed buffers, written and read: 512 rows of (row + output [D], gate, up, hidden [F])
    routed_buffers = V5E_KERNEL_ROWS * (2 * d + 3 * f) * 2  # 2,097,152
    in_out = 2 * t * d * 2  # layer input and output, bfloat16
    hbm = stored + 2 * gathered + 2 * routed_buffers + in_out
    assert hbm == 13_783_040
    assert plan.roofline.passes[0].hbm_bytes == hbm
    return hbm


def _v5e_ici_bytes_by_hand(plan: Plan) -> tuple[int, int]:
    """(forward, forward+backward) ICI bytes per device, checked against the plan."""
    fwd, train = plan.roofline.passes
    t, d, _, _, k, _ = V5E_DIMS
    # communication: the fsdp gather receives the other shard of every gathered weight
    gather = 128 * 8 * 4 + 3 * 4 * 128 * 512 * 2  # 1,576,960 (reduce-scatter: the same)
    all_reduce = 2 * (128 * 8 * 4) * (2 - 1) // 2  # router gradient over expert: 4,096
    tokens = 2 * 2 * t * k * d * (2 - 1) // 2  # dispatch + combine: 131,072 (backward: same)
    assert fwd.ici_bytes == gather + tokens == 1_708_032
    assert train.ici_bytes == 2 * gather + all_reduce + 2 * tokens == 3_420_160
    assert fwd.dcn_bytes == train.dcn_bytes == 0
    assert (fwd.ici_bytes, fwd.dcn_bytes) == transfer_bytes(plan, forward_only=True)
    assert (train.ici_bytes, train.dcn_bytes) == transfer_bytes(plan, forward_only=False)
    return gather + tokens, 2 * gather + all_reduce + 2 * tokens


def test_v5e_swiglu_ragged_all_to_all_by_hand() -> None:
    plan = plan_of(axes={"fsdp": 2, "expert": 2}, target=V5E, experts="ragged_all_to_all")
    r = plan.roofline
    fwd, train = r.passes
    assert (fwd.name, train.name) == ("forward", "forward+backward")
    router, routed, kernel = _v5e_flops_by_hand(plan)
    hbm = _v5e_hbm_bytes_by_hand(plan)
    fwd_ici, train_ici = _v5e_ici_bytes_by_hand(plan)

    # tpu-v5e: 197 TFLOP/s, 819 GB/s HBM, ICI 400 GB/s bidirectional, 1 device per chip
    peak, hbm_bw, ici_bw = 197e12, 819e9, 400e9 / 2
    assert r.peak_flops_per_s == peak
    assert r.hbm_bytes_per_s == hbm_bw
    assert r.ici_bytes_per_s == ici_bw
    assert r.dcn_bytes_per_s == 6.25e9

    compute_s, hbm_s, ici_s = kernel / peak, hbm / hbm_bw, fwd_ici / ici_bw
    assert fwd.compute_s == pytest.approx(compute_s, rel=REL)  # 2.05 us
    assert fwd.hbm_s == pytest.approx(hbm_s, rel=REL)  # 16.8 us
    assert fwd.ici_s == pytest.approx(ici_s, rel=REL)  # 8.54 us
    assert fwd.dcn_s == 0.0
    # no overlap chunks: every collective is exposed
    assert fwd.exposed_comm_s == pytest.approx(ici_s, rel=REL)
    assert fwd.bound_s == pytest.approx(max(compute_s, hbm_s) + ici_s, rel=REL)
    assert fwd.bound_by == "HBM"

    # forward+backward: FLOPs and HBM bytes 3x, communication the listed transfers
    assert train.router_flops == 3 * router
    assert train.routed_flops == 3 * routed
    assert train.useful_flops == 3 * (router + routed) == plan.cost.train_flops
    assert train.kernel_flops == 3 * kernel
    assert train.hbm_bytes == 3 * hbm
    train_ici_s = train_ici / ici_bw
    assert train.compute_s == pytest.approx(3 * compute_s, rel=REL)
    assert train.hbm_s == pytest.approx(3 * hbm_s, rel=REL)
    assert train.ici_s == pytest.approx(train_ici_s, rel=REL)
    assert train.exposed_comm_s == pytest.approx(train_ici_s, rel=REL)
    assert train.bound_s == pytest.approx(3 * hbm_s + train_ici_s, rel=REL)
    assert train.bound_by == "HBM"


# ---------------------------------------------------------------------------------------
# by hand: cpu, replicated experts, data 2 x fsdp 2, gelu (2 matmuls) + shared expert 128


def test_cpu_replicated_gelu_shared_by_hand() -> None:
    plan = plan_of(
        axes={"data": 2, "fsdp": 2}, target=CPU, experts="replicated", layer_extra=GELU_SHARED
    )
    r = plan.roofline
    fwd, train = r.passes
    assert not plan.ffn.gated
    assert plan.local_tokens == 128
    t, d, f, s, e, k, m = 128, 256, 512, 128, 8, 2, 2
    # replicated: the grouped matmul sees this device's t x K copies, no padding
    assert (plan.experts.ffn_rows, plan.kernel.config, plan.experts.ffn_calls) == (256, None, 1)

    router = 2 * t * d * e
    routed = 2 * m * t * k * d * f
    shared = 2 * m * t * d * s
    assert (router, routed, shared) == (524_288, 134_217_728, 16_777_216)
    assert (fwd.router_flops, fwd.routed_flops, fwd.shared_flops) == (router, routed, shared)
    assert fwd.useful_flops == router + routed + shared == 151_519_232
    # the worst-case buffer is exactly t x K rows: kernels run the useful FLOPs
    assert fwd.kernel_flops == router + 2 * m * 256 * d * f + shared == fwd.useful_flops

    # stored (float32): router [128, 8], up [8, 128, 512], down [8, 512, 128],
    # shared up [128, 128], shared down [128, 128]
    stored = (128 * 8 + 2 * 8 * 128 * 512 + 2 * 128 * 128) * 4  # 4,329,472
    # gathered: router [256, 8] float32; up, down [8, 256, 512] and shared [256, 128] bf16
    gathered = 256 * 8 * 4 + 2 * 8 * 256 * 512 * 2 + 2 * 256 * 128 * 2  # 4,333,568
    routed_buffers = 256 * (2 * d + 2 * f) * 2  # rows of (row + output, up + hidden)
    in_out = 2 * t * d * 2
    shared_act = t * 2 * s * 2  # the shared expert's up and hidden, bfloat16
    hbm = stored + 2 * gathered + 2 * routed_buffers + in_out + 2 * shared_act
    assert hbm == 14_831_616
    assert fwd.hbm_bytes == hbm
    assert train.hbm_bytes == 3 * hbm

    gather = 128 * 8 * 4 + 2 * 8 * 128 * 512 * 2 + 2 * 128 * 128 * 2  # 2,166,784
    data_all_reduce = 2 * stored * (2 - 1) // 2  # every parameter is replicated over data
    assert fwd.ici_bytes == gather
    assert train.ici_bytes == 2 * gather + data_all_reduce == 8_663_040
    assert (fwd.ici_bytes, fwd.dcn_bytes) == transfer_bytes(plan, forward_only=True)
    assert (train.ici_bytes, train.dcn_bytes) == transfer_bytes(plan, forward_only=False)

    assert train.useful_flops == 3 * fwd.useful_flops
    assert train.kernel_flops == 3 * fwd.kernel_flops
    assert train.shared_flops == 3 * shared
    # cpu: no figures, counts only
    assert (r.peak_flops_per_s, r.hbm_bytes_per_s, r.ici_bytes_per_s, r.dcn_bytes_per_s) == (
        0.0,
        0.0,
        0.0,
        0.0,
    )
    for p in (fwd, train):
        assert (p.compute_s, p.hbm_s, p.ici_s, p.dcn_s) == (0.0, 0.0, 0.0, 0.0)
        assert (p.exposed_comm_s, p.bound_s, p.bound_by) == (0.0, 0.0, "")


# ---------------------------------------------------------------------------------------
# by hand: tpu7x 2x2x1 (2 devices per chip), gelu + shared expert, fsdp 2 x expert 4
#
# t tokens per device, d embed, f ffn, s shared ffn, e experts, k top_k, m matmuls per
# expert (gelu: 2)
TPU7X_DIMS = (64, 256, 512, 128, 8, 2, 2)


def _tpu7x_flops_by_hand(plan: Plan) -> int:
    """The forward kernel FLOPs per device; router, routed and shared checked on the way."""
    fwd = plan.roofline.passes[0]
    # 4 chips x 2 devices = 8 devices; batch 8 -> 1 sequence of 64 tokens per device
    assert plan.mesh.num_devices == 8
    assert plan.local_tokens == 64
    t, d, f, s, e, k, m = TPU7X_DIMS
    # worst case: 4 x 64 group tokens, each sending min(2, 2 local experts) = 2 copies here
    assert (plan.experts.ffn_rows, plan.kernel.config, plan.experts.ffn_calls) == (512, None, 1)

    router = 2 * t * d * e
    routed = 2 * m * t * k * d * f
    shared = 2 * m * t * d * s
    kernel = router + 2 * m * 512 * d * f + shared
    assert (router, routed, shared, kernel) == (262_144, 67_108_864, 8_388_608, 277_086_208)
    assert (fwd.router_flops, fwd.routed_flops, fwd.shared_flops) == (router, routed, shared)
    assert fwd.useful_flops == router + routed + shared == 75_759_616
    assert fwd.kernel_flops == kernel
    return kernel


def _tpu7x_hbm_bytes_by_hand(plan: Plan) -> int:
    """Forward HBM bytes per device, checked against the plan."""
    t, d, f, s, *_ = TPU7X_DIMS
    stored = (128 * 8 + 2 * 2 * 128 * 512 + 2 * 128 * 128) * 4  # 1,183,744
    gathered = 256 * 8 * 4 + 2 * 2 * 256 * 512 * 2 + 2 * 256 * 128 * 2  # 1,187,840
    routed_buffers = 512 * (2 * d + 2 * f) * 2
    in_out = 2 * t * d * 2
    shared_act = t * 2 * s * 2
    hbm = stored + 2 * gathered + 2 * routed_buffers + in_out + 2 * shared_act
    assert hbm == 6_836_224
    assert plan.roofline.passes[0].hbm_bytes == hbm
    return hbm


def _tpu7x_ici_bytes_by_hand(plan: Plan) -> tuple[int, int]:
    """(forward, forward+backward) ICI bytes per device, checked against the plan."""
    fwd, train = plan.roofline.passes
    t, d, _, _, _, k, _ = TPU7X_DIMS
    gather = 128 * 8 * 4 + 2 * 2 * 128 * 512 * 2 + 2 * 128 * 128 * 2  # 593,920
    # router and shared expert are replicated over expert: all-reduce of their gradients
    replicated_over_expert = (128 * 8 + 2 * 128 * 128) * 4  # 135,168
    all_reduce = 2 * replicated_over_expert * (4 - 1) // 4  # 202,752
    tokens = 2 * 2 * t * k * d * (4 - 1) // 4  # 98,304
    assert fwd.ici_bytes == gather + tokens == 692_224
    assert train.ici_bytes == 2 * gather + all_reduce + 2 * tokens == 1_587_200
    assert (fwd.ici_bytes, fwd.dcn_bytes) == transfer_bytes(plan, forward_only=True)
    assert (train.ici_bytes, train.dcn_bytes) == transfer_bytes(plan, forward_only=False)
    return gather + tokens, 2 * gather + all_reduce + 2 * tokens


def test_tpu7x_gelu_shared_ragged_all_to_all_by_hand() -> None:
    plan = plan_of(
        axes={"fsdp": 2, "expert": 4},
        target=TPU7X,
        experts="ragged_all_to_all",
        layer_extra=GELU_SHARED,
    )
    r = plan.roofline
    fwd, train = r.passes
    kernel = _tpu7x_flops_by_hand(plan)
    hbm = _tpu7x_hbm_bytes_by_hand(plan)
    fwd_ici, train_ici = _tpu7x_ici_bytes_by_hand(plan)

    # tpu7x: 2,307 TFLOP/s, 7,380 GB/s, ICI 1,200 GB/s bidirectional per chip of 2 devices
    peak, hbm_bw, ici_bw = 2307e12 / 2, 7380e9 / 2, 1200e9 / 2 / 2
    assert r.peak_flops_per_s == peak
    assert r.hbm_bytes_per_s == hbm_bw
    assert r.ici_bytes_per_s == ici_bw
    assert r.dcn_bytes_per_s == 6.25e9 / 2

    compute_s, hbm_s = kernel / peak, hbm / hbm_bw
    ici_s = fwd_ici / ici_bw
    assert fwd.compute_s == pytest.approx(compute_s, rel=REL)
    assert fwd.hbm_s == pytest.approx(hbm_s, rel=REL)
    assert fwd.ici_s == pytest.approx(ici_s, rel=REL)
    assert fwd.exposed_comm_s == pytest.approx(ici_s, rel=REL)
    assert fwd.bound_s == pytest.approx(max(compute_s, hbm_s) + ici_s, rel=REL)
    assert fwd.bound_by == "HBM"

    train_ici_s = train_ici / ici_bw
    assert train.kernel_flops == 3 * kernel
    assert train.compute_s == pytest.approx(3 * compute_s, rel=REL)
    assert train.hbm_s == pytest.approx(3 * hbm_s, rel=REL)
    assert train.exposed_comm_s == pytest.approx(train_ici_s, rel=REL)
    assert train.bound_s == pytest.approx(3 * hbm_s + train_ici_s, rel=REL)


def test_compute_bound_when_flops_dominate() -> None:
    # data 4 on v5e 2x2, embed = ffn = 4096, t = 2 x 4096 = 8192 tokens per device: the routed
    # matmuls do 6 x 8192 x 2 x 4096^2 = 1.65e12 FLOPs (8.4 ms at 197 TFLOP/s) against
    # ~2.4 GB of weights and ~1.3 GB of routed buffers (~4.5 ms at 819 GB/s)
    plan = plan_of(
        axes={"data": 4}, target=V5E, experts="replicated", embed=4096, ffn=4096, seq=4096
    )
    assert plan.local_tokens == 8192
    for scale, p in zip((1, 3), plan.roofline.passes, strict=True):
        assert p.compute_s == pytest.approx(
            scale * (2 * 8192 * 4096 * 8 + 6 * 8192 * 2 * 4096 * 4096) / 197e12, rel=REL
        )
        assert p.compute_s > p.hbm_s
        assert p.bound_by == "compute"
        assert p.bound_s == pytest.approx(p.compute_s + p.exposed_comm_s, rel=REL)


# ---------------------------------------------------------------------------------------
# `moegen plan` and `moegen plan --json` for every example spec


@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=EXAMPLE_NAMES)
def test_cli_plan_prints_roofline(spec: Path, invoke_main) -> None:
    rel = spec.relative_to(REPO_ROOT).as_posix()
    plan = make_plan(load_valid(Path(rel)))
    result = invoke_main("plan", rel, cwd=REPO_ROOT)
    assert result.code == 0, result.output
    assert result.stdout == format_plan(plan) + "\n"
    lines = result.stdout.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("  roofline per device")]
    assert len(heads) == 1, result.stdout
    head = lines[heads[0]]
    r = plan.roofline
    tpu = plan.hardware != "cpu"
    if tpu:
        assert head.startswith(f"  roofline per device ({plan.hardware}: ")
        assert f"{r.peak_flops_per_s / 1e12:.0f} TFLOP/s" in head
        assert f"ICI {r.ici_bytes_per_s / 1e9:.0f} GB/s" in head
        assert ("DCN" in head) == (plan.mesh.slices > 1)
    else:
        assert head == "  roofline per device (no peak figures for cpu: counts only):"
    block = lines[heads[0] + 1 : heads[0] + 1 + (3 if tpu else 2) * 2]
    for name, at in (("forward", 0), ("forward+backward", 3 if tpu else 2)):
        p = next(q for q in r.passes if q.name == name)
        assert block[at].startswith(f"    {name:<17} FLOPs useful {p.useful_flops:.3e} ")
        assert f"kernels run {p.kernel_flops:.3e}" in block[at]
        assert block[at + 1].lstrip().startswith("HBM ")
        if tpu:
            assert block[at + 2].lstrip().startswith("lower bounds: compute ")
            assert f"layer >= {p.bound_s * 1e3:.3f} ms ({p.bound_by}-bound)" in block[at + 2]
    assert not any("lower bounds" in line for line in lines) or tpu


@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=EXAMPLE_NAMES)
def test_cli_plan_json_carries_roofline(spec: Path, invoke_main) -> None:
    rel = spec.relative_to(REPO_ROOT).as_posix()
    result = invoke_main("plan", rel, "--json", cwd=REPO_ROOT)
    assert result.code == 0, result.output
    data = json.loads(result.stdout)
    roof = data["roofline"]
    assert [p["name"] for p in roof["passes"]] == ["forward", "forward+backward"]
    expected = json.loads(json.dumps(make_plan(load_valid(Path(rel))).to_dict()["roofline"]))
    assert roof == expected
    fwd, train = roof["passes"]
    assert train["useful_flops"] == 3 * fwd["useful_flops"] == 3 * data["cost"]["forward_flops"]
    assert train["hbm_bytes"] == 3 * fwd["hbm_bytes"]
    assert train["ici_bytes"] + train["dcn_bytes"] == (
        data["network"]["ici_bytes"] + data["network"]["dcn_bytes"]
    )
