"""A set of decoder-layer indices held as arithmetic runs, never one entry a layer.

A config.json says which layers are MoE layers by rules (the first k dense, every n-th, a
period and offset) over num_hidden_layers, which the file may set to anything an int holds:
materialising 2**31 indices takes gigabytes and minutes. `LayerSet` keeps each run as a
`range` (lazy, with arithmetic length and membership), so a rule costs the same for 10 layers
as for 2**31; only the explicit lists a file spells out (mlp_only_layers, moe_layers) become
runs one index at a time, and those are as long as the file that holds them.

It lives beside the rules that find a model's MoE layers (moegen.families.layer_rules), which
the checkpoint loader and `moegen init --from-hf` both run.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from itertools import chain

# A run of every k-th layer with at most this many layers is written out index by index, as
# moegen always wrote it (Jamba's 72 layers, every 2nd: 36); a longer one as "a, b, ..., z",
# so that a description never grows with num_hidden_layers.
SPELLED = 128


@dataclass(frozen=True)
class LayerSet:
    """Ascending layer indices: `runs` are non-empty ranges (step >= 1), each one's indices
    all below the next one's first, so the set reads in order run by run."""

    runs: tuple[range, ...] = ()

    @classmethod
    def span(cls, run: range) -> LayerSet:
        return cls((run,) if len(run) else ())

    @classmethod
    def of(cls, indices: Iterable[int]) -> LayerSet:
        """The set of explicit indices (a list from the file), consecutive ones one run."""
        runs: list[range] = []
        for i in sorted(set(indices)):
            if runs and runs[-1].step == 1 and runs[-1].stop == i:
                runs[-1] = range(runs[-1].start, i + 1)
            else:
                runs.append(range(i, i + 1))
        return cls(tuple(runs))

    def __len__(self) -> int:
        return sum(len(run) for run in self.runs)

    def __bool__(self) -> bool:
        return bool(self.runs)

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self.runs)

    def __contains__(self, index: object) -> bool:
        at = bisect.bisect_right(self._starts, index) - 1  # type: ignore[call-overload]
        return at >= 0 and index in self.runs[at]

    @cached_property
    def _starts(self) -> list[int]:
        # found once: membership is asked for each per_layer_config entry, of each set
        return [run.start for run in self.runs]

    def first(self) -> int:
        return self.runs[0][0]

    def below(self, bound: int) -> LayerSet:
        """The indices under `bound`."""
        cut = (run[: _count_below(run, bound)] for run in self.runs)
        return LayerSet(tuple(run for run in cut if len(run)))

    def from_(self, bound: int) -> LayerSet:
        """The indices at or over `bound`."""
        cut = (run[_count_below(run, bound) :] for run in self.runs)
        return LayerSet(tuple(run for run in cut if len(run)))

    def without(self, indices: Iterable[int]) -> LayerSet:
        """The set less `indices`; each run is split where an index of it is removed."""
        removed = sorted({i for i in indices if i in self})
        runs: list[range] = []
        for run in self.runs:
            for i in removed[bisect.bisect_left(removed, run[0]) :]:
                if not run or i > run[-1]:
                    break
                at = run.index(i)
                runs.append(run[:at])
                run = run[at + 1 :]
            runs.append(run)
        return LayerSet(tuple(run for run in runs if len(run)))

    @classmethod
    def joined(cls, sets: Iterable[LayerSet]) -> LayerSet:
        """Sets that share no index nor interleave their runs (moegen.hf.layer_kinds: single
        layers, and the runs split around them) as one."""
        runs = sorted(chain.from_iterable(s.runs for s in sets), key=lambda run: run[0])
        for before, after in zip(runs, runs[1:], strict=False):
            assert before[-1] < after[0], f"interleaved runs {before} and {after}"
        return cls(tuple(runs))


def _count_below(run: range, bound: int) -> int:
    """How many of the run's indices are under `bound` (arithmetic, not a scan)."""
    if bound <= run[0]:
        return 0
    return min(len(run), (bound - run[0] + run.step - 1) // run.step)


def describe(layers: LayerSet) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"; a long run of every k-th layer -> "1, 3, ...,
    2147483645"."""
    parts: list[str | list[int]] = []  # "a, b, ..., z", or [first, last] of consecutive ones
    for run in layers.runs:
        if run.step > 1 and len(run) > SPELLED:
            parts.append(f"{run[0]}, {run[1]}, ..., {run[-1]}")
            continue
        for first, last in [(run[0], run[-1])] if run.step == 1 else [(i, i) for i in run]:
            if parts and isinstance(parts[-1], list) and parts[-1][1] + 1 == first:
                parts[-1][1] = last
            else:
                parts.append([first, last])
    return ", ".join(part if isinstance(part, str) else _span_text(*part) for part in parts)


def _span_text(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"
