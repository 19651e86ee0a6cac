"""`moegen.plan.roofline` under overlap: ring_of_experts with C chunks hides all but max(c, p) + min(c, p) / C - p of its transfers."""

from __future__ import annotations

import pytest
from roofline_cases import REL, V5E, plan_of

from moegen.plan import Plan

ICI_V5E = 400e9 / 2
PEAK_V5E = 197e12
T = 128  # tokens per device on fsdp 2 x expert 2
# the ring exchange per pass and direction: tokens gathered in bfloat16, partial outputs
# reduce-scattered in float32, from the 1 other expert device: (2 + 4) x t x D x (P - 1)
RING_BYTES = (2 + 4) * T * 256 * (2 - 1)  # 196,608


def ring(chunks: int, *, ffn: int, top_k: int) -> Plan:
    return plan_of(
        axes={"fsdp": 2, "expert": 2},
        target=V5E,
        experts="ring_of_experts",
        ffn=ffn,
        top_k=top_k,
        overlap_chunks=chunks,
    )


def _fsdp_gather(ffn: int) -> int:
    # router [128, 8] float32 and three [4, 128, F] bfloat16 shards from the other fsdp device
    return 128 * 8 * 4 + 3 * 4 * 128 * ffn * 2


# name -> (ffn, top_k, routed rows a device's experts run: t x min(K, 4 local) x 2 devices)
REGIMES = {
    "comm-hidden": (512, 2, T * 2 * 2),
    "comm-bound": (64, 1, T * 1 * 2),
}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_overlap_chunks_expose_less_forward(regime: str) -> None:
    ffn, top_k, rows = REGIMES[regime]
    one, four = ring(1, ffn=ffn, top_k=top_k), ring(4, ffn=ffn, top_k=top_k)
    assert [t.ici_bytes for t in one.network.transfers] == [
        t.ici_bytes for t in four.network.transfers
    ]
    for plan in (one, four):
        assert plan.kernel.config is None and plan.experts.ffn_rows * plan.experts.ffn_calls == rows
    c = RING_BYTES / ICI_V5E
    p = 2 * 3 * rows * 256 * ffn / PEAK_V5E  # the forward routed matmuls
    assert (c < p) == (regime == "comm-hidden")
    gather_s = _fsdp_gather(ffn) / ICI_V5E

    fwd1, fwd4 = one.roofline.passes[0], four.roofline.passes[0]
    assert fwd1.exposed_comm_s == pytest.approx(gather_s + c, rel=REL)
    overlapped = max(c, p) + min(c, p) / 4 - p
    assert fwd4.exposed_comm_s == pytest.approx(gather_s + overlapped, rel=REL)
    assert fwd4.exposed_comm_s < fwd1.exposed_comm_s
    assert fwd4.ici_s == fwd1.ici_s  # the same bytes move; less of their time shows
    assert fwd4.bound_s < fwd1.bound_s
    assert fwd4.bound_s == pytest.approx(
        max(fwd4.compute_s, fwd4.hbm_s) + gather_s + overlapped, rel=REL
    )


def test_overlap_chunks_expose_less_forward_backward_comm_hidden() -> None:
    ffn, top_k, rows = REGIMES["comm-hidden"]
    one, four = ring(1, ffn=ffn, top_k=top_k), ring(4, ffn=ffn, top_k=top_k)
    c = RING_BYTES / ICI_V5E
    p = 2 * 3 * rows * 256 * ffn / PEAK_V5E
    assert c < p  # each exchange hides under its own phase's matmuls but one chunk
    others = (2 * _fsdp_gather(ffn) + 2 * (128 * 8 * 4) * (2 - 1) // 2) / ICI_V5E
    train1, train4 = one.roofline.passes[1], four.roofline.passes[1]
    assert train1.exposed_comm_s == pytest.approx(others + 2 * c, rel=REL)
    assert train4.exposed_comm_s == pytest.approx(others + 2 * (c / 4), rel=REL)
    assert train4.exposed_comm_s < train1.exposed_comm_s


def test_overlap_forward_backward_comm_bound_uses_compute_once() -> None:
    ffn, top_k, rows = REGIMES["comm-bound"]
    plan = ring(4, ffn=ffn, top_k=top_k)
    c = RING_BYTES / ICI_V5E  # one exchange: forward, and again backward
    p = 2 * 3 * rows * 256 * ffn / PEAK_V5E  # forward routed matmuls; backward is 2p
    assert c > 3 * p
    others = (2 * _fsdp_gather(ffn) + 2 * (128 * 8 * 4) * (2 - 1) // 2) / ICI_V5E
    train = plan.roofline.passes[1]
    tokens_exposed = train.exposed_comm_s - others
    # 3p of matmuls can hide at most 3p of the 2c of transfers
    assert tokens_exposed >= 2 * c - 3 * p
    # forward exchange under the forward matmuls p, backward under the backward ones 2p
    # (here the same as overlapping 2c with 3p as a whole: c > 2p)
    per_phase = (max(c, p) + min(c, p) / 4 - p) + (max(c, 2 * p) + min(c, 2 * p) / 4 - 2 * p)
    assert tokens_exposed == pytest.approx(per_phase, rel=REL)
