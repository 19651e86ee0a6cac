"""Run 3 (exploration, one chip): generated modules before and after a template change, side
by side with the ceiling and the MaxText-style peer, in one process on the same inputs.

Every program (forward and forward+backward of each module and peer) is compiled first,
eight at a time in threads (a chip compile takes 15-23 s; one at a time the compiles alone
would spend the run), then each is timed alone: median of 10 calls after 2 warm-ups. Each
module's y and gradients are compared with the first module of its case (relative error).

    python3 ab.py DIR CASE=mod1,mod2,... [CASE=...]     # figures to $OUT/ab.json
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import explore as E  # noqa: E402
import variants as L  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
RESULTS: dict = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "rows": []}


def record(**row):
    RESULTS["rows"].append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "ab.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def median_ms(compiled, args, n=10):
    for _ in range(2):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(n):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def programs_of(case, folder, names, s):
    """name -> (layer fn, params, x) for the peers and each module of the case."""
    params, x, ct = E.make_inputs(s)
    k = s["K"]
    out = {
        "ceiling": (lambda p, x: L.dense_ceiling(p, x, top_k=k), params, x),
        "maxtext": (lambda p, x: L.maxtext_peer(p, x, top_k=k), params, x),
    }
    placed = None
    for name in names:
        mod = E.load_module(os.path.join(folder, name + ".py"))
        fn, mesh = E.module_layer(mod)
        if placed is None:  # every module of a case takes the same parameters
            placed = E.module_params(mod, params, mesh)
        xm = jax.device_put(x.reshape(mod.INPUT_SHAPE), mod.input_sharding(mesh))
        out[name] = (fn, placed, xm)
    return out, ct


def compile_all(progs, ct):
    """(name, pass) -> compiled, compiled in threads."""
    jobs = {}
    for name, (fn, p, x) in progs.items():
        jobs[(name, "fwd")] = (fn, p, x)
        jobs[(name, "fwdbwd")] = (E.fwd_bwd(fn, ct), p, x)

    def build(item):
        (key, (fn, p, x)) = item
        start = time.perf_counter()
        try:
            return key, jax.jit(fn).lower(p, x).compile(), time.perf_counter() - start
        except Exception:  # noqa: BLE001
            return key, traceback.format_exc()[-800:], time.perf_counter() - start

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return {key: (c, t) for key, c, t in pool.map(build, jobs.items())}


def run_case(case, folder, names, deadline):
    s = E.shapes_for(case)
    progs, ct = programs_of(case, folder, names, s)
    start = time.perf_counter()
    compiled = compile_all(progs, ct)
    record(case=case, compile_wall_s=round(time.perf_counter() - start, 1))
    first = {}
    for name, (_, p, x) in progs.items():
        if time.time() > deadline:
            record(case=case, name=name, skipped="deadline")
            continue
        row = timed_row(case, name, compiled, p, x)
        if "fwd_ms" in row:
            row["fwd_tfs"] = round(E.flops(s) / row["fwd_ms"] / 1e9, 1)
        if "fwdbwd_ms" in row:
            row["fwdbwd_tfs"] = round(3 * E.flops(s) / row["fwdbwd_ms"] / 1e9, 1)
        if name in names and not isinstance(compiled[(name, "fwdbwd")][0], str):
            row.update(parity_to_first(first, compiled, name, p, x))
        record(**row)
    del compiled


def timed_row(case, name, compiled, p, x):
    """Each pass's median ms and compile seconds (or its compile error) of one program."""
    row = {"case": case, "name": name}
    for pas in ("fwd", "fwdbwd"):
        c, secs = compiled[(name, pas)]
        if isinstance(c, str):
            row[pas + "_error"] = c
            continue
        row[pas + "_ms"] = round(median_ms(c, (p, x)), 3)
        row[pas + "_compile_s"] = round(secs, 1)
    return row


def parity_to_first(first, compiled, name, p, x):
    y = compiled[(name, "fwd")][0](p, x)
    grads, gx = compiled[(name, "fwdbwd")][0](p, x)
    # on the host: a big layer's gradients kept on the chip beside the next module's
    # parameters ran it out of HBM (llama4_scout, run 3)
    got = {
        k: np.asarray(v)
        for k, v in {"y": y, "dx": gx, **{"d" + k: v for k, v in grads.items()}}.items()
    }
    del y, grads, gx
    if not first:
        first.update(got)
        return {"parity_to": name}
    return {"rel_" + k: float(f"{_relerr(v, first[k]):.3g}") for k, v in got.items() if k in first}


def _relerr(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def run_pairs(folder_a, folder_b, names, deadline):
    """Each module name in two folders (before, after), timed with its own init_params and a
    random x: no peers (the layer's router may be any), parity of the second to the first."""
    for name in names:
        progs, first = {}, {}
        for tag, folder in (("a", folder_a), ("b", folder_b)):
            mod = E.load_module(os.path.join(folder, name + ".py"))
            mesh = mod.make_mesh()
            params = mod.init_params(jax.random.key(0), mesh)
            x = jax.random.normal(jax.random.key(1), mod.INPUT_SHAPE, jnp.float32)
            x = jax.device_put(x.astype(mod.COMPUTE_DTYPE), mod.input_sharding(mesh))
            fn = lambda p, xs, mod=mod, mesh=mesh: mod.moe_layer(p, xs, mesh=mesh)[0]  # noqa: E731
            progs[tag] = (fn, params, x)
        ct = jax.random.normal(jax.random.key(2), progs["a"][2].shape, jnp.float32)
        compiled = compile_all(progs, ct)
        for tag in list(progs):
            _, p, x = progs.pop(tag)  # one module's parameters on the chip at a time after this
            if time.time() > deadline:
                record(case=name, name=tag, skipped="deadline")
                continue
            row = timed_row(name, tag, compiled, p, x)
            if not isinstance(compiled[(tag, "fwdbwd")][0], str):
                row.update(parity_to_first(first, compiled, tag, p, x))
            record(**row)


def main(argv):
    if argv and argv[0] == "--pairs":  # --pairs DIR_BEFORE DIR_AFTER NAME...
        deadline = time.time() + float(os.environ.get("EXP_BUDGET_S", "500"))
        run_pairs(argv[1], argv[2], argv[3:], deadline)
        return
    folder = argv[0]
    deadline = time.time() + float(os.environ.get("EXP_BUDGET_S", "500"))
    for arg in argv[1:]:
        case, names = arg.split("=")
        try:
            run_case(case, folder, names.split(","), deadline)
        except Exception:  # noqa: BLE001
            record(case=case, error=traceback.format_exc()[-800:])
    stats = jax.devices()[0].memory_stats() or {}
    print("peak bytes", stats.get("peak_bytes_in_use"), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
