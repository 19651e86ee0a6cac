"""How to read bench/RESULTS.md: the notes its last section lists."""

READING_NOTES = (
    "Compiled flops and bytes of a megablox call are the kernel's own static CostEstimate: "
    "2*m*k*n and its operands' bytes over the whole row buffer, whatever the routing. The "
    "kernel's grid only runs the row tiles that hold rows of its groups (megablox's "
    "`num_active_tiles`, computed from the group sizes at run time), so where the plan sizes "
    "the buffer for the worst case (ragged_all_to_all: RECEIVE_ROWS, 4x the routed rows in "
    "mixtral_8x7b_ep_a2a_v5e; ring of experts: every copy of the expert group, 8x in "
    "qwen3_30b_a3b_ring_v6e) the compiled figure is "
    "an upper bound of the work done at run time, and */ useful* shows that bound, not waste "
    "at balanced routing. The XLA figures of the baselines come from XLA's own cost model of "
    "what GSPMD made of them.",
    "The two models also count a matmul differently: megablox's estimate counts its tiles as "
    "it moves them (the rows once per output tile, one expert's weights once per row tile), "
    "XLA counts a dot or a ragged dot as its operands and result once, whatever tiles its "
    "emitter uses. *bytes, kernel operands once* takes from the compiled bytes what each "
    "kernel call's estimate counts beyond one read of its operands and one write of its result "
    "(`moegen.verify.hlo.loops.kernel_tile_bytes`, loop trips included), so that the Pallas layers "
    "are counted as XLA counts the baselines; it equals *bytes accessed* for a layer without "
    "Pallas kernels.",
    "Where a baseline's */ useful* is above 1 without a worst-case buffer, GSPMD replicated work: "
    "e.g. ragged_dot on an expert-sharded mesh sorts the global batch and runs the grouped "
    "matmuls unsharded over the expert axis.",
    "*exposed / all collectives* counts static collectives of the scheduled HLO (one inside a "
    "loop body counts once). Synchronous collectives are exposed by definition; an async one "
    "is hidden when any compute is scheduled between its start and its done (XLA:TPU async "
    "collective fusions included). *exposed collective MiB* sums their result buffers (for a "
    "ragged all-to-all, the whole receive buffer: an upper bound of what moves).",
    "Peak memory is per device from the compiler; *fits HBM* compares it with the chip's HBM "
    "per device (moegen/hardware.py).",
    "CPU twin times are tens-of-tokens programs: they measure dispatch overhead and op count, "
    "not arithmetic, and say nothing about TPU speed. Pallas twins run interpreted.",
)
