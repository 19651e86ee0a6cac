"""The plans of a spec's shape variants (`shapes.variants`): the same layer and parameters,
other static input shapes. Each variant is planned whole, as the spec with its batch and
seq_len (every shape-dependent decision: local tokens, routed rows, capacity, buffers,
tiles, FFN slices, costs and memory); the module shares what does not depend on the shape
(init_params, PARAM_SHAPES, PARAM_SPECS) and suffixes what does with the variant's name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from moegen.load import LoadedSpec, shape_variants
from moegen.plan.model import Plan, Trade, VariantPlan


def variant_plans(
    loaded: LoadedSpec,
    plan_of: Callable[[LoadedSpec, str, Trade], Plan],
    memory: Mapping[str, Mapping[str, int]] | None = None,
) -> tuple[VariantPlan, ...]:
    """Each variant of `loaded` planned by `plan_of` (the variant, its name, its trade: the
    one its memory section pins, with `memory`'s pins (ffn_chunks, token_chunks) over it: the
    twin runs each variant as its full-size plan does)."""
    out = []
    for name, variant in shape_variants(loaded):
        trade = Trade.of(variant.spec.memory)
        if memory and name in memory:
            trade = replace(trade, **memory[name])
        plan = plan_of(variant, name, trade)
        out.append(
            VariantPlan(
                name=name,
                function=f"moe_layer_{name}",
                suffix=f"_{name}",
                constant_suffix=f"_{name.upper()}",
                batch=plan.batch,
                seq_len=plan.seq_len,
                input_shape=(plan.batch, plan.seq_len, plan.embed_dim),
                plan=plan,
            )
        )
    return tuple(out)
