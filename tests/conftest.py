"""Shared fixtures: the repository root, a throw-away copy of the project, and two ways to
run the command line (a real `python -m moegen` subprocess, and `moegen.cli.main` in-process
for the cases where a subprocess per call would be too slow)."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Tests run in parallel workers (pytest-xdist); those that compile for TPU in-process share
# libtpu with the others, as moegen's own verify workers do.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The tests' CPU programs are small and each compiled once or twice: LLVM's optimisations cost
# more than they save (a fifth of a twin-parity test's time). Results do not change: XLA's CPU
# code has no fast math either way, and libtpu's compiles (byte-exact memory figures,
# tests/fit/test_ledger.py) ignore the flag.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()

# The GPU libraries that lower GPU targets for CUDA: what each test marked
# @pytest.mark.gpu_library(name) needs (moegen.kernels.<name>.missing_<name>), the variable
# under which CI requires it, and its install. `make test` skips those tests (TE is still
# building beside it in CI); `make test-te` runs exactly them (-m gpu_library), both variables set.
GPU_LIBRARIES = {
    "te": ("MOEGEN_REQUIRE_TE", "make te"),
    "tokamax": ("MOEGEN_REQUIRE_TOKAMAX", "make gpu-kernels"),
}  # tests/kernels/test_te_lowering.py holds these to the registry's kernels that lower through one


def require_gpu_library(name: str) -> None:
    """Skip the running test without GPU library `name`, or fail it where CI requires it."""
    kernel = importlib.import_module(f"moegen.kernels.{name}")
    missing = getattr(kernel, f"missing_{name}")()  # looked up now: tests patch it
    if not missing:
        return
    required_by, install = GPU_LIBRARIES[name]
    reason = f"{name} is not installed here ({'; '.join(missing)}): {install}"
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{required_by}=1 but {reason}")
    pytest.skip(reason)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("gpu_library"):
        for name in marker.args:
            require_gpu_library(name)


REPO_ROOT = Path(__file__).resolve().parent.parent
# what libtpu prints on a CPU machine where the CLI keeps it quiet (tests check it does)
LIBTPU_NOISE = ("E0000", "TPU_WORKER_HOSTNAMES", "Logging before InitGoogle", "host bounds")
SPEC_DIR = REPO_ROOT / "specs"
GENERATED_DIR = REPO_ROOT / "generated"
EXAMPLE_SPECS = sorted(SPEC_DIR.glob("*.yaml"))
# placement files that example specs name (parallelism.placement); they travel with the specs
EXAMPLE_PLACEMENTS = sorted(SPEC_DIR.glob("*.placement.json"))
EXAMPLE_NAMES = [path.stem for path in EXAMPLE_SPECS]


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MOEGEN_DEBUG", None)  # tracebacks must not appear for user mistakes
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def run_moegen(
    *args: str | os.PathLike[str],
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """`python -m moegen ARGS` in `cwd` (default: the repository root); never raises on exit."""
    return subprocess.run(
        [sys.executable, "-m", "moegen", *map(str, args)],
        cwd=REPO_ROOT if cwd is None else cwd,
        env=_clean_env() if env is None else env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="backslashreplace",
        timeout=timeout,
        check=False,
    )


@pytest.fixture(autouse=True)
def _own_build_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Each test its own moegen cache (verification records, JAX's compilation cache), for
    itself and the moegen processes it starts: no test reuses another's verdict, none
    touches the user's ~/.cache/moegen."""
    monkeypatch.setenv("MOEGEN_CACHE_DIR", str(tmp_path_factory.mktemp("moegen-cache")))
    # moegen's private key (moegen.provenance): one per test session, never the user's
    monkeypatch.setenv("MOEGEN_STATE_DIR", str(tmp_path_factory.getbasetemp() / "moegen-state"))
    monkeypatch.delenv("MOEGEN_SECRET", raising=False)


@pytest.fixture(name="run_moegen")
def _run_moegen_fixture() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_moegen


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


def copy_project(dest: Path) -> Path:
    """specs/ (specs and schema) and generated/ of the repository, copied under `dest`."""
    (dest / "specs").mkdir(parents=True, exist_ok=True)
    (dest / "generated").mkdir(parents=True, exist_ok=True)
    for path in [*EXAMPLE_SPECS, *EXAMPLE_PLACEMENTS, SPEC_DIR / "moegen.schema.json"]:
        shutil.copyfile(path, dest / "specs" / path.name)
    for path in sorted(GENERATED_DIR.glob("*.py")):
        shutil.copyfile(path, dest / "generated" / path.name)
    return dest


@pytest.fixture
def tmp_project(tmp_path: Path) -> Path:
    """A project layout in tmp_path (specs/, generated/); run the CLI with cwd=tmp_project."""
    return copy_project(tmp_path)


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (hidden ones included) -> its bytes."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@pytest.fixture
def invoke_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., CliResult]:
    """Run `moegen.cli.main` (the console-script entry point) in-process with cwd changed."""
    from moegen.cli import main

    monkeypatch.delenv("MOEGEN_DEBUG", raising=False)

    def invoke(*args: str | os.PathLike[str], cwd: Path) -> CliResult:
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["moegen", *map(str, args)])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return invoke


def assert_twin_parity(report: Any) -> list[dict]:
    """Every twin-parity case of a verify report within tolerance (float32 1e-5, a bfloat16
    compute twin TOLERANCES["bfloat16"]); returns the parity steps for further checks."""
    from moegen.verify.twin import TOLERANCES  # imports jax: not before the device settings

    parity = [step for step in report.steps if step["step"].startswith("twin parity")]
    assert parity, report.steps
    for step in parity:
        for case in step["cases"]:
            assert case["max_relative_error"] < (
                TOLERANCES["float32"]
                if step["step"].startswith("twin parity (float32")
                else TOLERANCES["bfloat16"]
            ), (step["step"], case)
    return parity


def generated_from(choices: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The spec `choices` describe (tests/support/spec_builder.py), written as tmp_path/layer.yaml and
    generated there (loaded, validated, planned, rendered): a `moegen.pipeline.Generated`."""
    from spec_builder import spec_yaml

    from moegen.pipeline import generate

    (tmp_path / "layer.yaml").write_text(spec_yaml(choices))
    monkeypatch.chdir(tmp_path)
    return generate(Path("layer.yaml"))


def assert_no_traceback(text: str) -> None:
    assert "Traceback (most recent call last)" not in text, text
    assert "internal error" not in text, text


@pytest.fixture
def hypothesis_seed_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis mixes into its draws (5% of integers) constants it finds in the local modules
    loaded so far, so a seeded test's examples would depend on which test files pytest
    collected with it; without them, the seed alone fixes the examples (test_property*)."""
    from hypothesis.internal.conjecture import providers

    empty = providers.Constants()
    monkeypatch.setattr(providers, "_get_local_constants", lambda: empty)
