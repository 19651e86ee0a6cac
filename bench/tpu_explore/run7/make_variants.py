"""Run 7's variants of the one-chip Qwen3 module, made from base_qwen3.py / gather_qwen3.py."""

from pathlib import Path

HERE = Path(__file__).parent
ONEHOT = (
    "jnp.bincount(flat_ids, length=NUM_EXPERTS).astype(jnp.int32)",
    "jnp.sum(jax.nn.one_hot(flat_ids, NUM_EXPERTS, dtype=jnp.int32), axis=0)",
)
ONEHOT_COUNTS = (
    "jnp.bincount(expert_ids.reshape(ROUTED_ROWS), length=NUM_EXPERTS)",
    "jnp.sum(jax.nn.one_hot(expert_ids.reshape(ROUTED_ROWS), NUM_EXPERTS, dtype=jnp.int32), axis=0)",
)
TILES256 = [
    ("forward=(512, ", "forward=(256, "),
    ("input_gradient=(512, ", "input_gradient=(256, "),
    ("weight_gradient=(512, ", "weight_gradient=(256, "),
]
# The combine weights applied to the hidden rows [rows, F] before the down projection
# (linear, so the same sums), and the combine an unweighted sum of each token's copies.
WEIGHTED_FFN = [
    (
        "def _expert_ffn(rows: jax.Array, weights: Params, group_sizes: jax.Array) -> jax.Array:",
        "def _expert_ffn(rows: jax.Array, weights: Params, group_sizes: jax.Array, row_weights: jax.Array) -> jax.Array:",
    ),
    (
        "    hidden = jax.nn.silu(gate) * up\n",
        "    hidden = (jax.nn.silu(gate.astype(jnp.float32)) * up * row_weights[:, None]).astype(COMPUTE_DTYPE)\n",
    ),
    (
        "_expert_ffn(_dispatch(tokens, order, inverse), weights, group_sizes)",
        "_expert_ffn(_dispatch(tokens, order, inverse), weights, group_sizes, combine_weights.reshape(ROUTED_ROWS)[order])",
    ),
    (
        '    y = jnp.einsum("tkd,tk->td", out, combine_weights, preferred_element_type=jnp.float32)',
        "    y = out.sum(axis=1, dtype=jnp.float32)",
    ),
]


def variant(source: str, name: str, edits: list[tuple[str, str]]) -> None:
    text = (HERE / source).read_text()
    for old, new in edits:
        assert text.count(old) >= 1, (name, old)
        text = text.replace(old, new)
    (HERE / name).write_text(text)


variant("base_qwen3.py", "fast_qwen3.py", [ONEHOT, ONEHOT_COUNTS, *TILES256])
variant("gather_qwen3.py", "all_qwen3.py", [ONEHOT, ONEHOT_COUNTS, *TILES256, *WEIGHTED_FFN])
variant("gather_qwen3.py", "wgather_qwen3.py", [*WEIGHTED_FFN])
