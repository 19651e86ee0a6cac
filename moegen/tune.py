"""`moegen tune`: the spec's `auto` choices, made by compiling every candidate for the target.

A spec may leave the expert communication strategy, the overlap chunk count and a tiled
kernel's tiles to moegen (`auto`). Each combination of candidate values that passes validation is
planned, rendered and compiled (forward and forward+backward, no twins) for the target, then
scored by the roofline of `moegen.plan.roofline` with the compiler's own counts in place of
the plan's: max(compiled FLOPs / peak, compiled bytes accessed / HBM bandwidth) plus the
plan's exposed communication; where a candidate loops (token chunks, FFN slices, ring steps),
every candidate by the plan's step time (moegen.plan.step_time: each step of the pass at its
own bound, summed, with what a memory trade adds between the matmuls) plus its exposed
communication, since XLA's cost analysis counts a loop's body once.
Candidates that do not fit the device's HBM are out. On cpu, which has no peak figures, the
score is bytes accessed plus communication bytes.
The winner is written back into the spec in place of each `auto`, keeping every comment.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moegen.diagnostics import SpecError
from moegen.fit import (
    FIT_CHECK,
    Candidate,
    TuneResult,
    by_assignment,
    candidates,
    choose_by_assignment,
    count_by_plan,
    loops,
    set_score,
    yaml_value,
)
from moegen.hardware import hardware
from moegen.load import FieldPath, LoadedSpec, load_spec_bytes
from moegen.plan import make_plan
from moegen.render import render
from moegen.spec import Tiles
from moegen.variants import derive
from moegen.verify import XLA_READS, Compiled, VerifyError, require_verifiers, verify


def tune(
    loaded: LoadedSpec,
    *,
    budget_s: float = 240.0,
    on_candidate: Callable[[int, int, Candidate], None] = lambda i, n, c: None,
) -> TuneResult:
    """Score every valid candidate (until `budget_s` runs out); pick the best. Candidates are
    compiled, but where only memory trades are `auto` on a TPU target: then the plan ranks
    them and XLA's buffer assignment decides their fit (moegen.fit.by_assignment)."""
    if not loaded.spec.auto_fields():
        raise SpecError(
            [loaded.diagnostic((), "nothing to tune: write auto for parallelism.experts, "
                               "parallelism.overlap_chunks, target.tiles, "
                               "memory.token_chunks or memory.ffn_chunks")]
        )  # fmt: skip
    chip = hardware(loaded.spec.target.hardware)
    unit = "s" if chip.platform == "tpu" else "bytes"
    found = candidates(loaded)
    _refuse_a_spec_no_choice_mends(loaded, found)
    _require_verifiers_once(found)
    if by_assignment(loaded):
        winner = choose_by_assignment(found, XLA_READS, budget_s, on_candidate)
    else:
        winner = _compile_each(found, chip.hbm_bytes_per_device, budget_s, on_candidate)
    new_text = _written(loaded, winner.choices) if winner else loaded.source.text
    return TuneResult(found, winner, unit, new_text)


def _refuse_a_spec_no_choice_mends(loaded: LoadedSpec, found: list[Candidate]) -> None:
    """Where every candidate is refused for one reason, the reason is the spec's own, not
    its `auto` fields': raise it located, as `moegen build` would, instead of a table of
    the same refusal."""
    if found and all(c.plan is None for c in found) and len({c.problem for c in found}) == 1:
        derive(loaded, found[0].choices)  # raises the SpecError the candidates got


def _require_verifiers_once(found: list[Candidate]) -> None:
    """A missing compiler (libtpu, a GPU kernel's package) is said once, before any
    candidate is compiled or read: every candidate shares the target and the kernel."""
    planned = next((c for c in found if c.plan is not None and c.loaded is not None), None)
    if planned is not None:
        require_verifiers([(planned.loaded, planned.plan)])


def _written(loaded: LoadedSpec, choices: dict[FieldPath, Any]) -> str:
    """write_back's text, read back: the memory choices must be there as chosen (a layout
    the edit does not know, an anchored mapping say, is refused, located, not written)."""
    try:
        text = write_back(loaded, choices)
        spec_dir = Path(loaded.source.display).parent
        again = load_spec_bytes(text.encode(), loaded.source.display, loaded.source.name, spec_dir)
        same = all(
            getattr(again.spec.memory, path[1]) == value
            for path, value in choices.items()
            if path[0] == "memory"
        )
    except (ValueError, SpecError):
        same = False
    if not same:
        where = next((p for p in choices if p[0] == "memory"), ())
        message = "moegen tune cannot write its choice into this layout; write it by hand: "
        raise SpecError([loaded.diagnostic(where, message + _choices_text(choices))])
    return text


def _choices_text(choices: dict[FieldPath, Any]) -> str:
    return ", ".join(f"{'.'.join(map(str, path))}: {yaml_value(v)}" for path, v in choices.items())


def _compile_each(
    found: list[Candidate],
    hbm: int,
    budget_s: float,
    on_candidate: Callable[[int, int, Candidate], None],
) -> Candidate | None:
    """Compile and score each valid candidate in turn; the best that fits."""
    start = time.perf_counter()
    for i, candidate in enumerate(found):
        if candidate.plan is not None:
            if time.perf_counter() - start > budget_s:
                candidate.problem = f"not compiled: the {budget_s:.0f} s budget ran out"
            else:
                _score(candidate, hbm)
        on_candidate(i + 1, len(found), candidate)
    scored = [c for c in found if not c.problem]
    if any(loops(c.plan) for c in scored):
        for candidate in scored:
            count_by_plan(candidate)
    return min(scored, key=lambda c: c.score) if scored else None


def _score(candidate: Candidate, hbm: int) -> None:
    plan, concrete = candidate.plan, candidate.loaded
    assert plan is not None and concrete is not None
    start = time.perf_counter()
    try:
        report = verify(concrete, render(plan), plan=plan, run_twins=False, compile_forward=False)
    except VerifyError as err:
        candidate.problem = f"does not compile or fit: {str(err).splitlines()[0]}"
        return
    finally:
        candidate.seconds = time.perf_counter() - start
    train = report.step("compile forward+backward")
    assert isinstance(train, Compiled)  # a refusal raised VerifyError above
    candidate.flops = train.flops
    candidate.bytes_accessed = train.bytes_accessed
    candidate.peak_bytes = train.memory.peak
    if hbm and candidate.peak_bytes > hbm:
        candidate.problem = f"peak {candidate.peak_bytes / 2**30:.2f} GiB exceeds HBM"
        return
    set_score(candidate)


def write_back(loaded: LoadedSpec, choices: dict[FieldPath, Any]) -> str:
    """The spec text with each `auto` replaced by its choice; all else byte for byte.

    A tiles choice of None (the plan's own) removes nothing: it writes the tiles the plan chose.
    A choice of memory.fit_check (not an `auto` field: tune sets it where the compiler's
    figure, not the plan's, found the choice to fit) replaces the value written, or is
    written just before the first memory choice.
    """
    text = loaded.source.text
    # Lines as the loader counts them: '\n' ends a line, nothing else does; a leading
    # byte-order mark takes no column.
    lines = text.split("\n")
    bom = 1 if text.startswith("\ufeff") else 0
    edits = [_edit(loaded, path, value, choices) for path, value in choices.items()]
    for line, col, tokens, new in sorted(edits, reverse=True):
        row = lines[line - 1]
        start = col - 1 + (bom if line == 1 else 0)
        for token in tokens:
            if row.startswith(token, start):
                lines[line - 1] = row[:start] + new + row[start + len(token) :]
                break
        else:
            raise ValueError(f"no {tokens[0]} at line {line}, column {col}")
    return "\n".join(lines)


AUTO_TOKENS = ("auto", "'auto'", '"auto"')


def _edit(
    loaded: LoadedSpec, path: FieldPath, value: Any, choices: dict[FieldPath, Any]
) -> tuple[int, int, tuple[str, ...], str]:
    """(line, column, the tokens one of which is replaced there, the new text)."""
    if path == FIT_CHECK:
        return _fit_check_edit(loaded, value, [p for p in choices if p[0] == "memory"])
    line, col = loaded.locations.of_value(path)
    if value is None and path == ("target", "tiles"):
        plan = make_plan(derive(loaded, choices))
        # target.tiles: auto is a choice of a kernel that runs in tiles
        gate_up, down = plan.kernel.tiles or ((), ())
        value = Tiles(gate_up=list(gate_up), down=list(down))
    return line, col, AUTO_TOKENS, yaml_value(value)


def _fit_check_edit(
    loaded: LoadedSpec, value: str, memory_autos: list[FieldPath]
) -> tuple[int, int, tuple[str, ...], str]:
    """memory.fit_check's value replaced where written; else a new entry just before the
    first memory choice's key: `fit_check: V, ` in a flow mapping, a line of its own (at
    the key's indentation) in a block one."""
    values = loaded.locations.values
    if FIT_CHECK in values:
        line, col = values[FIT_CHECK]
        quoted = tuple(f"{q}{word}{q}" for q in ("", "'", '"') for word in ("plan", "compile"))
        return line, col, quoted, value
    line, col = min(loaded.locations.of_key(p) for p in memory_autos if p != FIT_CHECK)
    memory_line, memory_col = values[("memory",)]
    bom = 1 if memory_line == 1 and loaded.source.text.startswith("\ufeff") else 0
    row = loaded.source.text.split("\n")[memory_line - 1]
    flow = row.startswith("{", memory_col - 1 + bom)
    if flow:
        return line, col, ("",), f"fit_check: {value}, "
    return line, col, ("",), f"fit_check: {value}\n{' ' * (col - 1)}"


def patch(loaded: LoadedSpec, new_text: str) -> str:
    """A unified diff from the spec as written to the tuned spec."""
    name = loaded.source.display
    return "".join(
        difflib.unified_diff(
            loaded.source.text.splitlines(keepends=True),
            new_text.splitlines(keepends=True),
            fromfile=name,
            tofile=f"{name} (tuned)",
        )
    )
