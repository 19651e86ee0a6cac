"""The candidates of a memory trade or a tune: a value for each `auto` field, each validated
and planned, counted and scored by the plan (moegen.plan.step_time), and what tuning found.

`moegen tune` compiles them (moegen.tune), the fit stage reads their memory by the compiler's
figure (moegen.fit.by_assignment); both enumerate and score them here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from moegen.diagnostics import SpecError
from moegen.load import FieldPath, LoadedSpec
from moegen.plan import Plan, make_plan
from moegen.spec import Tiles
from moegen.strategies import STRATEGIES
from moegen.variants import derive

OVERLAP_CANDIDATES = (1, 2, 4, 8)
TOKEN_CHUNK_CANDIDATES = (1, 2, 4, 8, 16)  # those that do not split the tokens are refused
FFN_CHUNK_CANDIDATES = (1, 2, 4, 8, 16)  # those that do not split the FFN width are refused
# (rows, contraction, output) variants tried beside the plan's own choice
TILE_CANDIDATES = ((256, 512, 512), (512, 512, 1024), (512, 1024, 1024), (1024, 1024, 1024))


@dataclass
class Candidate:
    choices: dict[FieldPath, Any]
    loaded: LoadedSpec | None = None  # the spec with these choices, when it is valid
    plan: Plan | None = None
    problem: str = ""  # why it was not scored ('' when it was)
    flops: float = 0.0
    bytes_accessed: float = 0.0
    peak_bytes: int = 0
    score: float = float("inf")  # seconds on TPU targets, bytes on cpu
    seconds: float = 0.0  # compile time
    counted_by: str = "compiler"  # whose FLOPs and bytes scored it: "compiler" or "plan"
    peak_by: str = "compiler"  # whose peak decided its fit: a full compile, or XLA's assignment


@dataclass
class TuneResult:
    candidates: list[Candidate]
    winner: Candidate | None
    unit: str  # "s" or "bytes"
    new_text: str


def choice_values(loaded: LoadedSpec) -> dict[FieldPath, list[Any]]:
    """For each `auto` field, the values worth compiling."""
    spec = loaded.spec
    out: dict[FieldPath, list[Any]] = {}
    for path in spec.auto_fields():
        if path == ("parallelism", "experts"):
            sharded = "expert" in spec.mesh.axes
            out[path] = [
                name for name, option in STRATEGIES.items() if option.shards_experts == sharded
            ]
        elif path == ("parallelism", "overlap_chunks"):
            out[path] = list(OVERLAP_CANDIDATES)
        elif path == ("target", "tiles"):
            out[path] = [None, *(Tiles(gate_up=list(t), down=list(t)) for t in TILE_CANDIDATES)]
        elif path == ("memory", "token_chunks"):
            out[path] = list(TOKEN_CHUNK_CANDIDATES)
        elif path == ("memory", "ffn_chunks"):
            out[path] = list(FFN_CHUNK_CANDIDATES)
    return out


def candidates(loaded: LoadedSpec) -> list[Candidate]:
    """Every combination of candidate values, each validated (invalid ones say why)."""
    values = choice_values(loaded)
    out = []
    for combo in itertools.product(*values.values()):
        choices = dict(zip(values, combo, strict=True))
        strategy = choices.get(("parallelism", "experts"), loaded.spec.parallelism.experts)
        chunks = choices.get(("parallelism", "overlap_chunks"), 1)
        if chunks != 1 and not STRATEGIES[strategy].overlaps:
            continue  # chunks only overlap the ring's transfers
        out.append(candidate_of(loaded, choices))
    return out


def candidate_of(loaded: LoadedSpec, choices: dict[FieldPath, Any]) -> Candidate:
    """The spec with `choices`, validated and planned, or the first rule it breaks."""
    candidate = Candidate(choices)
    try:
        candidate.loaded = derive(loaded, choices)
    except SpecError as err:
        candidate.problem = err.diagnostics[0].message
    else:
        candidate.plan = make_plan(candidate.loaded)
    return candidate


def loops(plan: Plan | None) -> bool:
    """Whether the layer runs its experts in a loop (token chunks, FFN slices, ring steps)."""
    assert plan is not None
    return plan.experts.token_chunks > 1 or plan.ffn.chunks > 1 or plan.experts.ffn_calls > 1


def count_by_plan(candidate: Candidate) -> None:
    """Score by the plan's step time (moegen.plan.step_time) plus its exposed communication,
    where the target has chip figures (else its FLOPs and HBM bytes, as the roofline scores):
    XLA's cost analysis counts a loop's body once (a layer in 16 token chunks would count 1/16
    of its expert FLOPs), so compiled counts of candidates that loop differently cannot be
    compared; the plan counts every iteration of every candidate alike. The compiled peak
    still decides what fits."""
    assert candidate.plan is not None
    roof = candidate.plan.roofline
    train_roof = roof.passes[-1]
    candidate.flops = train_roof.kernel_flops
    candidate.bytes_accessed = train_roof.hbm_bytes
    candidate.counted_by = "plan"
    if roof.step.train_s:
        # The plan's step time, not a bound over the pass: what a memory trade adds between
        # the matmuls (weights read per chunk, gradients summed per chunk and slice) is most
        # of its cost on the chip, and the pass's bound misses it (bench/trade_time).
        candidate.score = roof.step.train_s + train_roof.exposed_comm_s
    else:
        set_score(candidate)


def set_score(candidate: Candidate) -> None:
    assert candidate.plan is not None
    roof = candidate.plan.roofline
    train_roof = roof.passes[-1]
    if roof.peak_flops_per_s:
        compute = candidate.flops / roof.peak_flops_per_s
        memory = candidate.bytes_accessed / roof.hbm_bytes_per_s
        candidate.score = max(compute, memory) + train_roof.exposed_comm_s
    else:
        candidate.score = candidate.bytes_accessed + train_roof.ici_bytes + train_roof.dcn_bytes


def yaml_value(value: Any) -> str:
    """A chosen value as YAML text (tiles as a flow mapping)."""
    if isinstance(value, Tiles):
        return f"{{gate_up: {list(value.gate_up or ())}, down: {list(value.down or ())}}}"
    if value is None:
        return "null"
    return str(value)


def trade_words(plan: Plan) -> str:
    """A plan's memory trade in words: "2 FFN slices x 1 token chunk"."""
    slices = _count(plan.ffn.chunks, "FFN slice")
    return f"{slices} x {_count(plan.experts.token_chunks, 'token chunk')}"


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"
