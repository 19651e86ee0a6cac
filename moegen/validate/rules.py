"""The rules of stage 2 that relate the layer, the mesh, the kernel and the target: batch and
mesh axes, experts over the expert axis, overlap chunks, topology and tiles. Each is a function
`LoadedSpec -> list[Diagnostic]`, registered in `moegen.validate.RULES`."""

from __future__ import annotations

from collections.abc import Callable

from moegen.diagnostics import Diagnostic
from moegen.hardware import hardware
from moegen.kernels import kernel
from moegen.load import LoadedSpec
from moegen.sizes import axes_label, axes_product, nearest_multiples
from moegen.spec import NON_BATCH_AXES
from moegen.strategies import overlapping_strategies, strategy
from moegen.validate.bounds import MAX_CHUNKS, known_batch_axes

Rule = Callable[[LoadedSpec], list[Diagnostic]]

# Fake host devices XLA:CPU can run the twin on without the verify step crawling.
MAX_CPU_DEVICES = 256


def top_k_within_experts(loaded: LoadedSpec) -> list[Diagnostic]:
    """A token cannot pick more distinct experts than exist (Tutel silently clamps)."""
    spec = loaded.spec
    if spec.router.top_k <= spec.layer.num_experts:
        return []
    return [
        loaded.diagnostic(
            ("router", "top_k"),
            f"must be <= layer.num_experts ({spec.layer.num_experts}), got {spec.router.top_k}",
        )
    ]


def batch_axes_are_mesh_axes(loaded: LoadedSpec) -> list[Diagnostic]:
    """Batch axes name mesh axes, each at most once (an axis used twice double-counts)."""
    names = loaded.spec.mesh.batch_axes or []
    out, seen = [], set()
    for i, name in enumerate(names):
        path = ("mesh", "batch_axes", i)
        if name not in loaded.spec.mesh.axes:
            known = ", ".join(loaded.spec.mesh.axes)
            out.append(loaded.diagnostic(path, f"'{name}' is not a mesh axis (mesh.axes: {known})"))
        elif name in seen:
            out.append(loaded.diagnostic(path, f"'{name}' is listed twice"))
        seen.add(name)
    return out


def data_parallel_axes_shard_batch(loaded: LoadedSpec) -> list[Diagnostic]:
    """A mesh axis that does not shard the batch repeats the same work on each of its devices.

    That holds for the expert axis too: it shards tokens as well as experts (counted once).
    """
    listed = loaded.spec.mesh.batch_axes
    if listed is None:
        return []
    axes = loaded.spec.mesh.axes
    missing = [axis for axis in axes if axis not in listed and axis not in NON_BATCH_AXES]
    if not missing:
        return []
    suggestion = list(dict.fromkeys([*(a for a in listed if a in axes), *missing]))
    return [
        loaded.diagnostic(
            ("mesh", "batch_axes"),
            f"mesh axes {missing} must shard the batch too; write {suggestion}",
        )
    ]


def batch_divisible_by_batch_axes(loaded: LoadedSpec) -> list[Diagnostic]:
    """Every device must receive the same whole number of sequences."""
    spec = loaded.spec
    axes = known_batch_axes(loaded)
    shards = axes_product(spec.mesh.axes, axes)
    if spec.shapes.batch % shards == 0:
        return []
    nearest = " or ".join(map(str, nearest_multiples(spec.shapes.batch, shards)))
    return [
        loaded.diagnostic(
            ("shapes", "batch"),
            f"{spec.shapes.batch} is not divisible by {axes_label(axes)} = {shards}; "
            f"nearest valid: {nearest}",
        )
    ]


def embed_divisible_by_fsdp(loaded: LoadedSpec) -> list[Diagnostic]:
    """FSDP shards every parameter along embed_dim, so each shard must be whole."""
    spec = loaded.spec
    fsdp = spec.mesh.axes.get("fsdp", 1)
    if spec.layer.embed_dim % fsdp == 0:
        return []
    nearest = " or ".join(map(str, nearest_multiples(spec.layer.embed_dim, fsdp)))
    return [
        loaded.diagnostic(
            ("layer", "embed_dim"),
            f"{spec.layer.embed_dim} is not divisible by fsdp = {fsdp} "
            f"(parameters are sharded along embed_dim); nearest valid: {nearest}",
        )
    ]


def single_expert_not_renormalized(loaded: LoadedSpec) -> list[Diagnostic]:
    """Renormalising one weight makes it 1.0: the router would never receive a gradient."""
    router = loaded.spec.router
    if not (router.top_k == 1 and router.renormalize):
        return []
    return [
        loaded.diagnostic(
            ("router", "renormalize"),
            "with top_k = 1 the renormalised weight is always 1.0 and the router gets zero "
            "gradient; set renormalize: false",
        )
    ]


def experts_divisible_by_expert_axis(loaded: LoadedSpec) -> list[Diagnostic]:
    """Every device of the expert axis holds the same number of whole experts."""
    spec = loaded.spec
    shards = spec.mesh.axes.get("expert", 1)
    if spec.layer.num_experts % shards == 0:
        return []
    nearest = " or ".join(map(str, nearest_multiples(spec.layer.num_experts, shards)))
    return [
        loaded.diagnostic(
            ("layer", "num_experts"),
            f"{spec.layer.num_experts} experts do not split over expert = {shards} devices; "
            f"nearest valid: {nearest}",
        )
    ]


def overlap_chunks_fit(loaded: LoadedSpec) -> list[Diagnostic]:
    """Overlap chunks split the embedding of a strategy's transfers into whole, aligned parts.

    Only a strategy whose transfers can overlap (the registry says which) has them; each chunk
    must hold the same number of columns (MaxText's 7 chunks over 512 silently drop one), and
    where a chunk is a contraction block of the kernel (megablox's 128-lane tiles) a whole
    number of its blocks.
    """
    spec = loaded.spec
    chunks = spec.parallelism.overlap_chunks
    if chunks == 1:
        return []
    path = ("parallelism", "overlap_chunks")
    if not strategy(spec.parallelism.experts).overlaps:
        overlapping = " or ".join(overlapping_strategies())
        return [
            loaded.diagnostic(
                path,
                f"{chunks} chunks overlap the token all-gather of {overlapping}; "
                f"experts: {spec.parallelism.experts} has none to overlap; set 1",
            )
        ]
    # the chunks split the width the tokens travel in: the experts' latent width, if any
    embed = spec.layer.routed_dim
    width = spec.layer.routed_field
    # a kernel whose chunk is a contraction block holds chunks to its block width
    lanes = kernel(spec.target.kernel).width_multiple

    def fits(count: int) -> bool:
        return embed % count == 0 and (embed // count) % lanes == 0

    if fits(chunks):
        return []
    valid = [str(c) for c in range(2, MAX_CHUNKS + 1) if fits(c)][:8]
    options = (
        f"valid chunk counts: {', '.join(valid)}, or 1 (no overlap)"
        if valid
        else "set 1 (no overlap)"
    )
    if embed % chunks:
        problem = f"{width} {embed} does not split into {chunks} equal chunks"
    else:
        problem = (
            f"chunks of {embed // chunks} columns are not whole {lanes}-lane tiles "
            f"for the {spec.target.kernel} kernel"
        )
    return [loaded.diagnostic(path, f"{problem}; {options}")]


def topology_matches_hardware(loaded: LoadedSpec) -> list[Diagnostic]:
    """A TPU target names one of its generation's slice shapes; cpu has none."""
    target = loaded.spec.target
    chip = hardware(target.hardware)
    if chip.platform == "cpu":
        if target.topology is None:
            return []
        return [
            loaded.diagnostic(("target", "topology"), "target cpu takes no topology; remove it")
        ]
    if target.topology is None:
        return [
            loaded.diagnostic(
                ("target",),
                at_key=True,
                message=f"{target.hardware} needs target.topology, one of: "
                + ", ".join(chip.topologies),
            )
        ]
    if target.topology in chip.topologies:
        return []
    devices = axes_product(loaded.spec.mesh.axes, loaded.spec.mesh.axes)
    per_slice = devices // target.slices
    matching = [t for t in chip.topologies if chip.devices(t) == per_slice]
    slices = f" ({target.slices} slices of {per_slice})" if target.slices > 1 else ""
    hint = f"; with {devices} devices{slices}: {', '.join(matching)}" if matching else ""
    return [
        loaded.diagnostic(
            ("target", "topology"),
            f"{target.topology!r} is not a {target.hardware} slice; valid: "
            f"{', '.join(chip.topologies)}{hint}",
        )
    ]


def mesh_matches_topology(loaded: LoadedSpec) -> list[Diagnostic]:
    """The mesh spans the whole slice: one mesh position per device."""
    target = loaded.spec.target
    chip = hardware(target.hardware)
    if chip.platform == "cpu" or target.topology not in chip.topologies:
        return []
    devices = axes_product(loaded.spec.mesh.axes, loaded.spec.mesh.axes)
    want = chip.devices(target.topology) * target.slices
    if devices == want:
        return []
    per_chip = f" ({chip.devices_per_chip} per chip)" if chip.devices_per_chip > 1 else ""
    slices = f" x {target.slices} slices" if target.slices > 1 else ""
    return [
        loaded.diagnostic(
            ("mesh", "axes"),
            at_key=True,
            message=f"the mesh has {devices} devices but {target.hardware} {target.topology}"
            f"{slices} has {want}{per_chip}; make the product of the axis sizes {want}",
        )
    ]


def mesh_fits_cpu_target(loaded: LoadedSpec) -> list[Diagnostic]:
    """The cpu target runs on fake host devices; keep their count tractable."""
    spec = loaded.spec
    devices = axes_product(spec.mesh.axes, spec.mesh.axes)
    if spec.target.hardware != "cpu" or devices <= MAX_CPU_DEVICES:
        return []
    return [
        loaded.diagnostic(
            ("mesh", "axes"),
            at_key=True,
            message=f"{devices} devices; target cpu runs at most {MAX_CPU_DEVICES} host devices",
        )
    ]
