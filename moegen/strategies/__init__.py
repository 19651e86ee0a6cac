"""The expert-parallel strategies (parallelism.experts): one module each, one registry.

The logic lives in moegen.strategies.registry, moegen.strategies.base and each strategy's
module; this package face only re-exports.
"""

from __future__ import annotations

from moegen.strategies.base import RowRequest, Strategy, StrategyRule, TrafficRequest
from moegen.strategies.registry import (
    STRATEGIES,
    STRATEGY_NAMES,
    STRATEGY_RULES,
    overlapping_strategies,
    sharding_strategies,
    strategy,
    strategy_is_registered,
)

__all__ = [
    "STRATEGIES",
    "STRATEGY_NAMES",
    "STRATEGY_RULES",
    "RowRequest",
    "Strategy",
    "StrategyRule",
    "TrafficRequest",
    "overlapping_strategies",
    "sharding_strategies",
    "strategy",
    "strategy_is_registered",
]
