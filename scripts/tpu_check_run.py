"""TPU check, run phase (on the TPU machine: python3 with jax, no moegen): time and check the
modules that tpu_check_prepare.py wrote, and report.

For each module of the manifest: time forward and forward+backward (median of 10 after 2
warm-ups, as the prototype that ran on a v5e chip), useful TF/s, and the same for the peers of
its shape (tpu_check_peers: the dense balanced ceiling, a MaxText-style megablox layer,
jax.lax.ragged_dot, tokamax.ragged_dot where installed; once a distinct shape), the chip's
peak memory beside the plan's, and parity of y and every gradient against a float32
reference. Every program is compiled ahead in threads (tpu_check_programs) while the first
ones are timed. Past --budget-s what is left is reported as "skipped: budget", never dropped.
Imports only jax, numpy, the standard library and the files under the work folder.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tpu_check_peers as peers  # noqa: E402
from tpu_check_kernels import kernel_line, run_kernels  # noqa: E402
from tpu_check_layers import (  # noqa: E402
    Layer,
    layer_inputs,
    load_layer,
    reference_inputs,
    relative_error,
    tolerance,
    verdict,
)
from tpu_check_programs import TIMING, Programs, fwd_bwd, median_ms  # noqa: E402
from tpu_check_report import PEAK_NOTE, Report, environment, table, times_text  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def peak_bytes() -> int | None:
    """The chip's peak_bytes_in_use (None where the backend keeps no memory stats: CPU)."""
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def timed_row(
    programs: Programs, key: str, fn: Any, args: tuple, ct: Any, flops: dict[str, int]
) -> tuple[dict[str, Any], Any, Any]:
    """Forward and forward+backward times of fn(*args) and their useful TF/s, and the two
    compiled programs (parity reuses them: no second compile of a big layer)."""
    forward, compile_f = programs.compiled((key, "fwd"), fn, *args)
    backward, compile_b = programs.compiled((key, "fwdbwd"), fwd_bwd(fn), *args, ct)
    fwd, fb = median_ms(forward, *args), median_ms(backward, *args, ct)
    row = {
        "fwd_ms": round(fwd, 3), "fwdbwd_ms": round(fb, 3),
        "compile_s": round(compile_f + compile_b, 1),
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


def peer_layers(entry: dict[str, Any], tokamax: bool) -> dict[str, Any]:
    """Each peer timed at this module's shape as fn(params, x) (tokamax's where installed)."""
    cfg = entry["routing"]
    return {
        name: (lambda p, x, f=layer: f(p, x, cfg))
        for name, layer in peers.PEERS.items()
        if name != "tokamax" or tokamax
    }


def peer_inputs(entry: dict[str, Any], abstract_only: bool = False) -> tuple[Any, Any, Any]:
    """(params, x, ct) of the peers at this module's shape (abstract: their shapes alone)."""
    s = entry["shapes"]

    def make() -> tuple[Any, Any, Any]:
        params = peers.peer_params(jax.random.key(1), s, jnp.dtype(s["param_dtype"]))
        x = jax.random.normal(jax.random.key(2), (s["tokens"], s["embed"]), jnp.float32)
        ct = jax.random.normal(jax.random.key(3), x.shape, jnp.float32)
        return params, x.astype(jnp.dtype(s["compute_dtype"])), ct

    return jax.eval_shape(make) if abstract_only else make()


def run_peers(
    report: Report, programs: Programs, entry: dict[str, Any], deadline: float
) -> dict[str, dict]:
    """Every peer at this module's shape: {peer: row}; rows also into the report."""
    key = shape_key(entry)
    params, x, ct = peer_inputs(entry)
    tokamax = not report.data["environment"]["tokamax"].startswith("tokamax not")
    layers = peer_layers(entry, tokamax)
    rows = {}
    for name in peers.PEERS:
        row: dict[str, Any] = {"shape": key, "peer": name}
        if name not in layers:
            row["skipped"] = "tokamax not installed"
        elif time.time() > deadline:
            row["skipped"] = "budget"
        else:
            try:
                program = f"peer {name} {key}"
                row |= timed_row(programs, program, layers[name], (params, x), ct, entry["flops"])[
                    0
                ]
            except Exception as err:  # noqa: BLE001 (a peer that fails is reported, not fatal)
                row["error"] = f"{type(err).__name__}: {str(err).strip()[:300]}"
                traceback.print_exc(file=sys.stderr)
        rows[name] = row
        report.data["peers"].append(row)
        report.line(f"  peer {name:<10} {times_text(row)}")
        report.save()
    return rows


def parity(
    entry: dict[str, Any], layer: Layer, programs: Programs, compiled: tuple, args: tuple
) -> dict[str, Any]:
    """Relative errors of y and of every gradient (each parameter, x) against the reference,
    which gets the module's own parameters (float32 copies where compute is float32)."""
    tol = tolerance(layer.module)
    params, x, ct = args
    y = compiled[0](params, x)
    grads, grad_x = compiled[1](params, x, ct)
    ref_args = reference_inputs(layer, params, x, ct)
    name = f"reference {entry['name']}"
    ref_fwd, _ = programs.compiled((name, "fwd"), layer.ref, *ref_args[:2])
    errors = {"y": float(relative_error(y, ref_fwd(*ref_args[:2])))}
    del y
    ref_bwd, _ = programs.compiled((name, "fwdbwd"), fwd_bwd(layer.ref), *ref_args)
    ref_grads, ref_grad_x = ref_bwd(*ref_args)
    errors["grad_x"] = float(relative_error(grad_x, ref_grad_x))
    for grad in sorted(grads):
        errors[f"grad_{grad}"] = float(relative_error(grads[grad], ref_grads[grad]))
    return verdict(errors, tol)


def check_module(
    report: Report,
    programs: Programs,
    entry: dict[str, Any],
    layer: Layer,
    deadline: float,
    peer_rows: dict,
) -> dict[str, Any]:
    """Time one module, set it beside its peers and the plan, and check its parity."""
    row: dict[str, Any] = {k: entry[k] for k in ("name", "kernel", "trade", "source_specs")}
    row |= {"shapes": entry["shapes"], "plan_train_peak_bytes": entry["plan"]["train_peak_bytes"]}
    params, x, ct = layer_inputs(layer)
    timing, forward, backward = timed_row(
        programs, entry["name"], layer.fn, (params, x), ct, entry["flops"]
    )
    row |= timing
    row["peak_bytes_in_use"] = peak_bytes()
    row |= ratios(row, peer_rows)
    report.line(f"  {entry['name']:<44} {times_text(row)}")
    if layer.ref is None:
        row["parity"] = {"skipped": entry["reference"]["reason"]}
    elif time.time() > deadline:
        row["parity"] = {"skipped": "budget"}
    else:
        try:
            row["parity"] = parity(entry, layer, programs, (forward, backward), (params, x, ct))
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


def submit_ahead(
    programs: Programs, entries: list[dict[str, Any]], layers: dict[str, Layer], tokamax: bool
) -> None:
    """Every program of the run, to be compiled in threads in the order the run times them:
    a new shape's peers, then each module's forward and forward+backward, then its reference's."""
    shapes: set[str] = set()
    for entry in entries:
        key = shape_key(entry)
        if key not in shapes:
            shapes.add(key)
            params, x, ct = peer_inputs(entry, abstract_only=True)
            for name, fn in peer_layers(entry, tokamax).items():
                programs.ahead((f"peer {name} {key}", "fwd"), fn, params, x)
                programs.ahead((f"peer {name} {key}", "fwdbwd"), fwd_bwd(fn), params, x, ct)
        layer = layers.get(entry["name"])
        if layer is None:
            continue  # it did not load: the run reports why
        params, x, ct = layer_inputs(layer, abstract_only=True)
        programs.ahead((entry["name"], "fwd"), layer.fn, params, x)
        programs.ahead((entry["name"], "fwdbwd"), fwd_bwd(layer.fn), params, x, ct)
        if layer.ref is not None:
            ref_args = reference_inputs(layer, params, x, ct)
            name = f"reference {entry['name']}"
            programs.ahead((name, "fwd"), layer.ref, *ref_args[:2])
            programs.ahead((name, "fwdbwd"), fwd_bwd(layer.ref), *ref_args)


def load_layers(entries: list[dict[str, Any]], work: Path) -> dict[str, Any]:
    """{name: Layer, or the error that kept it from loading}."""
    layers: dict[str, Any] = {}
    for entry in entries:
        try:
            layers[entry["name"]] = load_layer(entry, work)
        except Exception as err:  # noqa: BLE001 (one module's failure ends no other's)
            layers[entry["name"]] = f"{type(err).__name__}: {str(err).strip()[:400]}"
            traceback.print_exc(file=sys.stderr)
    return layers


def selected(manifest: dict[str, Any], only: list[str] | None) -> list[dict[str, Any]]:
    """The manifest's modules, or those whose name is (else holds) one of `only`, in order."""
    if not only:
        return manifest["modules"]
    picked = [e for part in only for e in manifest["modules"] if part == e["name"]]
    return picked or [e for e in manifest["modules"] if any(p in e["name"] for p in only)]


def run(
    work: Path, budget_s: float, only: list[str] | None = None, compile_only: bool = False
) -> int:
    """Every module of the manifest (or those `only` names), peers once a distinct shape; 0
    when all ran and passed."""
    deadline = time.time() + budget_s
    manifest = json.loads((work / "manifest.json").read_text(encoding="utf-8"))
    entries = selected(manifest, only)
    report = Report(environment())
    report.data["notes"].append(PEAK_NOTE)
    report.data["prepare_skipped"] = manifest.get("skipped", [])
    env = report.data["environment"]
    report.line(f"== tpu_check on {env['device_kind']} ({env['platform']}) jax {env['jax']} "
                f"jaxlib {env['jaxlib']} libtpu {env['libtpu']} {env['date']} ==")  # fmt: skip
    report.line(f"  {env['tokamax']}")
    layers = load_layers(entries, work)
    programs = Programs()
    try:
        loaded = {k: v for k, v in layers.items() if isinstance(v, Layer)}
        submit_ahead(programs, entries, loaded, not env["tokamax"].startswith("tokamax not"))
        start = time.perf_counter()
        left = programs.wait(deadline - time.time())
        seconds = time.perf_counter() - start
        report.line(f"  {programs.submitted - left} of {programs.submitted} programs compiled in "
                    f"{seconds:.0f} s (threads); timed with none compiling")  # fmt: skip
        if compile_only:
            return 0 if not left else 1
        peer_rows: dict[str, dict] = {}  # {shape: {peer: row}}
        for entry in entries:
            row = run_entry(report, programs, entry, layers, deadline, peer_rows)
            report.data["modules"].append(row)
            report.save()
            gc.collect()
    finally:
        programs.close()
    kernels = [
        k for k in manifest.get("kernels", []) if not only or any(p in k["name"] for p in only)
    ]
    report.line("-- the project's own Pallas kernel" if kernels else "")
    report.data["kernels"] = run_kernels(kernels, work, deadline)
    for line in [*map(kernel_line, report.data["kernels"]), *table(report.data["modules"])]:
        report.line(line)
    report.save()
    rows = [*report.data["modules"], *report.data["kernels"]]
    bad = [r for r in rows if "error" in r or not r.get("parity", {}).get("ok", True)]
    return 1 if bad else 0


def run_entry(
    report: Report,
    programs: Programs,
    entry: dict[str, Any],
    layers: dict[str, Any],
    deadline: float,
    peer_rows: dict[str, dict],
) -> dict[str, Any]:
    """One module's row (its shape's peers first, where they are new: into peer_rows)."""
    key = shape_key(entry)
    if key not in peer_rows and time.time() <= deadline:
        report.line(f"-- shape {key}")
        peer_rows[key] = run_peers(report, programs, entry, deadline)
        gc.collect()
    name, layer = entry["name"], layers[entry["name"]]
    if time.time() > deadline:
        report.line(f"  {name:<44} skipped: budget")
        return {"name": name, "kernel": entry["kernel"], "skipped": "budget"}
    try:
        if not isinstance(layer, Layer):
            raise RuntimeError(layer)
        return check_module(report, programs, entry, layer, deadline, peer_rows.get(key, {}))
    except Exception as err:  # noqa: BLE001 (one module's failure ends no other's)
        row = {"name": name, "kernel": entry["kernel"],
               "error": f"{type(err).__name__}: {str(err).strip()[:400]}"}  # fmt: skip
        report.line(f"  {name:<44} ERROR {row['error'][:200]}")
        traceback.print_exc(file=sys.stderr)
        return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=460.0, help="then skip the rest")
    parser.add_argument(
        "--repeats", type=int, default=TIMING["repeats"], help="timed calls (median)"
    )
    parser.add_argument(
        "--compile-only", action="store_true", help="compile every program (into JAX's cache)"
    )
    parser.add_argument("--only", nargs="*", help="module names (exact, in this order) or parts")
    parser.add_argument("--work", default=os.environ.get("TPU_CHECK_WORK") or ROOT / ".tpu_check")
    args = parser.parse_args(argv)
    TIMING["repeats"] = max(1, args.repeats)
    work = Path(args.work).resolve()
    if not (work / "manifest.json").exists():
        print(f"no {work}/manifest.json: run `scripts/tpu_check.sh prepare` first", file=sys.stderr)
        return 2
    return run(work, args.budget_s, args.only, args.compile_only)


if __name__ == "__main__":
    sys.exit(main())
