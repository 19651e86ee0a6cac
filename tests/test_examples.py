"""examples/train_step.py: optax training of a CPU twin, run as a user would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "examples" / "train_step.py"
TIME_LIMIT_S = 180  # a hang must fail, not stall CI; an idle 2-core machine needs about 35 s

LOSS = re.compile(r"^  loss (.+): step 0 (\S+) last (\S+)$", re.MULTILINE)
LOADS = re.compile(r"^  loads (.+): min (\S+) max (\S+) spread (\S+) cv (\S+)$", re.MULTILINE)


def run_example(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONIOENCODING="utf-8")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIME_LIMIT_S,
        check=False,
    )


def figures(stdout: str) -> tuple[dict[str, tuple[float, float]], dict[str, dict[str, float]]]:
    losses = {m[1]: (float(m[2]), float(m[3])) for m in LOSS.finditer(stdout)}
    loads = {
        m[1]: dict(zip(("min", "max", "spread", "cv"), map(float, m.groups()[1:]), strict=True))
        for m in LOADS.finditer(stdout)
    }
    return losses, loads


@pytest.mark.slow
def test_training_lowers_the_loss_and_the_bias_evens_the_loads() -> None:
    result = run_example()  # the default: DeepSeek-V3's twin, routing bias on and off
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "OK: the loss fell and the bias update evened out the expert loads" in result.stdout
    losses, loads = figures(result.stdout)
    assert set(losses) == {"bias update", "bias frozen"}, output
    for label, (first, last) in losses.items():
        assert last < 0.5 * first, f"{label}: loss {first} -> {last}\n{output}"
    assert set(loads) == {"step 0", "bias update last", "bias frozen last"}, output
    start, even, frozen = loads["step 0"], loads["bias update last"], loads["bias frozen last"]
    # The synthetic inputs skew the router: uneven at the start, and still so without the bias.
    assert start["cv"] > 1.0 and frozen["cv"] > 1.0, output
    for stat in ("spread", "cv"):
        assert even[stat] < frozen[stat], f"{stat}: {even} vs frozen {frozen}\n{output}"
        assert even[stat] < 0.5 * start[stat], f"{stat}: {even} vs step 0 {start}\n{output}"
    assert even["min"] > 0, f"an expert still gets no tokens with the bias update\n{output}"


@pytest.mark.slow
def test_a_loss_that_does_not_fall_fails_the_run() -> None:
    # Gradient ascent on a spec without routing bias (one quick run): the loss must rise.
    result = run_example(
        "specs/mixtral_small_cpu.yaml", "--steps", "6", "--window", "2", "--learning-rate=-0.05"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED: run 'no routing bias': the loss did not fall" in result.stderr
    losses, loads = figures(result.stdout)
    assert set(losses) == {"no routing bias"}
    assert set(loads) == {"step 0", "no routing bias last"}


def test_an_invalid_spec_exits_2_with_its_diagnostics(tmp_path: Path) -> None:
    text = (REPO_ROOT / "specs" / "mixtral_small_cpu.yaml").read_text(encoding="utf-8")
    spec = tmp_path / "too_many_picks.yaml"
    spec.write_text(re.sub(r"top_k: \d+", "top_k: 9", text), encoding="utf-8")
    result = run_example(str(spec))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "is not a valid spec" in result.stderr
    assert "router.top_k" in result.stderr and "got 9" in result.stderr
