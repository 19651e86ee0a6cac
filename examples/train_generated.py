"""Train the layer `moegen build` wrote: optax Adam on a fixed regression task, 12 steps.

    python train.py [MODULE]    # the generated module's import name (default: layers.moe)

Prints the loss at each step; exits 1 unless it fell. A cpu target runs on as many CPU
devices as its mesh has (fake ones, on one CPU); other targets take the machine's chips.
"""

import importlib
import sys

import jax
import jax.numpy as jnp
import optax

moe = importlib.import_module(sys.argv[1] if len(sys.argv) > 1 else "layers.moe")
jax.config.update("jax_num_cpu_devices", moe.NUM_DEVICES)  # before any device is touched

mesh = moe.make_mesh()  # the spec's mesh, with Explicit axes
params = moe.init_params(jax.random.key(0), mesh)  # created sharded as moe.PARAM_SPECS says
x_key, teacher_key = jax.random.split(jax.random.key(1))
x = jax.random.normal(x_key, moe.INPUT_SHAPE, moe.COMPUTE_DTYPE)
x = jax.device_put(x, moe.input_sharding(mesh))
teacher = jax.random.normal(teacher_key, (moe.EMBED_DIM, moe.EMBED_DIM)) / moe.EMBED_DIM**0.5
optimizer = optax.adam(1e-2)


def loss_fn(params, x):
    y, aux = moe.moe_layer(params, x)  # aux.tokens_per_expert: the load of each expert
    target = jnp.tanh(x.astype(jnp.float32) @ teacher)
    return jnp.mean((y.astype(jnp.float32) - target) ** 2)


@jax.jit
def train_step(params, opt_state, x):
    loss, grads = jax.value_and_grad(loss_fn)(params, x)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


losses = []
with jax.set_mesh(mesh):  # jit and grad of a module with Explicit mesh axes run under its mesh
    opt_state = optimizer.init(params)
    for step in range(12):
        params, opt_state, loss = train_step(params, opt_state, x)
        losses.append(float(loss))
        print(f"step {step:2d}  loss {losses[-1]:.5f}", flush=True)
fell = losses[-1] < losses[0]
print(f"loss {losses[0]:.5f} -> {losses[-1]:.5f}: {'fell' if fell else 'did NOT fall'}")
sys.exit(0 if fell else 1)
