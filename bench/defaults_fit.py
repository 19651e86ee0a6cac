"""Do the plan's own memory choices compile and fit? (issue 27, item 3)

    python -m bench.defaults_fit --population N --seed S [--recorded-only]

Each spec of the generated population (bench.population) is made too big to run whole: its
memory trades are dropped (the plan decides) and its batch doubled, a multiple of its batch
shards, until the plan puts the layer whole (one token chunk, the FFN whole) above its HBM
by more than LEDGER_OVERESTIMATE (where the plan trades memory of its own), at most
MAX_DOUBLINGS times. The build's default for that spec is then compiled for the TPU slice,
forward and forward+backward, by moegen's own verifier (twins off), and the compiled peak
judged against HBM. The default is the trade XLA's buffer assignment chooses
(moegen.fit.own_trade: the plan ranks the trades, XLA's read decides their fit, seconds each),
compiled as the spec with that trade written; the ledger's own choice, which the build
took before, is listed beside it. The figures go to the same
store as the ledger's population (bench/stores/ledger_population.json, keyed by the module's
hash and the pinned versions), so a rerun compiles only what changed.

Printed, one row per spec: the batch, the whole layer's planned peak, the ledger's choice
and its planned peak, the build's choice and XLA's figure of it, the compiled peak and the
verdict: "fits", "OOM" (the compiler's figure), or "refused" (the plan refuses it before
any compile, naming what would fit, or XLA's read finds no trade that fits: no default
walked into the compiler). With `--assigned`, each spec the ledger trades has its layer
whole read with XLA's buffer assignment (moegen.verify.memory.assigned, seconds a spec): whether the
ledger's trade was needed at all.
With `--tuned`, each traded spec is also tuned with its memory trades left `auto`
(`moegen tune`: the plan ranks the trades, XLA's buffer assignment decides their fit, in
seconds each; moegen.fit.by_assignment), and the tuned choice compiled in full where it differs
from the plan's (recorded in the same store): does the choice by XLA's figure compile and
fit, and what does it save?
Specs whose whole layer fits even at the largest batch tried are listed as "fits whole" and
not compiled.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.ledger_population import STORE, _load, plan_of, recorded
from bench.population import population
from moegen.diagnostics import SpecError
from moegen.fit import choose_own_trade, chooses_by_assignment
from moegen.load import load_spec_bytes
from moegen.pipeline import refuse_unfit
from moegen.plan import Plan, make_plan, over_hbm, peak
from moegen.render import render
from moegen.tune import tune
from moegen.validate import validate
from moegen.variants import unchecked
from moegen.verify import XLA_READS
from moegen.verify.memory.assigned import WHOLE, whole_layer

MAX_DOUBLINGS = 6
GiB = 2**30


def too_big(name: str, text: str) -> tuple[str, str] | None:
    """(name, YAML) of the spec with its memory trades dropped and the smallest batch (a
    multiple of the batch shards, at most 2**MAX_DOUBLINGS times the spec's) whose whole
    layer the plan puts above HBM by more than LEDGER_OVERESTIMATE; None when there is none
    below the largest batch the validator admits (its int32 indexing bound on a device's rows
    comes first)."""
    tree = yaml.safe_load(text)
    tree.pop("memory", None)
    batch = tree["shapes"]["batch"]
    low, high = batch, None  # low: whole fits (or the spec's own batch)
    for doublings in range(1, MAX_DOUBLINGS + 1):
        verdict = _whole_verdict(tree, batch * 2**doublings)
        if verdict == "refused":
            break
        if verdict == "too big":
            high = batch * 2**doublings
            break
        low = batch * 2**doublings
    if high is None:
        return None
    while high - low > batch:  # bisect in steps of the spec's batch (a multiple of shards)
        middle = low + (high - low) // 2 // batch * batch
        if _whole_verdict(tree, middle) == "too big":
            high = middle
        else:
            low = middle
    tree["shapes"]["batch"] = high
    label = f"{name}_b{high}"
    return label, yaml.safe_dump(tree, sort_keys=False)


def _whole_verdict(tree: dict[str, Any], batch: int) -> str:
    """ "too big" (the plan trades: the layer whole is over HBM), "fits", or "refused" (the
    validator refuses the batch for another rule)."""
    tree = tree | {"shapes": tree["shapes"] | {"batch": batch}}
    text = yaml.safe_dump(tree, sort_keys=False)
    try:
        loaded = validate(load_spec_bytes(text.encode(), "probe.yaml", "probe"))
    except SpecError as err:
        return "too big" if "cannot fit" in str(err) else "refused"
    whole = make_plan(unchecked(loaded, WHOLE), options=False)
    return "too big" if over_hbm(whole.memory) else "fits"


def judge(
    label: str, text: str, store: dict[str, Any], compile_missing: bool, path: Path = STORE
) -> str:
    """One row: the plan's ledger's choice for the spec, the build's (XLA's read chooses a
    trade the spec leaves open on a TPU target: moegen.fit.own_trade), and what the compiler made
    of the build's, compiled as the spec with that trade written."""
    loaded = validate(load_spec_bytes(text.encode(), f"{label}.yaml", label))
    whole = make_plan(unchecked(loaded, WHOLE), options=False)
    plan = make_plan(loaded)
    try:
        refuse_unfit(loaded, plan)
    except SpecError as err:
        return f"{label} | whole {peak(whole) / GiB:.2f} GiB | refused by the plan: {err}"[:400]
    ledger = f"{plan.ffn.chunks} slices x {plan.experts.token_chunks} token chunks"
    cells = [label, f"whole {peak(whole) / GiB:.2f} GiB", ledger, f"{peak(plan) / GiB:.2f}"]
    if not chooses_by_assignment(loaded, plan):
        figures = recorded(store, path, label, text, render(plan), compile_missing)
        return " | ".join([*cells, "the ledger's", "-", _compiled(figures, plan)])
    reads: list = []
    try:
        _, chosen, _ = choose_own_trade(loaded, plan, XLA_READS, reads.append)
    except SpecError as err:
        refused = err.diagnostics[0].message.split("; the build chooses")[-1][:200]
        return " | ".join([*cells, f"refused by XLA's read ({len(reads)} candidates){refused}"])
    trade = {"ffn_chunks": chosen.ffn.chunks, "token_chunks": chosen.experts.token_chunks}
    if (plan.ffn.chunks, plan.experts.token_chunks) == tuple(trade.values()):
        written_plan, label_written, written = plan, label, text  # the ledger's: compiled so
    else:
        label_written, written = f"{label}_chosen", with_trade(text, **trade)
        written_plan = plan_of(label_written, written)
    figures = recorded(store, path, label_written, written, render(written_plan), compile_missing)
    choice = f"{trade['ffn_chunks']} slices x {trade['token_chunks']} token chunks"
    figure = f"{reads[-1].peak_bytes / GiB:.2f}" if reads and reads[-1].peak_bytes else "-"
    cells += [f"{choice} (XLA's read, {len(reads)} candidates)", figure]
    return " | ".join([*cells, _compiled(figures, written_plan)])


def with_trade(text: str, ffn_chunks: int, token_chunks: int) -> str:
    """The spec `text` with its memory trade written, as the build's choice is compiled."""
    memory = {"ffn_chunks": ffn_chunks, "token_chunks": token_chunks}
    return yaml.safe_dump(yaml.safe_load(text) | {"memory": memory}, sort_keys=False)


def _compiled(figures: dict[str, Any] | None, plan: Plan) -> str:
    if figures is None:
        return "not compiled yet"
    return _verdict(figures, plan.memory.hbm_bytes_per_device)


def _verdict(figures: dict[str, Any], hbm: int) -> str:
    peaks, out_of_memory = [], []
    for program in ("forward", "train"):
        got = figures.get(program)
        if got is None:
            return f"no figure ({figures.get('error', 'not compiled')})"
        if "oom" in got:
            out_of_memory.append(f"{program} {got['memory_space']}: {got['oom'][:120]}")
        else:
            peaks.append(got["peak"])
    if out_of_memory:
        return "OOM " + "; ".join(out_of_memory)
    worst = max(peaks)
    return f"{worst / GiB:.2f} of {hbm / GiB:.2f} GiB: {'fits' if worst <= hbm else 'OVER'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.defaults_fit", description=__doc__)
    parser.add_argument("--population", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recorded-only", action="store_true", help="compile nothing new")
    parser.add_argument("--store", type=Path, default=STORE, help="the figures' JSON file")
    parser.add_argument(
        "--tuned",
        action="store_true",
        help="also tune each traded spec's memory trades by XLA's buffer assignment and "
        "compile the choice (moegen tune)",
    )
    parser.add_argument(
        "--assigned",
        action="store_true",
        help="also read XLA's buffer assignment of each traded layer whole (seconds a spec)",
    )
    args = parser.parse_args(argv)
    store = _load(args.store)
    print(
        "spec | whole layer planned | the ledger's choice | planned GiB | the build's choice "
        "| XLA's figure GiB | compiled peak",
        flush=True,
    )
    for name, text in population(args.population, args.seed):
        found = too_big(name, text)
        if found is None:
            print(
                f"{name} | fits whole at every batch tried (up to {2**MAX_DOUBLINGS} times its "
                "own, or to the validator's int32 bound on a device's rows)",
                flush=True,
            )
            continue
        line = judge(*found, store, not args.recorded_only, args.store)
        if args.assigned:
            line += whole_assigned(*found)
        if args.tuned:
            line += tuned(*found, store, not args.recorded_only, args.store)
        print(line, flush=True)
    return 0


def whole_assigned(label: str, text: str) -> str:
    """XLA's assigned peak of the layer whole, where the plan trades (moegen plan --assigned):
    whether the trade was needed at all."""
    loaded = validate(load_spec_bytes(text.encode(), f"{label}.yaml", label))
    whole = whole_layer(loaded, make_plan(loaded))
    if whole is None:  # the plan runs it whole already
        return ""
    if whole["peak"] is None:
        return " | whole, XLA's assignment: out of HBM"
    share = whole["peak"] / whole["hbm"]
    return f" | whole, XLA's assignment: {share:.0%} of HBM, {'fits' if whole['fits'] else 'over'}"


def tuned(
    label: str, text: str, store: dict[str, Any], compile_missing: bool, path: Path = STORE
) -> str:
    """The spec's memory trades chosen by `moegen tune` (XLA's buffer assignment decides the
    fit), and that choice compiled in full, where it is not the plan's own."""
    tree = yaml.safe_load(text)
    tree["memory"] = {"ffn_chunks": "auto", "token_chunks": "auto"}
    loaded = load_spec_bytes(yaml.safe_dump(tree, sort_keys=False).encode(), f"{label}.yaml", label)
    start = time.perf_counter()
    result = tune(loaded)
    seconds = time.perf_counter() - start
    reads = sum(1 for c in result.candidates if c.seconds)
    winner = result.winner
    if winner is None or winner.plan is None:
        return f" | tuned: nothing fits by XLA's assignment ({reads} read, {seconds:.0f} s)"
    choice = f"{winner.plan.ffn.chunks} slices x {winner.plan.experts.token_chunks} token chunks"
    cells = [f"tuned: {choice} ({reads} read, {seconds:.0f} s)", f"{winner.peak_bytes / GiB:.2f}"]
    ledger = make_plan(validate(load_spec_bytes(text.encode(), f"{label}.yaml", label)))
    if (ledger.ffn.chunks, ledger.experts.token_chunks) == (
        winner.plan.ffn.chunks,
        winner.plan.experts.token_chunks,
    ):
        return " | " + " | ".join([*cells, "the plan's own (compiled above)"])
    tuned_label = f"{label}_tuned"
    tuned_text = result.new_text
    tuned_loaded = validate(
        load_spec_bytes(tuned_text.encode(), f"{tuned_label}.yaml", tuned_label)
    )
    plan = make_plan(tuned_loaded)
    figures = recorded(store, path, tuned_label, tuned_text, render(plan), compile_missing)
    verdict = (
        "not compiled yet"
        if figures is None
        else _verdict(figures, plan.memory.hbm_bytes_per_device)
    )
    return " | " + " | ".join([*cells, verdict])


if __name__ == "__main__":
    sys.exit(main())
