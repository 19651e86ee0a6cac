"""The shrunken twin: the same spec with small dimensions, cheap enough to run on CPU.

Everything that decides the code path is kept (mesh axes and sizes, experts, top-k,
router options, strategy, kernel); only the sizes that merely scale the work shrink,
and the twin is validated by the same rules as the spec itself. One exception: a `te` spec's
twin uses kernel `xla` (Transformer Engine runs on NVIDIA GPUs only), so everything but the
TE call itself is checked on CPU.
"""

from __future__ import annotations

import math
from dataclasses import replace

from moegen.load import LoadedSpec
from moegen.plan import make_plan
from moegen.sizes import axes_product
from moegen.spec import Tiles
from moegen.tiling import LANES
from moegen.validate import validate

TWIN_SEQUENCES_PER_SHARD = 2
TWIN_SEQ_LEN = 5  # 10 tokens per device: routed rows 10*top_k, ragged against 32-row tiles
TWIN_MIN_EMBED = 16
TWIN_FFN = 24  # differs from embed so that a transposed weight cannot go unnoticed
TWIN_SHARED_FFN = 20  # differs from both, for the same reason
# Pallas twins run megablox interpreted with small tiles: rows padded past a ragged last tile,
# contraction and output dimensions smaller than one tile (both masked by the kernel).
TWIN_TILE = [32, 128, 128]


def twin_of(loaded: LoadedSpec, *, dtype: str | None = "float32") -> LoadedSpec:
    """The twin of a validated spec; `dtype` overrides both dtypes (None keeps the spec's)."""
    spec = loaded.spec
    fsdp = spec.mesh.axes.get("fsdp", 1)
    chunks = spec.parallelism.overlap_chunks
    # embed must split over fsdp and into overlap chunks (whole lane tiles for pallas)
    chunk_unit = chunks * LANES if spec.target.kernel == "pallas" and chunks > 1 else chunks
    unit = math.lcm(fsdp, chunk_unit)
    embed = unit * -(-TWIN_MIN_EMBED // unit)
    shards = axes_product(spec.mesh.axes, spec.batch_axes)
    # FFN slices as the full plan runs them (pinned or chosen), whole lanes for pallas; gate
    # and up side by side as the full plan runs them (whole lanes per slice when it does)
    full = make_plan(loaded)
    ffn_chunks = full.ffn_chunks
    ffn_unit = ffn_chunks * (LANES if spec.target.kernel == "pallas" and ffn_chunks > 1 else 1)
    if full.fuses_gate_up:
        ffn_unit = math.lcm(ffn_unit, ffn_chunks * LANES)
    ffn = ffn_unit * -(-TWIN_FFN // ffn_unit)
    if ffn == embed:  # a transposed weight must not go unnoticed
        ffn += ffn_unit
    updates = {
        "layer": spec.layer.model_copy(
            update={
                "embed_dim": embed,
                "ffn_dim": ffn,
                "shared_ffn_dim": TWIN_SHARED_FFN if spec.layer.shared_ffn_dim else None,
            }
        ),
        "shapes": spec.shapes.model_copy(
            update={"batch": shards * TWIN_SEQUENCES_PER_SHARD, "seq_len": TWIN_SEQ_LEN}
        ),
    }
    updates["memory"] = spec.memory.model_copy(update={"ffn_chunks": ffn_chunks})
    if spec.target.kernel == "te":
        # TE's GEMMs run on a GPU only: the twin runs the same module with the portable
        # grouped matmul in their place (same call signature), in the compute dtype.
        updates["target"] = spec.target.model_copy(update={"kernel": "xla", "quantization": "none"})
    if spec.target.kernel == "pallas":
        tiles = Tiles(gate_up=TWIN_TILE, down=TWIN_TILE)
        updates["target"] = spec.target.model_copy(update={"tiles": tiles})
    if dtype is not None:
        updates["dtypes"] = spec.dtypes.model_copy(update={"params": dtype, "compute": dtype})
    twin = validate(replace(loaded, spec=spec.model_copy(update=updates)))
    if make_plan(twin).fuses_gate_up != full.fuses_gate_up:
        raise AssertionError("the twin must run gate and up as the full-size layer does")
    return twin
