"""Two full-size layers the plan's ledger cannot settle alone, which XLA's buffer assignment
decides (tests/fit/test_refusal_read.py, test_own_trade.py, test_refit.py and the bench
tests that hold out the same layers)."""

# Llama 4 Scout's MoE block replicated over fsdp 4 on v5e 2x2 (bench.holdout, seed 3, spec 20
# made too big to run whole): the plan chooses 2 token chunks, planned 16.60 GiB, 4% over
# HBM and within the ledger's error, so not refused by it; XLA finds the chunks out of HBM
# (18.08G of temporaries) and the layer whole 14.30 GiB.
LLAMA4 = """\
version: 1
layer: {num_experts: 16, embed_dim: 5120, ffn_dim: 8192, shared_ffn_dim: 8192}
router: {top_k: 1, score: sigmoid, weighting: input}
shapes: {batch: 180, seq_len: 2048}
dtypes: {params: float32, compute: bfloat16}
mesh:
  axes: {fsdp: 4}
parallelism: {experts: replicated}
target: {hardware: tpu-v5e, topology: 2x2, kernel: xla}
"""

# DeepSeek-V3's block in a ring over fsdp 2 x expert 4 x sequence 2 on v6e 4x4 (bench.holdout,
# seed 2, spec 24 made too big): no trade leaves the ledger's headroom, so the plan takes the
# one it plans lowest, 16 FFN slices at 31.81 of 32 GiB; XLA needs 34.53 GiB of temporaries
# for them, and 25.94 GiB for the layer whole.
DEEPSEEK = """\
version: 1
layer: {num_experts: 256, embed_dim: 7168, ffn_dim: 2048, shared_ffn_dim: 2048}
router:
  top_k: 8
  score: sigmoid
  renormalize: true
  routed_scaling: 2.5
  group_limit: {groups: 8, keep: 4}
  routing_bias: true
shapes: {batch: 128, seq_len: 1024}
dtypes: {params: float32, compute: bfloat16}
mesh:
  axes: {fsdp: 2, expert: 4, sequence: 2}
parallelism: {experts: ring_of_experts}
target: {hardware: tpu-v6e, topology: 4x4, kernel: xla}
"""
