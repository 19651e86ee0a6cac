"""TPU check, run phase (on the TPU machine: python3 with jax, no moegen): time and check the
modules that tpu_check_prepare.py wrote, and report.

For each module of the manifest: compile, time forward and forward+backward (median of 10
after 2 warm-ups, as the prototype that ran on a v5e chip), useful TF/s, and the same for the
peers of its shape (tpu_check_peers: the dense balanced ceiling, a MaxText-style megablox
layer, jax.lax.ragged_dot, tokamax.ragged_dot where installed; once a distinct shape), the
chip's peak memory beside the plan's, and parity of y and every gradient against a float32
reference. Past --budget-s what is left is reported as "skipped: budget", never dropped.
Imports only jax, numpy, the standard library and the files under the work folder.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tpu_check_peers as peers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"warmups": 2, "repeats": 10}  # median of repeats after warm-ups (the prototype's)
# bf16 compute (or f32 at the TPU default precision) against the f32 reference: wide enough
# for bf16 rounding over a 14336-wide FFN (Mixtral 8x7B on a v5e chip: y 3.6e-2, the router
# gradient 6.0e-2, identical to 3 digits under kernels pallas and xla), while a wrong path
# (a reference routed differently) measured 0.87 and more.
BF16_TOLERANCE = 1e-1
F32_TOLERANCE = 1e-4  # f32 compute off TPU, against the f32 reference at "highest"
PEAK_NOTE = (
    "peak_bytes_in_use only grows within a process: a module's figure is the peak since the "
    "run started (its own, or an earlier module's where that was higher)"
)


class Report:
    """Lines on stdout and, when $OUT is set, in $OUT/tpu_check.txt and tpu_check.json."""

    def __init__(self, env: dict[str, Any]) -> None:
        out = os.environ.get("OUT")
        self.out = Path(out) if out else None
        if self.out:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "tpu_check.txt").write_text("", encoding="utf-8")
        self.data: dict[str, Any] = {"environment": env, "peers": [], "modules": [], "notes": []}

    def line(self, text: str = "") -> None:
        print(text, flush=True)
        if self.out:
            with (self.out / "tpu_check.txt").open("a", encoding="utf-8") as f:
                f.write(text + "\n")

    def save(self) -> None:
        if self.out:
            text = json.dumps(self.data, indent=1, default=str)
            (self.out / "tpu_check.json").write_text(text, encoding="utf-8")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """What ran: device, versions (libtpu where installed), date, whether tokamax imports."""
    device = jax.devices()[0]
    try:
        import tokamax  # noqa: F401

        tokamax_status = f"installed {_version('tokamax')}"
    except ImportError:
        tokamax_status = "tokamax not installed"
    return {
        "device_kind": device.device_kind, "platform": device.platform,
        "device_count": jax.device_count(), "jax": jax.__version__,
        "jaxlib": _version("jaxlib"), "libtpu": _version("libtpu") or _version("libtpu-nightly"),
        "python": platform.python_version(), "tokamax": tokamax_status,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }  # fmt: skip


def timeit(fn: Any, *args: Any) -> tuple[float, float, Any]:
    """(compile seconds, median milliseconds of the timed calls after the warm-ups, the
    compiled program)."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    for _ in range(TIMING["warmups"]):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(TIMING["repeats"]):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return compile_s, statistics.median(times) * 1e3, compiled


def fwd_bwd(fn: Any, ct: jax.Array) -> Any:
    """Gradients of sum(fn(p, x) * ct) with respect to the parameters and x."""

    def loss(p: Any, x: jax.Array) -> jax.Array:
        return jnp.sum(fn(p, x).astype(jnp.float32) * ct)

    return jax.grad(loss, argnums=(0, 1))


def peak_bytes() -> int | None:
    """The chip's peak_bytes_in_use (None where the backend keeps no memory stats: CPU)."""
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


@jax.jit
def relative_error(got: jax.Array, want: jax.Array) -> jax.Array:
    got, want = got.astype(jnp.float32), want.astype(jnp.float32)
    return jnp.linalg.norm(got - want) / jnp.maximum(jnp.linalg.norm(want), 1e-30)


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def timed_row(
    fn: Any, args: tuple, ct: jax.Array, flops: dict[str, int]
) -> tuple[dict[str, Any], Any, Any]:
    """Forward and forward+backward times of fn(*args) and their useful TF/s, and the two
    compiled programs (parity reuses them: no second compile of a big layer)."""
    compile_s, fwd, forward = timeit(fn, *args)
    compile_b, fb, backward = timeit(fwd_bwd(fn, ct), *args)
    row = {
        "fwd_ms": round(fwd, 3), "fwdbwd_ms": round(fb, 3),
        "compile_s": round(compile_s + compile_b, 1),
        "fwd_tfs": float(f"{flops['forward'] / fwd / 1e9:.4g}"),
        "fwdbwd_tfs": float(f"{flops['forward_backward'] / fb / 1e9:.4g}"),
    }  # fmt: skip
    return row, forward, backward


def shape_key(entry: dict[str, Any]) -> str:
    s, r = entry["shapes"], entry["routing"]
    return (
        f"E{s['experts']} D{s['embed']} F{s['ffn']} K{s['top_k']} T{s['tokens']} "
        f"{r['activation']} {r['score']} {s['param_dtype']}"
    )


def run_peers(report: Report, entry: dict[str, Any], deadline: float) -> dict[str, dict]:
    """Every peer at this module's shape: {peer: row}; rows also into the report."""
    s, cfg = entry["shapes"], entry["routing"]
    key = shape_key(entry)
    params = peers.peer_params(jax.random.key(1), s, jnp.dtype(s["param_dtype"]))
    x = jax.random.normal(jax.random.key(2), (s["tokens"], s["embed"]), jnp.float32)
    x = x.astype(jnp.dtype(s["compute_dtype"]))
    ct = jax.random.normal(jax.random.key(3), x.shape, jnp.float32)
    rows = {}
    for name, layer in peers.PEERS.items():
        row: dict[str, Any] = {"shape": key, "peer": name}
        if name == "tokamax" and report.data["environment"]["tokamax"].startswith("tokamax not"):
            row["skipped"] = "tokamax not installed"
        elif time.time() > deadline:
            row["skipped"] = "budget"
        else:
            try:
                layer_fn = lambda p, x, f=layer: f(p, x, cfg)  # noqa: E731
                row |= timed_row(layer_fn, (params, x), ct, entry["flops"])[0]
            except Exception as err:  # noqa: BLE001 (a peer that fails is reported, not fatal)
                row["error"] = f"{type(err).__name__}: {str(err).strip()[:300]}"
                traceback.print_exc(file=sys.stderr)
        rows[name] = row
        report.data["peers"].append(row)
        report.line(f"  peer {name:<10} {_times(row)}")
        report.save()
    return rows


def _times(row: dict[str, Any]) -> str:
    if "fwd_ms" in row:
        return (
            f"fwd {row['fwd_ms']:9.3f} ms {row['fwd_tfs']:7.3g} TF/s   fwd+bwd "
            f"{row['fwdbwd_ms']:9.3f} ms {row['fwdbwd_tfs']:7.3g} TF/s  "
            f"(compile {row['compile_s']} s)"
        )
    return f"skipped: {row['skipped']}" if "skipped" in row else f"ERROR {row.get('error')}"


def tolerance(module: ModuleType) -> float:
    """bf16 compute, or f32 at the TPU default matmul precision: 1e-1; f32 elsewhere: 1e-4."""
    f32 = jnp.dtype(module.COMPUTE_DTYPE) == jnp.float32
    return F32_TOLERANCE if f32 and jax.devices()[0].platform != "tpu" else BF16_TOLERANCE


def reference_fn(entry: dict[str, Any], work: Path, shape: tuple[int, ...]) -> Any:
    """The float32 reference of this module as fn(params, x) -> y like x (see prepare)."""
    choice = entry["reference"]
    cfg = choice["config"]
    if choice["kind"] == "simple":
        return lambda p, x: peers.reference(p, x.reshape(-1, shape[-1]), cfg).reshape(shape)
    if str(work) not in sys.path:
        sys.path.insert(0, str(work))
    ref = importlib.import_module("moegen_reference.layer")
    s = entry["shapes"]
    chunk = s["tokens"] if cfg.get("capacity") is not None else s["seq_len"]
    while chunk > 256 and chunk * s["experts"] * s["ffn"] > 2**27:
        chunk //= 2  # [chunk, experts, ffn] float32 intermediates of at most 512 MiB each
    return lambda p, x: peers.dense_reference(ref, p, x, cfg, chunk)


def parity(
    entry: dict[str, Any], work: Path, module: ModuleType, compiled: tuple, args: tuple, ct: Any
) -> dict[str, Any]:
    """Relative errors of y and of every gradient (each parameter, x) against the reference,
    which gets the module's own parameters (float32 copies where compute is float32)."""
    tol = tolerance(module)
    params, x = args
    y = compiled[0](params, x)
    grads, grad_x = compiled[1](params, x)
    # Plain single-device arrays for the reference (the module's carry its mesh's sharding
    # types, which the reference's scan and scatters need not follow); float32 copies where
    # compute is float32, so that no bf16 rounding of its gradients hides in the tolerance.
    device = jax.devices()[0]
    params, x = jax.device_put((params, x), SingleDeviceSharding(device))
    if tol == F32_TOLERANCE:
        params = jax.tree.map(lambda a: a.astype(jnp.float32), params)
        x = x.astype(jnp.float32)
    ref = reference_fn(entry, work, tuple(module.INPUT_SHAPE))
    ref_y = jax.jit(ref)(params, x)
    errors = {"y": float(relative_error(y, ref_y))}
    del y, ref_y
    ref_grads, ref_grad_x = jax.jit(fwd_bwd(ref, ct))(params, x)
    errors["grad_x"] = float(relative_error(grad_x, ref_grad_x))
    for name in sorted(grads):
        errors[f"grad_{name}"] = float(relative_error(grads[name], ref_grads[name]))
    worst = max(errors, key=errors.get)
    ok = all(v <= tol for v in errors.values())  # a NaN fails
    return {"ok": ok, "tolerance": tol, "max": errors[worst], "worst": worst, "errors": errors}


def check_module(
    report: Report, entry: dict[str, Any], work: Path, deadline: float, peer_rows: dict
) -> dict[str, Any]:
    """Time one module, set it beside its peers and the plan, and check its parity."""
    row: dict[str, Any] = {k: entry[k] for k in ("name", "kernel", "trade", "source_specs")}
    row |= {"shapes": entry["shapes"], "plan_train_peak_bytes": entry["plan"]["train_peak_bytes"]}
    module = load_module(work / entry["file"], f"tpu_check_{entry['name']}")
    mesh = module.make_mesh()
    params = module.init_params(jax.random.key(0), mesh)
    x = jax.random.normal(jax.random.key(4), module.INPUT_SHAPE, jnp.float32)
    x = jax.device_put(x.astype(module.COMPUTE_DTYPE), module.input_sharding(mesh))
    ct = jax.random.normal(jax.random.key(5), module.INPUT_SHAPE, jnp.float32)

    def fn(p: Any, xs: jax.Array) -> jax.Array:
        return module.moe_layer(p, xs, mesh=mesh)[0]

    timing, forward, backward = timed_row(fn, (params, x), ct, entry["flops"])
    row |= timing
    row["peak_bytes_in_use"] = peak_bytes()
    row |= ratios(row, peer_rows)
    report.line(f"  {entry['name']:<44} {_times(row)}")
    if entry["reference"]["kind"] == "none":
        row["parity"] = {"skipped": entry["reference"]["reason"]}
    elif time.time() > deadline:
        row["parity"] = {"skipped": "budget"}
    else:
        try:
            row["parity"] = parity(entry, work, module, (forward, backward), (params, x), ct)
        except Exception as err:  # noqa: BLE001 (the timing stands; the parity run failed)
            row["parity"] = {"ok": False, "error": f"{type(err).__name__}: {str(err)[:300]}"}
            traceback.print_exc(file=sys.stderr)
    return row


def ratios(row: dict[str, Any], peer_rows: dict[str, dict]) -> dict[str, Any]:
    """% of the dense ceiling's speed, and how many times faster than each sorted peer."""
    out: dict[str, Any] = {}
    for phase in ("fwd", "fwdbwd"):
        ceiling = peer_rows.get("ceiling", {}).get(f"{phase}_ms")
        out[f"{phase}_pct_ceiling"] = (
            round(100 * ceiling / row[f"{phase}_ms"], 1) if ceiling else None
        )
        for peer in ("maxtext", "ragged_dot", "tokamax"):
            ms = peer_rows.get(peer, {}).get(f"{phase}_ms")
            out[f"{phase}_x_{peer}"] = round(ms / row[f"{phase}_ms"], 2) if ms else None
    return out


def run(work: Path, budget_s: float, only: list[str] | None = None) -> int:
    """Every module of the manifest (or those whose name holds one of `only`, in that order),
    peers once a distinct shape; 0 when all ran and passed."""
    deadline = time.time() + budget_s
    manifest = json.loads((work / "manifest.json").read_text(encoding="utf-8"))
    if only:
        picked = [e for part in only for e in manifest["modules"] if part == e["name"]]
        manifest["modules"] = picked or [
            e for e in manifest["modules"] if any(part in e["name"] for part in only)
        ]
    report = Report(environment())
    report.data["notes"].append(PEAK_NOTE)
    report.data["prepare_skipped"] = manifest.get("skipped", [])
    env = report.data["environment"]
    report.line(f"== tpu_check on {env['device_kind']} ({env['platform']}) jax {env['jax']} "
                f"jaxlib {env['jaxlib']} libtpu {env['libtpu']} {env['date']} ==")  # fmt: skip
    report.line(f"  {env['tokamax']}")
    peers_by_shape: dict[str, dict] = {}
    for entry in manifest["modules"]:
        key = shape_key(entry)
        if key not in peers_by_shape and time.time() <= deadline:
            report.line(f"-- shape {key}")
            peers_by_shape[key] = run_peers(report, entry, deadline)
            gc.collect()
        if time.time() > deadline:
            row = {"name": entry["name"], "kernel": entry["kernel"], "skipped": "budget"}
            report.line(f"  {entry['name']:<44} skipped: budget")
        else:
            try:
                row = check_module(report, entry, work, deadline, peers_by_shape.get(key, {}))
            except Exception as err:  # noqa: BLE001 (one module's failure ends no other's)
                row = {"name": entry["name"], "kernel": entry["kernel"],
                       "error": f"{type(err).__name__}: {str(err).strip()[:400]}"}  # fmt: skip
                report.line(f"  {entry['name']:<44} ERROR {row['error'][:200]}")
                traceback.print_exc(file=sys.stderr)
        report.data["modules"].append(row)
        report.save()
        gc.collect()
    for line in table(report.data["modules"]):
        report.line(line)
    report.save()
    bad = [
        r for r in report.data["modules"] if "error" in r or not r.get("parity", {}).get("ok", True)
    ]
    return 1 if bad else 0


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The summary: one line a module."""
    gib = 2**30
    head = (f"{'module':<46} {'fwd ms':>9} {'f+b ms':>9} {'f+b TF/s':>8} {'%ceil':>6} "
            f"{'x maxtext':>9} {'x ragged':>8} {'peak GiB':>8} {'plan GiB':>8}  "
            "parity")  # fmt: skip
    lines = ["", "== summary (f+b: forward+backward; ratios on f+b) ==", head]
    for r in rows:
        if "fwd_ms" not in r:
            lines.append(f"{r['name']:<46} {r.get('skipped') or 'ERROR ' + r.get('error', '')}")
            continue
        p = r["parity"]
        verdict = f"skipped: {p['skipped']}" if "skipped" in p else _verdict(p)
        peak, plan = r.get("peak_bytes_in_use"), r.get("plan_train_peak_bytes")
        lines.append(
            f"{r['name']:<46} {r['fwd_ms']:9.3f} {r['fwdbwd_ms']:9.3f} {r['fwdbwd_tfs']:8.3g} "
            f"{_num(r['fwdbwd_pct_ceiling'], 6)} {_num(r['fwdbwd_x_maxtext'], 9)} "
            f"{_num(r['fwdbwd_x_ragged_dot'], 8)} {_num(peak and peak / gib, 8)} "
            f"{_num(plan and plan / gib, 8)}  {verdict}"
        )
    lines.append(f"(peak: {PEAK_NOTE})")
    return lines


def _verdict(p: dict[str, Any]) -> str:
    if "error" in p:
        return f"ERROR {p['error'][:120]}"
    ok = "ok" if p["ok"] else "FAIL"
    return f"{ok} {p['max']:.1e} ({p['worst']}) tol {p['tolerance']:.0e}"


def _num(value: float | None, width: int) -> str:
    return f"{value:{width}.2f}" if value is not None else f"{'-':>{width}}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=460.0, help="then skip the rest")
    parser.add_argument(
        "--repeats", type=int, default=TIMING["repeats"], help="timed calls (median)"
    )
    parser.add_argument("--only", nargs="*", help="module names (exact, in this order) or parts")
    parser.add_argument("--work", default=os.environ.get("TPU_CHECK_WORK") or ROOT / ".tpu_check")
    args = parser.parse_args(argv)
    TIMING["repeats"] = max(1, args.repeats)
    work = Path(args.work).resolve()
    if not (work / "manifest.json").exists():
        print(f"no {work}/manifest.json: run `scripts/tpu_check.sh prepare` first", file=sys.stderr)
        return 2
    return run(work, args.budget_s, args.only)


if __name__ == "__main__":
    sys.exit(main())
