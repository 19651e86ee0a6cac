"""Stage 2, validate: rules that relate several fields of a schema-valid spec.

Each rule is a named function `LoadedSpec -> list[Diagnostic]`, registered in `RULES`.
Every rule runs on every spec, so a user sees all violations at once. Messages say what
is wrong, the values involved, and the nearest valid value where one exists.
"""

from __future__ import annotations

from moegen.diagnostics import Diagnostic, SpecError
from moegen.kernels import KERNEL_RULES, kernel_is_registered
from moegen.load import LoadedSpec
from moegen.strategies import STRATEGY_RULES, strategy_is_registered
from moegen.validate.activation import ACTIVATION_RULES
from moegen.validate.bounds import (
    chunks_within_limit,
    experts_within_limit,
    indices_fit_int32,
    parameters_reasonably_sized,
)
from moegen.validate.latent import LATENT_RULES
from moegen.validate.memory import MEMORY_RULES
from moegen.validate.mesh_roles import MESH_ROLE_RULES
from moegen.validate.output_norms import OUTPUT_NORM_RULES
from moegen.validate.replicas import REPLICA_RULES
from moegen.validate.routing import ROUTING_RULES
from moegen.validate.rules import (
    Rule,
    batch_axes_are_mesh_axes,
    batch_divisible_by_batch_axes,
    data_parallel_axes_shard_batch,
    embed_divisible_by_fsdp,
    experts_divisible_by_expert_axis,
    mesh_fits_cpu_target,
    mesh_matches_topology,
    overlap_chunks_fit,
    single_expert_not_renormalized,
    top_k_within_experts,
    topology_matches_hardware,
)
from moegen.validate.shape_variants import SHAPE_VARIANT_RULES, variant_shapes_obey_the_rules
from moegen.validate.shared_weighting import SHARED_WEIGHTING_RULES
from moegen.validate.slices import SLICE_RULES

SHAPE_RULES: tuple[Rule, ...] = (
    top_k_within_experts,
    batch_axes_are_mesh_axes,
    data_parallel_axes_shard_batch,
    batch_divisible_by_batch_axes,
    embed_divisible_by_fsdp,
    single_expert_not_renormalized,
    *STRATEGY_RULES,
    experts_divisible_by_expert_axis,
    overlap_chunks_fit,
    indices_fit_int32,
    parameters_reasonably_sized,
    experts_within_limit,
    chunks_within_limit,
    topology_matches_hardware,
    mesh_matches_topology,
    mesh_fits_cpu_target,
    *MESH_ROLE_RULES,
    *ROUTING_RULES,
    *SHARED_WEIGHTING_RULES,
    *REPLICA_RULES,
    *ACTIVATION_RULES,
    *LATENT_RULES,
    *OUTPUT_NORM_RULES,
    *SLICE_RULES,
    *MEMORY_RULES,
    *KERNEL_RULES,  # each kernel's own, from the registry
)
# Every rule above runs on each shape variant too, reported at the variant's lines.
RULES: tuple[Rule, ...] = (
    *SHAPE_RULES,
    *SHAPE_VARIANT_RULES,
    variant_shapes_obey_the_rules(lambda loaded: [d for r in SHAPE_RULES for d in r(loaded)]),
)


def check_rules(loaded: LoadedSpec) -> list[Diagnostic]:
    """Run every rule; return all diagnostics (empty when the spec is valid). A kernel or a
    strategy its registry does not hold is reported alone, like a schema error: the rules ask
    the registries about them."""
    unknown = kernel_is_registered(loaded) + strategy_is_registered(loaded)
    return unknown or [d for rule in RULES for d in rule(loaded)]


def choices_left_to_tune(loaded: LoadedSpec) -> list[Diagnostic]:
    """`auto` marks a choice `moegen tune` makes; nothing else can build such a spec."""
    return [
        loaded.diagnostic(
            path,
            f"auto is chosen by `moegen tune {loaded.source.display}`, which compiles the "
            "candidates and writes the best here; run it, or write a value",
        )
        for path in loaded.spec.auto_fields()
    ]


def validate(loaded: LoadedSpec) -> LoadedSpec:
    """Raise SpecError listing every violated rule; return the spec unchanged otherwise.

    A spec with `auto` choices is reported for those alone: the other rules need values.
    """
    diagnostics = choices_left_to_tune(loaded) or check_rules(loaded)
    if diagnostics:
        raise SpecError(diagnostics)
    return loaded
