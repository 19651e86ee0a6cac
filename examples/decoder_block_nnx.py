"""A tiny decoder in Flax NNX around a moegen MoE layer: train, save, restore.

    .venv/bin/python examples/decoder_block_nnx.py [--steps N] [--checkpoint-dir DIR]

The MoE layer comes from the small spec below (8 experts, top-2 sigmoid routing with the
aux-loss-free balancing bias, embed 64, on a data 2 x fsdp 2 mesh of CPU devices), rendered
with moegen's own stages (load, validate, plan, render) into a temporary directory and
imported; any generated module works the same way (`import generated.NAME as moe`).

The model: token embedding, one decoder block (RMSNorm, causal self-attention, residual;
RMSNorm, the moegen layer as `moegen.nnx.MoELayer`, residual), a final RMSNorm and the
embedding's transpose as the output head. It is created inside `nnx.jit` under the mesh, so
every parameter is created already sharded (the MoE weights as the module's PARAM_SPECS say,
the rest replicated).

Training: next-token cross-entropy on sequences of a fixed random bigram chain (each token
is followed by one of two successors), optax AdamW through `nnx.Optimizer(..., wrt=nnx.Param)`,
and after each step the layer's routing-bias update, which the optimizer leaves alone. It
prints the loss every step, saves `nnx.state(model)` with orbax, restores it into a fresh
model built from the abstract state (`nnx.get_abstract_model`), and checks the restored model
gives exactly the same logits. Exits 1 if the loss did not fall or the outputs differ.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a CPU example; set before jax starts

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from flax import nnx  # noqa: E402

from moegen.nnx import MoELayer  # noqa: E402

SPEC = """\
version: 1
description: A tiny DeepSeek-style layer for the Flax example.
layer:
  num_experts: 8
  embed_dim: 64
  ffn_dim: 128
router:
  top_k: 2
  score: sigmoid
  renormalize: true
  routing_bias: true
shapes:
  batch: 8
  seq_len: 32
dtypes:
  params: float32
  compute: float32
mesh:
  axes:
    data: 2
    fsdp: 2
target:
  hardware: cpu
  kernel: xla
"""
VOCAB = 64
HEADS = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps")
    parser.add_argument("--learning-rate", type=float, default=1e-2, help="AdamW step size")
    parser.add_argument("--bias-rate", type=float, default=1e-3, help="routing-bias change")
    parser.add_argument("--checkpoint-dir", type=Path, help="default: a temporary directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    return args


def render_layer(directory: Path) -> ModuleType:
    """The spec above through moegen's stages, imported as a module."""
    from moegen.load import load_spec_bytes
    from moegen.plan import make_plan
    from moegen.render import render
    from moegen.validate import validate

    name = "tiny_moe_nnx"
    loaded = validate(load_spec_bytes(SPEC.encode(), "decoder_block_nnx.yaml", name))
    path = directory / f"{name}.py"
    path.write_text(render(make_plan(loaded)), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the module's NamedTuples look it up
    spec.loader.exec_module(module)
    return module


class DecoderBlock(nnx.Module):
    """Pre-norm causal self-attention, then the MoE layer, each with a residual."""

    def __init__(self, moe: ModuleType, mesh: jax.sharding.Mesh, rngs: nnx.Rngs) -> None:
        dim = moe.EMBED_DIM
        self.attention_norm = nnx.RMSNorm(dim, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(
            num_heads=HEADS, in_features=dim, decode=False, rngs=rngs
        )
        self.moe_norm = nnx.RMSNorm(dim, rngs=rngs)
        self.moe = MoELayer(moe, rngs=rngs, mesh=mesh)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, Any]:
        causal = nnx.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        x = x + self.attention(self.attention_norm(x), mask=causal)
        y, aux = self.moe(self.moe_norm(x).astype(self.moe.module.COMPUTE_DTYPE))
        return x + y.astype(x.dtype), aux


class TinyDecoder(nnx.Module):
    """Token embedding, one DecoderBlock, RMSNorm, the embedding's transpose as the head."""

    def __init__(self, moe: ModuleType, mesh: jax.sharding.Mesh, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(VOCAB, moe.EMBED_DIM, rngs=rngs)
        self.block = DecoderBlock(moe, mesh, rngs)
        self.final_norm = nnx.RMSNorm(moe.EMBED_DIM, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, Any]:
        # A one-hot product rather than nnx.Embed's gather, whose output sharding JAX cannot
        # infer from batch-sharded indices under an Explicit-axes mesh.
        x = jax.nn.one_hot(tokens, VOCAB) @ self.embed.embedding.get_value()
        x, aux = self.block(x)
        return self.embed.attend(self.final_norm(x)), aux


def loss_fn(model: TinyDecoder, tokens: jax.Array) -> tuple[jax.Array, Any]:
    """Next-token cross-entropy; tokens is [BATCH, SEQ_LEN + 1]."""
    logits, aux = model(tokens[:, :-1])
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
    return losses.mean(), aux


@nnx.jit
def train_step(
    model: TinyDecoder, optimizer: nnx.Optimizer, tokens: jax.Array, bias_rate: float
) -> jax.Array:
    (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, tokens)
    optimizer.update(model, grads)  # nnx.Param only: the routing bias is not one
    model.block.moe.update_routing_bias(aux.tokens_per_expert, bias_rate)
    return loss


@nnx.jit
def logits_of(model: TinyDecoder, tokens: jax.Array) -> jax.Array:
    return model(tokens)[0]


class Batches:
    """Sequences of a fixed random bigram chain: each token is followed by one of its two
    successors, chosen at random; laid out over the mesh like the MoE layer's input."""

    def __init__(self, moe: ModuleType, mesh: jax.sharding.Mesh, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.successors = self.rng.integers(0, VOCAB, size=(VOCAB, 2))
        self.shape = (moe.BATCH, moe.SEQ_LEN + 1)
        spec = jax.sharding.PartitionSpec(moe.BATCH_AXES)
        self.sharding = jax.sharding.NamedSharding(mesh, spec)

    def next(self) -> jax.Array:
        tokens = np.empty(self.shape, np.int32)
        tokens[:, 0] = self.rng.integers(0, VOCAB, size=self.shape[0])
        for t in range(self.shape[1] - 1):
            pick = self.rng.integers(0, 2, size=self.shape[0])
            tokens[:, t + 1] = self.successors[tokens[:, t], pick]
        return jax.device_put(tokens, self.sharding)


def run(moe: ModuleType, args: argparse.Namespace, directory: Path) -> int:
    """Train, save to `directory`, restore, compare; the exit status."""
    mesh = moe.make_mesh(jax.devices()[: moe.NUM_DEVICES])
    with jax.set_mesh(mesh):  # created inside jit under the mesh: every parameter sharded
        model = nnx.jit(lambda: TinyDecoder(moe, mesh, nnx.Rngs(args.seed)))()
    optimizer = nnx.Optimizer(model, optax.adamw(args.learning_rate), wrt=nnx.Param)
    batches = Batches(moe, mesh, args.seed)

    losses = []
    with jax.set_mesh(mesh):
        for step in range(args.steps):
            losses.append(float(train_step(model, optimizer, batches.next(), args.bias_rate)))
            print(f"step {step:3d}  loss {losses[-1]:.4f}", flush=True)
    bias = np.asarray(model.block.moe.routing_bias.get_value())
    print(f"routing bias after training: min {bias.min():+.4f} max {bias.max():+.4f}")

    # Save the state with orbax; restore it into a fresh model built from the abstract state.
    path = (directory / "state").absolute()
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, nnx.state(model), force=True)
    checkpointer.wait_until_finished()

    def fresh() -> TinyDecoder:  # other initial values: the restore must replace them all
        return TinyDecoder(moe, mesh, nnx.Rngs(args.seed + 1))

    graphdef, abstract = nnx.get_abstract_model(fresh, mesh)
    restored = nnx.merge(graphdef, checkpointer.restore(path, abstract))
    print(f"saved and restored {path}")

    with jax.set_mesh(mesh):
        tokens = batches.next()[:, :-1]
        same = np.array_equal(logits_of(model, tokens), logits_of(restored, tokens))
    leaves = [jax.tree.leaves(nnx.state(m)) for m in (model, restored)]
    same = same and all(np.array_equal(a, b) for a, b in zip(*leaves, strict=True))
    falls = losses[-1] < losses[0]
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; restored state and outputs identical: {same}")
    if not falls:
        print("FAILED: the loss did not fall", file=sys.stderr)
    if not same:
        print("FAILED: the restored model gives other outputs", file=sys.stderr)
    return 0 if falls and same else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="decoder_block_nnx_") as scratch:
        moe = render_layer(Path(scratch))
        jax.config.update("jax_num_cpu_devices", moe.NUM_DEVICES)  # before any computation
        return run(moe, args, args.checkpoint_dir or Path(scratch))


if __name__ == "__main__":
    sys.exit(main())
