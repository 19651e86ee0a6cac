"""GPU check, run phase (on the GPU machine, jax only): two plain-JAX baselines and the timing.

The bf16 matmul peak (a big jnp.dot, median of several), then forward and forward+backward
time of the realistic module (kernel xla), of the same layer with kernel tokamax (tokamax's
Pallas Mosaic GPU ragged_dot; when prepared and tokamax imports), and of a dense one-hot
layer (every token through every expert) and a plain jax.lax.ragged_dot layer (sort, grouped
matmuls, unsort; no shard_map, no plan),
with useful TFLOP/s against the measured peak. The baselines are first checked against the
dense reference on the float32 parity twins (check_baselines).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from gpu_check_parity import (
    Report,
    _matmul_precision,
    _random_case,
    _set_mesh,
    import_path,
    relative_error,
)


def check_baselines(report: Report, ref: ModuleType, manifest: dict, work: Path) -> bool:
    """The two timing baselines' forward output against the reference, on the float32 twins."""
    import jax.numpy as jnp
    import numpy as np

    ok = True
    for entry in manifest["parity"]:
        name = entry["name"]
        try:
            module = sys.modules.get(f"gpu_check_{name}") or import_path(
                work / entry["module"], f"gpu_check_{name}"
            )
            if jnp.dtype(module.COMPUTE_DTYPE) != jnp.float32:
                continue
            params, x, _ = _random_case(module, 0)
            params = {k: jnp.asarray(v) for k, v in params.items()}
            x = jnp.asarray(x)
            with _matmul_precision("highest"):
                cfg = ref.ReferenceConfig(**entry["router"])
                want = np.asarray(ref.dense_moe(params, x, cfg)[0])
                errors = {
                    label: relative_error(layer(params, x, entry["router"]), want)
                    for label, layer in (
                        ("dense one-hot", dense_onehot_layer),
                        ("plain ragged_dot", ragged_dot_layer),
                    )
                }
        except Exception as err:
            report.error(f"baselines on {name}", err)
            ok = False
            continue
        good = all(e < entry["tolerance"] for e in errors.values())
        ok &= good
        report.line(
            f"  {'ok  ' if good else 'FAIL'} baselines on {name:<24} forward y: "
            + ", ".join(f"{k} {v:.1e}" for k, v in errors.items())
        )
    return ok


def _route(tokens: Any, router: Any, top_k: int, score: str, renormalize: bool) -> tuple:
    """Top-k combine weights [T, k] (float32) and expert ids [T, k]; router math in float32."""
    import jax
    import jax.numpy as jnp

    logits = jnp.dot(
        tokens.astype(jnp.float32), router.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
    )
    scores = jax.nn.softmax(logits, axis=-1) if score == "softmax" else jax.nn.sigmoid(logits)
    weights, ids = jax.lax.top_k(scores, top_k)
    if renormalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights, ids


def dense_onehot_layer(params: dict, x: Any, router_cfg: dict) -> Any:
    """Baseline: every token through every expert, one-hot combine (einsum dispatch)."""
    import jax
    import jax.numpy as jnp

    batch, seq, embed = x.shape
    cdt = x.dtype
    experts = params["router"].shape[1]
    tokens = x.reshape(batch * seq, embed)
    weights, ids = _route(tokens, params["router"], **router_cfg)
    combine = jnp.einsum("tk,tke->te", weights, jax.nn.one_hot(ids, experts, dtype=jnp.float32))
    gate = jnp.einsum("td,edf->tef", tokens, params["w_gate"].astype(cdt))
    up = jnp.einsum("td,edf->tef", tokens, params["w_up"].astype(cdt))
    out = jnp.einsum("tef,efd->ted", jax.nn.silu(gate) * up, params["w_down"].astype(cdt))
    y = jnp.einsum("ted,te->td", out, combine, preferred_element_type=jnp.float32)
    return y.astype(cdt).reshape(batch, seq, embed)


def ragged_dot_layer(params: dict, x: Any, router_cfg: dict) -> Any:
    """Baseline: sort token copies by expert, jax.lax.ragged_dot x3, unsort, combine."""
    import jax
    import jax.numpy as jnp

    batch, seq, embed = x.shape
    cdt = x.dtype
    experts = params["router"].shape[1]
    top_k = router_cfg["top_k"]
    tokens = x.reshape(batch * seq, embed)
    weights, ids = _route(tokens, params["router"], **router_cfg)
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    group_sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)
    rows = tokens[order // top_k]
    gate = jax.lax.ragged_dot(rows, params["w_gate"].astype(cdt), group_sizes)
    up = jax.lax.ragged_dot(rows, params["w_up"].astype(cdt), group_sizes)
    out = jax.lax.ragged_dot(jax.nn.silu(gate) * up, params["w_down"].astype(cdt), group_sizes)
    out = out[jnp.argsort(order)].reshape(batch * seq, top_k, embed)
    y = jnp.einsum("tkd,tk->td", out, weights, preferred_element_type=jnp.float32)
    return y.astype(cdt).reshape(batch, seq, embed)


def _tokamax_layer(report: Report, work: Path, entry: dict, mesh: Any, args: tuple) -> dict:
    """{label: (layer, args)} of the kernel tokamax module on the xla module's mesh and values
    (same parameters and layout: one device each); the layer is None when it fails to import."""
    if "tokamax_module" not in entry:
        return {}
    path = work / entry["tokamax_module"]
    label = f"moegen {path.stem}"
    try:
        module = import_path(path, f"gpu_check_{path.stem}")
    except Exception as err:
        report.error(f"{label}: import (tokamax, from .gpu_check/wheels)", err)
        return {label: (None, args)}
    return {label: (lambda p, xs: module.moe_layer(p, xs, mesh=mesh)[0], args)}


def useful_flops(module: ModuleType) -> float:
    """Forward FLOPs that a dropless layer must do: router + top_k experts' three matmuls."""
    tokens = module.BATCH * module.SEQ_LEN
    d, f, e, k = module.EMBED_DIM, module.FFN_DIM, module.NUM_EXPERTS, module.TOP_K
    return 2.0 * tokens * d * e + k * tokens * 3 * 2.0 * d * f


def time_compiled(
    fn: Any, args: tuple, runs: int, warmup: int, max_timed_s: float = 30.0
) -> tuple[float, float, list, Any]:
    """(compile seconds, median seconds, all seconds, last output) of jit(fn)(*args).

    Fewer runs (at least 3) when one call is so slow that `runs` would pass `max_timed_s`."""
    import jax

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    one = float("inf")
    for _ in range(max(warmup, 1)):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        one = min(one, time.perf_counter() - start)
    runs = max(3, min(runs, int(max_timed_s / max(one, 1e-9))))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return compile_s, statistics.median(times), times, out


def measure_peak(report: Report, n: int, runs: int) -> float | None:
    import jax
    import jax.numpy as jnp

    report.line(f"== bf16 matmul peak: jnp.dot {n}x{n} @ {n}x{n}, median of {runs} ==")
    try:
        ka, kb = jax.random.split(jax.random.key(0))
        a = jax.random.normal(ka, (n, n), jnp.bfloat16)
        b = jax.random.normal(kb, (n, n), jnp.bfloat16)
        _, median, times, _ = time_compiled(jnp.dot, (a, b), runs, warmup=3)
    except Exception as err:
        report.error("matmul peak", err)
        return None
    peak = 2.0 * n**3 / median / 1e12
    report.line(
        f"  peak {peak:8.4g} TFLOP/s  ({median * 1e3:.3f} ms median, "
        f"min {min(times) * 1e3:.3f} ms, max {max(times) * 1e3:.3f} ms)"
    )
    report.data["peak"] = {"n": n, "tflops": peak, "median_s": median, "times_s": times}
    return peak


def run_timing(
    report: Report, work: Path, entry: dict, peak: float | None, runs: int, deadline: float
) -> bool:
    import jax
    import jax.numpy as jnp

    name = entry["name"]
    router_cfg = entry["router"]
    try:
        module = import_path(work / entry["module"], f"gpu_check_{name}")
        mesh = module.make_mesh(jax.devices()[: module.NUM_DEVICES])
        with _set_mesh(mesh):
            params = module.init_params(jax.random.key(0), mesh)
        kx, kc = jax.random.split(jax.random.key(1))
        x = jax.device_put(
            jax.random.normal(kx, module.INPUT_SHAPE, module.COMPUTE_DTYPE),
            module.input_sharding(mesh),
        )
        ct = jax.device_put(
            jax.random.normal(kc, module.INPUT_SHAPE, module.COMPUTE_DTYPE),
            module.input_sharding(mesh),
        )
    except Exception as err:
        report.error(f"{name}: import / init", err)
        return False
    flops = useful_flops(module)
    report.line(
        f"== forward / forward+backward: {name}: {module.NUM_EXPERTS} experts top-"
        f"{module.TOP_K}, embed {module.EMBED_DIM}, ffn {module.FFN_DIM}, tokens "
        f"{module.BATCH}x{module.SEQ_LEN}, params {jnp.dtype(module.PARAM_DTYPE).name}, compute "
        f"{jnp.dtype(module.COMPUTE_DTYPE).name}; median of {runs} after 2 warm-ups =="
    )
    report.line(
        f"  useful FLOPs: forward {flops / 1e12:.4g} T, forward+backward {3 * flops / 1e12:.4g} T"
        " (router + top_k experts x 3 matmuls; x3 for fwd+bwd); 'vs moegen y': relative "
        "difference of the forward output from the moegen layer's (bf16 compute)"
    )
    # The baselines are plain JAX: the same values on the one device, no mesh, no shard_map.
    single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    plain = [jax.device_put(a, single) for a in (params, x, ct)]
    layers = {
        f"moegen {name}": (lambda p, xs: module.moe_layer(p, xs, mesh=mesh)[0], (params, x, ct)),
        **_tokamax_layer(report, work, entry, mesh, (params, x, ct)),
        "baseline dense one-hot": (
            functools.partial(dense_onehot_layer, router_cfg=router_cfg),
            plain,
        ),
        "baseline plain ragged_dot": (
            functools.partial(ragged_dot_layer, router_cfg=router_cfg),
            plain,
        ),
    }
    header = (
        f"  {'layer':<40} {'pass':<8} {'ms':>9} {'TFLOP/s':>9} {'% peak':>7} {'compile s':>10}"
        f" {'runs':>5} {'vs moegen y':>12}"
    )
    report.line(header)
    ok = True
    module_y = None
    for label, (layer, (p_in, x_in, ct_in)) in layers.items():
        on_mesh = label.startswith("moegen")
        if layer is None:  # the tokamax module did not import: reported, counted as failed
            ok = False
            continue

        def loss(p: dict, xs: Any, c: Any, layer: Any = layer) -> Any:
            return jnp.sum(layer(p, xs).astype(jnp.float32) * c.astype(jnp.float32))

        programs = {
            "fwd": (layer, (p_in, x_in), flops),
            "fwd+bwd": (jax.grad(loss, argnums=(0, 1)), (p_in, x_in, ct_in), 3 * flops),
        }
        for pass_name, (fn, args, pass_flops) in programs.items():
            if time.monotonic() > deadline:
                report.line(f"  {label:<40} {pass_name:<8} skipped: time budget spent")
                ok = False
                continue
            try:
                with _set_mesh(mesh) if on_mesh else contextlib.nullcontext():
                    compile_s, median, times, out = time_compiled(fn, args, runs, warmup=2)
            except Exception as err:
                report.error(f"{label} {pass_name}", err)
                ok = False
                continue
            diff = ""
            if pass_name == "fwd":
                if on_mesh and module_y is None:
                    module_y = out
                elif module_y is not None:
                    diff = f"{relative_error(out, module_y):.1e}"
            del out
            tflops = pass_flops / median / 1e12
            shown = f"{tflops:9.1f}" if tflops >= 10 else f"{tflops:9.3g}"
            share = f"{100 * tflops / peak:6.1f}%" if peak else "    n/a"
            report.line(
                f"  {label:<40} {pass_name:<8} {median * 1e3:9.2f} {shown} {share:>7} "
                f"{compile_s:10.1f} {len(times):5d} {diff:>12}"
            )
            report.data["timing"].append(
                {
                    "layer": label,
                    "pass": pass_name,
                    "median_s": median,
                    "times_s": times,
                    "useful_flops": pass_flops,
                    "tflops": tflops,
                    "percent_of_peak": 100 * tflops / peak if peak else None,
                    "compile_s": compile_s,
                    "relative_difference_from_moegen_y": diff or None,
                }
            )
    return ok
