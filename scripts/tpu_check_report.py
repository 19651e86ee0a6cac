"""TPU check, run phase: the report (lines on stdout and under $OUT) and its summary table.

Imports only jax and the standard library (no moegen on the TPU machine).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
from pathlib import Path
from typing import Any

import jax

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


def times_text(row: dict[str, Any]) -> str:
    if "fwd_ms" in row:
        return (
            f"fwd {row['fwd_ms']:9.3f} ms {row['fwd_tfs']:7.3g} TF/s   fwd+bwd "
            f"{row['fwdbwd_ms']:9.3f} ms {row['fwdbwd_tfs']:7.3g} TF/s  "
            f"(compile {row['compile_s']} s)"
        )
    return f"skipped: {row['skipped']}" if "skipped" in row else f"ERROR {row.get('error')}"


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
