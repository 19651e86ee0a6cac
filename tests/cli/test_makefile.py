"""The Makefile's set-up levels, read with `make -n` (nothing installed): `make example` installs
moegen and the train extra (optax: the quick start trains a layer); the test targets add the
test extras to the same .venv, once, and `make test` makes a second venv as `make example` makes
.venv, for the README's quick start (tests/cli/test_readme.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT

EXTRAS = '".[dev,tpu,checkpoints,oracle,flax]"'
CORE_INSTALL = 'pip install -q -e ".[train]"\n'
EXAMPLE_VENV = ".venv/example"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make here")


def _dry_run(project: Path, *args: str) -> str:
    """`make -n ARGS`: the commands make would run (a target, and variables to set)."""
    done = subprocess.run(
        ["make", "-n", *args], cwd=project, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml", "scripts/make-venv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, tmp_path / name)
    return tmp_path


def _stamp(project: Path, name: str) -> None:
    """A stamp newer than what it depends on (make compares modification times)."""
    path = project / ".venv" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    later = time.time() + 10
    os.utime(path, (later, later))


def test_example_installs_moegen_and_the_train_extra(project):
    commands = _dry_run(project, "example")
    assert "scripts/make-venv .venv" in commands and CORE_INSTALL in commands
    assert EXTRAS not in commands
    assert "moegen build specs/mixtral_small_cpu.yaml" in commands


@pytest.mark.parametrize("target", ["setup", "test", "test-fast", "check"])
def test_test_targets_install_the_extras_too(project, target):
    commands = _dry_run(project, target)
    assert CORE_INSTALL in commands and EXTRAS in commands


def test_after_example_the_tests_only_add_the_extras(project):
    _stamp(project, ".moegen-core-installed")
    commands = _dry_run(project, "test")
    assert EXTRAS in commands and f".venv/bin/python -m {CORE_INSTALL}" not in commands
    assert "make-venv .venv\n" not in commands


def test_test_makes_the_quick_starts_venv_as_example_makes_venv(project):
    _stamp(project, ".moegen-core-installed")
    _stamp(project, ".moegen-installed")
    commands = _dry_run(project, "test")
    assert f"scripts/make-venv {EXAMPLE_VENV}\n" in commands
    assert f"{EXAMPLE_VENV}/bin/python -m {CORE_INSTALL}" in commands
    assert f"{EXAMPLE_VENV}/bin/python -m pip install -q -e {EXTRAS}" not in commands
    assert f"MOEGEN_EXAMPLE_VENV={project / EXAMPLE_VENV} " in commands
    assert "MOEGEN_REQUIRE_EXAMPLE_VENV=1 " in commands


def test_a_venv_named_on_the_command_line_is_set_up_there(project):
    commands = _dry_run(project, "VENV=/elsewhere/venv", "example")
    assert "scripts/make-venv /elsewhere/venv\n" in commands
    assert f"/elsewhere/venv/bin/python -m {CORE_INSTALL}" in commands
    assert "touch /elsewhere/venv/.moegen-core-installed" in commands


def test_after_setup_nothing_is_installed_again(project):
    _stamp(project, ".moegen-core-installed")
    _stamp(project, ".moegen-installed")
    _stamp(project, "example/.moegen-core-installed")
    for target in ("example", "test", "check"):
        assert "pip install" not in _dry_run(project, target), target
