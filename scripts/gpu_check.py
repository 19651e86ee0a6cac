"""GPU check of moegen's `xla` kernel: twin parity on the GPU, and forward+backward timing.

Two phases, both driven by scripts/gpu_check.sh:

  prepare   here, with the project's venv (moegen, pydantic, ruff): writes small spec YAMLs,
            renders their 1-device modules with `moegen build --no-verify` into .gpu_check/
            (git-ignored), copies the dense reference there and writes a manifest.
  run       on the GPU machine, with plain `python3` and whatever jax is installed there
            (0.11.2 on the H200 machine); imports neither moegen nor pydantic, only jax, numpy
            and the files under .gpu_check/:
              1. twin parity of each small module on the GPU against the dense reference
                 (forward, aux.tokens_per_expert, gradients of x and every parameter; float32
                 twins at matmul precision "highest", tolerance 1e-4), random routing and
                 starved experts, as moegen/verify/worker.py does on CPU;
              2. the bf16 matmul peak (a big jnp.dot, median of several);
              3. forward and forward+backward time of the realistic module and of two plain
                 JAX baselines of the same shapes: a dense one-hot layer (every token through
                 every expert, one-hot combine einsum) and a plain jax.lax.ragged_dot layer
                 (sort, grouped matmuls, unsort; no shard_map, no plan), with useful TFLOP/s
                 (router + top_k experts' three matmuls, x3 for forward+backward) against
                 the measured peak.
            Lines are printed and, when $OUT is set, written to $OUT/gpu_check.txt as they come
            (and $OUT/gpu_check.json at the end).

`run --quick` times a small module instead of the full-size one and a small matmul, so the run
phase can be tried on CPU: JAX_PLATFORMS=cpu python scripts/gpu_check.py run --quick
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".gpu_check"
MANIFEST = "manifest.json"

# ---------------------------------------------------------------------------------------------
# prepare (here, with moegen)
# ---------------------------------------------------------------------------------------------

TWIN_SHAPES = {"embed_dim": 64, "ffn_dim": 96, "batch": 4, "seq_len": 16}
FLOAT32_TOLERANCE = 1e-4  # GPU float32 matmuls at "highest", against the float32 reference
BF16_TOLERANCE = 5e-2  # bf16 compute against the float32 reference: catches a wrong path only

# name: (experts, router, params dtype, compute dtype, tolerance); routers of today's schema.
PARITY_SPECS: dict[str, tuple[int, dict[str, Any], str, str, float]] = {
    "twin_softmax_top2_renorm": (
        8,
        {"top_k": 2, "score": "softmax", "renormalize": True},
        "float32",
        "float32",
        FLOAT32_TOLERANCE,
    ),
    "twin_softmax_top2": (
        8,
        {"top_k": 2, "score": "softmax", "renormalize": False},
        "float32",
        "float32",
        FLOAT32_TOLERANCE,
    ),
    "twin_sigmoid_top1": (
        16,
        {"top_k": 1, "score": "sigmoid", "renormalize": False},
        "float32",
        "float32",
        FLOAT32_TOLERANCE,
    ),
    "twin_sigmoid_top2_renorm": (
        8,
        {"top_k": 2, "score": "sigmoid", "renormalize": True},
        "float32",
        "float32",
        FLOAT32_TOLERANCE,
    ),
    "twin_softmax_top2_renorm_bf16": (
        8,
        {"top_k": 2, "score": "softmax", "renormalize": True},
        "float32",
        "bfloat16",
        BF16_TOLERANCE,
    ),
}

MIXTRAL_ROUTER = {"top_k": 2, "score": "softmax", "renormalize": True}
# Mixtral 8x7B layer on one device; `quick` is the same layer shrunk for a CPU try of `run`.
TIMING_SPECS = {
    "full": (
        "mixtral_8x7b_1gpu",
        {"embed_dim": 4096, "ffn_dim": 14336, "batch": 8, "seq_len": 2048},
    ),
    "quick": (
        "mixtral_small_1gpu_quick",
        {"embed_dim": 256, "ffn_dim": 512, "batch": 2, "seq_len": 128},
    ),
}


def spec_yaml(
    description: str,
    experts: int,
    router: dict[str, Any],
    shapes: dict[str, int],
    params_dtype: str,
    compute_dtype: str,
) -> str:
    router_lines = "".join(
        f"  {key}: {str(value).lower() if isinstance(value, bool) else value}\n"
        for key, value in router.items()
    )
    return (
        "version: 1\n"
        f"description: {json.dumps(description)}\n"
        "layer:\n"
        f"  num_experts: {experts}\n"
        f"  embed_dim: {shapes['embed_dim']}\n"
        f"  ffn_dim: {shapes['ffn_dim']}\n"
        "router:\n"
        f"{router_lines}"
        "shapes:\n"
        f"  batch: {shapes['batch']}\n"
        f"  seq_len: {shapes['seq_len']}\n"
        "dtypes:\n"
        f"  params: {params_dtype}\n"
        f"  compute: {compute_dtype}\n"
        "mesh:\n"
        "  axes:\n"
        "    data: 1\n"
        "target:\n"
        "  hardware: cpu\n"
        "  kernel: xla\n"
    )


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def prepare(args: argparse.Namespace) -> int:
    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    specs_dir, modules_dir = work / "specs", work / "modules"
    specs_dir.mkdir(parents=True)

    manifest: dict[str, Any] = {
        "commit": _git("rev-parse", "HEAD"),
        "dirty_paths": [line[3:] for line in _git("status", "--porcelain").splitlines()],
        "prepared_at": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "parity": [],
        "timing": {},
    }
    spec_paths = []
    for name, (experts, router, params_dtype, compute_dtype, tol) in PARITY_SPECS.items():
        path = specs_dir / f"{name}.yaml"
        path.write_text(
            spec_yaml(
                f"gpu_check twin: {name}", experts, router, TWIN_SHAPES, params_dtype, compute_dtype
            ),
            encoding="utf-8",
        )
        spec_paths.append(path)
        manifest["parity"].append(
            {"name": name, "module": f"modules/{name}.py", "router": router, "tolerance": tol}
        )
    for key, (name, shapes) in TIMING_SPECS.items():
        path = specs_dir / f"{name}.yaml"
        path.write_text(
            spec_yaml(
                f"gpu_check timing ({key}): Mixtral 8x7B-style layer on one device",
                8,
                MIXTRAL_ROUTER,
                shapes,
                "float32",
                "bfloat16",
            ),
            encoding="utf-8",
        )
        spec_paths.append(path)
        manifest["timing"][key] = {
            "name": name,
            "module": f"modules/{name}.py",
            "router": MIXTRAL_ROUTER,
        }

    command = [
        sys.executable,
        "-m",
        "moegen",
        "build",
        "--no-verify",
        "--out",
        str(modules_dir),
        *map(str, spec_paths),
    ]
    print(
        "$",
        " ".join(os.path.relpath(c, ROOT) if c.startswith("/") else c for c in command),
        flush=True,
    )
    result = subprocess.run(command, cwd=ROOT)
    if result.returncode != 0:
        print(f"prepare: moegen build failed (exit {result.returncode})", file=sys.stderr)
        return result.returncode
    reference = ROOT / "moegen" / "verify" / "reference.py"
    shutil.copy(reference, work / "reference.py")
    (work / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    size = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    print(
        f"prepared {len(spec_paths)} modules and the reference in "
        f"{os.path.relpath(work, ROOT)}/ ({size / 1024:.0f} KiB) "
        f"at commit {manifest['commit'][:12]}"
        + (f", {len(manifest['dirty_paths'])} paths modified" if manifest["dirty_paths"] else "")
    )
    return 0


# ---------------------------------------------------------------------------------------------
# run (there: jax only)
# ---------------------------------------------------------------------------------------------


class Report:
    """Plain text lines on stdout and, when $OUT is set, in $OUT/gpu_check.txt as they come."""

    def __init__(self) -> None:
        out = os.environ.get("OUT")
        self.out = Path(out) if out else None
        self.text = self.out / "gpu_check.txt" if self.out else None
        if self.text:
            self.out.mkdir(parents=True, exist_ok=True)
            self.text.write_text("", encoding="utf-8")
        self.data: dict[str, Any] = {"parity": [], "timing": [], "errors": []}

    def line(self, text: str = "") -> None:
        print(text, flush=True)
        if self.text:
            with self.text.open("a", encoding="utf-8") as f:
                f.write(text + "\n")

    def error(self, where: str, err: BaseException) -> None:
        first = (str(err).strip().splitlines() or [""])[0][:300]
        self.line(f"  ERROR {where}: {type(err).__name__}: {first}")
        self.data["errors"].append(
            {"where": where, "type": type(err).__name__, "message": str(err)}
        )
        traceback.print_exc(file=sys.stderr)

    def finish(self) -> None:
        if self.out:
            (self.out / "gpu_check.json").write_text(
                json.dumps(self.data, indent=1, default=str), encoding="utf-8"
            )


def import_path(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def relative_error(got: Any, want: Any) -> float:
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.linalg.norm(want)), 1e-30)
    return float(np.linalg.norm(got - want)) / scale


def _set_mesh(mesh: Any) -> Any:
    import jax

    setter = getattr(jax, "set_mesh", None) or getattr(jax.sharding, "use_mesh", None)
    return setter(mesh) if setter else contextlib.nullcontext()


def _matmul_precision(value: str | None) -> Any:
    import jax

    if hasattr(jax, "default_matmul_precision"):
        return jax.default_matmul_precision(value)

    @contextlib.contextmanager
    def scoped() -> Any:
        old = jax.config.jax_default_matmul_precision
        jax.config.update("jax_default_matmul_precision", value)
        try:
            yield
        finally:
            jax.config.update("jax_default_matmul_precision", old)

    return scoped()


class Reference:
    """The copied dense reference, old API (RouterConfig, dense_moe -> y) or new
    (ReferenceConfig, dense_moe -> (y, aux))."""

    def __init__(self, path: Path) -> None:
        self.module = import_path(path, "gpu_check_reference")
        m = self.module
        self.config_class = getattr(m, "ReferenceConfig", None) or m.RouterConfig

    def config(self, router: dict[str, Any], module: ModuleType) -> Any:
        known = dict(router) | {
            "num_experts": module.NUM_EXPERTS,
            "embed_dim": module.EMBED_DIM,
            "ffn_dim": module.FFN_DIM,
        }
        if dataclasses.is_dataclass(self.config_class):
            names = {f.name for f in dataclasses.fields(self.config_class)}
        else:
            names = set(inspect.signature(self.config_class).parameters)
        missing = set(router) - names
        if missing:
            raise TypeError(f"the reference config takes no {sorted(missing)}")
        return self.config_class(**{k: v for k, v in known.items() if k in names})

    def forward(self, params: dict, x: Any, cfg: Any) -> tuple[Any, Any]:
        """(y, tokens_per_expert or None)."""
        out = self.module.dense_moe(params, x, cfg)
        if isinstance(out, tuple) and not hasattr(out, "shape"):
            y, aux = out[0], (out[1] if len(out) > 1 else None)
            counts = getattr(aux, "tokens_per_expert", None)
            if counts is None and isinstance(aux, dict):
                counts = aux.get("tokens_per_expert")
            return y, counts
        counts = None
        if hasattr(self.module, "tokens_per_expert"):
            counts = self.module.tokens_per_expert(params, x, cfg)
        return out, counts


def _random_case(module: ModuleType, seed: int) -> tuple[dict, Any, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    params = {
        name: rng.normal(0.0, module.INIT_SCALES[name], shape).astype(np.float32)
        for name, shape in module.PARAM_SHAPES.items()
    }
    x = rng.normal(0.0, 1.0, module.INPUT_SHAPE).astype(np.float32)
    cotangent = rng.normal(0.0, 1.0, module.INPUT_SHAPE).astype(np.float32)
    return params, x, cotangent


def _starved_case(module: ModuleType, seed: int) -> tuple[dict, Any, Any, list[int]]:
    """Positive tokens and router columns of one sign: negative columns never win top-k."""
    import numpy as np

    params, x, cotangent = _random_case(module, seed)
    experts, top_k = module.NUM_EXPERTS, module.TOP_K
    starved = list(range(1, experts, 2))[: experts - top_k]
    x = np.abs(x) + 0.1
    router = 0.25 * np.abs(params["router"])
    router[:, starved] *= -1.0
    params["router"] = router
    return params, x, cotangent, starved


def parity_case(
    module: ModuleType, ref: Reference, cfg: Any, params: dict, x: Any, cotangent: Any
) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding

    mesh = module.make_mesh(jax.devices()[: module.NUM_DEVICES])
    placed = {
        name: jax.device_put(
            jnp.asarray(value, module.PARAM_DTYPE), NamedSharding(mesh, module.PARAM_SPECS[name])
        )
        for name, value in params.items()
    }
    placed_x = jax.device_put(jnp.asarray(x, module.COMPUTE_DTYPE), module.input_sharding(mesh))
    ct = jnp.asarray(cotangent, jnp.float32)

    def module_loss(p: dict, xs: Any) -> Any:
        y, _ = module.moe_layer(p, xs, mesh=mesh)
        return jnp.sum(y.astype(jnp.float32) * ct)

    with _set_mesh(mesh):
        y, aux = jax.jit(functools.partial(module.moe_layer, mesh=mesh))(placed, placed_x)
        grads, grad_x = jax.jit(jax.grad(module_loss, argnums=(0, 1)))(placed, placed_x)

    # The reference sees exactly the values the module saw (after any dtype rounding).
    host_params = {k: jnp.asarray(np.asarray(v, np.float32)) for k, v in placed.items()}
    host_x = jnp.asarray(np.asarray(placed_x, np.float32))

    def reference_loss(p: dict, xs: Any) -> Any:
        return jnp.sum(ref.forward(p, xs, cfg)[0] * ct)

    ref_y, ref_counts = jax.jit(lambda p, xs: ref.forward(p, xs, cfg))(host_params, host_x)
    ref_grads, ref_grad_x = jax.jit(jax.grad(reference_loss, argnums=(0, 1)))(host_params, host_x)

    errors = {"y": relative_error(y, ref_y), "grad_x": relative_error(grad_x, ref_grad_x)}
    errors |= {f"grad_{k}": relative_error(grads[k], ref_grads[k]) for k in ref_grads}
    counts = np.asarray(aux.tokens_per_expert).tolist()
    want_counts = None if ref_counts is None else np.asarray(ref_counts).tolist()
    return {"errors": errors, "counts": counts, "ref_counts": want_counts}


def run_parity(report: Report, work: Path, manifest: dict) -> bool:
    import jax

    platform = jax.devices()[0].platform
    report.line(f"== twin parity on {platform} (module vs dense reference; relative errors) ==")
    try:
        ref = Reference(work / "reference.py")
    except Exception as err:
        report.error("importing the reference", err)
        return False
    ok = True
    for entry in manifest["parity"]:
        name, tol = entry["name"], entry["tolerance"]
        try:
            module = import_path(work / entry["module"], f"gpu_check_{name}")
            cfg = ref.config(entry["router"], module)
        except Exception as err:
            report.error(f"{name}: import", err)
            report.data["parity"].append({"name": name, "ok": False, "error": repr(err)})
            ok = False
            continue
        cases = [("random routing", *_random_case(module, 0), [])]
        if module.NUM_EXPERTS > module.TOP_K:
            cases.append(("starved experts", *_starved_case(module, 1)))
        for case, params, x, cotangent, starved in cases:
            start = time.perf_counter()
            try:
                with _matmul_precision("highest"):
                    result = parity_case(module, ref, cfg, params, x, cotangent)
            except Exception as err:
                report.error(f"{name} / {case}", err)
                report.data["parity"].append(
                    {"name": name, "case": case, "ok": False, "error": repr(err)}
                )
                ok = False
                continue
            errors = result["errors"]
            worst = max(errors, key=errors.get)
            problems = []
            if not errors[worst] < tol:
                problems.append(f"{worst} {errors[worst]:.2e} >= {tol:.0e}")
            if result["ref_counts"] is not None and result["counts"] != result["ref_counts"]:
                problems.append(f"tokens_per_expert {result['counts']} != {result['ref_counts']}")
            if starved and any(result["counts"][e] for e in starved):
                problems.append(f"starved experts {starved} got tokens {result['counts']}")
            ok &= not problems
            verdict = "ok  " if not problems else "FAIL"
            report.line(
                f"  {verdict} {name:<32} {case:<16} max {errors[worst]:.2e} ({worst}, tol "
                f"{tol:.0e})  y {errors['y']:.1e}  grad_x {errors['grad_x']:.1e}  "
                f"{time.perf_counter() - start:5.1f} s"
                + ("  counts not checked" if result["ref_counts"] is None else "")
                + ("  -- " + "; ".join(problems) if problems else "")
            )
            report.data["parity"].append(
                {"name": name, "case": case, "ok": not problems, "tolerance": tol, **result}
            )
    ok &= check_baselines(report, ref, manifest, work)
    report.line(f"  parity on {platform}: {'all ok' if ok else 'FAILURES'}")
    return ok


def check_baselines(report: Report, ref: Reference, manifest: dict, work: Path) -> bool:
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
                want = np.asarray(ref.forward(params, x, ref.config(entry["router"], module))[0])
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


# --- timing -----------------------------------------------------------------------------------


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
                if on_mesh:
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


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    deadline = started + args.budget_s
    report = Report()
    work = Path(args.work)
    manifest_path = work / MANIFEST
    if not manifest_path.exists():
        report.line(
            f"no {os.path.relpath(manifest_path, ROOT)}: run `scripts/gpu_check.sh prepare` "
            "here first and carry .gpu_check to the GPU machine"
        )
        report.finish()
        return 2
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    try:
        import jax
        import numpy as np
    except Exception as err:
        report.error("importing jax", err)
        report.finish()
        return 2
    try:
        devices = jax.devices()
    except Exception as err:  # e.g. JAX_PLATFORMS=cuda with no GPU
        report.error("jax.devices()", err)
        devices = []
    platform = devices[0].platform if devices else "none"
    report.line(
        f"gpu_check: jax {jax.__version__}, numpy {np.__version__}, python "
        f"{sys.version.split()[0]}; devices {[str(d) for d in devices]}"
    )
    kind = getattr(devices[0], "device_kind", "?") if devices else "?"
    report.line(
        f"  modules prepared at {manifest['prepared_at']} from commit {manifest['commit'][:12]}"
        + (f" (+{len(manifest['dirty_paths'])} modified paths)" if manifest["dirty_paths"] else "")
    )
    report.data |= {"jax": jax.__version__, "devices": [str(d) for d in devices], "kind": kind}
    if platform != "gpu" and not args.allow_cpu:
        report.line(
            f"NO GPU VISIBLE: jax's default backend is {platform!r} (devices: "
            f"{[str(d) for d in devices]}). This check needs an NVIDIA GPU with jax's CUDA "
            "plugin (the H200 machine of the device tool); check nvidia-smi and "
            "`python3 -c 'import jax; print(jax.devices())'` there. To try the script on CPU, "
            "pass --quick (or --allow-cpu)."
        )
        report.finish()
        return 3
    ok = True
    if not args.skip_parity:
        ok &= run_parity(report, work, manifest)
    if not args.skip_timing:
        peak = measure_peak(report, 1024 if args.quick else args.peak_n, args.runs)
        entry = manifest["timing"]["quick" if args.quick else "full"]
        ok &= run_timing(report, work, entry, peak, args.runs, deadline)
    report.line(f"gpu_check: {'OK' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    report.data["ok"] = ok
    report.finish()
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("prepare", help="render the modules into .gpu_check/ (needs moegen)")
    p.add_argument("--work", default=str(WORK))
    r = sub.add_parser("run", help="parity and timing on the GPU (needs jax only)")
    r.add_argument("--work", default=str(WORK))
    r.add_argument("--quick", action="store_true", help="small timing shapes; allows CPU")
    r.add_argument("--allow-cpu", action="store_true", help="run even with no GPU visible")
    r.add_argument("--runs", type=int, default=10, help="timed runs per program (median)")
    r.add_argument("--peak-n", type=int, default=8192, help="matmul size for the peak")
    r.add_argument("--budget-s", type=float, default=400, help="skip timings after this")
    r.add_argument("--skip-parity", action="store_true")
    r.add_argument("--skip-timing", action="store_true")
    args = parser.parse_args(argv)
    if args.mode == "prepare":
        return prepare(args)
    args.allow_cpu |= args.quick
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
