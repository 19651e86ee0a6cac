"""The plan object: everything static about one generated module.

Plan itself holds the module's identity and shapes, global and per device; what each part of
the layer decides is a typed sub-plan, built by one function beside its type: the router
(`router.py`), the expert FFN (`ffn.py`), the mesh (`mesh.py`), the kernel with its backend's
config (`kernel.py`), the parameters, the expert placement, costs, network and roofline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moegen.plan.costs import CostPlan
from moegen.plan.experts import ExpertPlan
from moegen.plan.ffn import FfnPlan
from moegen.plan.kernel import KernelPlan
from moegen.plan.memory import MemoryPlan
from moegen.plan.mesh import MeshPlan
from moegen.plan.network import NetworkPlan
from moegen.plan.params import ParamPlan, PartitionSpec
from moegen.plan.roofline import Roofline
from moegen.plan.router import RouterPlan
from moegen.spec import Memory


@dataclass(frozen=True)
class Trade:
    """The memory trade a shape is planned with: its token chunks and FFN slices, each None
    where the plan chooses. Read from the spec once (`Trade.of`); the plan's candidates are
    other trades of the same shape, planned from its quantities, never a rewritten spec."""

    token_chunks: int | None = None
    ffn_chunks: int | None = None

    @classmethod
    def of(cls, memory: Memory) -> Trade:
        """The trade a spec's memory section pins."""
        return cls(memory.token_chunks, memory.ffn_chunks)


@dataclass(frozen=True)
class ChunkCandidates:
    """memory.token_chunks candidates, each planned: alone (each listed count with the spec's
    FFN slices) and with FFN slices (each listed count above 1 with each listed slice count
    above 1, both pinned); none where token chunks cannot run."""

    token_chunks: tuple[TokenChunkOption, ...] = ()
    sliced_token_chunks: tuple[TokenChunkOption, ...] = ()


@dataclass(frozen=True)
class TokenChunkOption:
    """One value of memory.token_chunks (with the FFN slices each chunk runs) and what it
    costs, per device."""

    chunks: int
    ffn_chunks: int  # FFN slices in each chunk: the spec's, or those the plan chooses
    forward_peak: int  # planned, bytes
    train_peak: int  # planned forward+backward, bytes
    train_flops: int  # a training step's FLOPs as run (worst-case buffers, recomputation)
    ici_bytes: int  # forward+backward: sliced weights under fsdp are gathered once per chunk
    train_s: float = 0.0  # a training step's estimated seconds (moegen.plan.step_time)


@dataclass(frozen=True)
class InitPlan:
    """init_params beyond the normal draws: what starts at zero, what at one."""

    zeros: bool  # some parameters (biases) start at zero (INIT_SCALES 0.0)
    ones: tuple[str, ...]  # parameters that start at one (norm weights, scales): INIT_ONES


@dataclass(frozen=True)
class Plan:
    """Everything static about one generated module."""

    moegen_version: str
    module_name: str
    spec_display: str
    spec_sha256: str
    description: str
    summary: str
    hardware: str

    batch: int
    seq_len: int
    local_seq_len: int  # SEQ_LEN / sequence shards
    embed_dim: int
    ffn_dim: int
    local_ffn_dim: int  # FFN_DIM / tensor shards: the expert FFN columns of one device
    num_experts: int
    local_experts: int
    copies_per_device: int  # most copies of one token a device receives: min(top_k, local slots)
    batch_shards: int
    local_batch: int
    local_tokens: int
    routed_rows: int  # dropless: every token copy of this device has a row
    global_tokens: int  # BATCH * SEQ_LEN: balance losses average over all of them
    param_dtype: str
    compute_dtype: str
    router_dtype: str
    input_partition: PartitionSpec
    init: InitPlan  # which parameters start at zero or at one, not random

    router: RouterPlan
    ffn: FfnPlan
    mesh: MeshPlan
    kernel: KernelPlan
    params: tuple[ParamPlan, ...]
    experts: ExpertPlan
    cost: CostPlan
    network: NetworkPlan
    roofline: Roofline
    memory: MemoryPlan
    # shapes.variants: the same parameters, other static input shapes (none: one shape)
    variants: tuple[VariantPlan, ...] = ()
    # memory.token_chunks candidates, each planned (none where token chunks cannot run)
    chunk_candidates: ChunkCandidates = ChunkCandidates()

    # the main shape or a variant runs token chunks: the module imports what they use
    some_shape_chunks_tokens: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    def shape_plans(self) -> list[tuple[str, Plan]]:
        """Every shape's plan, named: the main shape ("") first, then each variant's."""
        return [("", self), *((variant.name, variant.plan) for variant in self.variants)]


@dataclass(frozen=True)
class VariantPlan:
    """One shape variant: its names in the module and its whole plan."""

    name: str
    function: str  # moe_layer_NAME
    suffix: str  # _NAME, added to the module's functions that depend on the shape
    constant_suffix: str  # _NAME upper-cased, added to the shape-dependent constants
    batch: int
    seq_len: int
    input_shape: tuple[int, int, int]
    plan: Plan
