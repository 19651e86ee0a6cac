"""How the FFN slices run, beside how many there are: the decisions the plan's ledger, its
FFN plan and its trades read alike."""

from __future__ import annotations

from moegen.plan.costs import DTYPE_BYTES
from moegen.plan.experts import ExpertPlan
from moegen.spec import Spec


def casts_per_slice(spec: Spec, chunks: int) -> bool:
    """FFN slices round their weights to the compute dtype one slice at a time
    (memory.weight_casts: per_slice), where XLA would cast all of them once."""
    return chunks > 1 and spec.memory.weight_casts == "per_slice"


def slice_grads_by_hand(spec: Spec, chunks: int, experts: ExpertPlan) -> bool:
    """Whether the FFN slices' backward pass is written out rather than derived. In token
    chunks, the derived one sums a chunk's sliced weight gradients into a buffer of their
    own, in the parameter dtype, before the sum over the chunks: a second copy of every
    sliced weight's gradient (bench/MAXTEXT.md). Written out, that buffer is in the compute
    dtype, where the grouped matmul returns each slice's gradient (megablox does; XLA may
    fold the rounding away and keep float32): worth it where that dtype is the narrower."""
    narrower = DTYPE_BYTES[spec.dtypes.compute] < DTYPE_BYTES[spec.dtypes.params]
    return chunks > 1 and experts.token_chunks > 1 and narrower


def regathers_weights(spec: Spec, chunks: int) -> bool:
    """Sliced weights sharded over fsdp are gathered slice by slice, again in the backward."""
    return chunks > 1 and spec.mesh.axes.get("fsdp", 1) > 1
