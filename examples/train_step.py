"""Train one spec's CPU twin with optax on a synthetic regression task.

    .venv/bin/python examples/train_step.py [SPEC] [--steps N] [--bias-rate R] [...]

The script builds the spec's shrunken twin with moegen's own stages (load, validate, twin_of,
plan with Pallas kernels interpreted, render) into a temporary directory, imports it on as
many fake CPU devices as its mesh has, and trains it:

- data: x ~ N(0, 1) shifted by a common offset along one fixed direction, so that at the start
  the router sends most token copies to a few experts; the target is a fixed random teacher,
  tanh(x @ A) @ B; every step draws a new batch;
- loss: mean squared error, plus aux.load_balance_loss and aux.router_z_loss when the spec asks
  for them; optax Adam on every parameter except the routing bias;
- when the spec has router.routing_bias, it trains twice from the same start on the same
  batches: with the aux-loss-free update after every step (routing_bias +=
  rate * sign(mean load - load), the module's update_routing_bias), and with the bias frozen
  at zero.

It prints the loss every few steps, then a summary: the loss at step 0 and over the last few
steps, and the expert loads (aux.tokens_per_expert: min, max, spread = max - min, coefficient
of variation) at step 0 and over the last few steps of each run. It exits 1 if a loss did not
fall or if the bias update did not leave the loads more even (smaller spread and cv) than the
frozen bias, and 2 if the spec is invalid.

Any spec works; the default, DeepSeek-V3, has sigmoid scores, expert groups, the routing bias
and a shared expert. A spec without router.routing_bias (every other example spec) trains
once, and its loads are only reported. Pallas specs run their kernels interpreted, which is
the slow part on CPU: fewer --steps for a quick look.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = REPO_ROOT / "specs" / "deepseek_v3_v5p.yaml"
AUX_LOSSES = ("load_balance_loss", "router_z_loss")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("spec", nargs="?", type=Path, default=DEFAULT_SPEC, help="spec YAML")
    parser.add_argument("--steps", type=int, default=24, help="training steps per run")
    parser.add_argument("--learning-rate", type=float, default=1e-2, help="Adam step size")
    parser.add_argument(
        "--bias-rate", type=float, default=0.02, help="routing-bias change per step"
    )
    parser.add_argument(
        "--offset", type=float, default=2.0, help="length of the inputs' common shift"
    )
    parser.add_argument("--window", type=int, default=5, help="last steps averaged in the summary")
    parser.add_argument("--print-every", type=int, default=4, help="loss print interval")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 1 <= args.window < args.steps:
        parser.error(f"need 1 <= --window < --steps, got {args.window} and {args.steps}")
    return args


def build_twin(spec_path: Path, out_dir: Path) -> tuple[Path, int]:
    """Render the float32 CPU twin of `spec_path`; returns its path and device count."""
    from moegen.diagnostics import SpecError
    from moegen.load import load_spec
    from moegen.plan import make_plan
    from moegen.render import render
    from moegen.validate import validate
    from moegen.verify import twin_of

    try:
        twin = twin_of(validate(load_spec(spec_path)))
    except SpecError as err:
        print(f"train_step: {spec_path} is not a valid spec:\n{err}", file=sys.stderr)
        sys.exit(2)
    plan = make_plan(twin, interpret=True)
    path = out_dir / f"{plan.module_name}_twin.py"
    path.write_text(render(plan), encoding="utf-8")
    return path, plan.mesh.num_devices


def use_fake_cpu_devices(count: int) -> None:
    """JAX fixes its device count when its backend starts: set it before importing jax."""
    if "jax" in sys.modules:
        raise RuntimeError("jax was imported before the device count was set")
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
    os.environ["JAX_PLATFORMS"] = "cpu"


def import_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_step(moe: ModuleType, args: argparse.Namespace, mesh: Any) -> tuple[Any, Any, dict]:
    """The jitted `train_step`, the optimizer and the initial parameters.

    The step takes the bias rate as an argument, so all runs share one compilation.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import NamedSharding

    has_bias = "routing_bias" in moe.PARAM_SHAPES
    embed = moe.EMBED_DIM

    init_key, teacher_key, offset_key, data_key = jax.random.split(jax.random.key(args.seed), 4)
    initial = moe.init_params(init_key, mesh)  # created sharded as PARAM_SPECS says
    trainable_names = [name for name in initial if name != "routing_bias"]
    shardings = {name: NamedSharding(mesh, moe.PARAM_SPECS[name]) for name in trainable_names}
    teacher_a, teacher_b = jax.random.normal(teacher_key, (2, embed, embed)) / np.sqrt(embed)
    direction = jax.random.normal(offset_key, (embed,))
    offset = args.offset * direction / jnp.linalg.norm(direction)

    def batch(step: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Batch number `step`: shifted Gaussian tokens and the teacher's outputs."""
        x = jax.random.normal(jax.random.fold_in(data_key, step), moe.INPUT_SHAPE) + offset
        target = jnp.tanh(x @ teacher_a) @ teacher_b
        x = jax.sharding.reshard(x.astype(moe.COMPUTE_DTYPE), moe.input_sharding(mesh))
        return x, target

    def loss_fn(trainable: dict, bias: jax.Array | None, x: jax.Array, target: jax.Array):
        params = dict(trainable, routing_bias=bias) if has_bias else trainable
        y, aux = moe.moe_layer(params, x, mesh=mesh)
        loss = jnp.mean((y.astype(jnp.float32) - target) ** 2)
        for name in AUX_LOSSES:  # present when the spec asks for them
            if name in aux._fields:
                loss = loss + getattr(aux, name)
        return loss, aux.tokens_per_expert

    optimizer = optax.adam(args.learning_rate)

    @jax.jit
    def train_step(trainable, opt_state, bias, step, bias_rate):
        x, target = batch(step)
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, loads), grads = grad_fn(trainable, bias, x, target)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        trainable = jax.sharding.reshard(optax.apply_updates(trainable, updates), shardings)
        if has_bias:  # aux-loss-free balancing: no gradient, a nudge after each step
            bias = moe.update_routing_bias(bias, loads, bias_rate)
        return trainable, opt_state, bias, loss, loads

    return train_step, optimizer, initial


def make_trainer(moe: ModuleType, args: argparse.Namespace) -> Any:
    """`run(bias_rate) -> (losses, loads)`: one training run, `loads` [steps, NUM_EXPERTS].

    Every run starts from the same parameters and sees the same batches.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = moe.make_mesh(jax.devices()[: moe.NUM_DEVICES])
    train_step, optimizer, initial = make_step(moe, args, mesh)

    def replicated(value: Any) -> Any:
        return jax.device_put(value, NamedSharding(mesh, P()))

    def run(bias_rate: float) -> tuple[list[float], np.ndarray]:
        trainable = {name: value for name, value in initial.items() if name != "routing_bias"}
        bias = initial.get("routing_bias")
        # Adam's step count is created unplaced: put it where train_step returns it, or the
        # second step would compile again.
        opt_state = jax.tree.map(
            lambda leaf: leaf if leaf.ndim else replicated(leaf), optimizer.init(trainable)
        )
        rate = replicated(jnp.float32(bias_rate))
        losses, loads = [], []
        with jax.set_mesh(mesh):
            for step in range(args.steps):
                trainable, opt_state, bias, loss, load = train_step(
                    trainable, opt_state, bias, replicated(jnp.int32(step)), rate
                )
                losses.append(float(loss))
                loads.append(np.asarray(load))
                if step % args.print_every == 0 or step == args.steps - 1:
                    print(f"  step {step:3d}  loss {losses[-1]:.5f}", flush=True)
        return losses, np.stack(loads)

    return run


def show_loads(label: str, loads: Any) -> str:
    """One summary line (the test parses it): min, max, spread and cv of per-expert loads."""
    import numpy as np

    loads = np.asarray(loads, np.float64)
    low, high = loads.min(), loads.max()
    cv = loads.std() / loads.mean()
    return f"  loads {label}: min {low:.1f} max {high:.1f} spread {high - low:.1f} cv {cv:.3f}"


def summarise(results: dict[str, tuple[list[float], Any]], w: int) -> list[str]:
    """Print each run's loss and loads over its last `w` steps; what failed, if anything."""
    print(f"summary (last: mean of the last {w} steps; loads: token copies per expert and step)")
    failures = []
    for label, (losses, _) in results.items():
        first, last = losses[0], sum(losses[-w:]) / w
        print(f"  loss {label}: step 0 {first:.5f} last {last:.5f}")
        if not last < first:
            failures.append(f"run '{label}': the loss did not fall ({first:.5f} -> {last:.5f})")
    step0 = next(iter(results.values()))[1][0]  # every run starts alike
    print(show_loads("step 0", step0))
    after = {label: loads[-w:].mean(axis=0) for label, (_, loads) in results.items()}
    for label, loads in after.items():
        print(show_loads(f"{label} last", loads))
    if "bias update" in after:
        even, frozen = after["bias update"], after["bias frozen"]
        spread = {k: v.max() - v.min() for k, v in (("update", even), ("frozen", frozen))}
        cv = {k: v.std() / v.mean() for k, v in (("update", even), ("frozen", frozen))}
        if not (spread["update"] < spread["frozen"] and cv["update"] < cv["frozen"]):
            failures.append(
                "the bias update did not even out the loads: spread "
                f"{spread['update']:.1f} vs {spread['frozen']:.1f} frozen, "
                f"cv {cv['update']:.3f} vs {cv['frozen']:.3f} frozen"
            )
    return failures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="moegen-train-") as tmp:
        path, devices = build_twin(args.spec, Path(tmp))
        use_fake_cpu_devices(devices)
        moe = import_module(path)  # imports jax
    copies = moe.BATCH * moe.SEQ_LEN * moe.TOP_K
    print(f"{args.spec}: its CPU twin on {devices} fake devices")
    print("  " + "\n  ".join(moe.__doc__.split("\n\n")[0].splitlines()))
    print(
        f"  x {list(moe.INPUT_SHAPE)}: {copies} token copies per step, "
        f"{copies / moe.NUM_EXPERTS:.1f} per expert when even"
    )
    extra = [name for name in AUX_LOSSES if name in moe.Aux._fields]
    print(f"  loss: mse{''.join(f' + aux.{name}' for name in extra)}; Adam {args.learning_rate}")

    runs = {"no routing bias": 0.0}
    if "routing_bias" in moe.PARAM_SHAPES:
        runs = {"bias update": args.bias_rate, "bias frozen": 0.0}
    run = make_trainer(moe, args)
    results = {}
    for label, rate in runs.items():
        how = f"routing_bias += {rate} * sign(mean load - load) each step"
        print(f"run '{label}', {args.steps} steps" + (f": {how}" if rate else ""))
        run_start = time.perf_counter()
        results[label] = run(rate)
        print(f"  {time.perf_counter() - run_start:.1f} s", flush=True)

    failures = summarise(results, args.window)
    print(f"total {time.perf_counter() - start:.1f} s")
    if failures:
        for failure in failures:
            print(f"FAILED: {failure}", file=sys.stderr)
        return 1
    evened = " and the bias update evened out the expert loads" if "bias update" in results else ""
    print(f"OK: the loss fell{evened}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
