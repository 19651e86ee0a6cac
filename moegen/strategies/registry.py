"""The table of expert-parallel strategies, by the name a spec's parallelism.experts gives,
and the rules that hold between a strategy and the rest of the spec.

The stages ask it what a strategy does instead of comparing names: validation asks
`strategy_is_registered` first, then runs `STRATEGY_RULES`; the plan counts rows,
bytes and buffers by `strategy(name)`, and `moegen schema` writes the names into the JSON
schema. A strategy is added by one module beside these, one line below and its template.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec, choice_message
from moegen.strategies.base import Strategy, StrategyRule
from moegen.strategies.ragged_all_to_all import RAGGED_ALL_TO_ALL
from moegen.strategies.replicated import REPLICATED
from moegen.strategies.ring_of_experts import RING_OF_EXPERTS

# in the order the spec's schema lists them; the first is the schema's default
STRATEGIES: Mapping[str, Strategy] = MappingProxyType(
    {s.name: s for s in (REPLICATED, RAGGED_ALL_TO_ALL, RING_OF_EXPERTS)}
)
STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGIES)


def strategy(name: str) -> Strategy:
    """The strategy a validated spec names (KeyError for one strategy_is_registered refuses)."""
    return STRATEGIES[name]


def strategy_is_registered(loaded: LoadedSpec) -> list[Diagnostic]:
    """parallelism.experts names a strategy of the table, or auto (left to `moegen tune`)."""
    name = loaded.spec.parallelism.experts
    if name in STRATEGIES or name == "auto":
        return []
    message = choice_message(name, [*STRATEGY_NAMES, "auto"])
    return [loaded.diagnostic(("parallelism", "experts"), message)]


def sharding_strategies() -> tuple[str, ...]:
    """The names of the strategies that shard experts over an expert axis, in table order."""
    return tuple(name for name, s in STRATEGIES.items() if s.shards_experts)


def overlapping_strategies() -> tuple[str, ...]:
    """The names of the strategies whose transfers overlap_chunks can hide."""
    return tuple(name for name, s in STRATEGIES.items() if s.overlaps)


def expert_axis_matches_strategy(loaded: LoadedSpec) -> list[Diagnostic]:
    """Experts are sharded over the `expert` axis exactly when a strategy moves tokens to them."""
    spec = loaded.spec
    chosen = strategy(spec.parallelism.experts)
    has_axis = "expert" in spec.mesh.axes
    size = spec.mesh.axes.get("expert", 0)
    if not chosen.shards_experts and has_axis:
        return [
            loaded.diagnostic(
                ("mesh", "axes", "expert"),
                at_key=True,
                message=f"an expert axis shards experts, but parallelism.experts is "
                f"{chosen.name}; set it to {' or '.join(sharding_strategies())}"
                + ("; or remove the axis (of size 1, it shards nothing)" if size == 1 else ""),
            )
        ]
    if chosen.shards_experts and not has_axis:
        return [
            loaded.diagnostic(
                ("parallelism", "experts"),
                f"{chosen.name} shards experts over a mesh axis named expert; add one to mesh.axes",
            )
        ]
    return []


# every strategy's own rules, then those between a strategy and the rest of the spec
STRATEGY_RULES: tuple[StrategyRule, ...] = (
    *(rule for s in STRATEGIES.values() for rule in s.rules),
    expert_axis_matches_strategy,
)
