"""Declared template contracts (moegen/render.py KERNEL_MACROS, STRATEGY_MACROS): every
kernel and every strategy template provides its kind's macros, and nothing else of theirs is
called from outside, so a kernel or strategy cannot lack what another template calls (issue
16: te.jinja lacked grouped_matmul_f32 and `kernel: te` in FFN slices crashed in render)."""

from __future__ import annotations

import re

import pytest
from jinja2 import nodes

from moegen.render import KERNEL_MACROS, STRATEGY_MACROS, _environment, templates_dir

KINDS = {"kernel": ("kernels", KERNEL_MACROS), "strategy": ("strategies", STRATEGY_MACROS)}


def _macros(relative: str) -> set[str]:
    env = _environment()
    source = (templates_dir() / relative).read_text(encoding="utf-8")
    return {macro.name for macro in env.parse(source).find_all(nodes.Macro)}


def _calls_from_outside(alias: str, folder: str) -> set[str]:
    """Names called as `alias.NAME(` in the templates outside `folder`."""
    return {
        name
        for path in templates_dir().rglob("*.jinja")
        if path.parent.name != folder
        for name in re.findall(rf"\b{alias}\.(\w+)\(", path.read_text(encoding="utf-8"))
    }


CASES = [
    pytest.param(alias, path.relative_to(templates_dir()).as_posix(), id=path.stem)
    for alias, (folder, _) in KINDS.items()
    for path in sorted((templates_dir() / folder).glob("*.jinja"))
]


@pytest.mark.parametrize(("alias", "relative"), CASES)
def test_template_provides_its_contract(alias: str, relative: str) -> None:
    _, contract = KINDS[alias]
    missing = set(contract) - _macros(relative)
    assert not missing, f"{relative} lacks the {alias} macros {sorted(missing)}"


@pytest.mark.parametrize("alias", sorted(KINDS))
def test_other_templates_call_only_the_contract(alias: str) -> None:
    folder, contract = KINDS[alias]
    called = _calls_from_outside(alias, folder)
    assert called, f"no template calls a {alias} macro: the scan is broken"
    assert called <= set(contract), f"called but not declared: {sorted(called - set(contract))}"


def test_every_kind_has_its_templates() -> None:
    assert len([c for c in CASES if c.values[0] == "kernel"]) == 3
    assert len([c for c in CASES if c.values[0] == "strategy"]) == 3
