"""GPU check, run phase (on the GPU machine, jax only): the report, and twin parity.

Imports neither moegen nor pydantic: only jax, numpy and the files under .gpu_check/ (the
modules, and moegen's dense reference copied there by gpu_check_prepare). Each small module
runs on the GPU against the reference, forward, aux.tokens_per_expert and gradients of x and
every parameter, on random routing and starved experts, as moegen/verify/worker/child.py does on
CPU (float32 twins at matmul precision "highest").
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any


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
    module: ModuleType, ref: ModuleType, cfg: Any, params: dict, x: Any, cotangent: Any
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
        return jnp.sum(ref.dense_moe(p, xs, cfg)[0] * ct)

    def reference(p: dict, xs: Any) -> tuple[Any, Any]:
        y, aux = ref.dense_moe(p, xs, cfg)
        return y, aux.tokens_per_expert

    ref_y, ref_counts = jax.jit(reference)(host_params, host_x)
    ref_grads, ref_grad_x = jax.jit(jax.grad(reference_loss, argnums=(0, 1)))(host_params, host_x)

    errors = {"y": relative_error(y, ref_y), "grad_x": relative_error(grad_x, ref_grad_x)}
    errors |= {f"grad_{k}": relative_error(grads[k], ref_grads[k]) for k in ref_grads}
    counts = np.asarray(aux.tokens_per_expert).tolist()
    return {"errors": errors, "counts": counts, "ref_counts": np.asarray(ref_counts).tolist()}


def run_parity(report: Report, work: Path, manifest: dict) -> tuple[bool, ModuleType | None]:
    """Every parity module against the copied reference: (all passed, the reference)."""
    import jax

    platform = jax.devices()[0].platform
    report.line(f"== twin parity on {platform} (module vs dense reference; relative errors) ==")
    try:
        sys.path.insert(0, str(work))  # the package moegen_reference (gpu_check_prepare)
        ref = importlib.import_module("moegen_reference.layer")
    except Exception as err:
        report.error("importing the reference", err)
        return False, None
    ok = True
    for entry in manifest["parity"]:
        name, tol = entry["name"], entry["tolerance"]
        try:
            module = import_path(work / entry["module"], f"gpu_check_{name}")
            cfg = ref.ReferenceConfig(**entry["router"])
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
            if result["counts"] != result["ref_counts"]:
                problems.append(f"tokens_per_expert {result['counts']} != {result['ref_counts']}")
            if starved and any(result["counts"][e] for e in starved):
                problems.append(f"starved experts {starved} got tokens {result['counts']}")
            ok &= not problems
            verdict = "ok  " if not problems else "FAIL"
            report.line(
                f"  {verdict} {name:<32} {case:<16} max {errors[worst]:.2e} ({worst}, tol "
                f"{tol:.0e})  y {errors['y']:.1e}  grad_x {errors['grad_x']:.1e}  "
                f"{time.perf_counter() - start:5.1f} s"
                + ("  -- " + "; ".join(problems) if problems else "")
            )
            report.data["parity"].append(
                {"name": name, "case": case, "ok": not problems, "tolerance": tol, **result}
            )
    return ok, ref
