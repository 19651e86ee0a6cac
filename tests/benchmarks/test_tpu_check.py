"""The TPU device check harness (scripts/tpu_check*.py, issue 52 item 1) runs end to end on a
CPU: `prepare --tiny` into a temporary folder, then the run phase in a child process with
moegen (and the prepare side's libraries) made unimportable, as on the TPU machine. A wrong
reference, a peer that stopped running, a module that no longer times or a report without
its version fields fails here rather than on the chip."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
# What the run phase may import: jax, numpy, the standard library, its own peers file, and
# tokamax where installed; everything else (moegen above all) is absent on the TPU machine.
BLOCKED = ("moegen", "yaml", "pydantic", "click", "jinja2")
RUN_UNDER_BLOCK = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("not on the TPU machine: " + name)
        return None
sys.meta_path.insert(0, Block())
sys.argv = {argv!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _prepare_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "tpu_check_prepare", SCRIPTS / "tpu_check_prepare.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_phase(work: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(SCRIPTS / "tpu_check_run.py"), "--work", str(work), *args]
    code = RUN_UNDER_BLOCK.format(blocked=BLOCKED, argv=argv)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "OUT": str(out), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_run_phase_imports_only_jax_numpy_and_stdlib() -> None:
    run_phase = ("run", "peers", "programs", "layers", "report", "kernels")
    allowed = {"jax", "numpy", "tokamax", "__future__", *(f"tpu_check_{n}" for n in run_phase)}
    for name in (f"tpu_check_{n}.py" for n in run_phase):
        tree = ast.parse((SCRIPTS / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            outside = {r for r in roots if r not in allowed and r not in sys.stdlib_module_names}
            assert not outside, f"{name} imports {outside}"


def test_one_chip_spec_keeps_the_layer_and_drops_multi_device_keys() -> None:
    prepare = _prepare_module()
    spec = {
        "layer": {"num_experts": 128, "embed_dim": 2048, "ffn_dim": 768},
        "router": {"top_k": 8, "score": "softmax", "renormalize": True},
        "shapes": {"batch": 8, "seq_len": 8192, "variants": {"eval": {"batch": 1}}},
        "dtypes": {"params": "float32", "compute": "bfloat16"},
        "mesh": {"axes": {"expert": 8}},
        "parallelism": {"experts": "ragged_all_to_all", "placement": "x.placement.json"},
        "memory": {"token_chunks": 8},
        "target": {"hardware": "tpu-v5p", "topology": "2x2x2", "kernel": "pallas"},
    }
    chip, notes = prepare.one_chip(spec, tiny=False)
    assert chip["layer"] == spec["layer"] and chip["router"] == spec["router"]
    assert chip["dtypes"] == spec["dtypes"]
    assert chip["mesh"] == {"axes": {"fsdp": 1}}
    assert chip["shapes"] == {"batch": 2, "seq_len": 4096}  # 8192 tokens, seq_len <= 4096
    assert chip["target"] == {"hardware": "tpu-v5e", "topology": "1x1", "kernel": "pallas"}
    assert "parallelism" not in chip and "memory" not in chip
    assert {"dropped parallelism", "dropped memory", "dropped shape variants"} <= set(notes)
    shapes = {"experts": 8, "embed": 4096, "ffn": 14336, "top_k": 2, "tokens": 8192}
    gated = 2 * 8192 * 2 * 4096 * 14336 * 3 + 2 * 8192 * 4096 * 8
    assert prepare.forward_flops({**shapes, "gated": True}) == gated


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _check_report(report: dict[str, Any], manifest: dict[str, Any]) -> None:
    env = report["environment"]
    for key in ("device_kind", "platform", "jax", "jaxlib", "libtpu", "date", "tokamax"):
        assert key in env, key
    assert env["platform"] == "cpu" and env["jax"] and env["jaxlib"] and env["date"]
    names = [m["name"] for m in manifest["modules"]]
    assert [r["name"] for r in report["modules"]] == names
    kinds = {m["reference"]["kind"] for m in manifest["modules"]}
    assert {"simple", "dense"} <= kinds, kinds  # both references are exercised
    tolerances = set()
    for row in report["modules"]:
        assert "error" not in row and "skipped" not in row, row
        assert _finite(row["fwd_ms"]) and _finite(row["fwdbwd_ms"]), row
        assert _finite(row["fwdbwd_tfs"]) and _finite(row["fwdbwd_pct_ceiling"]), row
        assert _finite(row["fwdbwd_x_maxtext"]) and _finite(row["fwdbwd_x_ragged_dot"]), row
        assert row["peak_bytes_in_use"] is None  # CPU keeps no memory stats
        parity = row["parity"]
        assert parity["ok"], (row["name"], parity)
        assert {"y", "grad_x", "grad_router", "grad_w_up", "grad_w_down"} <= set(parity["errors"])
        assert all(0 <= e <= parity["tolerance"] for e in parity["errors"].values()), parity
        tolerances.add(parity["tolerance"])
    assert tolerances == {1e-4, 1e-1}  # the float32-compute module is held to 1e-4
    by_peer: dict[str, list[dict]] = {}
    for row in report["peers"]:
        by_peer.setdefault(row["peer"], []).append(row)
    for peer in ("ceiling", "maxtext", "ragged_dot"):
        assert by_peer[peer] and all(_finite(r.get("fwdbwd_ms")) for r in by_peer[peer]), peer
    # the project's own Pallas kernel (the overlapped ring's _gmm_add), interpreted here
    assert [k["name"] for k in report["kernels"]] == [k["name"] for k in manifest["kernels"]]
    assert manifest["kernels"], "no committed module defines _gmm_add any more"
    for row in report["kernels"]:
        assert row["parity"]["ok"], row
        assert {"sum", "grad_lhs", "grad_rhs", "grad_total"} == set(row["parity"]["errors"])
        assert all(_finite(row[f"{k}_ms"]) for k in ("fused_fwd", "fused_fwdbwd", "unfused_fwd"))
    tokamax = by_peer["tokamax"]
    assert all(
        r.get("skipped") == "tokamax not installed" or _finite(r.get("fwd_ms")) for r in tokamax
    )


@pytest.mark.slow
def test_tiny_harness_runs_on_cpu(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    env = {**os.environ, "TPU_CHECK_WORK": str(work)}
    prepared = subprocess.run(
        [sys.executable, str(SCRIPTS / "tpu_check_prepare.py"), "--tiny"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stdout[-3000:] + prepared.stderr[-3000:]
    manifest = json.loads((work / "manifest.json").read_text(encoding="utf-8"))
    assert len(manifest["modules"]) >= 5 and manifest["tiny"]
    assert not (work / "modules" / "__init__.py").exists()

    ran = _run_phase(work, out, "--repeats", "2")
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-4000:]
    report = json.loads((out / "tpu_check.json").read_text(encoding="utf-8"))
    _check_report(report, manifest)
    text = (out / "tpu_check.txt").read_text(encoding="utf-8")
    assert "== summary" in text and all(m["name"] in text for m in manifest["modules"])

    # Past the budget nothing is dropped silently: every module and peer says why it is left.
    late = _run_phase(work, tmp_path / "late", "--budget-s", "0")
    assert late.returncode == 0, late.stderr[-3000:]
    late_report = json.loads((tmp_path / "late" / "tpu_check.json").read_text(encoding="utf-8"))
    assert [r.get("skipped") for r in late_report["modules"]] == ["budget"] * len(
        manifest["modules"]
    )
    assert [r.get("skipped") for r in late_report["kernels"]] == ["budget"] * len(
        manifest["kernels"]
    )
