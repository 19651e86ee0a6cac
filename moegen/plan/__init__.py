"""Stage 3, plan: every static quantity the generated module needs, in plain Python.

The logic lives in moegen.plan.assemble; this package face only re-exports.
"""

from __future__ import annotations

from moegen.plan.activation import GluPlan
from moegen.plan.assemble import MAIN_SHAPE, make_plan
from moegen.plan.costs import CostPlan
from moegen.plan.experts import ExpertPlan
from moegen.plan.ffn import FfnChunkOption, FfnPlan
from moegen.plan.headroom import (
    LEDGER_OVERESTIMATE,
    MEASURED_OVERESTIMATE,
    REFUSAL_OVERESTIMATE,
    cannot_fit,
    memory_peak,
    over_hbm,
    peak,
    proved_unfit,
)
from moegen.plan.kernel import KernelPlan
from moegen.plan.memory import MemoryPlan
from moegen.plan.mesh import MeshPlan
from moegen.plan.model import ChunkCandidates, Plan, TokenChunkOption
from moegen.plan.network import NetworkPlan, Transfer
from moegen.plan.params import ParamPlan, PartitionSpec
from moegen.plan.report import format_plan
from moegen.plan.roofline import PassRoofline, Roofline
from moegen.plan.router import RouterPlan
from moegen.plan.variants import VariantPlan

__all__ = [
    "ChunkCandidates",
    "CostPlan",
    "ExpertPlan",
    "FfnChunkOption",
    "FfnPlan",
    "GluPlan",
    "KernelPlan",
    "LEDGER_OVERESTIMATE",
    "MAIN_SHAPE",
    "MEASURED_OVERESTIMATE",
    "MemoryPlan",
    "MeshPlan",
    "NetworkPlan",
    "ParamPlan",
    "PartitionSpec",
    "PassRoofline",
    "REFUSAL_OVERESTIMATE",
    "Plan",
    "Roofline",
    "RouterPlan",
    "TokenChunkOption",
    "Transfer",
    "VariantPlan",
    "cannot_fit",
    "format_plan",
    "make_plan",
    "memory_peak",
    "over_hbm",
    "peak",
    "proved_unfit",
]
