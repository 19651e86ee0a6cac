"""How the grouped matmuls read the routed experts' weights: in the compute dtype, or float32
as stored, each block cast in VMEM by the kernel.

With float32 parameters and bfloat16 compute, a module casts every expert weight to bfloat16
before its grouped matmuls: a copy of all of them written each step and read again by every
kernel. A kernel that casts each weight block in VMEM (`Kernel.casts_weight_blocks`: the
pallas module's own gmm) reads the stored float32 weights instead; measured on one v5e chip
(Qwen3-30B-A3B, 8,192 tokens, bench/TPU_CHECK.md): 12.39 / 40.58 ms forward /
forward+backward against 16.12 / 45.77 with the copy.

Where the same weights are read more than once a step, the copy pays for itself, and the plan
keeps it: token chunks, ring steps and overlap chunks call each projection once per chunk or
step (4 token chunks measured 127.7 ms reading float32 against 91.8 with the copy), FFN slices
and replicas cut or concatenate the weights first, and an fsdp gather moves half the bytes in
bfloat16. Only the expert axis may shard the mesh: with the FFN width over a tensor axis, or
the gradients all-reduced over data or sequence replicas, XLA held other amounts than the
ledger models (the population's s0_021, tensor 8 x sequence 2 on tpu7x: 1.51 GiB forward+
backward against 1.21 with the cast; s0_039, data 4 x expert 2 x sequence 2 on tpu7x: 17.62
against 16.09; s0_016, data 2 x sequence 2 on v5p: 28.57 against 35.68), so the plan casts
there until the ledger is measured for it. Nothing a twin changes enters the
decision, so the twin verifies the same path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from moegen.kernels import kernel
from moegen.load import LoadedSpec
from moegen.plan.experts import ExpertPlan
from moegen.plan.params import ParamPlan, routed_expert_param

STORED_DTYPE = "float32"  # the only parameter dtype read as stored (bfloat16 needs no cast)


def kernel_weight_dtype(loaded: LoadedSpec, experts: ExpertPlan, ffn_chunks: int) -> str:
    """The dtype the grouped matmuls read the routed weights in: float32 as stored, where the
    kernel casts blocks itself and each projection is one call over the whole weights; else
    the compute dtype (the weights cast once before the calls)."""
    spec = loaded.spec
    compute = spec.dtypes.compute
    one_call = (
        ffn_chunks == 1
        and experts.token_chunks == 1
        and experts.ffn_calls == 1
        and experts.overlap_chunks == 1
    )
    reads_stored = (
        kernel(spec.target.kernel).casts_weight_blocks
        and spec.dtypes.params == STORED_DTYPE
        and compute != STORED_DTYPE
        and one_call
        and spec.parallelism.redundant_experts == 0
        and _only_experts_sharded(spec.mesh.axes)
    )
    return STORED_DTYPE if reads_stored else compute


def _only_experts_sharded(axes: Mapping[str, int]) -> bool:
    """No axis but the expert axis has more than one device: each device holds its experts'
    weights whole and alone, and their gradients are complete on it (no fsdp gather, no
    tensor-sharded width, no all-reduce over data or sequence replicas)."""
    return all(size == 1 for axis, size in axes.items() if axis != "expert")


def is_routed_weight(param: ParamPlan) -> bool:
    """A grouped matmul's weights: the routed experts' own blocks of two dimensions ([E, in,
    out]; their biases and output norm weights are [E, width])."""
    return routed_expert_param(param.shape_names) and len(param.shape_names) == 3


def read_in_kernel(params: tuple[ParamPlan, ...], weight_dtype: str) -> tuple[ParamPlan, ...]:
    """The parameters as the layer uses them when the kernels read the routed weights in
    `weight_dtype`: those weights keep it (no cast before the calls), the rest is unchanged."""
    return tuple(replace(p, use_dtype=weight_dtype) if is_routed_weight(p) else p for p in params)
