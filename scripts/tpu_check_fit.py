"""TPU check, phase one: whether a one-chip layer fits one v5e chip, by moegen's plan (run in a
child process with the project's venv: this file imports nothing of moegen)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
HBM_BYTES = int(15.7 * 2**30)  # one TPU v5e chip, as JAX sees it


def moegen_python() -> str:
    """The venv's interpreter (moegen installed), else this one."""
    return str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def plan_of(path: Path) -> tuple[dict[str, Any] | None, str]:
    """`moegen plan --json` of one spec: (the plan, "") or (None, why not)."""
    command = [moegen_python(), "-m", "moegen", "plan", "--json", str(path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        return None, (result.stderr.strip() or result.stdout.strip())[-600:]
    return json.loads(result.stdout), ""


def planned_peak(plan: dict[str, Any]) -> int:
    """The plan's forward+backward peak, else parameters x 3 (params, grads, a working copy)."""
    peak = plan.get("memory", {}).get("train_peak")
    return int(peak) if peak else 3 * int(plan["cost"]["param_bytes"])


def variants_fit(path: Path, spec: dict[str, Any], others: list[dict[str, Any]]) -> str:
    """Why a variant of the layer does not fit one chip ("" when all do): each of `others`
    (kernels, memory trades: changes to `spec`) planned beside it, so that every module of a
    layer has the same parameter dtype (float32 weights read as stored can fit where the xla
    kernel's or a trade's copy of them does not)."""
    for changes in others:
        variant = copy.deepcopy(spec)
        for section, values in changes.items():
            variant[section] = {**variant.get(section, {}), **values}
        plan, why = plan_of(write_spec(path.with_name(path.stem + "_fit.yaml"), variant))
        if plan is None or planned_peak(plan) > HBM_BYTES:
            peak = f"planned peak {planned_peak(plan) / 2**30:.1f} GiB" if plan else why
            return f"{changes}: {peak}"
    return ""


def fitting_plan(
    path: Path,
    spec: dict[str, Any],
    notes: list[str],
    tiny: bool,
    others: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """Plan the one-chip spec at `path`; where float32 parameters do not fit one chip (moegen
    refuses the plan, or its peak or one of the `others` variants' is over HBM_BYTES) but
    bfloat16 ones do, rewrite the spec with bfloat16 parameters. (plan, "") or (None, why)."""
    plan, why = plan_of(write_spec(path, spec))
    if tiny:
        return plan, why and f"moegen plan failed: {why}"
    if plan is not None and planned_peak(plan) <= HBM_BYTES:
        why = variants_fit(path, spec, others or [])
        if not why:
            return plan, ""
    first = why or f"planned peak {planned_peak(plan) / 2**30:.1f} GiB"  # type: ignore[arg-type]
    if spec["dtypes"]["params"] != "float32":
        return None, f"does not fit one chip: {first}"
    spec["dtypes"]["params"] = "bfloat16"
    plan, why = plan_of(write_spec(path, spec))
    if plan is not None and planned_peak(plan) <= HBM_BYTES:
        notes.append(f"params float32 -> bfloat16 (with float32: {first.splitlines()[0][:160]})")
        return plan, ""
    second = why or f"planned peak {planned_peak(plan) / 2**30:.1f} GiB"  # type: ignore[arg-type]
    return None, f"does not fit one chip, with bfloat16 params either: {second}"
