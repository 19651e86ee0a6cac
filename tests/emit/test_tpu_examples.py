"""The TPU example specs: fresh without compiling, and the Mixtral v5e example built through the CLI to the committed module."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from conftest import (
    EXAMPLE_SPECS,
    GENERATED_DIR,
    REPO_ROOT,
    assert_no_traceback,
    run_moegen,
    snapshot,
)

import moegen.pipeline
import moegen.verify.verification
from moegen.load import load_spec
from moegen.plan import make_plan
from moegen.plan.costs import DTYPE_BYTES


def _is_tpu_spec(path: Path) -> bool:
    try:
        return load_spec(path).spec.target.hardware.startswith("tpu")
    except Exception:  # an invalid spec is another test's failure; judge it by its text
        text = path.read_text(encoding="utf-8", errors="replace")
        return re.search(r"^\s*hardware:\s*['\"]?tpu", text, re.MULTILINE) is not None


TPU_SPECS = [path for path in EXAMPLE_SPECS if _is_tpu_spec(path)]
TPU_NAMES = [path.stem for path in TPU_SPECS]


def test_there_are_tpu_example_specs():
    assert "mixtral_8x7b_v5e" in TPU_NAMES


@pytest.mark.parametrize("name", TPU_NAMES)
def test_tpu_example_is_fresh_without_compiling(name, invoke_main, monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("moegen check must not verify or compile")

    monkeypatch.setattr(moegen.verify.verification, "_run_worker", no_compile)
    monkeypatch.setattr(moegen.pipeline, "verify", no_compile)
    result = invoke_main("check", f"specs/{name}.yaml", cwd=REPO_ROOT)
    assert result.code == 0, result.output
    assert result.stderr.strip() == "1 generated module(s) fresh", result.output
    assert result.stdout == ""


@pytest.mark.slow
def test_mixtral_v5e_builds_through_the_cli_and_matches_the_committed_module(tmp_project):
    """The one full CLI build for a TPU target: twins, compiles, verdict, committed bytes."""
    name = "mixtral_8x7b_v5e"
    target = tmp_project / "generated" / f"{name}.py"
    target.unlink()
    others = snapshot(tmp_project / "generated")
    result = run_moegen("build", f"specs/{name}.yaml", cwd=tmp_project)
    err = result.stderr
    assert result.returncode == 0, err
    assert result.stdout == ""
    assert_no_traceback(err)
    for step in (
        "verify: import",
        "verify: twin parity (float32)",
        "verify: twin parity (bfloat16 compute, float32 params)",
    ):
        assert f"  {step} " in err, step
    # Arguments on one device: its parameter shards and its slice of x.
    loaded = load_spec(tmp_project / "specs" / f"{name}.yaml")
    plan = make_plan(loaded)
    x_bytes = plan.local_tokens * plan.embed_dim * DTYPE_BYTES[loaded.spec.dtypes.compute]
    arguments = plan.cost.param_bytes + x_bytes
    for step in ("compile forward", "compile forward+backward"):
        compiled = re.search(
            rf"^  verify: {re.escape(step)}\s+\d+\.\d+ s  per device: args ([\d.]+) MiB, .*; "
            r"([\d.e+]+) FLOPs",
            err,
            re.M,
        )
        assert compiled, err
        assert math.isclose(float(compiled.group(1)) * 2**20, arguments, rel_tol=0.05)
        assert float(compiled.group(2)) > 0
    verdict = re.search(r"^  verify: memory verdict\s+\d+\.\d+ s  (.*)$", err, re.M)
    assert verdict, err
    assert re.match(
        r"fits: forward \d+\.\d\d GiB, forward\+backward \d+\.\d\d GiB of 16\.00 GiB HBM per "
        r"device \(plan estimate: forward \d+\.\d\d, forward\+backward \d+\.\d\d GiB\)$",
        verdict.group(1),
    ), verdict.group(1)
    assert err.rstrip().endswith(f"wrote generated/{name}.py")
    assert target.read_bytes() == (GENERATED_DIR / f"{name}.py").read_bytes()
    assert snapshot(tmp_project / "generated") == others | {f"{name}.py": target.read_bytes()}
