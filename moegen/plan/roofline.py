"""The roofline of one layer, per device: FLOPs, HBM bytes, communication, lower-bound times.

Formulas (the project's hardware reference, shared/reference/hardware-and-roofline.md), with
t tokens per device, D embed, F expert width, S shared-expert width, E experts, K top-k and
m = 3 matmuls per FFN (gated) or 2 (plain):
  useful FLOPs, forward: router 2tDE, routed experts 2m tK DF, shared expert 2m tDS;
  kernel FLOPs: the routed matmuls over the worst-case buffers the kernels are given
    (rows padded to whole tiles; what the compiler counts), the rest as useful;
  forward+backward: 3x forward (input and weight gradients each cost a forward), plus the
    (gate and) up matmuls again when the FFN runs in slices recomputed in the backward pass;
  HBM bytes, forward: stored parameters read, gathered weights written and read, routed
    buffers and shared-expert activations written and read, layer input and output;
    forward+backward: 3x forward;
  communication: every collective of `moegen.plan.network`, its bytes over ICI and DCN.
Times are lower bounds: compute = kernel FLOPs / peak, HBM = bytes / bandwidth, ICI and DCN =
bytes / link bandwidth. Token exchanges overlapped in C chunks expose
max(comm, compute) + min(comm, compute) / C - compute of their comm time; every other
collective counts as exposed. bound = max(compute, HBM) + exposed communication.
"""

from __future__ import annotations

from dataclasses import dataclass

from moegen.hardware import Hardware
from moegen.plan.network import NetworkPlan, Transfer
from moegen.plan.step_time import StepTime

# No datasheet figure: a 200 Gb/s NIC per host of 8 chips (v5e/v6e) is ~3 GB/s per chip; we
# assume 6.25 GB/s per chip (a 200 Gb/s NIC per 4 chips) for every TPU generation.
DCN_BYTES_PER_S_PER_CHIP = 6.25e9


@dataclass(frozen=True)
class PassRoofline:
    """One pass (forward, or forward+backward) on one device."""

    name: str
    router_flops: int
    routed_flops: int  # useful: every chosen token copy once
    shared_flops: int
    useful_flops: int
    kernel_flops: int  # as run: routed matmuls over the padded worst-case buffers
    hbm_bytes: int
    ici_bytes: int
    dcn_bytes: int
    # lower-bound seconds on the target (0.0 on targets without figures: cpu)
    compute_s: float
    hbm_s: float
    ici_s: float
    dcn_s: float
    exposed_comm_s: float
    bound_s: float
    bound_by: str  # "compute" | "HBM" (before communication), "" on cpu


@dataclass(frozen=True)
class Roofline:
    peak_flops_per_s: float  # per device
    hbm_bytes_per_s: float
    ici_bytes_per_s: float  # per device, one direction
    dcn_bytes_per_s: float
    passes: tuple[PassRoofline, ...]  # forward, forward+backward
    # not bounds: the passes' estimated seconds as run (moegen.plan.step_time), and the same
    # shape's with no trade (one token chunk, the FFN whole), which a trade's is a multiple of
    step: StepTime = StepTime(0.0, 0.0)
    whole_step: StepTime = StepTime(0.0, 0.0)


def roofline(
    chip: Hardware,
    *,
    local_tokens: int,
    routed_rows: int,
    kernel_rows: int,
    embed_dim: int,
    ffn_dim: int,
    shared_ffn_dim: int,
    num_experts: int,
    gated: bool,
    hbm_forward_bytes: int,
    network: NetworkPlan,
    overlap_chunks: int,
    recompute_flops: int = 0,
    latent_dim: int = 0,
) -> Roofline:
    per_chip = max(chip.devices_per_chip, 1)
    peak = chip.peak_bf16_flops_per_chip / per_chip
    hbm_bw = chip.hbm_bytes_per_s_per_chip / per_chip
    ici_bw = chip.ici_bytes_per_s_per_chip / 2 / per_chip  # datasheet figures are bidirectional
    dcn_bw = DCN_BYTES_PER_S_PER_CHIP / per_chip if chip.platform == "tpu" else 0.0
    matmuls = 3 if gated else 2
    router = 2 * local_tokens * embed_dim * num_experts
    # the routed path: the experts, and the projections into their latent width and back
    routed_dim = latent_dim or embed_dim
    latent = 2 * 2 * local_tokens * embed_dim * latent_dim
    routed = 2 * matmuls * routed_rows * routed_dim * ffn_dim + latent
    shared = 2 * matmuls * local_tokens * embed_dim * shared_ffn_dim
    kernel = 2 * matmuls * kernel_rows * routed_dim * ffn_dim + latent
    work = _Work(router, routed, shared, kernel)
    rates = _Rates(peak, hbm_bw, ici_bw, dcn_bw)
    forward_transfers = tuple(t for t in network.transfers if _in_forward(t.name))
    forward = _Pass("forward", 1, forward_transfers, 0)
    # FFN slices recompute (gate and) up in the backward pass
    training = _Pass("forward+backward", 3, network.transfers, recompute_flops)
    passes = tuple(
        _pass_roofline(p, work, rates, hbm_forward_bytes, overlap_chunks)
        for p in (forward, training)
    )
    return Roofline(peak, hbm_bw, ici_bw, dcn_bw, passes)


@dataclass(frozen=True)
class _Work:
    """FLOPs of one forward pass per device."""

    router: int
    routed: int  # the routed experts' useful FLOPs (latent projections included)
    shared: int
    kernel: int  # what the grouped-matmul kernels run, on worst-case buffers


@dataclass(frozen=True)
class _Rates:
    """Per device: peak FLOP/s, HBM, ICI (one direction) and DCN bytes/s."""

    peak: float
    hbm: float
    ici: float
    dcn: float


@dataclass(frozen=True)
class _Pass:
    name: str
    scale: int  # forward passes' work it does: 1 forward, 3 forward+backward
    transfers: tuple[Transfer, ...]
    extra_flops: int  # recomputed in the backward pass


def _pass_roofline(
    p: _Pass, work: _Work, rates: _Rates, hbm_forward_bytes: int, overlap_chunks: int
) -> PassRoofline:
    ici = sum(t.ici_bytes for t in p.transfers)
    dcn = sum(t.dcn_bytes for t in p.transfers)
    run = p.scale * (work.router + work.kernel + work.shared) + p.extra_flops
    compute_s = run / rates.peak if rates.peak else 0.0
    hbm_s = p.scale * hbm_forward_bytes / rates.hbm if rates.hbm else 0.0
    kernel_s = work.kernel / rates.peak if rates.peak else 0.0
    exposed = sum(
        _exposed_seconds(t, rates.ici, rates.dcn, overlap_chunks, kernel_s) for t in p.transfers
    )
    return PassRoofline(
        name=p.name,
        router_flops=p.scale * work.router,
        routed_flops=p.scale * work.routed,
        shared_flops=p.scale * work.shared,
        useful_flops=p.scale * (work.router + work.routed + work.shared),
        kernel_flops=run,
        hbm_bytes=p.scale * hbm_forward_bytes,
        ici_bytes=ici,
        dcn_bytes=dcn,
        compute_s=compute_s,
        hbm_s=hbm_s,
        ici_s=ici / rates.ici if rates.ici else 0.0,
        dcn_s=dcn / rates.dcn if rates.dcn else 0.0,
        exposed_comm_s=exposed,
        bound_s=max(compute_s, hbm_s) + exposed,
        bound_by=("compute" if compute_s >= hbm_s else "HBM") if rates.peak else "",
    )


def _exposed_seconds(
    transfer: Transfer, ici_bw: float, dcn_bw: float, overlap_chunks: int, kernel_s: float
) -> float:
    """The seconds of a transfer that no matmul hides.

    The routed matmuls of its own pass hide an overlapped ring transfer but one chunk's: the
    forward's matmuls for the forward exchange, the backward's (2x) for it.
    """
    comm_s = (transfer.ici_bytes / ici_bw if ici_bw else 0.0) + (
        transfer.dcn_bytes / dcn_bw if dcn_bw else 0.0
    )
    if overlap_chunks <= 1 or "tokens" not in transfer.name:
        return comm_s
    expert_s = (2 if transfer.name.endswith(", backward") else 1) * kernel_s
    total = max(comm_s, expert_s) + min(comm_s, expert_s) / overlap_chunks
    return max(0.0, total - expert_s)


def _in_forward(transfer_name: str) -> bool:
    """Forward: the fsdp weight gather and the forward token exchange."""
    return transfer_name == "fsdp weight all-gather" or transfer_name.endswith(", forward")
