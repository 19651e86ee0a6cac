"""moegen.pins states the versions a generated module's header says it is tested with: they
are the pins of pyproject.toml, or the header says something the install does not do."""

from __future__ import annotations

import tomllib

import pytest
from conftest import REPO_ROOT

from moegen import pins
from moegen.load import load_spec_bytes
from moegen.plan import prose
from moegen.validate import validate

PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def _pinned(requirements: list[str], name: str) -> str:
    return next(r.split("==")[1] for r in requirements if r.split("==")[0] == name)


def test_the_pins_are_pyprojects() -> None:
    assert _pinned(PROJECT["dependencies"], "jax") == pins.JAX
    assert _pinned(PROJECT["dependencies"], "jaxlib") == pins.JAX
    assert _pinned(PROJECT["optional-dependencies"]["tpu"], "libtpu") == pins.LIBTPU


@pytest.mark.parametrize(
    ("spec", "says", "not_said"),
    [
        (
            "qwen3_30b_a3b_v6e",
            ["jax 0.12.0.1 and libtpu 0.0.51", "compiled for tpu-v6e", "0.10.2"],
            [],
        ),
        (
            "mixtral_8x7b_h100",
            ["jax 0.12.0.1", "compiled for gpu-h100", "the version moegen pins"],
            ["libtpu", "0.10.2"],
        ),
        ("mixtral_8x7b_cpu", ["jax 0.12.0.1", "twin on CPU"], ["libtpu", "compiled for"]),
    ],
)
def test_a_module_says_what_it_is_tested_with(
    spec: str, says: list[str], not_said: list[str]
) -> None:
    path = REPO_ROOT / "specs" / f"{spec}.yaml"
    loaded = validate(load_spec_bytes(path.read_bytes(), f"specs/{spec}.yaml", spec))
    text = prose.tested_with(loaded.spec.target.hardware)
    assert all(s in text for s in says), text
    assert not any(s in text for s in not_said), text
