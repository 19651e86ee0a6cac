"""GPU check of moegen's `xla` and `tokamax` kernels: twin parity on the GPU, and timing.

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
                 starved experts, as moegen/verify/worker/child.py does on CPU;
              2. the bf16 matmul peak (a big jnp.dot, median of several);
              3. forward and forward+backward time of the realistic module and of two plain
                 JAX baselines of the same shapes: a dense one-hot layer (every token through
                 every expert, one-hot combine einsum) and a plain jax.lax.ragged_dot layer
                 (sort, grouped matmuls, unsort; no shard_map, no plan), with useful TFLOP/s
                 (router + top_k experts' three matmuls, x3 for forward+backward) against
                 the measured peak.
            Lines are printed and, when $OUT is set, written to $OUT/gpu_check.txt as they come
            (and $OUT/gpu_check.json at the end).

Each phase has its module: gpu_check_prepare.py (prepare), gpu_check_parity.py (the report
and twin parity) and gpu_check_timing.py (baselines and timing) for run; this one dispatches.
The run side reads the copied reference as it is (ReferenceConfig, dense_moe -> (y, aux)).

`run --quick` times a small module instead of the full-size one and a small matmul, so the run
phase can be tried on CPU: JAX_PLATFORMS=cpu python scripts/gpu_check.py run --quick
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from gpu_check_parity import Report, run_parity
from gpu_check_prepare import MANIFEST, ROOT, WORK, prepare
from gpu_check_timing import check_baselines, measure_peak, run_timing


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
    if platform != "gpu" and _drop_tokamax(manifest):
        report.line("  kernel tokamax skipped: its Mosaic GPU kernels need an NVIDIA GPU")
    ok = True
    if not args.skip_parity:
        parity_ok, ref = run_parity(report, work, manifest)
        if ref is not None:
            parity_ok &= check_baselines(report, ref, manifest, work)
            report.line(f"  parity on {platform}: {'all ok' if parity_ok else 'FAILURES'}")
        ok &= parity_ok
    if not args.skip_timing:
        peak = measure_peak(report, 1024 if args.quick else args.peak_n, args.runs)
        entry = manifest["timing"]["quick" if args.quick else "full"]
        ok &= run_timing(report, work, entry, peak, args.runs, deadline)
    report.line(f"gpu_check: {'OK' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    report.data["ok"] = ok
    report.finish()
    return 0 if ok else 1


def _drop_tokamax(manifest: dict) -> bool:
    """Leave the kernel tokamax twin and timing modules out (off GPU); whether there were any."""
    parity = [e for e in manifest["parity"] if not e["name"].endswith("_tokamax")]
    dropped = len(parity) < len(manifest["parity"])
    manifest["parity"] = parity
    for entry in manifest["timing"].values():
        dropped |= entry.pop("tokamax_module", None) is not None
    return dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("prepare", help="render the modules into .gpu_check/ (needs moegen)")
    p.add_argument("--work", default=str(WORK))
    p.add_argument(
        "--no-tokamax", dest="tokamax", action="store_false",
        help="no kernel tokamax modules and no wheels (xla only)",
    )  # fmt: skip
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
