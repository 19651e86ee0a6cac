"""A fresh hold-out, read by XLA's buffer assignment: the ledger and the plan's own trades on
population seeds nobody has compiled or looked at (issue 27, items 2 and 3).

    python -m bench.holdout --population 60 --seed 2 [--store bench/stores/holdout_assigned.json]
                            [--take-fitting-trade]

Seeds 0 and 1 of bench.population have been compiled in full, and looked at while the ledger
(moegen/plan/memory.py) and the plan's trade rules were written: seed 0 is their fit set, and
seed 1, the hold-out, shaped two rules (bench/LEDGER.md says which). This reads seeds no rule
was written on, with the figure that is the compiled one to 0.0034% on those 220 programs
(`python -m bench.assigned`): XLA's buffer assignment, stopped before code generation
(moegen.verify.memory.assigned), seconds a spec where a full compile takes minutes.

For each spec, as drawn: the plan's forward and forward+backward peaks against the assigned
ones (planned / assigned - 1). Then, as bench.defaults_fit does, the spec made too big to run
whole (its trades dropped, its batch raised until the plan puts the layer whole over HBM): the
build's own choice, as moegen.fit.own_trade makes it (the trades ranked by the plan's roofline,
read the same way in that order, the first that fits what the compiler grants a program
taken, with the generated code's margin, `fits_by_assignment`), beside the ledger's; with
`memory.fit_check` other than `assigned` the ledger's own choice, read; a refusal by the plan
is checked against the layer whole's assignment (a refusal of a layer that fits would be
wrong).
With `--take-fitting-trade`, a refused one is also given to moegen.fit.refit, as `moegen build
--take-fitting-trade` would: the plan's other trades read the same way, fastest first, and
the first that fits taken (or none).

Figures are kept in the store under the module's hash and the compile versions (as the
population's compiled records are), so a rerun reads only what changed. Nothing in the store
decides anything: a record that does not parse is read again.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.assigned import _records
from bench.defaults_fit import too_big
from bench.ledger_population import STORES, _save, distribution_line, module_key, plan_of
from bench.population import population
from moegen.diagnostics import SpecError
from moegen.fit import (
    CompilerReads,
    ReadError,
    choose_own_trade,
    chooses_by_assignment,
    fits_by_assignment,
    take_fitting_trade,
)
from moegen.load import load_spec_bytes
from moegen.pipeline import refuse_unfit
from moegen.plan import Plan, cannot_fit, make_plan
from moegen.render import render
from moegen.validate import validate
from moegen.variants import unchecked
from moegen.verify import VerifyError
from moegen.verify.memory.assigned import WHOLE, assigned_memory

STORE = STORES / "holdout_assigned.json"
FITTED_SEEDS = (0, 1)  # compiled and looked at while the ledger's rules were written
READ_TIMEOUT_S = 900
GiB = 2**30
PROGRAMS = {"forward": "forward", "forward+backward": "train"}


def read(store: Path, name: str, plan: Plan, variant: str = "") -> dict[str, Any]:
    """{"forward": peak, "forward+backward": peak} of the module `plan` renders (its main
    shape, or the shape variant `variant`), or {"refused": the compiler's line}: from the
    store, or read now and stored."""
    source = render(plan)
    key = module_key(source) + (f":{variant}" if variant else "")
    known = _records(store).get(key)
    if _well_formed(known):
        return known
    try:
        figures = assigned_memory(plan, source, timeout_s=READ_TIMEOUT_S, variant=variant)
        entry: dict[str, Any] = {p: figures[p].peak for p in PROGRAMS}
    except VerifyError as err:
        entry = {"refused": str(err).strip().splitlines()[0][:300]}
    records = _records(store)  # read again: another run may have written meanwhile
    records[key] = {"spec": name, **entry}
    _save(store, {"modules": records})
    return records[key]


def _well_formed(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    if isinstance(entry.get("refused"), str):
        return True
    return all(isinstance(entry.get(p), int) and entry[p] > 0 for p in PROGRAMS)


def ledger_row(store: Path, name: str, text: str, errors: dict[str, list]) -> str:
    """The spec as drawn: planned against assigned, each program."""
    plan = plan_of(name, text)
    got = read(store, name, plan)
    planned = {"forward": plan.memory.forward_peak, "forward+backward": plan.memory.train_peak}
    if "refused" in got:
        return f"{name} | refused by the compiler: {got['refused'][:120]}"
    cells = [name]
    for program in PROGRAMS:
        error = planned[program] / got[program] - 1
        errors[program].append((error, name))
        cells.append(
            f"{program} {planned[program] / GiB:.2f} vs {got[program] / GiB:.2f} GiB ({error:+.1%})"
        )
    return " | ".join(cells)


def read_every_shape(store: Path, name: str, plan: Plan) -> dict[str, Any]:
    """read() of every shape of the module (one trade serves them all): each program's
    largest peak, or the first refusal."""
    reads = [read(store, name, plan, variant) for variant, _ in plan.shape_plans()]
    refused = [entry["refused"] for entry in reads if "refused" in entry]
    if refused:
        return {"refused": refused[0]}
    return {program: max(entry[program] for entry in reads) for program in PROGRAMS}


def default_row(
    store: Path, name: str, text: str, verdicts: dict[str, list], take: bool = False
) -> str | None:
    """The spec made too big to run whole: the plan's own choice, judged by assignment;
    `take`: where it is refused, the trade `moegen build --take-fitting-trade` takes."""
    found = too_big(name, text)
    if found is None:
        return None
    label, big = found
    loaded = validate(load_spec_bytes(big.encode(), f"{label}.yaml", label))
    plan = make_plan(loaded)
    try:
        refuse_unfit(loaded, plan)
    except SpecError as err:
        row = _refused_row(store, label, loaded, plan, err, verdicts)
        return row + (_taken(store, label, loaded, plan, err, verdicts) if take else "")
    if chooses_by_assignment(loaded, plan):  # the build's choice: moegen.own_trade
        return _chosen_row(store, label, loaded, plan, verdicts)
    got = read_every_shape(store, label, plan)
    choice = f"{plan.ffn.chunks} slices x {plan.experts.token_chunks} token chunks"
    if "refused" in got:  # out of HBM, or a read that failed (host memory, a timeout)
        verdict = "OVER" if "out of HBM" in got["refused"] else "no figure"
        verdicts[verdict].append(label)
        return f"{label} | {choice} | {verdict}: {got['refused'][:120]}"
    grant = plan.memory.hbm_bytes_per_device
    verdict = "fits" if fits_by_assignment(plan, _peak(got)) else "OVER"
    verdicts[verdict].append(label)
    if cannot_fit(plan):  # memory.fit_check: assigned let it through (moegen.fit.refusal_read)
        verdicts["the ledger alone refused it, XLA's read let it through"].append(label)
        choice += " (the ledger alone refused it; XLA's read let it through)"
    return f"{label} | {choice} | {_peak(got) / GiB:.2f} of {grant / GiB:.2f} GiB: {verdict}"


def _chosen_row(store: Path, label: str, loaded: Any, plan: Plan, verdicts: dict[str, list]) -> str:
    """A trade the spec leaves open, as the build chooses it (XLA's read, fastest first),
    every read through the store; the ledger's own choice beside it."""
    ledger = f"the ledger's {plan.ffn.chunks} slices x {plan.experts.token_chunks} token chunks"
    reads: list = []
    try:
        _, chosen, _ = choose_own_trade(loaded, plan, _store_reads(store, label), reads.append)
    except SpecError as err:
        verdicts["no trade fits by XLA's read: refused"].append(label)
        return f"{label} | {ledger} | refused: {err.diagnostics[0].message[-160:]}"
    same = (chosen.ffn.chunks, chosen.experts.token_chunks) == (
        plan.ffn.chunks,
        plan.experts.token_chunks,
    )
    kind = "the ledger's trade" if same else "another trade than the ledger's"
    verdicts[f"chosen by XLA's read: {kind}"].append(label)
    grant = chosen.memory.hbm_bytes_per_device
    peak = reads[-1].peak_bytes
    choice = f"{chosen.ffn.chunks} slices x {chosen.experts.token_chunks} token chunks"
    return (
        f"{label} | {ledger} | the build's {choice} ({len(reads)} candidates) | "
        f"{peak / GiB:.2f} of {grant / GiB:.2f} GiB: fits"
    )


def _store_reads(store: Path, label: str) -> CompilerReads:
    """XLA's read of a trade through the store: its peak, or ReadError with its refusal."""

    def read_peak(candidate: Plan) -> int:
        got = read_every_shape(store, label + "_trade", candidate)
        if "refused" in got:
            raise ReadError(got["refused"])
        return _peak(got)

    return CompilerReads(peak=read_peak, missing=lambda: None)


def _refused_row(
    store: Path, label: str, loaded: Any, plan: Plan, err: SpecError, verdicts: dict[str, list]
) -> str:
    """A refusal of the spec made too big, judged by the layer whole's assignment."""
    if "where the plan's trade does not" in str(err):  # XLA's read names the layer whole
        verdicts["refused in seconds by XLA's read, naming the layer whole (fits)"].append(label)
        return f"{label} | refused by XLA's read of the plan's trade, the layer whole named"
    whole = make_plan(unchecked(loaded, WHOLE), options=False)
    got = read_every_shape(store, label + "_whole", whole)
    if "refused" in got and "out of HBM" not in got["refused"]:
        verdicts["no figure"].append(label)
        return f"{label} | refused by the plan | the layer whole: no figure ({got['refused']})"
    fits = "refused" not in got and fits_by_assignment(whole, _peak(got))
    verdicts["refused, whole fits (wrong)" if fits else "refused, whole out of HBM"].append(label)
    whole_words = "FITS" if fits else "out of HBM"
    return f"{label} | refused by the plan | the layer whole by assignment: {whole_words}"


def _taken(
    store: Path, label: str, loaded: Any, plan: Plan, err: SpecError, verdicts: dict[str, list]
) -> str:
    """The trade --take-fitting-trade takes where the plan's own is refused (moegen.fit.refit),
    every read through the store."""

    try:
        _, words = take_fitting_trade(loaded, plan, err, _store_reads(store, label))
    except SpecError as still:
        verdicts["refused, and no other trade fits by XLA's read"].append(label)
        return " | --take-fitting-trade: " + str(still).rsplit("took no trade: ", 1)[-1]
    verdicts["refused, and --take-fitting-trade takes a trade XLA fits"].append(label)
    return " | --take-fitting-trade took " + words.split("; took ", 1)[-1]


def _peak(entry: dict[str, Any]) -> int:
    return max(entry[p] for p in PROGRAMS)


def summary(errors: dict[str, list], verdicts: dict[str, list]) -> list[str]:
    """The ledger's error against XLA's figure (planned / assigned - 1), each program, and
    the verdicts on the plan's own trades."""
    lines = [distribution_line(f"ledger {p}", found) for p, found in errors.items() if found]
    counted = ", ".join(f"{len(names)} {verdict}" for verdict, names in verdicts.items() if names)
    lines.append(f"the plan's own trades on the specs made too big: {counted or 'none'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.holdout", description=__doc__)
    parser.add_argument("--population", type=int, default=60)
    parser.add_argument("--seed", type=int, default=2, help="a seed other than 0 and 1")
    parser.add_argument("--store", type=Path, default=STORE, help="the figures' JSON file")
    parser.add_argument(
        "--take-fitting-trade",
        action="store_true",
        help="where the plan's own trade is refused, read the trade the build flag would take",
    )
    args = parser.parse_args(argv)
    if args.seed in FITTED_SEEDS:
        parser.error(f"seed {args.seed} was looked at while the rules were written: not a hold-out")
    print(f"population seed {args.seed}, {args.population} specs, read by XLA's assignment")
    errors: dict[str, list] = {program: [] for program in PROGRAMS}
    verdicts: dict[str, list] = defaultdict(list)
    for name, text in population(args.population, args.seed):
        print(ledger_row(args.store, name, text, errors), flush=True)
        row = default_row(args.store, name, text, verdicts, args.take_fitting_trade)
        if row is not None:
            print("  too big: " + row, flush=True)
    print("\n".join(summary(errors, verdicts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
