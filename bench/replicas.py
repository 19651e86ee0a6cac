"""Redundant experts measured (issue 30): the rows on the busiest device of the expert axis
without replicas and with 1 and 2 extra slots per device, next to what the placement
predicted, on fake CPU devices.

    python -m bench.replicas                 # seeds 0 (development) and 1 (hold-out)
    python -m bench.replicas --seeds 0 --steps 50

Two layers, shrunk to run on CPU (ffn_dim 2, embed_dim = num_experts so that the router can
be the identity, float32): Qwen3-30B-A3B-shaped (128 experts, top-8 softmax renormalised)
over expert 8, and DeepSeek-V3-shaped (256 experts, top-8 sigmoid renormalised) over
expert 16, each TOKENS tokens a measured call (TRAIN_TOKENS a training step). The loads:

- Zipf s = 0.8, 1.0, 1.2: token copies routed with probability p (Zipf, the hot experts at
  seeded random places). The router is the identity and x[token] = log(p) + Gumbel noise:
  the top-k of that samples k experts without replacement in proportion to p (the Gumbel
  top-k trick). The placement is chosen from one batch's aux.tokens_per_expert and measured
  on another batch (a fresh seed).
- trained: the small layer without replicas trained `--steps` SGD steps on a synthetic
  regression (x with a fixed random offset, so that the random router is skewed; targets
  tanh(x @ A)), its aux.tokens_per_expert summed with accumulate_load and written with
  save_load, over all the steps and over the last RECENT_STEPS (the router drifts while it
  trains); each record's placement is measured on a fresh batch through the trained layer.

Measured: aux.received_rows (the most rows any device received). Predicted: the most of
Placement.rows(the measured batch's aux.tokens_per_expert). On its own load: busiest / mean
by the placement's prediction for the load it was chosen from. bytes: the plan's
replicas.moved_bytes, the replicas' weights each device receives a step, forward (the
gradients go back the same way: twice that in a training step).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAKE_DEVICES = 16  # the most any layer here uses; set before jax is imported
FFN_DIM = 2  # the FFN's width does not change which rows go where
TOKENS = 2048  # a measured call
TRAIN_TOKENS = 128  # a training step: small, so that 200 steps take seconds
RECENT_STEPS = 20  # the second record: the last steps only (the router drifts in training)
ZIPF = (0.8, 1.0, 1.2)
EXTRA_SLOTS = (1, 2)


@dataclass(frozen=True)
class Shape:
    name: str
    experts: int
    devices: int
    router: str  # the spec's router section

    def spec(self, tokens: int) -> str:
        return f"""version: 1
layer: {{num_experts: {self.experts}, embed_dim: {self.experts}, ffn_dim: {FFN_DIM}}}
router: {self.router}
shapes: {{batch: {self.devices}, seq_len: {tokens // self.devices}}}
mesh: {{axes: {{expert: {self.devices}}}}}
parallelism: {{experts: ragged_all_to_all}}
dtypes: {{params: float32, compute: float32}}
target: {{hardware: cpu, kernel: xla}}
"""


SHAPES = (
    Shape("qwen3-30b-a3b/ep8", 128, 8, "{top_k: 8, score: softmax, renormalize: true}"),
    Shape("deepseek-v3/ep16", 256, 16, "{top_k: 8, score: sigmoid, renormalize: true}"),
)


@dataclass(frozen=True)
class Layer:
    """A generated module, imported, with its plan and mesh."""

    module: Any
    plan: Any
    mesh: Any
    forward: Any  # jitted moe_layer


def build(
    shape: Shape, directory: Path, name: str, placement: Any = None, tokens: int = TOKENS
) -> Layer:
    """Generate (no verification) and import the layer, with `placement`'s replicas."""
    import jax

    from moegen.pipeline import generate

    text = shape.spec(tokens)
    if placement is not None:
        (directory / f"{name}.json").write_text(json.dumps(placement.as_json("bench.replicas")))
        redundant = len(placement.extra[0]) * shape.devices
        text = text.replace(
            "{experts: ragged_all_to_all}",
            f"{{experts: ragged_all_to_all, redundant_experts: {redundant}, "
            f"placement: {name}.json}}",
        )
    (directory / f"{name}.yaml").write_text(text)
    generated = generate(directory / f"{name}.yaml")
    path = directory / f"{name}.py"
    path.write_text(generated.source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"bench_replicas_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mesh = module.make_mesh(jax.devices()[: shape.devices])
    return Layer(module, generated.plan, mesh, jax.jit(module.moe_layer))


def identity_params(layer: Layer, seed: int) -> dict:
    """The layer's parameters with the router set to the identity."""
    import jax
    import jax.numpy as jnp

    params = layer.module.init_params(jax.random.key(seed), layer.mesh)
    router = params["router"]
    params["router"] = jax.device_put(jnp.eye(*router.shape, dtype=router.dtype), router.sharding)
    return params


def zipf_batch(layer: Layer, p: Any, seed: int) -> Any:
    """x whose top-k under the identity router samples k experts in proportion to p."""
    import jax
    import numpy as np

    shape = layer.module.INPUT_SHAPE
    x = np.log(p) + np.random.default_rng(seed).gumbel(size=shape)
    return jax.device_put(x.astype(np.float32), layer.module.input_sharding(layer.mesh))


def zipf_p(experts: int, s: float, seed: int) -> Any:
    import numpy as np

    weights = 1.0 / np.arange(1, experts + 1) ** s
    return np.random.default_rng(seed).permutation(weights) / weights.sum()


def run(layer: Layer, params: dict, x: Any) -> tuple[int, list[float]]:
    """(aux.received_rows, aux.tokens_per_expert) of one call."""
    import numpy as np

    _, aux = layer.forward(params, x)
    return int(aux.received_rows), [float(v) for v in np.asarray(aux.tokens_per_expert)]


@dataclass(frozen=True)
class Trained:
    params: dict
    whole: list[float]  # the load of every step
    recent: list[float]  # the load of the last RECENT_STEPS
    x: Any  # a fresh batch for the measured layer
    losses: tuple[float, float]  # the first and last step's


def train(student: Layer, measured: Layer, seed: int, steps: int, directory: Path) -> Trained:
    """`steps` SGD steps of `student` and the loads they recorded, and a fresh batch for
    `measured` from the same inputs. The layers differ only in tokens per call, so they
    share parameters."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from moegen.placement import accumulate_load, read_load, save_load

    m, rng = student.module, np.random.default_rng([seed, 1000])
    width = m.INPUT_SHAPE[-1]
    offset = rng.normal(size=width).astype(np.float32)  # skews the random router
    teacher = jnp.asarray(rng.normal(size=(width, width)) / np.sqrt(width), jnp.float32)

    def batch(layer: Layer) -> Any:
        x = offset + rng.normal(size=layer.module.INPUT_SHAPE).astype(np.float32)
        return jax.device_put(x, layer.module.input_sharding(layer.mesh))

    def loss(params: dict, x: Any) -> tuple[Any, Any]:
        y, aux = m.moe_layer(params, x)
        return jnp.mean((y - jnp.tanh(x @ teacher)) ** 2), aux.tokens_per_expert

    optimizer = optax.sgd(0.5)

    @jax.jit
    def step(params: dict, state: Any, x: Any) -> tuple[dict, Any, Any, Any]:
        (value, counts), grads = jax.value_and_grad(loss, has_aux=True)(params, x)
        updates, state = optimizer.update(grads, state)
        return optax.apply_updates(params, updates), state, counts, value

    params = m.init_params(jax.random.key(seed), student.mesh)
    state, losses = optimizer.init(params), []
    whole = recent = jnp.zeros(m.NUM_EXPERTS, jnp.float32)
    add = jax.jit(accumulate_load)
    with jax.set_mesh(student.mesh):
        for index in range(steps):
            params, state, counts, value = step(params, state, batch(student))
            whole = add(whole, counts)
            recent = add(recent, counts) if index >= steps - RECENT_STEPS else recent
            losses.append(float(value))
    records = []
    for name, load, counted in (("whole", whole, steps), ("recent", recent, RECENT_STEPS)):
        path = directory / f"load_{name}_{seed}.json"
        save_load(path, load, min(counted, steps))
        records.append(read_load(path, m.NUM_EXPERTS))
    return Trained(params, records[0], records[1], batch(measured), (losses[0], losses[-1]))


@dataclass(frozen=True)
class Row:
    layer: str
    load: str
    seed: int
    extra: int  # extra slots per device
    measured: int  # aux.received_rows
    predicted: float  # the most of Placement.rows(the measured batch's tokens_per_expert)
    mean: float  # copies / devices
    planned: float  # busiest / mean the placement gives the load it was chosen from
    moved_bytes: int = 0  # forward, per device

    def cells(self) -> list[str]:
        error = (self.predicted - self.measured) / self.measured
        moved = f"{self.moved_bytes} ({2 * self.moved_bytes})" if self.extra else "-"
        return [
            self.layer,
            self.load,
            str(self.seed),
            str(self.extra),
            str(self.measured),
            f"{self.predicted:.1f}",
            f"{error:+.2%}",
            f"{self.measured / self.mean:.3f}",
            f"{self.planned:.3f}",
            moved,
        ]


HEADER = [
    "layer",
    "load",
    "seed",
    "extra slots",
    "busiest rows",
    "predicted",
    "pred. error",
    "busiest / mean",
    "on its own load",
    "bytes/step fwd (fwd+bwd)",
]


@dataclass(frozen=True)
class Case:
    """One load of one layer: where its modules go and what its rows are called."""

    shape: Shape
    plain: Layer  # the layer without replicas
    directory: Path
    load: str
    seed: int
    tag: str  # its modules' names start with it


def measure(case: Case, params: dict, chosen_from: list[float], x: Any) -> list[Row]:
    """Rows of one load: the layer without replicas and with each EXTRA_SLOTS, placed for
    `chosen_from` and measured on `x`."""
    from moegen.placement import contiguous, place

    shape = case.shape
    received, tokens = run(case.plain, params, x)
    row = dict(layer=shape.name, load=case.load, seed=case.seed, mean=sum(tokens) / shape.devices)
    before = contiguous(shape.experts, shape.devices)
    planned = before.busiest_over_mean(chosen_from)
    rows = [
        Row(**row, extra=0, measured=received, predicted=max(before.rows(tokens)), planned=planned)
    ]
    for extra in EXTRA_SLOTS:
        placement = place(chosen_from, shape.devices, extra)
        layer = build(shape, case.directory, f"{case.tag}_x{extra}", placement)
        got, same_tokens = run(layer, params, x)
        assert same_tokens == tokens, "replicas must not change the routing"
        rows.append(
            Row(
                **row,
                extra=extra,
                measured=got,
                predicted=max(placement.rows(tokens)),
                planned=placement.busiest_over_mean(chosen_from),
                moved_bytes=layer.plan.experts.replicas.moved_bytes,
            )
        )
    return rows


def seed_rows(
    shape: Shape, plain: Layer, student: Layer, seed: int, steps: int, directory: Path
) -> list[Row]:
    """The Zipf loads' rows and the trained records' rows of one seed."""
    rows = []
    params = identity_params(plain, seed)
    for index, s in enumerate(ZIPF):
        p = zipf_p(shape.experts, s, seed)
        chosen_from = run(plain, params, zipf_batch(plain, p, (seed, index, 0)))[1]
        x = zipf_batch(plain, p, (seed, index, 1))  # another batch: a fresh seed
        case = Case(shape, plain, directory, f"Zipf {s}", seed, f"zipf{index}_s{seed}")
        rows += measure(case, params, chosen_from, x)
    trained = train(student, plain, seed, steps, directory)
    first, last = trained.losses
    print(f"{shape.name} seed {seed}: training loss {first:.4f} -> {last:.4f}", flush=True)
    recent = min(RECENT_STEPS, steps)
    for name, record in (("all", trained.whole), ("last", trained.recent)):
        load = f"trained, {name} {steps if name == 'all' else recent} steps"
        case = Case(shape, plain, directory, load, seed, f"trained_{name}_s{seed}")
        rows += measure(case, trained.params, record, trained.x)
    return rows


def shape_rows(shape: Shape, seeds: list[int], steps: int, directory: Path) -> list[Row]:
    plain = build(shape, directory, "plain")
    student = build(shape, directory, "student", tokens=TRAIN_TOKENS)
    return [
        row for seed in seeds for row in seed_rows(shape, plain, student, seed, steps, directory)
    ]


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=200, help="training steps of the record")
    parser.add_argument("--only", choices=[s.name for s in SHAPES], help="one layer")
    args = parser.parse_args()
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="moegen-replicas-") as tmp:
        for shape in SHAPES:
            if args.only in (None, shape.name):
                directory = Path(tmp) / shape.name.replace("/", "_")
                directory.mkdir()
                began = time.perf_counter()
                rows += shape_rows(shape, args.seeds, args.steps, directory)
                print(f"{shape.name}: {time.perf_counter() - began:.0f} s", flush=True)
    print(table(rows))
    print(f"\nwall time {time.perf_counter() - start:.0f} s ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    if "jax" in sys.modules:
        raise SystemExit("bench.replicas sets the fake device count: run it as a program")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={FAKE_DEVICES}"
    )
    main()
