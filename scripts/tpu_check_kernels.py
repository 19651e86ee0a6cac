"""TPU check, run phase: the project's own Pallas kernel on the chip.

`_gmm_add` (templates/kernels/pallas.jinja: the overlapped ring's in-place partial sums,
total + lhs @ rhs[g] on each group's rows, written into total's buffer) as a generated module
defines it, at that module's own shapes: against a float32 `ragged_dot` reference at
"highest" precision, forward and its three gradients, and timed beside the unfused sum it
replaces (megablox's gmm, then an add), forward and forward+backward. The CPU tests run the
same kernel interpreted (tests/kernels/test_gmm_accumulate.py); only the chip compiles it with
Mosaic.
Imports only jax, numpy and the standard library (no moegen on the TPU machine).
"""

from __future__ import annotations

import math
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tpu_check_layers import F32_TOLERANCE, load_module, relative_error, tolerance, verdict
from tpu_check_programs import median_ms

# bf16 operands rounded once, float32 sums: ~4e-3 measured on Mixtral-wide layers; a wrong
# group (a row summed into the wrong expert) moves the result by O(1). Float32 compute off a
# TPU is held to the modules' F32_TOLERANCE; on a TPU its default precision rounds like bf16.
BF16_TOLERANCE = 2e-2
FILLED = 0.9  # the share of the rows the random groups take: the rest belong to no group


def local_width(module: ModuleType) -> int:
    """The output width of one gate (or up) call: the weight's last dimension on a device
    (fsdp shards are gathered before the call; other axes on that dimension are not)."""
    name = "w_gate" if "w_gate" in module.PARAM_SHAPES else "w_up"
    spec = tuple(module.PARAM_SPECS[name])
    last = spec[-1] if len(spec) == len(module.PARAM_SHAPES[name]) else None
    axes = () if last is None else (last,) if isinstance(last, str) else tuple(last)
    sizes = dict(zip(module.MESH_AXES, module.MESH_SHAPE, strict=True))
    fsdp = getattr(module, "FSDP_AXIS", None)
    return module.PARAM_SHAPES[name][-1] // math.prod(sizes[a] for a in axes if a != fsdp)


def kernel_inputs(module: ModuleType, seed: int = 0) -> tuple[Any, ...]:
    """(lhs, rhs, group_sizes, total, cotangent) at the module's shapes: random groups over
    FILLED of the rows, some of them empty."""
    rows, depth, experts = module.PADDED_ROWS, module.CHUNK_WIDTH, module.LOCAL_EXPERTS
    width = local_width(module)
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, int(rows * FILLED) + 1, size=experts - 1))
    sizes = np.diff(np.concatenate([[0], cuts, [int(rows * FILLED)]])).astype(np.int32)
    lhs = rng.normal(size=(rows, depth)).astype(np.float32)
    rhs = (rng.normal(size=(experts, depth, width)) / math.sqrt(depth)).astype(np.float32)
    total = rng.normal(size=(rows, width)).astype(np.float32)
    cotangent = rng.normal(size=(rows, width)).astype(np.float32)
    lhs = jnp.asarray(lhs, module.COMPUTE_DTYPE)
    rhs = jnp.asarray(rhs, module.COMPUTE_DTYPE)
    return lhs, rhs, jnp.asarray(sizes), jnp.asarray(total), jnp.asarray(cotangent)


def reference(lhs: jax.Array, rhs: jax.Array, sizes: jax.Array, total: jax.Array) -> jax.Array:
    grouped = jnp.arange(lhs.shape[0]) < sizes.sum()
    product = jax.lax.ragged_dot(
        lhs.astype(jnp.float32), rhs.astype(jnp.float32), sizes,
        precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32,
    )  # fmt: skip
    return total + jnp.where(grouped[:, None], product, 0.0)


def _relative(got: jax.Array, want: jax.Array) -> float:
    return float(relative_error(got, want))


def parity(module: ModuleType, args: tuple[Any, ...]) -> dict[str, Any]:
    """Relative errors of the sum and of the gradients of lhs (rows of a group: megablox
    leaves the others unwritten and the module selects them away), rhs and total."""
    lhs, rhs, sizes, total, cotangent = args
    got, got_vjp = jax.vjp(lambda a, b, t: module._gmm_add(a, b, sizes, t), lhs, rhs, total)
    want, want_vjp = jax.vjp(lambda a, b, t: reference(a, b, sizes, t), lhs, rhs, total)
    grouped = (jnp.arange(lhs.shape[0]) < sizes.sum())[:, None]
    got_grads, want_grads = got_vjp(cotangent), want_vjp(cotangent)
    errors = {
        "sum": _relative(got, want),
        "grad_lhs": _relative(*(jnp.where(grouped, g[0], 0) for g in (got_grads, want_grads))),
        "grad_rhs": _relative(got_grads[1], want_grads[1]),
        "grad_total": _relative(got_grads[2], want_grads[2]),
    }
    # the modules' rule for float32 compute (tpu_check_layers.tolerance), bf16's of a kernel
    f32 = tolerance(module) == F32_TOLERANCE
    return verdict(errors, F32_TOLERANCE if f32 else BF16_TOLERANCE)


def timings(module: ModuleType, args: tuple[Any, ...]) -> dict[str, float]:
    """Forward and forward+backward ms of the kernel and of the unfused sum it replaces."""
    lhs, rhs, sizes, total, cotangent = args

    def fused(a: jax.Array, b: jax.Array, t: jax.Array) -> jax.Array:
        return module._gmm_add(a, b, sizes, t)

    def unfused(a: jax.Array, b: jax.Array, t: jax.Array) -> jax.Array:
        return t + module._gmm(a, b, sizes, module.GATE_UP_TILING, jnp.float32)

    out: dict[str, float] = {}
    for name, fn in (("fused", fused), ("unfused", unfused)):

        def loss(a: jax.Array, b: jax.Array, t: jax.Array, fn: Any = fn) -> jax.Array:
            return jnp.sum(fn(a, b, t) * cotangent)

        forward = jax.jit(fn).lower(lhs, rhs, total).compile()
        backward = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(lhs, rhs, total).compile()
        out[f"{name}_fwd_ms"] = round(median_ms(forward, lhs, rhs, total), 4)
        out[f"{name}_fwdbwd_ms"] = round(median_ms(backward, lhs, rhs, total), 4)
    return out


def check_kernel(entry: dict[str, Any], work: Path) -> dict[str, Any]:
    """One generated module's _gmm_add: its shapes, parity and times."""
    row: dict[str, Any] = {"name": entry["name"], "kernel": "_gmm_add", "source": entry["source"]}
    try:
        module = load_module(work / entry["file"], f"tpu_check_kernel_{entry['name']}")
        args = kernel_inputs(module)
        row["shapes"] = {
            "lhs": list(args[0].shape), "rhs": list(args[1].shape), "total": list(args[3].shape),
            "grouped_rows": int(args[2].sum()), "tiling": list(module.ACCUMULATE_TILING),
        }  # fmt: skip
        row["parity"] = parity(module, args)
        row |= timings(module, args)
    except Exception as err:  # noqa: BLE001 (one kernel's failure ends no other's)
        row["error"] = f"{type(err).__name__}: {str(err).strip()[:400]}"
        traceback.print_exc()
    return row


def kernel_line(row: dict[str, Any]) -> str:
    if "skipped" in row:
        return f"  {row['name']:<44} _gmm_add skipped: {row['skipped']}"
    if "error" in row:
        return f"  {row['name']:<44} _gmm_add ERROR {row['error'][:200]}"
    p = row["parity"]
    verdict = "ok" if p["ok"] else "FAIL"
    return (
        f"  {row['name']:<44} _gmm_add {verdict} {p['max']:.1e} ({p['worst']}) tol "
        f"{p['tolerance']:.0e}; fwd {row['fused_fwd_ms']:.3f} ms (unfused "
        f"{row['unfused_fwd_ms']:.3f}), fwd+bwd {row['fused_fwdbwd_ms']:.3f} ms (unfused "
        f"{row['unfused_fwdbwd_ms']:.3f})"
    )


def run_kernels(entries: list[dict[str, Any]], work: Path, deadline: float) -> list[dict]:
    """Every kernel entry of the manifest (past the deadline: skipped, with the reason)."""
    rows = []
    for entry in entries:
        if time.time() > deadline:
            rows.append({"name": entry["name"], "kernel": "_gmm_add", "skipped": "budget"})
        else:
            rows.append(check_kernel(entry, work))
    return rows
