"""Small integer helpers shared by the validate and plan stages."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

INT32_LIMIT = 2**31


def axes_product(axes: Mapping[str, int], names: Iterable[str]) -> int:
    """Product of the sizes of the named mesh axes (1 for none)."""
    return math.prod(axes[name] for name in names)


def nearest_multiples(value: int, divisor: int) -> list[int]:
    """The positive multiples of `divisor` just below and above `value`."""
    below = value // divisor * divisor
    return [m for m in (below, below + divisor) if m > 0 and m != value]


def axes_label(names: Iterable[str]) -> str:
    """('data', 'fsdp') -> 'data*fsdp'."""
    return "*".join(names) or "1"
