"""How one parameter of a generated module is read from checkpoint tensors.

A parameter has named axes (PARAM_AXES: router is `de`, [EMBED_DIM, NUM_EXPERTS]); a
`Source` says how the axes of the checkpoint tensor it comes from relate to them, so that the
region of the parameter one device holds becomes the region of the checkpoint tensor to read:

- the same axes in another order (a transpose): `Source("gate.weight", ("e", "d"))`;
- a size-one axis (`"1"`): Qwen2-MoE's shared-expert gate [1, D] -> [D];
- two axes merged into one, major first (`"ef"`): DBRX's w1 [E * F, D];
- one tensor per expert (`{i}` in the key): Mixtral's `experts.{i}.w1.weight` [F, D];
- one part of an axis that holds several side by side (`Split`): gate and up in a fused
  [E, 2F, D] (chunked: up starts at F) or gpt-oss's [E, D, 2F] (interleaved: gate at even
  columns, up at odd ones).

Only the region is read (`fetch(key, index)` is given slices of the checkpoint tensor), never
the whole tensor unless the region is the whole parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

# The axes of every parameter a generated module may have: e experts, d embed, f FFN width,
# s shared-expert width.
PARAM_AXES: Mapping[str, str] = {
    "router": "de",
    "router_bias": "e",
    "routing_bias": "e",
    "w_gate": "edf",
    "w_up": "edf",
    "w_down": "efd",
    "b_gate": "ef",
    "b_up": "ef",
    "b_down": "ed",
    "shared_gate": "ds",
    "shared_up": "ds",
    "shared_down": "sd",
    "shared_expert_gate": "d",
    "shared_b_gate": "s",
    "shared_b_up": "s",
    "shared_b_down": "d",
    "output_norm": "d",
    "expert_output_norm": "ed",
    "shared_output_norm": "d",
}

AXIS_NAMES = {"e": "NUM_EXPERTS", "d": "EMBED_DIM", "f": "FFN_DIM", "s": "SHARED_FFN_DIM"}

Region = Mapping[str, tuple[int, int]]  # axis -> [start, stop)
# A source key that starts with this is relative to the decoder layer, not to the MoE block:
# A.X-K1's checkpoints keep the block's output norm beside it (`post_mlp_layernorm.weight`).
IN_LAYER = "../"


def full_key(block: str, key: str) -> str:
    """The checkpoint key of `key`, relative to the MoE block whose prefix is `block` (e.g.
    "model.layers.3.mlp."), or to its decoder layer where it starts with IN_LAYER."""
    if key.startswith(IN_LAYER):
        return block[: block.rstrip(".").rfind(".") + 1] + key.removeprefix(IN_LAYER)
    return block + key


Fetch = Callable[[str, tuple[slice, ...]], np.ndarray]


@dataclass(frozen=True)
class Split:
    """The parameter's `axis` is part `part` of `parts` laid side by side along one source
    axis: chunked (part k at [k * size, (k + 1) * size)) or interleaved (part k at k, k +
    parts, ...)."""

    axis: str
    part: int
    parts: int = 2
    interleaved: bool = False

    def index(self, size: int, start: int, stop: int) -> slice:
        if self.interleaved:
            return slice(
                self.parts * start + self.part, self.parts * (stop - 1) + self.part + 1, self.parts
            )
        return slice(self.part * size + start, self.part * size + stop)


@dataclass(frozen=True)
class Source:
    """A checkpoint tensor (its key relative to the MoE block) read as a parameter."""

    key: str  # `{i}`: one tensor per expert, i = 0 .. NUM_EXPERTS - 1
    axes: tuple[str, ...]  # per source axis: a parameter axis, "1", or two merged (major first)
    split: Split | None = None

    @property
    def per_expert(self) -> bool:
        return "{i}" in self.key

    def key_of(self, expert: int | None = None) -> str:
        return self.key.format(i=expert) if self.per_expert else self.key

    def shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The shape of one source tensor (one expert's, for per-expert keys)."""
        out = []
        for axis in self.axes:
            if axis == "1":
                out.append(1)
            elif len(axis) == 2:
                out.append(sizes[axis[0]] * sizes[axis[1]])
            elif self.split is not None and axis == self.split.axis:
                out.append(sizes[axis] * self.split.parts)
            else:
                out.append(sizes[axis])
        return tuple(out)

    def shape_text(self) -> str:
        """The expected shape in the module's constants: [NUM_EXPERTS, 2 * FFN_DIM, EMBED_DIM]."""
        out = []
        for axis in self.axes:
            if axis == "1":
                out.append("1")
            elif len(axis) == 2:
                out.append(f"{AXIS_NAMES[axis[0]]} * {AXIS_NAMES[axis[1]]}")
            elif self.split is not None and axis == self.split.axis:
                out.append(f"{self.split.parts} * {AXIS_NAMES[axis]}")
            else:
                out.append(AXIS_NAMES[axis])
        return "[" + ", ".join(out) + "]"

    def read(
        self, fetch: Fetch, region: Region, sizes: Mapping[str, int], out_axes: str
    ) -> np.ndarray:
        """The parameter's `region`, in the parameter's axis order `out_axes`."""
        if self.per_expert:
            first, stop = region["e"]
            blocks = [
                self._read_one(fetch, self.key_of(e), region, sizes)[0] for e in range(first, stop)
            ]
            names = ["e", *self._names()]
            block = np.stack(blocks)
        else:
            block, names = self._read_one(fetch, self.key, region, sizes)
        return np.transpose(block, [names.index(axis) for axis in out_axes])

    def _names(self) -> list[str]:
        return [name for axis in self.axes if axis != "1" for name in axis]

    def _read_one(
        self, fetch: Fetch, key: str, region: Region, sizes: Mapping[str, int]
    ) -> tuple[np.ndarray, list[str]]:
        names = self._names()
        lengths = [region[name][1] - region[name][0] for name in names]
        index: list[slice] = []
        merged: tuple[str, str] | None = None
        for position, axis in enumerate(self.axes):
            if axis == "1":
                index.append(slice(0, 1))
            elif len(axis) == 2:
                if position != 0:
                    raise AssertionError(f"{self.key}: a merged axis must come first")
                merged = (axis[0], axis[1])
                index.append(slice(None))  # filled below
            else:
                start, stop = region[axis]
                if self.split is not None and axis == self.split.axis:
                    index.append(self.split.index(sizes[axis], start, stop))
                else:
                    index.append(slice(start, stop))
        if merged is None:
            return fetch(key, tuple(index)).reshape(lengths), names
        major, minor = merged
        (m0, m1), (n0, n1), width = region[major], region[minor], sizes[minor]
        if (n0, n1) == (0, width):  # whole rows of the minor axis: one contiguous read
            block = fetch(key, (slice(m0 * width, m1 * width), *index[1:]))
        else:
            block = np.concatenate(
                [
                    fetch(key, (slice(m * width + n0, m * width + n1), *index[1:]))
                    for m in range(m0, m1)
                ]
            )
        return block.reshape(lengths), names
