"""Small integer helpers shared by the validate and plan stages."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

INT32_LIMIT = 2**31


def axes_product(axes: Mapping[str, int], names: Iterable[str]) -> int:
    """Product of the sizes of the named mesh axes (1 for none)."""
    return math.prod(axes[name] for name in names)


def nearest_multiples(value: int, divisor: int) -> list[int]:
    """The positive multiples of `divisor` just below and above `value` that a spec's size
    may hold (below 2**31)."""
    below = value // divisor * divisor
    return [m for m in (below, below + divisor) if 0 < m < INT32_LIMIT and m != value]


def axes_label(names: Iterable[str]) -> str:
    """('data', 'fsdp') -> 'data*fsdp'."""
    return "*".join(names) or "1"


def divisors(value: int) -> list[int]:
    """Every positive divisor of `value`, ascending.

    Pairs (d, value // d) up to the square root: for the schema's sizes (< 2**31) that is at
    most 46,341 steps, where a scan up to the value itself took minutes."""
    low, high = [], []
    for d in range(1, math.isqrt(value) + 1):
        if value % d == 0:
            low.append(d)
            if d * d != value:
                high.append(value // d)
    return low + high[::-1]


# Messages list at most this many valid values; a size can have over a thousand divisors.
MAX_LISTED = 8


def listed(values: list[int], near: int) -> str:
    """Ascending `values` as "a, b, c"; when there are more than MAX_LISTED, the ones nearest
    `near` (the value written), and how many there are."""
    if len(values) <= MAX_LISTED:
        return ", ".join(map(str, values))
    nearest = sorted(sorted(values, key=lambda v: (abs(v - near), v))[:MAX_LISTED])
    return f"{', '.join(map(str, nearest))} (the {MAX_LISTED} nearest {near} of {len(values)})"


def ffn_slice_problem(ffn_dim: int, chunks: int, kernel: str, width_multiple: int) -> str:
    """Why an FFN of `ffn_dim` columns cannot run in `chunks` slices ('' when it can): the
    slices must be equal, and whole multiples of the kernel's block width where a slice is a
    block of its calls (megablox: the output width of the gate and up calls and the
    contraction width of down, in lane tiles)."""
    if ffn_dim % chunks:
        return f"ffn_dim {ffn_dim} does not split into {chunks} equal slices"
    if (ffn_dim // chunks) % width_multiple:
        return (
            f"slices of {ffn_dim // chunks} columns are not whole {width_multiple}-lane tiles "
            f"for {kernel}"
        )
    return ""
