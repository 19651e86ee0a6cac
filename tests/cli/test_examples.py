"""examples/train_step.py (optax training of a CPU twin) and examples/train_generated.py (of a
module `moegen build` wrote), run as a user would run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
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


# ---------------------------------------------------------------------------------------
# examples/train_generated.py: a generated module (not a twin), trained as docs/how-to/wheel.md says

TRAIN_GENERATED = REPO_ROOT / "examples" / "train_generated.py"
STEP = re.compile(r"^step +(\d+)  loss (\S+)$", re.MULTILINE)


@pytest.mark.slow
def test_train_generated_trains_the_module_a_build_wrote(tmp_path: Path) -> None:
    from conftest import run_moegen

    assert run_moegen("init", cwd=tmp_path).returncode == 0
    built = run_moegen("build", "specs/moe.yaml", "--out", "layers", "--no-verify", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    (tmp_path / "train.py").write_text(TRAIN_GENERATED.read_text(encoding="utf-8"), "utf-8")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONIOENCODING="utf-8")
    env.pop("XLA_FLAGS", None)  # the script sets the device count itself
    result = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIME_LIMIT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    losses = [float(m[2]) for m in STEP.finditer(result.stdout)]
    assert len(losses) == 12, result.stdout
    assert losses[-1] < 0.2 * losses[0], result.stdout
    header = (tmp_path / "layers" / "moe.py").read_text(encoding="utf-8").splitlines()[2]
    assert header == "# spec: specs/moe.yaml"  # the module trained is the one the build wrote
