"""XLA's own memory figure of the full-size program, in seconds: the TPU compiler's buffer
assignment, read as soon as it is written and before code generation, which is most of a
compile's minutes.

A compile for a TPU slice runs XLA's HLO passes (fusion, scheduling, buffer assignment: a
second or a few) and then generates code (Mosaic kernels, LLO: 6 s to minutes). The peak a
finished compile reports (`memory_analysis()`: arguments + outputs + temporaries) is fixed
by the buffer assignment; code generation does not move it. So each program is compiled in
a worker of its own (forward and forward+backward side by side) with an XLA dump of that
module alone, and the worker is stopped once the assignment is on disk: the same figure as
the full compile (bench/LEDGER.md: within 0.003% on every program measured), without the
code generation. A program the compiler proves out of HBM while it assigns is refused with
the compiler's own message; its last HBM check, after code generation, also counts the
generated code (tens of MiB), so a peak that close to HBM is the full compile's to decide.

The worker is `python -c WORKER_MAIN MODULE TPU_JSON PROGRAM` and dies with moegen
(moegen.interrupts.guard_worker), in the verify workers' private scratch directory.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moegen.fit import KEPT, KeptPeak, every_shapes_own_trades, fits_by_assignment
from moegen.load import LoadedSpec
from moegen.plan import Plan, make_plan
from moegen.render import render
from moegen.variants import unchecked
from moegen.verify.memory.compiler_errors import crash_words, out_of_memory
from moegen.verify.memory.verdict import VerifyError
from moegen.verify.messages import PROGRAMS
from moegen.verify.records.read_record import keep, read_key, recall
from moegen.verify.verification import scratch_directory, tpu_target
from moegen.verify.worker.pool import worker_env

# the jitted function's name in each program, which names XLA's module and its dump files
MODULE_NAMES = {"forward": "jit_moe_layer", "forward+backward": "jit_loss"}
ASSIGNMENT = "after_optimizations-buffer-assignment.txt"
# written after the assignment's own files: the assignment is complete on disk
DONE = "after_optimizations_after_buffer_assignment.txt"
POLL_S = 0.05
WORKER_MAIN = (
    "from moegen.interrupts import guard_worker; guard_worker(); import runpy; "
    "runpy.run_module('moegen.verify.memory.assigned_worker', run_name='__main__', alter_sys=True)"
)
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+),(.*)$", re.M)
_PARAMETER = re.compile(r"\bparameter \d+")


@dataclass(frozen=True)
class AssignedMemory:
    """One program's bytes per device as XLA assigned them, and the seconds it took."""

    argument: int
    output: int
    temp: int
    seconds: float
    kept: bool = False  # read back from an earlier read (moegen.verify.records.read_record)

    @property
    def peak(self) -> int:
        return self.argument + self.output + self.temp


def assigned_sizes(buffer_assignment: str) -> tuple[int, int, int]:
    """(argument, output, temporaries) bytes of an XLA buffer assignment, as
    `memory_analysis()` counts them: the entry parameters, the live-out allocations that are
    not parameters (the output tuple's index table included), the preallocated temporaries
    of the default memory space (another colour is another memory, not HBM)."""
    argument = output = temp = 0
    for size, rest in _ALLOCATION.findall(buffer_assignment):
        parameter = _PARAMETER.search(rest) is not None
        argument += int(size) if parameter else 0
        output += int(size) if "maybe-live-out" in rest and not parameter else 0
        temp += int(size) if "preallocated-temp" in rest and "color" not in rest else 0
    return argument, output, temp


def assigned_memory(
    plan: Plan, source: str, timeout_s: float = 600, variant: str = ""
) -> dict[str, AssignedMemory]:
    """XLA's assigned memory of each full-size program of `source` (rendered from `plan`)
    for its TPU slice: of the main shape, or of the shape variant named `variant`. Raises
    VerifyError off TPU, or when a compile fails or runs out of HBM (the compiler's
    message), or after `timeout_s`."""
    tpu = tpu_target(plan)
    if tpu is None:
        raise VerifyError("TPU targets only: this target has no compile-only TPU slice")
    shape = _Shape(json.dumps(tpu.to_json()), plan.mesh.num_devices, variant)
    key = read_key(source, variant, shape.tpu, shape.num_devices)
    kept = recall(key)
    if kept is not None:  # read before: its figures, or the compiler's refusal
        figures, refused = kept
        if refused:  # the compiler's words, said to be kept on their first line
            first, newline, rest = refused.partition("\n")
            raise VerifyError(first + KEPT + newline + rest)
        return {p: AssignedMemory(**figure, kept=True) for p, figure in figures.items()}
    try:
        found = _read(source, shape, timeout_s)
    except VerifyError as err:
        if "out of HBM" in str(err):
            keep(key, {}, str(err))
        raise
    keep(key, {program: _figures(figure) for program, figure in found.items()})
    return found


def _read(source: str, shape: _Shape, timeout_s: float) -> dict[str, AssignedMemory]:
    with scratch_directory() as folder:
        (folder / "layer.py").write_text(source, encoding="utf-8")
        start = time.perf_counter()
        workers = {program: _start(folder, program, shape) for program in PROGRAMS}
        try:
            return _wait(folder, workers, start, timeout_s, shape.variant)
        finally:
            for proc in workers.values():
                if proc.poll() is None:
                    proc.kill()
                proc.wait()


def _figures(figure: AssignedMemory) -> dict[str, float]:
    """A read's figures as kept (moegen.verify.records.read_record): all but whether it was kept."""
    return {name: value for name, value in asdict(figure).items() if name != "kept"}


@dataclass(frozen=True)
class _Shape:
    """What a worker compiles for: the slice (TpuTarget as JSON), its devices, the shape
    (a variant's name; empty: the main shape)."""

    tpu: str
    num_devices: int
    variant: str


def module_name(program: str, variant: str = "") -> str:
    """XLA's module name of `program` (a variant's forward is its own function, suffixed)."""
    suffix = f"_{variant}" if variant and program == "forward" else ""
    return MODULE_NAMES[program] + suffix


def _start(folder: Path, program: str, shape: _Shape) -> subprocess.Popen[bytes]:
    """A worker compiling `program`, dumping XLA's files of that module alone."""
    dump = folder / MODULE_NAMES[program]
    name = module_name(program, shape.variant)
    module_only = (f"--xla_dump_to={dump}", f"--xla_dump_hlo_module_re=^{name}$")
    # the scratch folder: removed by moegen, by the worker if it outlives moegen (a SIGKILL)
    env = worker_env(shape.num_devices, folder, module_only)
    log = (folder / f"{MODULE_NAMES[program]}.log").open("wb")
    layer = str(folder / "layer.py")
    command = [sys.executable, "-c", WORKER_MAIN, layer, shape.tpu, program, shape.variant]
    with log:
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)


def _wait(
    folder: Path,
    workers: dict[str, subprocess.Popen[bytes]],
    start: float,
    timeout_s: float,
    variant: str = "",
) -> dict[str, AssignedMemory]:
    """Poll each worker's dump until its assignment is complete, then stop that worker."""
    found: dict[str, AssignedMemory] = {}
    while len(found) < len(workers):
        for program, proc in workers.items():
            if program in found:
                continue
            dump = folder / MODULE_NAMES[program]
            done = sorted(dump.glob(f"*.{module_name(program, variant)}.*{DONE}"))
            if done:
                assignment = Path(str(done[-1]).removesuffix(DONE) + ASSIGNMENT)
                sizes = assigned_sizes(assignment.read_text(encoding="utf-8"))
                found[program] = AssignedMemory(*sizes, time.perf_counter() - start)
                proc.kill()
            elif proc.poll() is not None:
                raise VerifyError(_failure(folder, program, proc.returncode))
        if time.perf_counter() - start > timeout_s:
            raise VerifyError(f"XLA's buffer assignment not written after {timeout_s:.0f} s")
        time.sleep(POLL_S)
    return found


def _failure(folder: Path, program: str, returncode: int | None = None) -> str:
    """What a worker that ended before its assignment said: the compiler's HBM or VMEM
    verdict where it gave one, else the end of its output and how it ended (a signal: the
    host's own memory, say, not the device's)."""
    text = (folder / f"{MODULE_NAMES[program]}.log").read_text(errors="replace")
    refused = out_of_memory(text[max(text.find("RESOURCE_EXHAUSTED"), 0) :])
    if refused is not None:
        return f"compile {program}: out of {refused.memory_space.upper()}: {refused.first_line}"
    how = f" (killed by signal {-returncode})" if returncode is not None and returncode < 0 else ""
    crashed = crash_words(text, returncode)
    if crashed is not None:
        return f"compile {program}: {crashed}"
    tail = text.strip()[-2000:] or "no output"
    return f"compile {program} ended before XLA's buffer assignment{how}:\n{tail}"


def assigned_peak(plan: Plan) -> int:
    """The largest of the programs' peaks as XLA assigned them, per device, of every shape
    of the module rendered from `plan` (the main one and each variant's: one module holds
    them all, and a memory trade is chosen for all); a KeptPeak where every figure was read
    back. Raises VerifyError as assigned_memory does."""
    source = render(plan)
    figures = [
        figure
        for variant, _ in plan.shape_plans()
        for figure in assigned_memory(plan, source, variant=variant).values()
    ]
    peak = max(figure.peak for figure in figures)
    return KeptPeak(peak) if all(figure.kept for figure in figures) else peak


# The layer as first written: one token chunk, the FFN unsliced.
WHOLE = {("memory", "token_chunks"): 1, ("memory", "ffn_chunks"): 1}


def whole_layer(loaded: LoadedSpec, plan: Plan) -> dict[str, Any] | None:
    """Where the layer runs in FFN slices or token chunks: XLA's assigned peak of the layer
    whole, and whether it fits HBM (the plan trades on its ledger, which can be over); None
    where every shape already runs whole. Raises VerifyError as assigned_memory does, but
    for an out-of-HBM refusal of the whole layer, which is its answer."""
    shapes = [shape for _, shape in plan.shape_plans()]
    if all(shape.ffn.chunks == 1 and shape.experts.token_chunks == 1 for shape in shapes):
        return None
    whole = make_plan(unchecked(loaded, WHOLE), options=False)
    hbm = whole.memory.hbm_bytes_per_device
    try:
        peak = assigned_peak(whole)
    except VerifyError as err:
        if "out of HBM" not in str(err):
            raise
        return {"peak": None, "hbm": hbm, "fits": False, "compiler": str(err)}
    return {"peak": peak, "hbm": hbm, "fits": fits_by_assignment(whole, peak)}


def whole_layer_text(whole: dict[str, Any]) -> str:
    """whole_layer's answer in words."""
    head = "the layer whole (the FFN unsliced, one token chunk)"
    if whole["peak"] is None:
        return f"{head}: out of HBM, as the compiler says ({whole['compiler']})"
    if whole["fits"]:
        return (
            f"{head}: {_size(whole)}: it fits; memory.ffn_chunks: 1 and token_chunks: 1 "
            "recompute nothing"
        )
    return f"{head}: {_size(whole)}: it does not fit"


def _size(whole: dict[str, Any]) -> str:
    return f"{whole['peak'] / 2**30:.2f} GiB, {whole['peak'] / whole['hbm']:.0%} of HBM"


TUNE = (
    " (memory.ffn_chunks: auto and memory.token_chunks: auto, then `moegen tune`, read each "
    "trade's figure the same way and write the fastest that fits)"
)


def whole_layer_verdict(loaded: LoadedSpec, plan: Plan, out_of_hbm: bool = False) -> str | None:
    """For the build: where the plan chose FFN slices or token chunks on its own on a TPU
    target (by its ledger, an estimate), whether the layer whole fits by XLA's buffer
    assignment (seconds, beside the full compile's minutes), and what to write if it does.
    None where the plan chose no trade of its own. A read that fails is said, not raised:
    the module the build verified stands either way. `out_of_hbm`: the full-size compile of
    the plan's trade ran out of HBM (the words say what to write instead)."""
    own = every_shapes_own_trades(loaded.spec.memory, plan)
    if not own:
        return None
    chosen = f"the plan's ledger chose {' and '.join(own)}"
    try:
        whole = whole_layer(loaded, plan)
    except VerifyError as err:
        reason = str(err).strip().splitlines()[0]
        return f"{chosen}; XLA's buffer assignment of the layer whole could not be read ({reason})"
    if whole is None:
        return None
    # the memory verdict before this step names `moegen tune` for the fastest trade that fits
    if whole["peak"] is None:
        refused = str(whole["compiler"]).strip().splitlines()[0]
        needed = f"{chosen}; the layer whole is out of HBM ({refused}): a trade is needed"
        return needed + (TUNE if out_of_hbm else "")
    read = f"{chosen}; XLA's buffer assignment of the layer whole: {_size(whole)}"
    write = "write memory.ffn_chunks: 1 and memory.token_chunks: 1"
    if whole["fits"]:
        if out_of_hbm:  # the plan's own trade ran out where the layer whole fits
            return f"{read}: it fits, where the plan's trade does not: {write}"
        return f"{read}: it fits, and the trade recomputes for nothing: {write}"
    return f"{read}: it does not fit, a trade is needed" + (TUNE if out_of_hbm else "")
