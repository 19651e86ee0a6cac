"""The shrunken twin: the same spec with small dimensions, cheap enough to run on CPU.

Everything that decides the code path is kept (mesh axes and sizes, experts, top-k,
router options, strategy, kernel, FFN slices and gate/up side by side as the full plan runs
them); only the sizes that merely scale the work shrink, and the twin is validated by the same
rules as the spec itself (moegen.variants). One exception: a kernel that cannot run on CPU
names its substitute in the registry (moegen.kernels: the GPU-only kernels' twins run the
portable grouped matmul), so everything but the kernel call itself is checked on CPU.

The twins are derived from the full-size plan, once: `twins_of` gives the specs to run and
`plan_twin` plans each one (kernels interpreted on CPU), the only time a twin is planned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from moegen.kernels import LANES, kernel
from moegen.load import FieldPath, LoadedSpec
from moegen.plan import MAIN_SHAPE, Plan, make_plan
from moegen.sizes import axes_product
from moegen.spec import ShapeVariant
from moegen.variants import derive

TWIN_SEQUENCES_PER_SHARD = 2
TWIN_SEQ_LEN = 5  # per sequence shard; 10 tokens per device: routed rows 10*top_k, ragged
# against 32-row tiles
TWIN_MIN_EMBED = 16
TWIN_FFN = 24  # differs from embed so that a transposed weight cannot go unnoticed
TWIN_SHARED_FFN = 20  # differs from both, for the same reason
TWIN_LATENT = 12  # the experts' latent width, where they have one: differs from the others
# float32 twin: the bar. Low-precision twins compare bf16 compute to a float32
# reference, so they only catch gross errors (a wrong path, not rounding). Measured on drawn
# cpu specs in bfloat16 compute (the worst relative error of any output or gradient, the
# largest 1% of element differences set aside, moegen.verify.reference.parity.set_aside_share):
# 105 cases of every activation, median 6.1e-3, worst 2.1e-2; 55 cases of ReLU with
# input weighting, where rounding flips the most ReLU terms, median 1.2e-2, worst 4.9e-2;
# hold-out (another seed, 75 ReLU cases, after the bound was chosen): median 6.2e-3, worst
# 5.8e-2. Nothing set aside, that last population's worst is 8.1e-2. On real layers
# (bench/TWIN_TOLERANCE.md, python -m bench.twin_tolerance): worst 1.3e-2, and 5.9e-2 for
# ReLU with input weighting.
TOLERANCES = {"float32": 1e-5, "bfloat16": 1e-1}


class TwinSpec(NamedTuple):
    label: str  # names the step: "twin parity (LABEL)"
    loaded: LoadedSpec
    tolerance: float  # relative error allowed against the float32 dense reference


def twins_of(loaded: LoadedSpec, plan: Plan) -> list[TwinSpec]:
    """The twins verification runs: float32, and the spec's own dtypes when they differ."""
    twins = [TwinSpec("float32", twin_of(loaded, plan, dtype="float32"), TOLERANCES["float32"])]
    dtypes = loaded.spec.dtypes
    if (dtypes.params, dtypes.compute) != ("float32", "float32"):
        label = f"{dtypes.compute} compute, {dtypes.params} params"
        worst = max(TOLERANCES[dtypes.params], TOLERANCES[dtypes.compute])
        twins.append(TwinSpec(label, twin_of(loaded, plan, dtype=None), worst))
    return twins


def plan_twin(twin: LoadedSpec, full: Plan) -> Plan:
    """The plan a twin runs (Pallas kernels interpreted), checked to keep the full layer's
    gate/up layout: a twin that took another path would prove nothing about this one."""
    # each variant's twin slices its FFN and chunks its tokens as that variant's full-size
    # plan does (pinned or chosen: the small twin would fit whole), and each shape runs its
    # forward pass whole or in slices as its full-size plan does (the twin's ledger may differ)
    memory = {
        v.name: {"ffn_chunks": v.plan.ffn.chunks, "token_chunks": v.plan.experts.token_chunks}
        for v in full.variants
    }
    pinned: dict[str, Any] = {"variant_memory": memory} if memory else {}
    shapes = [(MAIN_SHAPE, full), *((v.name, v.plan) for v in full.variants)]
    whole = {name: shape.ffn.whole_forward for name, shape in shapes if shape.ffn.chunks > 1}
    if whole:  # only FFN slices choose how their forward pass runs
        pinned["whole_forward"] = whole
    # the combine weights where the full-size layer applies them (the twin's widths differ)
    pinned["weights_on_hidden"] = full.experts.combine.weights_on_hidden
    plan = make_plan(twin, interpret=True, **pinned)
    if plan.ffn.fuses_gate_up != full.ffn.fuses_gate_up:
        raise AssertionError("the twin must run gate and up as the full-size layer does")
    if plan.experts.combine.weights_on_hidden != full.experts.combine.weights_on_hidden:
        raise AssertionError(
            "the twin must combine the experts' outputs as the full-size layer does"
        )
    return plan


def twin_of(
    loaded: LoadedSpec, plan: Plan | None = None, *, dtype: str | None = "float32"
) -> LoadedSpec:
    """The twin of a validated spec whose full-size plan is `plan` (planned here when not
    given); `dtype` overrides both dtypes (None keeps the spec's)."""
    return derive(loaded, twin_overrides(loaded, plan or make_plan(loaded), dtype))


def twin_variants(
    variants: Mapping[str, ShapeVariant],
    shards: int,
    sequence_shards: int = 1,
    token_chunks: int = 1,
) -> Mapping[str, ShapeVariant]:
    """The twin's shape variants: as small as its main shape, each a distinct sequence length
    (moe_layer dispatches on the shape), split evenly over the sequence axis, a device's tokens
    into the spec's token chunks."""
    # the smallest step of a device's sequence length that keeps its tokens splitting
    step = token_chunks // math.gcd(TWIN_SEQUENCES_PER_SHARD, token_chunks)
    return MappingProxyType(
        {
            name: ShapeVariant(
                batch=shards * TWIN_SEQUENCES_PER_SHARD,
                seq_len=(twin_seq_len(token_chunks) + i * step) * sequence_shards,
            )
            for i, name in enumerate(variants, start=1)
        }
    )


def twin_copies(loaded: LoadedSpec, full: Plan, seq_len: int) -> int:
    """A capacity's count for a twin of `seq_len`: in proportion to the tokens it counts over
    (one sequence's, or a device's), so that the twin drops too."""
    spec = loaded.spec
    tokens = seq_len  # one sequence's
    if spec.router.capacity.per == "device":
        tokens = TWIN_SEQUENCES_PER_SHARD * seq_len // spec.sequence_shards
    rows = tokens * spec.router.top_k
    return max(1, -(-spec.router.capacity.copies * rows // full.router.group_rows))


def twin_seq_len(token_chunks: int) -> int:
    """A device's sequence length in the twin: TWIN_SEQ_LEN, stretched so that its tokens split
    into the spec's token chunks."""
    tokens = TWIN_SEQUENCES_PER_SHARD * TWIN_SEQ_LEN
    return TWIN_SEQ_LEN * (token_chunks // math.gcd(tokens, token_chunks))


def _twin_widths(latent_dim: int | None, fsdp: int, chunk_unit: int) -> tuple[int, int | None]:
    """The twin's embed_dim and latent_dim (None where the spec has none): each splits over
    fsdp, and the width the tokens travel to the experts in (the latent one, where there is
    one) into the overlap chunks, whole blocks of the kernel's calls (megablox's lane tiles)."""
    travels = math.lcm(fsdp, chunk_unit)
    if latent_dim is None:
        return travels * -(-TWIN_MIN_EMBED // travels), None
    embed = fsdp * -(-TWIN_MIN_EMBED // fsdp)
    latent = travels * -(-TWIN_LATENT // travels)
    return embed, latent + travels if latent == embed else latent


def twin_overrides(loaded: LoadedSpec, full: Plan, dtype: str | None) -> dict[FieldPath, Any]:
    """The fields a twin changes, and their values."""
    spec = loaded.spec
    fsdp = spec.mesh.axes.get("fsdp", 1)
    chunks = spec.parallelism.overlap_chunks
    chosen = kernel(spec.target.kernel)
    chunk_unit = chunks * (chosen.width_multiple if chunks > 1 else 1)
    embed, latent = _twin_widths(spec.layer.latent_dim, fsdp, chunk_unit)
    shards = axes_product(spec.mesh.axes, spec.batch_axes)
    # FFN slices as the full plan runs them (pinned or chosen), whole blocks of the kernel; gate
    # and up side by side as the full plan runs them (whole lanes per slice when it does)
    # and each tensor shard holds its equal part of every FFN width (that part is what slices)
    ffn_chunks = full.ffn.chunks
    # token chunks as the full plans run them (pinned or chosen: the small twin would fit
    # whole); every twin shape's tokens split into each shape's count (their multiple)
    token_chunks = full.experts.token_chunks
    twin_chunks = math.lcm(token_chunks, *(v.plan.experts.token_chunks for v in full.variants))
    tensor = spec.tensor_shards
    ffn_unit = ffn_chunks * (chosen.width_multiple if ffn_chunks > 1 else 1)
    if full.ffn.fuses_gate_up:
        ffn_unit = math.lcm(ffn_unit, ffn_chunks * LANES)
    ffn_unit *= tensor
    ffn = ffn_unit * -(-TWIN_FFN // ffn_unit)
    while ffn in (embed, latent):  # a transposed weight must not go unnoticed
        ffn += ffn_unit
    # whole shared experts where the router weighs each (layer.shared_experts, 1 otherwise)
    shared_unit = math.lcm(tensor, spec.layer.shared_experts)
    shared = shared_unit * -(-TWIN_SHARED_FFN // shared_unit)
    overrides: dict[FieldPath, Any] = {
        ("layer", "embed_dim"): embed,
        ("layer", "ffn_dim"): ffn,
        ("layer", "shared_ffn_dim"): shared if spec.layer.shared_ffn_dim else None,
        ("layer", "latent_dim"): latent,
        ("shapes", "batch"): shards * TWIN_SEQUENCES_PER_SHARD,
        ("shapes", "seq_len"): twin_seq_len(twin_chunks) * spec.sequence_shards,
        ("memory", "ffn_chunks"): ffn_chunks,
        ("memory", "token_chunks"): token_chunks,
    }
    if spec.router.capacity is not None and spec.router.capacity.copies is not None:
        copies = twin_copies(loaded, full, overrides[("shapes", "seq_len")])
        overrides[("router", "capacity", "copies")] = copies
    if spec.shapes.variants:
        overrides[("shapes", "variants")] = twin_variants(
            spec.shapes.variants, shards, spec.sequence_shards, twin_chunks
        )
    # the kernel's substitute on CPU (another kernel where it runs on GPUs only, the same
    # module and call signature) or its small tiles
    overrides.update(chosen.twin_overrides)
    if dtype is not None:
        overrides[("dtypes", "params")] = dtype
        overrides[("dtypes", "compute")] = dtype
        overrides[("memory", "weight_casts")] = "once"  # one dtype: nothing is cast
    return overrides
