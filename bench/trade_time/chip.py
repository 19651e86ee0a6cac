"""On the TPU chip (jax alone, no moegen): each layer of bench/trade_time/modules whole and
traded, forward and forward+backward, median of 10 calls after 2 warm-ups.

    python3 bench/trade_time/chip.py bench/trade_time/modules    # figures to $OUT/trade_time.json

A layer's variants share its parameters, input and cotangent (their shapes are the same):
each variant's y and gradients are compared with the whole layer's (relative error, on a
strided sample of a million elements of each), so a trade that computed something else
shows. Every program of a layer is compiled first, eight at a time in threads, then each is
timed alone; the compiler's own memory figures of each forward+backward program are kept
beside its time.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

OUT = os.environ.get("OUT", "/tmp")
BUDGET_S = float(os.environ.get("TRADE_BUDGET_S", "540"))
HLO_DIR = os.path.join(OUT, "hlo") if os.environ.get("TRADE_HLO") else ""
LAYERS = [n for n in os.environ.get("TRADE_LAYERS", "").split(",") if n]  # default: all
RESULTS: dict = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "rows": []}


def record(**row) -> None:
    RESULTS["rows"].append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "trade_time.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def load(folder: str, name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def programs(module, ct):
    mesh = module.make_mesh()

    def forward(p, x):
        return module.moe_layer(p, x, mesh=mesh)[0]

    def train(p, x):
        def loss(p, x):
            return jnp.sum(forward(p, x).astype(jnp.float32) * ct)

        return jax.grad(loss, argnums=(0, 1))(p, x)

    return {"fwd": forward, "fwdbwd": train}


def compile_all(jobs, p, x):
    def build(item):
        key, fn = item
        start = time.perf_counter()
        try:
            return key, jax.jit(fn).lower(p, x).compile(), time.perf_counter() - start
        except Exception:  # noqa: BLE001
            return key, traceback.format_exc()[-600:], time.perf_counter() - start

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return {key: (c, s) for key, c, s in pool.map(build, jobs.items())}


def median_ms(compiled, p, x, n=10):
    for _ in range(2):
        jax.block_until_ready(compiled(p, x))
    times = []
    for _ in range(n):
        start = time.perf_counter()
        jax.block_until_ready(compiled(p, x))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


SAMPLE = 1 << 20  # elements of each output compared (a strided sample: the run 1 driver
# brought every gradient of Mixtral to the host in float64 and spent its minutes there)


def sample(a: jax.Array) -> np.ndarray:
    flat = np.asarray(a).reshape(-1)  # in its own dtype: float64 copies cost the time
    return flat[:: max(flat.size // SAMPLE, 1)].astype(np.float32)


def compiler_counts(compiled) -> dict:
    """The compiler's FLOPs and bytes accessed of a program (a loop's body counted once)."""
    try:
        cost = compiled.cost_analysis() or {}
        cost = cost[0] if isinstance(cost, list) else cost
        return {k: cost.get(k) for k in ("flops", "bytes accessed")}
    except Exception as err:  # noqa: BLE001
        return {"error": repr(err)[:200]}


def relerr(a: np.ndarray, b: np.ndarray) -> float:
    return float(f"{np.linalg.norm(a - b) / max(float(np.linalg.norm(b)), 1e-30):.3g}")


def run_layer(folder: str, layer: dict, deadline: float) -> None:
    modules = {label: load(folder, v["module"]) for label, v in layer["variants"].items()}
    whole = modules["whole"]
    mesh = whole.make_mesh()
    p = whole.init_params(jax.random.key(0), mesh)
    x = jax.random.normal(jax.random.key(1), whole.INPUT_SHAPE, jnp.float32)
    x = jax.device_put(x.astype(whole.COMPUTE_DTYPE), whole.input_sharding(mesh))
    ct = jax.random.normal(jax.random.key(2), whole.INPUT_SHAPE, jnp.float32)
    jobs = {(lab, kind): fn for lab, m in modules.items() for kind, fn in programs(m, ct).items()}
    start = time.perf_counter()
    compiled = compile_all(jobs, p, x)
    record(layer=layer["layer"], compile_wall_s=round(time.perf_counter() - start, 1))
    reference = None
    for label in modules:
        row = {"layer": layer["layer"], "variant": label}
        if time.time() > deadline:
            record(**row, skipped="deadline")
            continue
        for kind in ("fwd", "fwdbwd"):
            c, secs = compiled[(label, kind)]
            if isinstance(c, str):
                row[kind + "_error"] = c
                continue
            row[kind + "_ms"] = round(median_ms(c, p, x), 3)
            row[kind + "_compile_s"] = round(secs, 1)
            row[kind + "_cost"] = compiler_counts(c)
            if kind == "fwdbwd":
                stats = c.memory_analysis()
                row["temp_bytes"] = int(getattr(stats, "temp_size_in_bytes", 0))
                if HLO_DIR:  # the optimized program, to see what a trade adds
                    os.makedirs(HLO_DIR, exist_ok=True)
                    module = layer["variants"][label]["module"]
                    with open(os.path.join(HLO_DIR, module + ".hlo.txt"), "w") as f:
                        f.write(c.as_text())
        if "fwdbwd_ms" in row and "fwd_ms" in row:
            y = sample(compiled[(label, "fwd")][0](p, x))
            grads, gx = compiled[(label, "fwdbwd")][0](p, x)
            got = {"y": y, "dx": sample(gx), **{"d" + k: sample(v) for k, v in grads.items()}}
            del grads, gx
            if reference is None:
                reference = got
            else:
                row["rel"] = {k: relerr(v, reference[k]) for k, v in got.items()}
        record(**row)
    del compiled, p, x


def main(argv: list[str]) -> None:
    folder = argv[0]
    deadline = time.time() + BUDGET_S
    with open(os.path.join(folder, "layers.json")) as f:
        layers = json.load(f)
    for layer in layers:
        if LAYERS and layer["layer"] not in LAYERS:
            continue
        try:
            run_layer(folder, layer, deadline)
        except Exception:  # noqa: BLE001
            record(layer=layer["layer"], error=traceback.format_exc()[-800:])
    stats = jax.devices()[0].memory_stats() or {}
    print("peak bytes", stats.get("peak_bytes_in_use"), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
