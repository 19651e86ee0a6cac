"""Run 6 on a CPU: the variant's row movements (_dispatch, _permute) against plain indexing,
values and gradients, at small sizes; their code is read out of gather_qwen3.py itself."""

import sys

import jax
import jax.numpy as jnp
import numpy as np

with open(sys.argv[1] if len(sys.argv) > 1 else "gather_qwen3.py") as file:
    source = file.read()
start = source.index("# Row movements whose gradients")
last = "_permute.defvjp(_permute_fwd, _permute_bwd)"
end = source.index(last) + len(last)
namespace = {"jax": jax, "jnp": jnp, "LOCAL_TOKENS": 6, "TOP_K": 3, "EMBED_DIM": 4}
exec(source[start:end], namespace)  # noqa: S102 (this folder's own variant)
tokens = jnp.asarray(np.random.default_rng(0).normal(size=(6, 4)), jnp.float32)
ids = jnp.asarray(np.random.default_rng(1).integers(0, 5, size=18))
order = jnp.argsort(ids, stable=True)
inverse = jnp.argsort(order)
weights = jnp.asarray(np.random.default_rng(2).normal(size=(18, 4)), jnp.float32)


def plain(t):
    rows = t[order // 3] * weights
    return (rows[inverse] ** 2).sum()


def variant(t):
    rows = namespace["_dispatch"](t, order, inverse) * weights
    return (namespace["_permute"](rows, inverse, order) ** 2).sum()


np.testing.assert_allclose(variant(tokens), plain(tokens), rtol=1e-6)
np.testing.assert_allclose(jax.grad(variant)(tokens), jax.grad(plain)(tokens), rtol=1e-5)
print("run 6 row movements: values and gradients match plain indexing")
