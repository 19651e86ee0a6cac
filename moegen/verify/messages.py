"""The verify stage's messages: the job its worker runs, and the steps the worker reports.

The parent writes a `Job` as JSON; the worker prints one JSON line per finished step, or
`{"error": ...}` and exits; the parent decodes each line into its class (`decode`), which is
what `VerifyReport.steps`, the progress callback and the CLI see. Each is a frozen dataclass,
so readers test `isinstance` and read fields, never which keys a dict happens to hold. The
step's name says which class it is ("import", "twin parity (...)", "compile PROGRAM",
"lower PROGRAM for cuda", "memory verdict"); a compile step is either the compiled figures or
the compiler's refusal (`oom`). That one decoder is the only place that reads the JSON.

Every message is also, read-only, the dict of its JSON form: `--json` output,
`json.dumps(report.steps)` and callers that read the report as JSON (or write one by hand,
as tests do) keep working.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from moegen.verify.memory.compiler_errors import out_of_memory


class Message(dict):
    """Base of every message: a frozen dataclass whose dict is its JSON form."""

    # JSON keys that differ from the field's name (a Python keyword, say)
    renamed: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        dict.update(self, self.to_json())

    def to_json(self) -> dict[str, Any]:
        """The JSON form: fields in order, those that are None left out."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[self.renamed.get(f.name, f.name)] = _plain(value)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """Fields from their keys (missing ones take their defaults; unknown keys are ignored,
        so that a job or report from an older moegen still reads)."""
        kwargs = {}
        for f in dataclasses.fields(cls):
            key = cls.renamed.get(f.name, f.name)
            if key in data:
                kwargs[f.name] = cls._field(f.name, data[key])
        return cls(**kwargs)

    @classmethod
    def _field(cls, name: str, value: Any) -> Any:
        """A field's value from its JSON (subclasses with nested messages decode them)."""
        return tuple(value) if isinstance(value, list) else value

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{type(self).__name__} is read-only")

    __setitem__ = __delitem__ = __ior__ = _read_only  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]


def _plain(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_json()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------
# The job: what the worker is to check (parent -> worker, one JSON file)


@dataclasses.dataclass(frozen=True, eq=True)
class TwinJob(Message):
    path: str  # the rendered twin module
    label: str
    tolerance: float
    reference: dict[str, Any]  # ReferenceConfig's fields (moegen.verify.reference_config)
    variant: str | None = None  # a shape variant's name: its function and shape are checked

    @classmethod
    def _field(cls, name: str, value: Any) -> Any:
        return value


@dataclasses.dataclass(frozen=True, eq=True)
class CudaTarget(Message):
    sm: int  # compute capability x 10
    quantization: str
    call_sites: int  # grouped-matmul calls in the forward code
    kernel: str  # the kernel lowered (target.kernel: moegen.kernels names its lowering)


@dataclasses.dataclass(frozen=True, eq=True)
class TpuTarget(Message):
    topology_name: str  # libtpu's name, e.g. "v5e:2x4"
    chips_per_host_bounds: tuple[int, ...]
    num_slices: int = 1


PROGRAMS = ("forward", "forward+backward")


@dataclasses.dataclass(frozen=True, eq=True)
class Job(Message):
    module: str  # the rendered full-size module
    twins: tuple[TwinJob, ...] = ()
    compile: bool = True  # compile (or lower for CUDA) the full-size programs
    programs: tuple[str, ...] = PROGRAMS
    cuda: CudaTarget | None = None  # lower for CUDA (the kernel's lowering) instead of compiling
    tpu: TpuTarget | None = None  # compile for this slice on compile-only TPU devices
    variants: tuple[str, ...] = ()  # shape variants compiled too, after the main shape
    compilation_cache: str | None = None  # JAX's persistent cache for the CPU compiles

    @classmethod
    def _field(cls, name: str, value: Any) -> Any:
        if value is None:
            return None
        if name == "twins":
            return tuple(TwinJob.from_json(t) for t in value)
        if name == "cuda":
            return CudaTarget.from_json(value)
        if name == "tpu":
            return TpuTarget.from_json(value)
        return super()._field(name, value)


# ---------------------------------------------------------------------------------------
# The steps: what the worker found (worker -> parent, one JSON line each)


@dataclasses.dataclass(frozen=True, eq=True)
class ParityCase(Message):
    """One routing case of a twin against the dense reference."""

    case: str  # "random routing" | "starved experts"
    max_relative_error: float
    tokens_per_expert: tuple[int, ...]
    dropped: int | None = None  # copies dropped by capacity (specs with a capacity only)
    starved_experts: tuple[int, ...] | None = None  # experts routed no token on purpose


@dataclasses.dataclass(frozen=True, eq=True)
class Memory(Message):
    """Per-device sizes of a compiled program (memory_analysis), bytes."""

    argument: int = 0
    output: int = 0
    temp: int = 0
    alias: int = 0
    generated_code: int = 0

    @property
    def peak(self) -> int:
        """What XLA must hold at once (generated code is not device memory)."""
        return self.argument + self.output + self.temp - self.alias

    def to_json(self) -> dict[str, Any]:
        return super().to_json() | {"peak": self.peak}


@dataclasses.dataclass(frozen=True, eq=True)
class CollectiveTotals(Message):
    """Collectives of a compiled program (moegen.verify.hlo.collectives.summarize, totals only)."""

    renamed: ClassVar[dict[str, str]] = {"asynchronous": "async"}
    total: int = 0
    asynchronous: int = 0
    sync: int = 0
    hidden: int = 0  # compute scheduled while in flight
    hidden_by_matmul: int = 0
    exposed: int = 0
    bytes: int = 0
    exposed_bytes: int = 0


@dataclasses.dataclass(frozen=True, eq=True)
class Step(Message):
    step: str  # its name in the report and the progress lines
    seconds: float


@dataclasses.dataclass(frozen=True, eq=True)
class Imported(Step):
    """The full-size module imported."""


@dataclasses.dataclass(frozen=True, eq=True)
class TwinParity(Step):
    cases: tuple[ParityCase, ...] = ()

    @classmethod
    def _field(cls, name: str, value: Any) -> Any:
        if name == "cases":
            return tuple(ParityCase.from_json(c) for c in value)
        return super()._field(name, value)


@dataclasses.dataclass(frozen=True, eq=True)
class Compiled(Step):
    memory: Memory = Memory()
    flops: float = 0.0  # per device, every loop trip counted
    bytes_accessed: float = 0.0
    collectives: CollectiveTotals | None = None
    hidden_transfers: int | None = None  # ring transfers a grouped matmul overlaps (TPU, C > 1)
    transfers: int | None = None

    @classmethod
    def _field(cls, name: str, value: Any) -> Any:
        if name == "memory":
            return Memory.from_json(value)
        if name == "collectives":
            return None if value is None else CollectiveTotals.from_json(value)
        return super()._field(name, value)


@dataclasses.dataclass(frozen=True, eq=True)
class CompilerOutOfMemory(Step):
    """The compiler proved the program cannot fit: a verdict, not a crash."""

    oom: str = ""  # the compiler's first line
    memory_space: str = "hbm"  # "hbm" | "vmem" (a kernel's scoped VMEM)
    call: str | None = None  # the kernel the compiler names, when it does

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        if "memory_space" in data:
            return super().from_json(data)
        found = out_of_memory(data.get("oom", ""))  # written before it was classified
        extra = {"memory_space": found.memory_space, "call": found.call} if found else {}
        return super().from_json({**data, **extra})


@dataclasses.dataclass(frozen=True, eq=True)
class Lowered(Step):
    sm: int = 0
    # the kernel's custom calls in the lowered module (its CudaLowering's call prefix)
    te_calls: dict[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def _field(cls, name: str, value: Any) -> Any:
        return dict(value) if name == "te_calls" else super()._field(name, value)


@dataclasses.dataclass(frozen=True, eq=True)
class MemoryVerdict(Step):
    verdict: str = ""


@dataclasses.dataclass(frozen=True, eq=True)
class Reused(Step):
    """No worker ran: a record of the same verification passed (moegen.verify.records.record); the
    recorded steps follow, with their figures and times as they were measured then."""

    verified_at: str = ""  # ISO 8601
    reason: str = ""  # "module unchanged", or unchanged but for its header and description


@dataclasses.dataclass(frozen=True, eq=True)
class RecordIgnored(Step):
    """A record of this verification was there but proved nothing (moegen.verify.records.record,
    moegen.verify.records.evidence): the worker runs, and this says why."""

    reason: str = ""


@dataclasses.dataclass(frozen=True, eq=True)
class WorkerFailed(Message):
    """A check failed, or generated code raised: the worker's last line."""

    error: str


@dataclasses.dataclass
class VerifyReport:
    """The steps of one verification, in the order they finished."""

    steps: list[Step] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.steps = [as_step(s) for s in self.steps]  # a report written as JSON reads too

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.step == name)


def encode(message: Message) -> str:
    """One JSON line."""
    return json.dumps(message.to_json())


def decode(data: Mapping[str, Any]) -> Message:
    """The message a JSON object holds; ValueError when it is none."""
    try:
        if "step" not in data and "error" in data:
            return WorkerFailed.from_json(data)
        return as_step(data)
    except (TypeError, KeyError, AttributeError) as err:  # fields missing or of another type
        raise ValueError(f"not a verify message: {err}") from None


def as_step(step: Mapping[str, Any]) -> Step:
    """A step as it is (a Step), or decoded from its JSON by its step name."""
    if isinstance(step, Step):
        return step
    name = step.get("step", "")
    if name == "import":
        return Imported.from_json(step)
    if name.startswith("twin parity"):
        return TwinParity.from_json(step)
    if name == "memory verdict":
        return MemoryVerdict.from_json(step)
    if name == "reused record":
        return Reused.from_json(step)
    if name == "record ignored":
        return RecordIgnored.from_json(step)
    if name.startswith("lower "):
        return Lowered.from_json(step)
    if name.startswith("compile "):
        out_of = "oom" in step  # the only step name with two outcomes
        return (CompilerOutOfMemory if out_of else Compiled).from_json(step)
    raise ValueError(f"not a verify step: {name!r}")
