"""Can a spec's compiled peak be read off smaller compiles of the same layer? (issue 27, item 2)

    python -m bench.extrapolate --seed S --specs s0_007_gpt_oss_120b s0_054_qwen3_30b_a3b ...

The hand-kept ledger (moegen/plan/memory.py) misses some population specs by 30-70%. The issue
offers another source for the figure: the program itself, compiled on the real target at two
small token counts, its peak extrapolated linearly to the spec's tokens. This measures whether
that would be within 10%: for each named population spec (bench.population), the layer is
compiled (twins off, forward and forward+backward, moegen's own verifier) with a quarter and
a half of its sequence length (each a multiple of the sequence shards and of the token chunks),
and the line through the two peaks is read at the full sequence length. The full-size figure is
the one recorded in bench/stores/ledger_population.json. Compiles are recorded in the same
store, so a rerun compiles nothing it has.

It is a measurement, not a model moegen uses: a small compile takes as long as a full one
(compile time follows the program's structure, not its sizes), so the figure would come from
the build or `moegen tune`, never from `moegen plan`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from bench.ledger_population import PROGRAMS, STORE, _load, planned, recorded
from bench.population import population

FRACTIONS = (4, 2)  # the sequence length divided by these
# A shorter sequence keeps at least this many tokens, and a multiple of it, in each sequence
# shard's token chunk: a TPU sublane's rows, so the small layer tiles as the full one does.
SUBLANE_ROWS = 8
GiB = 2**30


def shrunk(text: str, divisor: int) -> str | None:
    """The spec with its sequence length divided by `divisor`, or None where the shorter
    sequence would not split over the sequence shards and token chunks evenly."""
    tree = yaml.safe_load(text)
    seq_len = tree["shapes"]["seq_len"]
    shards = tree["mesh"]["axes"].get("sequence", 1)
    chunks = (tree.get("memory") or {}).get("token_chunks", 1)
    if seq_len % divisor or (seq_len // divisor) % (shards * chunks * SUBLANE_ROWS):
        return None
    tree["shapes"]["seq_len"] = seq_len // divisor
    tree["description"] = f"{tree['description']} (sequence / {divisor})"
    return yaml.safe_dump(tree, sort_keys=False)


def peaks(name: str, text: str, store: dict[str, Any], path: Path) -> dict[str, Any]:
    """The compiled figures of `text`, compiled now if the store has none."""
    figures = recorded(store, path, name, text, planned(name, text)[1])
    assert figures is not None  # compile_missing: always a record
    return figures


def extrapolated(name: str, text: str, store: dict[str, Any], path: Path) -> str:
    full_seq = yaml.safe_load(text)["shapes"]["seq_len"]
    full = peaks(name, text, store, path)
    points = []
    for divisor in FRACTIONS:
        small = shrunk(text, divisor)
        if small is None:
            return f"{name} | the sequence does not split by {divisor}"
        points.append((full_seq // divisor, peaks(f"{name}_seq{divisor}", small, store, path)))
    cells = [name]
    for program in PROGRAMS:
        figures = [p[program]["peak"] for _, p in points if "peak" in p.get(program, {})]
        want = full.get(program, {}).get("peak")
        if len(figures) < 2 or want is None:
            cells.append(f"{program}: no figure")
            continue
        (t1, _), (t2, _) = points
        slope = (figures[1] - figures[0]) / (t2 - t1)
        got = figures[1] + slope * (full_seq - t2)
        cells.append(
            f"{program}: {figures[0] / GiB:.2f}, {figures[1] / GiB:.2f} -> {got / GiB:.2f} "
            f"vs {want / GiB:.2f} GiB ({got / want - 1:+.1%})"
        )
    return " | ".join(cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.extrapolate", description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--population", type=int, default=60)
    parser.add_argument("--specs", nargs="+", required=True)
    parser.add_argument("--store", type=Path, default=STORE)
    args = parser.parse_args(argv)
    specs = dict(population(args.population, args.seed))
    store = _load(args.store)
    for name in args.specs:
        print(extrapolated(name, specs[name], store, args.store), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
